"""Traces of `capstan serve`, received over OTLP/HTTP by a loopback receiver written here and
decoded by the OpenTelemetry project's own protobuf classes (`opentelemetry-proto` from PyPI):
the spans of a turn whose worker calls a tool, all under the client's `traceparent`; their
names and GenAI attributes at the pinned schema; the parent links through the worker; a
tool call's receipt; and no canary secret or token in any byte the receiver got."""

import asyncio
import glob
import http.server
import os
import shutil
import subprocess
import tempfile
import threading
import urllib.request

import pytest
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import BINARY, PLUGINS, ROOT, TOKEN, Server
from otlp_receiver import Receiver

CANARY = "cnryTraceQ7wE3rT9yU1xZ"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
SCHEMA = "https://opentelemetry.io/schemas/1.41.0"


@pytest.fixture
def receiver():
    running = Receiver()
    yield running
    running.stop()


def traced_server(receiver, monkeypatch, content):
    monkeypatch.setenv("CANARY_SECRET", CANARY)
    # The environment's own OTLP variables would send the spans elsewhere.
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                 "OTEL_SDK_DISABLED", "OTEL_TRACES_EXPORTER"):
        monkeypatch.delenv(name, raising=False)
    extra = f"""
[telemetry]
otlp_endpoint = "{receiver.url}"
content = {"true" if content else "false"}

[secrets.CANARY]
env = "CANARY_SECRET"
hosts = ["api.example.com"]
header = "Authorization: Bearer {{CANARY}}"
"""
    server = Server(tokens=True, extra=extra)
    # A file named with the secret: the worker's listing holds it.
    (server.base / "workspace" / CANARY).write_text("x")
    return server


def say(server, text, traceparent=None):
    data = ('{"text": "%s", "wait": true}' % text).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    if traceparent:
        headers["traceparent"] = traceparent
    request = urllib.request.Request(f"{server.url}/v1/channels/main/messages", data=data,
                                     method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.status == 200


def one(spans, name, parent=None):
    matching = [s for s in spans if s["name"] == name and parent in (None, s["parent"])]
    assert len(matching) == 1, f"{name} under {parent}: {[(s['name'], s['parent']) for s in spans]}"
    return matching[0]


def no_canary(receiver):
    """No eight bytes of the secret or the token in any body, in any case."""
    for path, content_type, body in receiver.bodies:
        assert path == "/v1/traces", path
        assert content_type == "application/x-protobuf", content_type
        body = body.lower()
        for name, value in {"secret": CANARY, "token": TOKEN}.items():
            for start in range(0, len(value) - 7):
                piece = value[start:start + 8].lower().encode()
                assert piece not in body, f"eight bytes of the {name} were exported: {piece!r}"


@pytest.mark.parametrize("content", [False, True])
def test_a_turn_its_worker_and_their_tool_calls_are_one_trace_under_the_client_s_span(
        receiver, monkeypatch, content):
    server = traced_server(receiver, monkeypatch, content)
    try:
        say(server, "Please count the files.", f"00-{TRACE_ID}-{CLIENT_SPAN}-01")
    finally:
        # The last batch is sent as the server stops.
        server.stop()
    spans = receiver.spans()
    assert spans, "no span was received"
    no_canary(receiver)
    for span in spans:
        assert span["service"] == "capstan", span
        assert span["schema"] == SCHEMA, span
        assert span["scope"] == "capstan", span

    # Every span of the message's work is in the client's trace.
    assert {s["trace"] for s in spans} == {TRACE_ID}, spans
    channel = one(spans, "invoke_agent channel", CLIENT_SPAN)
    assert channel["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert channel["attributes"]["gen_ai.agent.id"] == "channel:main"
    assert channel["attributes"]["gen_ai.conversation.id"] == "channel:main"

    # The channel's model requests: children of its turn, with the model's name.
    chats = [s for s in spans if s["parent"] == channel["id"] and s["name"].startswith("chat")]
    assert chats, [s["name"] for s in spans]
    for chat in chats:
        assert chat["attributes"]["gen_ai.operation.name"] == "chat"
        assert chat["attributes"]["gen_ai.provider.name"] == "scripted"
        assert chat["name"] == "chat " + chat["attributes"]["gen_ai.request.model"]

    spawn = one(spans, "execute_tool spawn_worker", channel["id"])
    assert spawn["attributes"]["gen_ai.tool.type"] == "function"

    # The worker's turn is a child of the call that spawned it; its tool call, of its turn;
    # and the channel's turn that takes its report in, of the call too.
    worker = one(spans, "invoke_agent worker", spawn["id"])
    assert worker["attributes"]["gen_ai.conversation.id"] == "channel:main"
    assert worker["attributes"]["gen_ai.agent.id"].startswith("worker:")
    one(spans, "invoke_agent channel", spawn["id"])
    listing = one(spans, "execute_tool file_list", worker["id"])
    figures = listing["attributes"]
    assert figures["gen_ai.tool.type"] == "extension"
    assert figures["capstan.receipt.bytes_in"] == len('{"path":"."}')
    assert figures["capstan.receipt.bytes_out"] > 0
    assert figures["capstan.receipt.peak_memory_bytes"] > 0
    # A figure of zero is left out.
    assert "capstan.receipt.requests" not in figures

    # Arguments and results only when the config opts in, and then redacted.
    if content:
        assert figures["gen_ai.tool.call.arguments"] == '{"path":"."}'
        assert "notes.txt" in figures["gen_ai.tool.call.result"]
        assert "[redacted secret CANARY]" in figures["gen_ai.tool.call.result"]
    else:
        for span in spans:
            assert not any(k in span["attributes"] for k in
                           ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result")), span


def test_a_trace_the_client_does_not_record_is_not_sent(receiver, monkeypatch):
    server = traced_server(receiver, monkeypatch, False)
    try:
        say(server, "Please count the files.", f"00-{TRACE_ID}-{CLIENT_SPAN}-00")
        say(server, "Please count the files.")
    finally:
        server.stop()
    spans = receiver.spans()
    # Only the second message's work, in a trace of its own.
    traces = {s["trace"] for s in spans}
    assert TRACE_ID not in traces and len(traces) == 1, traces
    one(spans, "invoke_agent channel", "")
    assert all(s["flags"] & 0x1 for s in spans), spans


def test_the_standard_sampler_variable_is_followed(receiver, monkeypatch):
    # Parent-based, off for traces of its own: only the client's recorded trace is sent.
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_always_off")
    server = traced_server(receiver, monkeypatch, False)
    try:
        say(server, "Please count the files.")
        say(server, "Please count the files.", f"00-{TRACE_ID}-{CLIENT_SPAN}-01")
    finally:
        server.stop()
    spans = receiver.spans()
    assert spans and {s["trace"] for s in spans} == {TRACE_ID}, spans


def test_without_an_endpoint_nothing_is_sent(receiver, monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    server = Server(tokens=False)
    try:
        data = b'{"text": "hello", "wait": true}'
        request = urllib.request.Request(f"{server.url}/v1/channels/main/messages", data=data,
                                         method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
    finally:
        server.stop()
    assert receiver.bodies == []


def test_the_standard_variable_turns_traces_on(receiver, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    server = Server(tokens=False)
    try:
        data = b'{"text": "hello", "wait": true}'
        request = urllib.request.Request(
            f"{server.url}/v1/channels/main/messages", data=data, method="POST",
            headers={"Content-Type": "application/json",
                     "traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})
        with urllib.request.urlopen(request, timeout=120) as response:
            assert response.status == 200
    finally:
        server.stop()
    channel = one(receiver.spans(), "invoke_agent channel", CLIENT_SPAN)
    assert channel["trace"] == TRACE_ID


class Cluster:
    """A PostgreSQL server of Debian's package on a socket in a fresh directory, run as the
    postgres user when the tests run as root, as the Rust tests' own cluster is."""

    def __init__(self):
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
        if not found:
            pytest.fail("PostgreSQL's server is missing: scripts/test installs it")
        self.bin = os.path.dirname(found[-1])
        self.dir = tempfile.mkdtemp(prefix="capstan-pg-", dir="/tmp")
        self.root = os.getuid() == 0
        if self.root:
            shutil.chown(self.dir, "postgres", "postgres")
        self.data = os.path.join(self.dir, "data")
        self.run("initdb", "-D", self.data, "-U", "capstan", "--auth=trust",
                 "--encoding=UTF8", "--locale=C.UTF-8")
        self.run("pg_ctl", "-D", self.data, "-o", f"-c listen_addresses='' -k {self.dir}",
                 "-l", os.path.join(self.dir, "server.log"), "-w", "start")
        self.url = "postgres://capstan@" + self.dir.replace("/", "%2F") + "/postgres"

    def run(self, program, *args):
        command = [f"{self.bin}/{program}", *args]
        if self.root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, cwd="/", capture_output=True, text=True)
        assert done.returncode == 0, f"{program}: {done.stdout}{done.stderr}"

    def stop(self):
        self.run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def test_a_message_forwarded_to_the_host_that_answers_keeps_the_client_s_trace(receiver, monkeypatch):
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    cluster = Cluster()
    extra = f"""
[store]
kind = "postgres"
url = "{cluster.url}"

[telemetry]
otlp_endpoint = "{receiver.url}"
content = false
"""
    hosts = []
    try:
        first = Server(tokens=True, extra=extra)
        hosts.append(first)
        second = Server(tokens=True, extra=extra)
        hosts.append(second)
        # The first host opens the conversation and answers it from then on.
        say(first, "hello")
        say(second, "hello", f"00-{TRACE_ID}-{CLIENT_SPAN}-01")
    finally:
        pids = [host.process.pid for host in hosts]
        for host in hosts:
            host.stop()
        cluster.stop()
    traced = [s for s in receiver.spans() if s["trace"] == TRACE_ID]
    # Answered by the first host, as a child of the span the client gave the second.
    channel = one(traced, "invoke_agent channel", CLIENT_SPAN)
    assert channel["pid"] == pids[0], (channel, pids)


FETCH = """
[[step]]
process = "channel"
when = "fetch the status"
repeat = true
tool_calls = [
  { name = "spawn_worker", arguments = { task = "Fetch the status page." } },
  { name = "skip" },
]

[[step]]
process = "worker"
when = "fetch the status page"
repeat = true
tool_calls = [
  { name = "http_request", arguments = { method = "GET", url = "http://CANARY.invalid/" } },
  { name = "http_request", arguments = { method = "GET", url = "POST_URL" } },
]

[[step]]
process = "worker"
when = "status ok"
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "fetched" } }]

[[step]]
process = "channel"
when = "fetched"
repeat = true
reply = "Fetched."
"""


def test_a_tool_s_request_is_a_client_span_under_its_call_and_the_receipt_counts_it(
        receiver, monkeypatch):
    counted = []

    class Status(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            counted.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "9")
            self.end_headers()
            self.wfile.write(b"status ok")

        def log_message(self, *args):
            pass

    status = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Status)
    port = status.server_address[1]
    threading.Thread(target=status.serve_forever, daemon=True).start()
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    extra = f"""
[telemetry]
otlp_endpoint = "{receiver.url}"
content = false

[profiles.worker]
tools = ["http_request", "set_status"]
net = ["http://127.0.0.1:{port}"]

[secrets.CANARY]
env = "CANARY_SECRET"
hosts = ["api.example.com"]
header = "Authorization: Bearer {{CANARY}}"
"""
    monkeypatch.setenv("CANARY_SECRET", CANARY)
    # The model knows the secret and spells it in a host name, which is lowercased.
    script = FETCH.replace("CANARY", CANARY)
    server = Server(tokens=True, post_url=f"http://127.0.0.1:{port}/status", extra=extra,
                    script=script)
    try:
        say(server, "Please fetch the status.", f"00-{TRACE_ID}-{CLIENT_SPAN}-01")
    finally:
        server.stop()
        status.shutdown()
    spans = receiver.spans()
    no_canary(receiver)
    assert counted == ["/status"], counted
    calls = [s for s in spans if s["name"] == "execute_tool http_request"]
    assert len(calls) == 2, calls
    refused, call = sorted(calls, key=lambda s: s["attributes"].get("capstan.receipt.requests", 0))
    # The request to the host named with the secret was refused (no rule allows it), its
    # host redacted in the span.
    assert refused["attributes"]["capstan.receipt.requests_refused"] == 1
    guessed = one(spans, "GET", refused["id"])
    assert guessed["attributes"]["capstan.net.decision"] == "refused"
    assert guessed["attributes"]["server.address"] == "[redacted secret CANARY].invalid"
    assert guessed["status"] == 2  # error
    # As many requests on the receipt as the server saw.
    assert call["trace"] == TRACE_ID
    assert call["attributes"]["capstan.receipt.requests"] == len(counted)
    assert call["attributes"]["capstan.receipt.request_bytes_received"] == len(b"status ok")
    request = one(spans, "GET", call["id"])
    assert request["kind"] == 3, request  # client
    assert request["attributes"] == {
        "http.request.method": "GET",
        "server.address": "127.0.0.1",
        "server.port": port,
        "http.response.status_code": 200,
        "capstan.net.decision": "allowed",
    }, request


def test_an_mcp_client_s_traceparent_in_meta_is_the_parent_of_the_served_call(receiver, tmp_path):

    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "notes.txt").write_text("a note\n")
    (tmp_path / "capstan.toml").write_text(f"""
[agent]
plugins_dir = "{PLUGINS}"
workspace = "workspace"

[telemetry]
otlp_endpoint = "{receiver.url}"
content = false

[profiles.worker]
tools = ["file_list"]
capabilities = ["fs.read"]
""")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "CAPSTAN_CACHE_DIR": str(ROOT / "target" / "test-component-cache"),
        "CAPSTAN_STATE_DIR": str(tmp_path / "state"),
    }
    params = StdioServerParameters(
        command=str(BINARY), args=["mcp", "--profile", "worker", "--config", "capstan.toml"],
        env=env, cwd=str(tmp_path))

    async def call():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                meta = {"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"}
                result = await client.call_tool("file_list", {"path": "."}, meta=meta)
                assert not result.is_error, result

    asyncio.run(call())
    # The server sends its last batch as it exits, once its input is closed.
    assert receiver.arrived.wait(timeout=120), "no span arrived"
    spans = receiver.spans()
    served = one(spans, "tools/call file_list", CLIENT_SPAN)
    assert served["trace"] == TRACE_ID and served["kind"] == 2, served  # server
    assert served["attributes"]["mcp.method.name"] == "tools/call"
    assert served["attributes"]["gen_ai.tool.name"] == "file_list"
    executed = one(spans, "execute_tool file_list", served["id"])
    assert executed["attributes"]["capstan.receipt.bytes_out"] > 0


def test_a_receiver_that_refuses_the_spans_is_logged_once_and_the_host_goes_on(monkeypatch):
    taken = []

    class Refusing(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            taken.append(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    refusing = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=refusing.serve_forever, daemon=True).start()
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    url = f"http://127.0.0.1:{refusing.server_address[1]}"
    server = Server(tokens=False, extra=f'[telemetry]\notlp_endpoint = "{url}"\ncontent = false\n')
    try:
        for _ in range(2):
            data = b'{"text": "hello", "wait": true}'
            request = urllib.request.Request(f"{server.url}/v1/channels/main/messages", data=data,
                                             method="POST",
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=120) as response:
                assert response.status == 200
    finally:
        process = server.process
        server.stop()
        refusing.shutdown()
    assert taken, "the receiver was sent the spans"
    logged = process.stderr.read()
    assert logged.count("spans could not be sent to the OTLP receiver") == 1, logged
    assert "[telemetry] otlp_endpoint" in logged, logged
