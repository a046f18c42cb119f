"""Capstan's helper for tool plugins written in Python, built with componentize-py.

A plugin is a module that registers its tools on a `Toolbox` and exports it as `Tool`:

    from capstan_sdk import Toolbox, ToolError

    toolbox = Toolbox()

    @toolbox.tool(needs=["fs.read"])
    def line_count(path: str) -> int:
        \"\"\"Counts the lines of a workspace file.

        Args:
            path: a file, relative to the workspace root
        \"\"\"
        with open(path, encoding="utf-8") as file:
            return sum(1 for _ in file)

    Tool = toolbox.export()

Built against the `plugin-wasi` world of Capstan's WIT:

    componentize-py -d wit -w plugin-wasi componentize app -o app.wasm

- The arguments' JSON Schema comes from the function's signature: `str`, `int`, `float`,
  `bool`, `list[...]`, `dict`, `Optional[...]`, and defaults (which make a parameter
  optional). The docstring's first paragraph is the description the model reads; its
  `Args:` lines describe the parameters. A parameter named `ctx` receives the call's
  context (caller, call id, capabilities) and is not an argument.
- Arguments are checked against that schema (or the one given as `schema=`) before the
  function runs: an unknown key, a missing one or a wrong type is an `invalid-args` error
  naming the key; arguments nested deeper than 64 levels are refused unparsed.
- A `str` result is returned as it is; anything else as JSON (None as `null`; NaN and
  other values JSON cannot hold are a `failed` error).
- `ToolError.denied(...)` and its siblings end a call with that kind of error. Python's own
  errors map too: `FileNotFoundError` is `not-found`, `PermissionError` is `denied` (a
  write under a read-only grant), anything else is `failed` with its type and message; a
  plugin never traps on an exception.
- A host import (`wit_world.imports.tasks`, `memory`, `secrets`) that refuses raises
  `componentize_py_types.Err` holding a `HostError_*`; left uncaught, it ends the call as
  the matching tool error with the host's message (`denied`, `not-found`, `invalid` as
  `invalid-args`, `failed`). `host_error(err)` gives that `ToolError` to a tool that
  catches it.
- `capstan_sdk.http` makes HTTP requests through the host (`http.get(url)`); declare
  `net:HOST` in `needs`.
- Every module a tool uses must be imported at the top of the file: componentize-py
  snapshots the interpreter at build time, and a module first imported during a call is
  not there.
"""

import inspect
import json
import os
import types as _pytypes
import typing

from componentize_py_types import Err
from wit_world import exports as _exports
from wit_world.imports import log as _log
from wit_world.imports.capstan_plugin_types import (
    CallContext,
    HostError_Denied,
    HostError_Failed,
    HostError_Invalid,
    HostError_NotFound,
    ToolError_Denied,
    ToolError_Failed,
    ToolError_InvalidArgs,
    ToolError_NotFound,
    ToolSpec,
)

__all__ = ["Toolbox", "ToolError", "CallContext", "log", "host_error", "current_context"]

_KINDS = {
    "invalid-args": ToolError_InvalidArgs,
    "denied": ToolError_Denied,
    "not-found": ToolError_NotFound,
    "failed": ToolError_Failed,
}


class ToolError(Exception):
    """Ends a call with an error the model reads: `invalid-args`, `denied`, `not-found` or
    `failed`, and a message."""

    def __init__(self, kind: str, message: str):
        if kind not in _KINDS:
            raise ValueError(f"unknown tool error kind {kind!r}; one of {', '.join(_KINDS)}")
        message = _text(message)
        super().__init__(message)
        self.kind = kind
        self.message = message

    @classmethod
    def invalid_args(cls, message: str) -> "ToolError":
        return cls("invalid-args", message)

    @classmethod
    def denied(cls, message: str) -> "ToolError":
        return cls("denied", message)

    @classmethod
    def not_found(cls, message: str) -> "ToolError":
        return cls("not-found", message)

    @classmethod
    def failed(cls, message: str) -> "ToolError":
        return cls("failed", message)


# A host import's refusal, by the tool error it becomes.
_HOST_KINDS = {
    HostError_Denied: "denied",
    HostError_NotFound: "not-found",
    HostError_Invalid: "invalid-args",
    HostError_Failed: "failed",
}


def host_error(err: Err) -> ToolError:
    """The tool error a host import's `Err` stands for, with the host's message: raise it,
    or read its `kind` and `message`. Any other `Err` (a WASI call's) is `failed`."""
    kind = _HOST_KINDS.get(type(err.value))
    if kind is not None:
        return ToolError(kind, err.value.value)
    if type(err.value) in (ToolError_InvalidArgs, ToolError_Denied, ToolError_NotFound, ToolError_Failed):
        kind = next(k for k, t in _KINDS.items() if t is type(err.value))
        return ToolError(kind, err.value.value)
    return ToolError.failed(f"a host call failed: {_text(err.value)}")


# The context of the call running now: one call runs at a time in an instance.
_current: CallContext | None = None


def current_context() -> CallContext | None:
    """The context of the call running now (caller, call id, capabilities), or None
    outside a call. `capstan_sdk.http` reads it to refuse a request the call holds no
    `net:` grant for, before the host would have to stop the call."""
    return _current


def log(level: str, message: str) -> None:
    """Writes a line to the host's log, tagged with the plugin and tool: `level` is one of
    `trace`, `debug`, `info`, `warn`, `error`. The host rate-limits it per call."""
    _log.write(_log.Level[level.upper()], message)


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean"}

# Arguments nested deeper than this are refused before they are parsed: CPython's parser
# recurses, and the sandbox's stack is small.
MAX_ARGS_DEPTH = 64


def _text(value) -> str:
    """`value` as text the host can take: any object's `str`, never failing, and lone
    surrogates (which JSON escapes may carry) written as escapes rather than refused."""
    try:
        text = value if isinstance(value, str) else str(value)
    except BaseException:  # a __str__ that raises
        text = f"<{type(value).__name__} that cannot be shown>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _depth(text: str) -> int:
    """How deep the arrays and objects of a JSON text nest."""
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _schema_of(annotation) -> tuple[dict, bool]:
    """The JSON Schema of a parameter's annotation, and whether it admits None."""
    if annotation is inspect.Parameter.empty or annotation is typing.Any:
        return {}, False
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, _pytypes.UnionType):
        rest = [arg for arg in args if arg is not type(None)]
        if len(rest) == 1 and len(rest) < len(args):
            return _schema_of(rest[0])[0], True
        return {"anyOf": [_schema_of(arg)[0] for arg in rest]}, len(rest) < len(args)
    if annotation in _SCALARS:
        return {"type": _SCALARS[annotation]}, False
    if annotation is list or origin is list:
        return ({"type": "array", "items": _schema_of(args[0])[0]} if args else {"type": "array"}), False
    if annotation is dict or origin is dict:
        return {"type": "object"}, False
    raise TypeError(f"capstan_sdk: no JSON Schema for the annotation {annotation!r}")


def _param_docs(doc: str) -> dict[str, str]:
    """`name: text` lines under an `Args:` heading of a docstring."""
    found, inside = {}, False
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped in ("Args:", "Arguments:", "Parameters:"):
            inside = True
        elif inside and not stripped:
            inside = False
        elif inside and ":" in stripped:
            name, text = stripped.split(":", 1)
            found[name.strip()] = text.strip()
    return found


def _matches(value, schema: dict) -> bool:
    if not isinstance(schema, dict):
        return True
    kind = schema.get("type")
    if "anyOf" in schema:
        return any(_matches(value, option) for option in schema["anyOf"])
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "array":
        items = schema.get("items", {})
        return isinstance(value, list) and all(_matches(item, items) for item in value)
    if kind == "object":
        return isinstance(value, dict)
    return True


class _Tool:
    def __init__(self, function, name, description, needs, schema):
        self.function = function
        self.name = name
        self.needs = list(needs)
        signature = inspect.signature(function)
        self.takes_ctx = "ctx" in signature.parameters
        doc = inspect.getdoc(function) or ""
        self.description = description or doc.split("\n\n")[0].replace("\n", " ").strip()
        if not self.description:
            raise ValueError(f"capstan_sdk: tool `{name}` needs a description (a docstring)")
        # Parameters that may be left out or null: they are passed as None when missing.
        self.nullable: set[str] = set()
        if schema is not None:
            self.schema = schema
            return
        docs = _param_docs(doc)
        properties, required = {}, []
        for param in signature.parameters.values():
            if param.name == "ctx":
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(f"capstan_sdk: tool `{name}` takes *args or **kwargs; name each argument")
            prop, nullable = _schema_of(param.annotation)
            if param.name in docs:
                prop = {**prop, "description": docs[param.name]}
            properties[param.name] = prop
            if nullable:
                self.nullable.add(param.name)
            if param.default is param.empty and not nullable:
                required.append(param.name)
        self.schema = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            self.schema["required"] = required

    def check(self, args: dict) -> None:
        """Checks `args` against the schema's top level: unknown keys (unless the schema
        admits more), missing required ones, and each value's type. Integers written as
        `5.0` are taken as `5`."""
        properties = self.schema.get("properties", {})
        if self.schema.get("additionalProperties") is False:
            for key in args:
                if key not in properties:
                    known = ", ".join(f"`{name}`" for name in properties) or "none"
                    raise ToolError.invalid_args(f"unknown argument `{key}` (arguments: {known})")
        for key in self.schema.get("required", []):
            if key not in args:
                raise ToolError.invalid_args(f"missing argument `{key}`")
        for key, value in list(args.items()):
            prop = properties.get(key)
            if prop is None or (value is None and key in self.nullable):
                continue
            if isinstance(prop, dict) and prop.get("type") == "integer" and isinstance(value, float) and value.is_integer():
                args[key] = value = int(value)
            if not _matches(value, prop):
                expected = prop.get("type", "a value of the schema")
                raise ToolError.invalid_args(f"argument `{key}` must be {expected}, not {json.dumps(value)[:80]}")
        for key in self.nullable:
            args.setdefault(key, None)


class Toolbox:
    """The tools of one plugin. Register with `@toolbox.tool(...)`, export with
    `Tool = toolbox.export()`."""

    def __init__(self):
        self._tools: dict[str, _Tool] = {}

    def tool(self, function=None, *, name=None, description=None, needs=(), schema=None, effect=None):
        """Registers a function as a tool. `name` defaults to the function's name,
        `description` to its docstring's first paragraph, `schema` to one derived from its
        signature; `needs` lists the capabilities it declares (`fs.read`, `fs.write`,
        `tasks.read`, `memory.write`, `net:api.example.com`, ...); `effect` declares what a
        call does, `"read"`, `"write-local"` or `"send"` (it reaches a person or a program
        outside the host), for the host's data-flow rules, which take the higher of it and
        what the capabilities imply."""
        if effect not in (None, "read", "write-local", "send"):
            raise ValueError(f"capstan_sdk: effect {effect!r} is not read, write-local or send")

        def register(fn):
            tool_name = name or fn.__name__
            if tool_name in self._tools:
                raise ValueError(f"capstan_sdk: tool `{tool_name}` is registered twice")
            tool = _Tool(fn, tool_name, description, needs, schema)
            # The effect travels as an entry of the capability list: the contract's record
            # stays as it is.
            if effect is not None:
                tool.needs.append(f"effect:{effect}")
            self._tools[tool_name] = tool
            return fn

        return register(function) if function is not None else register

    def describe(self) -> list[ToolSpec]:
        return [
            ToolSpec(name=t.name, description=t.description, args_schema=json.dumps(t.schema), capabilities=t.needs)
            for t in self._tools.values()
        ]

    def call(self, name: str, args_json: str, context: CallContext) -> str:
        _hold_workspace(context)
        try:
            return _text(self._run(name, args_json, context))
        except ToolError as err:
            raise Err(_KINDS[err.kind](_text(err.message)))
        except FileNotFoundError as err:
            raise Err(ToolError_NotFound(_text(_os_message(err))))
        except PermissionError as err:
            raise Err(ToolError_Denied(_text(_os_message(err))))
        except Err as err:
            # A host import's refusal, left uncaught: the tool error it stands for. Raised
            # as it is, a HostError would not fit the export's type and would trap.
            mapped = host_error(err)
            raise Err(_KINDS[mapped.kind](_text(mapped.message)))
        except BaseException as err:  # never a trap: SystemExit and KeyboardInterrupt too
            raise Err(ToolError_Failed(f"{type(err).__name__}: {_text(err)}"))

    def _run(self, name: str, args_json: str, context: CallContext) -> str:
        tool = self._tools.get(name)
        if tool is None:
            raise ToolError.not_found(f"no tool `{name}` in this plugin")
        if args_json.count("[") + args_json.count("{") > MAX_ARGS_DEPTH and _depth(args_json) > MAX_ARGS_DEPTH:
            raise ToolError.invalid_args(f"the arguments nest deeper than {MAX_ARGS_DEPTH} levels")
        try:
            args = json.loads(args_json)
        except ValueError as err:
            raise ToolError.invalid_args(f"the arguments are not JSON: {err}")
        if not isinstance(args, dict):
            raise ToolError.invalid_args("the arguments must be a JSON object")
        tool.check(args)
        if tool.takes_ctx:
            args["ctx"] = context
        global _current
        _current = context
        try:
            result = tool.function(**args)
        finally:
            _current = None
        if isinstance(result, str):
            return result
        try:
            return json.dumps(result, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ToolError.failed(f"the tool's result is not JSON: {err}")

    def export(self):
        """The class componentize-py exports as `capstan:plugin/tool`: assign it to `Tool`
        at the top level of the app module."""
        toolbox = self

        class Tool(_exports.Tool):
            def describe(self) -> list[ToolSpec]:
                return toolbox.describe()

            def call(self, name: str, args_json: str, context: CallContext) -> str:
                return toolbox.call(name, args_json, context)

        return Tool


_workspace_held = False


def _hold_workspace(context: CallContext) -> None:
    """Has the C library fetch the workspace's preopen at an instance's first call that
    may use it, even one that ends before opening a file. It fetches it on first use and
    holds it from then on; the host compares what a kept instance holds with what it held
    after its first call, so a handle first fetched later would look like a leak and cost
    the instance."""
    global _workspace_held
    if _workspace_held or not any(c in ("fs.read", "fs.write") for c in context.capabilities):
        return
    _workspace_held = True
    try:
        os.stat(".")
    except OSError:
        pass  # no workspace: opening a file says so, if the tool tries


def _os_message(err: OSError) -> str:
    where = f"{err.filename}: " if err.filename else ""
    return f"{where}{err.strerror or err}"
