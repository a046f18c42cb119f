"""HTTP requests from a tool, through the host: `get`, `post` and `request`.

    from capstan_sdk import Toolbox, http

    toolbox = Toolbox()

    @toolbox.tool(needs=["net:api.example.com"])
    def weather(city: str) -> dict:
        \"\"\"Today's weather in a city.\"\"\"
        return http.get(f"https://api.example.com/weather?city={city}").json()

Each request goes through the host's `wasi:http`, which checks it against the call's
`net:` rules (the tool's declaration, intersected with its process's grant), may inject a
secret bound to the host, and bounds its size and time.

Every failure is a `ToolError` the model can act on, never a trap:
- a URL that is not `http://` or `https://`, or a header the host does not take:
  `invalid-args`;
- a request the host refused (no `net:` rule covers it, a limit): `denied`, with the
  host's message as it is: which grant or limit refused it and the config line that
  would allow it;
- a call that holds no `net:` grant at all: `denied`, before anything is sent;
- DNS, connection, TLS, timeout or protocol failures: `failed`, naming what failed.

A response of any status is returned, not raised: check `response.status` (or call
`response.raise_for_status()`).
"""

# Imported here, not when first needed: the build snapshots the interpreter, and a codec
# first looked up during a call is not there.
import encodings.idna  # noqa: F401
import json as _json
import operator as _operator
import urllib.parse as _urlparse

from componentize_py_types import Err
from wit_world.imports import outgoing_handler as _handler
from wit_world.imports import wasi_http_types as _wasi
from wit_world.imports import streams as _streams

import capstan_sdk as _sdk
from capstan_sdk import ToolError

__all__ = ["Response", "get", "post", "request", "REFUSAL_PREFIX", "MAX_RESPONSE_BYTES"]

# How every message of a request the host refused begins.
REFUSAL_PREFIX = "capstan refused this request:"

# The most response body read by default; more is cut off (`Response.truncated`).
MAX_RESPONSE_BYTES = 4 << 20

# `blocking-write-and-flush` takes at most 4096 bytes per call.
_WRITE_CHUNK = 4096
_READ_CHUNK = 64 * 1024

_METHODS = {
    "GET": _wasi.Method_Get,
    "HEAD": _wasi.Method_Head,
    "POST": _wasi.Method_Post,
    "PUT": _wasi.Method_Put,
    "DELETE": _wasi.Method_Delete,
    "CONNECT": _wasi.Method_Connect,
    "OPTIONS": _wasi.Method_Options,
    "TRACE": _wasi.Method_Trace,
    "PATCH": _wasi.Method_Patch,
}


class Response:
    """A response: `status` (an int), `headers` (a dict of lower-case names to values,
    repeated headers joined with `, `), `body` (bytes) and `truncated` (True when the body
    went on past the limit)."""

    def __init__(self, status: int, headers: dict[str, str], body: bytes, truncated: bool):
        self.status = status
        self.headers = headers
        self.body = body
        self.truncated = truncated

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    def text(self) -> str:
        """The body as UTF-8 text (invalid bytes replaced)."""
        return self.body.decode("utf-8", "replace")

    def json(self):
        """The body parsed as JSON; `failed` naming the status when it is not JSON."""
        try:
            return _json.loads(self.body)
        except ValueError as err:
            raise ToolError.failed(f"the response (status {self.status}) is not JSON: {err}")

    def raise_for_status(self) -> "Response":
        """This response if its status is below 400; else `not-found` for 404, `failed`
        for any other, with the status and the start of the body."""
        if self.status < 400:
            return self
        start = self.text()[:200]
        if self.status == 404:
            raise ToolError.not_found(f"HTTP 404: {start}")
        raise ToolError.failed(f"HTTP {self.status}: {start}")

    def __repr__(self) -> str:
        return f"<Response {self.status}, {len(self.body)} bytes>"


def get(url: str, *, headers: dict[str, str] | None = None, timeout: float | None = None,
        max_bytes: int = MAX_RESPONSE_BYTES) -> Response:
    """`GET url`."""
    return request("GET", url, headers=headers, timeout=timeout, max_bytes=max_bytes)


def post(url: str, body: bytes | str | None = None, *, json=None, headers: dict[str, str] | None = None,
         timeout: float | None = None, max_bytes: int = MAX_RESPONSE_BYTES) -> Response:
    """`POST url` with `body` (bytes, or text sent as UTF-8), or `json` (any value, sent as
    JSON with `content-type: application/json`)."""
    return request("POST", url, body=body, json=json, headers=headers, timeout=timeout, max_bytes=max_bytes)


def request(method: str, url: str, *, headers: dict[str, str] | None = None, body: bytes | str | None = None,
            json=None, timeout: float | None = None, max_bytes: int = MAX_RESPONSE_BYTES) -> Response:
    """Sends one request and reads its response, at most `max_bytes` of its body.
    `timeout` (seconds) bounds connecting and each wait for data; the call's deadline
    bounds the whole."""
    what = f"{method} {url}"
    _check_granted(what)
    scheme, authority, path = _split(url)
    limit = _count(max_bytes, "max_bytes", what)
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or not timeout >= 0):
        raise ToolError.invalid_args(f"{what}: `timeout` must be a number of seconds, 0 or more, not {timeout!r}")
    headers = dict(headers or {})
    if json is not None:
        if body is not None:
            raise ToolError.invalid_args(f"{what}: give `body` or `json`, not both")
        body = _json.dumps(json).encode("utf-8")
        if not any(name.lower() == "content-type" for name in headers):
            headers["content-type"] = "application/json"
    if isinstance(body, str):
        body = body.encode("utf-8")
    elif body is not None:
        try:
            body = bytes(body)  # bytearray, memoryview: the host takes bytes only
        except TypeError:
            raise ToolError.invalid_args(f"{what}: `body` must be bytes or text, not {type(body).__name__}")
    for name, value in headers.items():
        if str(name).lower() == "content-length" and not str(value if not isinstance(value, bytes) else value.decode("latin-1")).strip().isdigit():
            raise ToolError.invalid_args(f"{what}: header `content-length` must be a number of bytes, not {value!r}")
    # The length goes first, so the host can check it against its limit before the body.
    if (body or method.upper() in ("POST", "PUT", "PATCH")) and not any(n.lower() == "content-length" for n in headers):
        headers["content-length"] = str(len(body or b""))
    outgoing = _build(method, scheme, authority, path, headers, what)
    try:
        outgoing_body = outgoing.body()
    except Err:
        raise ToolError.failed(f"{what}: the request body was already taken")
    try:
        future = _handler.handle(outgoing, _options(timeout))
    except Err as err:
        raise _from_code(err.value, what)
    # The host reads the body only once it has the request: write it after `handle`.
    sent = None
    try:
        _write_body(outgoing_body, body or b"", what)
    except ToolError as err:
        sent = err
    try:
        _wasi.OutgoingBody.finish(outgoing_body, None)
    except Err as err:
        sent = sent or _from_code(err.value, what)
    with future:
        try:
            response = _wait(future, what)
        except ToolError as err:
            # The response explains a failed upload best; a refusal above all.
            raise err if sent is None or err.message.startswith(REFUSAL_PREFIX) else sent
    if sent is not None and sent.message.startswith(REFUSAL_PREFIX):
        raise sent
    with response:
        return _read(response, limit, what)


def _count(value, name: str, what: str) -> int:
    """`value` as a count of bytes: an int, 0 or more (a float or a negative one would not
    fit the host's integer and would stop the call)."""
    try:
        count = _operator.index(value)
    except TypeError:
        raise ToolError.invalid_args(f"{what}: `{name}` must be a whole number, not {value!r}")
    if count < 0:
        raise ToolError.invalid_args(f"{what}: `{name}` must be 0 or more, not {count}")
    return count


def _check_granted(what: str) -> None:
    """Refuses, before anything is sent, a request outside a call or of a call that holds
    no `net:` rule: the host links no HTTP for such a call and would stop it."""
    context = _sdk.current_context()
    if context is None:
        raise ToolError.denied(f"{REFUSAL_PREFIX} {what}: no tool call is running; make requests from a tool")
    if not any(cap.startswith("net:") for cap in context.capabilities):
        held = ", ".join(context.capabilities) or "none"
        raise ToolError.denied(
            f"{REFUSAL_PREFIX} {what}: this call holds no network grant (it runs with: {held}); "
            f"declare `net:HOST` in the tool's `needs` and grant it in its process's profile "
            f"(`net = [\"HOST\"]`); `capstan policy --why KIND TOOL URL` shows what is missing"
        )


def _split(url: str) -> tuple[type, str, str]:
    try:
        parts = _urlparse.urlsplit(url)
        port = parts.port
    except ValueError as err:
        raise ToolError.invalid_args(f"{url!r} is not a URL: {err}")
    scheme = {"http": _wasi.Scheme_Http, "https": _wasi.Scheme_Https}.get(parts.scheme.lower())
    if scheme is None:
        raise ToolError.invalid_args(f"{url!r}: only http:// and https:// URLs can be requested")
    if not parts.hostname:
        raise ToolError.invalid_args(f"{url!r} names no host")
    if parts.username is not None or parts.password is not None:
        raise ToolError.invalid_args(f"{url!r}: credentials in a URL are not sent; use a header")
    host = parts.hostname
    if ":" in host:
        host = f"[{host}]"
    elif not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError as err:
            raise ToolError.invalid_args(f"{url!r}: the host name cannot be encoded: {err}")
    authority = host if port is None else f"{host}:{port}"
    # Spaces and other characters a URL may not hold are percent-encoded; what is
    # encoded already stays as it is.
    path = _urlparse.quote(parts.path or "/", safe="/%:@!$&'()*+,;=~-._")
    if parts.query:
        path = f"{path}?{_urlparse.quote(parts.query, safe='/?%:@!$&()*+,;=~-._')}"
    return scheme, authority, path


def _build(method, scheme, authority, path, headers, what):
    entries = []
    for name, value in headers.items():
        raw = bytes(value) if isinstance(value, (bytes, bytearray)) else str(value).encode("utf-8")
        entries.append((str(name), raw))
    try:
        fields = _wasi.Fields.from_list(entries)
    except Err as err:
        raise ToolError.invalid_args(f"{what}: {_header_error(err.value, entries)}")
    outgoing = _wasi.OutgoingRequest(fields)
    wasi_method = _METHODS.get(method.upper())
    method_value = wasi_method() if wasi_method else _wasi.Method_Other(method)
    for part, setter, value in (
        ("method", outgoing.set_method, method_value),
        ("scheme", outgoing.set_scheme, scheme()),
        ("host and port", outgoing.set_authority, authority),
        ("path", outgoing.set_path_with_query, path),
    ):
        try:
            setter(value)
        except Err:
            raise ToolError.invalid_args(f"the host does not accept the {part} of {what}")
    return outgoing


def _header_error(err, entries) -> str:
    names = ", ".join(f"`{name}`" for name, _ in entries)
    if isinstance(err, _wasi.HeaderError_Forbidden):
        return f"a header among {names} may not be set by a tool: the host sets it itself or does not send it"
    return f"a header among {names} has an invalid name or value"


def _options(timeout):
    if timeout is None:
        return None
    options = _wasi.RequestOptions()
    nanos = min(max(0, int(timeout * 1e9)), (1 << 63) - 1)
    # A host that does not support an option refuses it; the call's deadline still
    # bounds the request then.
    for setter in (options.set_connect_timeout, options.set_first_byte_timeout, options.set_between_bytes_timeout):
        try:
            setter(nanos)
        except Err:
            pass
    return options


def _write_body(outgoing_body, data: bytes, what: str) -> None:
    if not data:
        return
    try:
        stream = outgoing_body.write()
    except Err:
        raise ToolError.failed(f"{what}: the request body was already taken")
    with stream:
        for start in range(0, len(data), _WRITE_CHUNK):
            try:
                stream.blocking_write_and_flush(data[start:start + _WRITE_CHUNK])
            except Err as err:
                raise _stream_error(err.value, what, "sending the request body")


def _wait(future, what: str):
    while True:
        got = future.get()
        if got is None:
            with future.subscribe() as pollable:
                pollable.block()
            continue
        # Some(Ok(Ok(response))) | Some(Ok(Err(code))) | Some(Err(()))
        outer = got
        if isinstance(outer, Err):
            raise ToolError.failed(f"{what}: the response was already taken")
        inner = outer.value
        if isinstance(inner, Err):
            raise _from_code(inner.value, what)
        return inner.value


def _read(response, limit: int, what: str) -> Response:
    status = response.status()
    headers: dict[str, str] = {}
    with response.headers() as fields:
        for name, value in fields.entries():
            name = name.lower()
            value = value.decode("utf-8", "replace")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
    try:
        body = response.consume()
    except Err:
        raise ToolError.failed(f"{what}: the response body was already taken")
    chunks, size, truncated = [], 0, False
    with body:
        try:
            stream = body.stream()
        except Err:
            raise ToolError.failed(f"{what}: the response body was already taken")
        with stream:
            while True:
                want = min(_READ_CHUNK, limit + 1 - size)
                try:
                    chunk = stream.blocking_read(want)
                except Err as err:
                    if isinstance(err.value, _streams.StreamError_Closed):
                        break
                    raise _stream_error(err.value, what, "reading the response body")
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    truncated = True
                    break
    data = b"".join(chunks)
    return Response(status, headers, data[:limit], truncated)


def _stream_error(err, what: str, doing: str) -> ToolError:
    if isinstance(err, _streams.StreamError_LastOperationFailed):
        code = _wasi.http_error_code(err.value)
        if code is not None:
            return _from_code(code, f"{what} ({doing})")
        return ToolError.failed(f"{what} failed {doing}: {err.value.to_debug_string()}")
    return ToolError.failed(f"{what} failed {doing}: the connection closed early")


def _from_code(code, what: str) -> ToolError:
    """A `wasi:http` error code as a tool error: the host's refusal as `denied` with its
    message as it is, any other code `failed`, named in words."""
    if isinstance(code, _wasi.ErrorCode_InternalError) and code.value:
        if code.value.startswith(REFUSAL_PREFIX):
            return ToolError.denied(code.value)
        return ToolError.failed(code.value)
    name = type(code).__name__.removeprefix("ErrorCode_")
    words = "".join(f" {c.lower()}" if c.isupper() else c for c in name).strip()
    detail = getattr(code, "value", None)
    extra = f" ({detail})" if detail not in (None, "") and not isinstance(detail, (bool,)) else ""
    return ToolError.failed(f"{what} failed: {words}{extra}")
