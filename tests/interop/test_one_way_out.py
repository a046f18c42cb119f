"""One way out: a canary secret, a canary serve token and a canary provider key, planted in
the model's streamed reply, a tool's result, a tool's error, an MCP server's answer and a
model's failure, are never found in any byte that leaves Capstan: every route of `capstan
serve` (through a recording proxy, so every byte the server sends is searched), the official
OpenAI SDK streaming and not, the official MCP SDK over HTTP and over stdio, the event
stream, the CLI and the logs, and what rests on disk (the store's files, a recording). Ten
thousand responses are collected in all.

The model is a small OpenAI-compatible server of the test's own that streams its answer a
few characters at a time, so a canary is split across deltas, and quotes the key it was
called with."""

import asyncio
import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from openai import OpenAI

from conftest import BINARY, PLUGINS, ROOT

SERVERS = pathlib.Path(__file__).parent / "servers"

# Made of pieces no other output holds, so a window of any eight bytes of one is a leak.
SECRET = "cnrySecQ7xZ9pL2vK4mW8"
TOKEN = "cnryTokR3nB6tY1uJ5hD0"
KEY = "cnryKeyF8gH2jK4lZ6xC9"
CANARIES = {"secret": SECRET, "token": TOKEN, "provider key": KEY}
RESPONSES = 10_000

CONFIG = """
[agent]
plugins_dir = "plugins"
workspace = "workspace"

[provider]
kind = "openai"
base_url = "{model}/v1"
api_key_env = "CANARY_PROVIDER_KEY"
model = "fake"

[secrets.CANARY]
env = "CANARY_SECRET"
hosts = ["api.example.com"]
header = "Authorization: Bearer {{CANARY}}"

[serve]
# Ten thousand answers in a minute or two, from one token.
requests_per_minute = 1000000

[serve.tokens.ops]
env = "CANARY_TOKEN"
scope = "admin"

[mcp.notes]
command = [{python}, {notes}]

[profiles.worker]
tools = ["file_read", "file_list", "notes.*"]
capabilities = ["fs.read"]
"""


def leaks(data: bytes) -> list:
    """Each canary found in `data`, whole or as any eight bytes of it, with where."""
    found = []
    for name, value in CANARIES.items():
        for start in range(len(value) - 7):
            window = value[start:start + 8].encode()
            at = data.find(window)
            if at >= 0:
                context = data[max(0, at - 80):at + 80].decode("utf-8", "replace")
                found.append(f"{name} ({window!r}) in …{context}…")
                break
    return found


class FakeModel:
    """An OpenAI-compatible chat server: its answer names the secret, the token and the
    key it was called with, streamed three characters a delta; a message holding "fail"
    gets a 500 whose body quotes the key."""

    def __init__(self):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                key = self.headers.get("authorization", "").removeprefix("Bearer ")
                last = body["messages"][-1].get("content") or ""
                if "fail" in str(last):
                    payload = json.dumps({"error": {"message": f"bad key {key}"}}).encode()
                    self.send_response(500)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                text = f"The secret is {SECRET}, the token {TOKEN}, my key {key}."
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("content-type", "text/event-stream")
                    self.end_headers()
                    for i in range(0, len(text), 3):
                        chunk = {"choices": [{"index": 0, "delta": {"content": text[i:i + 3]}}]}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    done = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
                    self.wfile.write(f"data: {json.dumps(done)}\n\ndata: [DONE]\n\n".encode())
                    return
                payload = json.dumps({
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": text}}],
                }).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        outer.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        outer.thread.start()

    def close(self):
        self.server.shutdown()


class RecordingProxy:
    """A TCP proxy on loopback in front of `capstan serve`: clients talk to it, and every
    byte the server sends back is kept, to be searched."""

    def __init__(self, upstream_port: int):
        self.upstream = ("127.0.0.1", upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.received = bytearray()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, source, sink, record):
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if record:
                    with self.lock:
                        self.received += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self):
        self.listener.close()


class Deployment:
    """A directory with the config, a workspace holding the canaries, and the plugins."""

    def __init__(self, model_url: str):
        self.dir = tempfile.TemporaryDirectory(prefix="capstan-outbound-")
        self.base = pathlib.Path(self.dir.name)
        (self.base / "workspace").mkdir()
        (self.base / "workspace" / "canary.txt").write_text(f"secret={SECRET}\ntoken={TOKEN}\nkey={KEY}\n")
        plugins = self.base / "plugins"
        plugins.mkdir()
        for plugin in PLUGINS.glob("*.wasm"):
            (plugins / plugin.name).write_bytes(plugin.read_bytes())
        q = json.dumps
        (self.base / "capstan.toml").write_text(CONFIG.format(
            model=model_url, python=q(sys.executable), notes=q(str(SERVERS / "notes.py"))))
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.base),
            "CAPSTAN_CACHE_DIR": str(ROOT / "target" / "test-component-cache"),
            "CAPSTAN_STATE_DIR": str(self.base / "state"),
            "CANARY_SECRET": SECRET,
            "CANARY_TOKEN": TOKEN,
            "CANARY_PROVIDER_KEY": KEY,
        }

    def command(self, *args, stdin=None):
        """Runs the CLI to its end; its stdout and stderr, as bytes."""
        done = subprocess.run(
            [str(BINARY), *args, "--config", str(self.base / "capstan.toml")],
            cwd=self.base, env=self.env, input=stdin, capture_output=True, timeout=300,
        )
        return done.returncode, done.stdout + done.stderr


def get(url: str, token: str = TOKEN):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def post(url: str, body: dict):
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST",
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def text_of(result):
    return "".join(block.text for block in result.content if block.type == "text")


async def mcp_calls(read, write):
    """The MCP calls that carry a canary back: a file's contents, an error naming a path,
    an MCP server's answer. Returns their texts."""
    info = types.Implementation(name="outbound", version="1.0")
    async with ClientSession(read, write, client_info=info) as client:
        await client.initialize()
        read_file = await client.call_tool("file_read", {"path": "canary.txt"})
        missing = await client.call_tool("file_read", {"path": f"{TOKEN}.txt"})
        answer = await client.call_tool("notes.search", {"query": SECRET})
        return [text_of(read_file), text_of(missing), text_of(answer)]


async def over_http(url):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {TOKEN}"})
    async with http:
        async with streamable_http_client(f"{url}/mcp/worker", http_client=http) as (read, write, *_):
            return await mcp_calls(read, write)


async def over_stdio(deployment, copy):
    """`capstan mcp` on stdio, its standard output copied to `copy` as it is read."""
    command = f'"{BINARY}" mcp --profile worker --config "{deployment.base / "capstan.toml"}" | tee "{copy}"'
    params = StdioServerParameters(command="/bin/sh", args=["-c", command], env=deployment.env,
                                   cwd=str(deployment.base))
    async with stdio_client(params) as (read, write):
        return await mcp_calls(read, write)


# Every route `capstan serve` has, as ROUTES in `host/tests/all/serve.rs` lists them from the
# source (`POST /hooks/{name}` is posted to below).
GETS = [
    "/v1/channels", "/v1/channels/main/history", "/v1/workers", "/v1/branches", "/v1/tasks",
    "/v1/policy", "/v1/audit", "/v1/audit/requests", "/v1/audit/costs?by=tool",
    "/v1/approvals?all=true", "/v1/approvals/1",
    "/v1/plugins", "/v1/tools", "/v1/models", "/metrics",
    "/v1/openapi.json", "/healthz", "/", "/app.js", "/style.css", f"/v1/{TOKEN}",
]


def test_no_canary_leaves_by_any_door():
    model = FakeModel()
    deployment = Deployment(model.url)
    serve_err = open(deployment.base / "serve.err", "wb")
    server = subprocess.Popen(
        [str(BINARY), "serve", "--config", str(deployment.base / "capstan.toml"), "--addr", "127.0.0.1:0"],
        cwd=deployment.base, env=deployment.env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=serve_err,
    )
    collected = []
    try:
        first = server.stdout.readline().decode()
        assert first.startswith("capstan serve: listening on "), first
        upstream = int(first.strip().rstrip("/").rsplit(":", 1)[1])
        proxy = RecordingProxy(upstream)
        url = f"http://127.0.0.1:{proxy.port}"
        responses = 0

        # The event stream, opened first so it carries every event that follows.
        events = urllib.request.urlopen(urllib.request.Request(
            f"{url}/v1/events", headers={"Authorization": f"Bearer {TOKEN}"}), timeout=120)

        # The OpenAI SDK, not streaming, streaming, and a model that fails quoting its key.
        client = OpenAI(base_url=f"{url}/v1", api_key=TOKEN, max_retries=0)
        whole = client.chat.completions.create(
            model="capstan", user="sdk", messages=[{"role": "user", "content": "hello"}])
        streamed = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in client.chat.completions.create(
                model="capstan", user="sdk", stream=True,
                messages=[{"role": "user", "content": "hello again"}])
            if chunk.choices)
        try:
            client.chat.completions.create(
                model="capstan", user="failing", messages=[{"role": "user", "content": "fail now"}])
        except Exception as err:  # the SDK's error carries the server's text
            collected.append(str(err).encode())
        responses += 3
        assert "[redacted secret CANARY]" in whole.choices[0].message.content, whole
        assert "[redacted secret token.ops]" in streamed, streamed
        assert "[redacted secret provider.api_key]" in streamed, streamed

        # The JSON API, then what the event stream carried of it all.
        status, body = post(f"{url}/v1/channels/main/messages", {"text": "hi", "wait": True})
        assert status == 200, body
        assert "[redacted secret CANARY]" in json.loads(body)["reply"], body
        responses += 1
        with events:
            seen = b""
            while seen.count(b"turn_finished") < 4:
                seen += events.read1(65536)
        responses += 1

        # MCP over HTTP, through the proxy, and over stdio.
        http_texts = asyncio.run(over_http(url))
        responses += 3
        copy = deployment.base / "mcp-stdio.out"
        stdio_texts = asyncio.run(over_stdio(deployment, copy))
        collected.append(copy.read_bytes())
        responses += 3
        for texts in (http_texts, stdio_texts):
            assert "[redacted secret CANARY]" in texts[0], texts
            assert "[redacted secret token.ops]" in texts[1], texts
            assert "[redacted secret CANARY]" in texts[2], texts

        # The CLI: a tool's result, a run of the agent, its errors.
        workspace = str(deployment.base / "workspace")
        code, out = deployment.command("tool", "call", "file_read", '{"path": "canary.txt"}',
                                       "--as", "worker", "--workspace", workspace)
        assert code == 0 and b"[redacted secret" in out, out
        collected.append(out)
        code, out = deployment.command("tool", "call", "file_read", json.dumps({"path": f"{TOKEN}.txt"}),
                                       "--as", "worker", "--workspace", workspace)
        assert code != 0 and b"[redacted secret token.ops]" in out, out
        collected.append(out)
        recording = deployment.base / "recorded.toml"
        code, out = deployment.command("run", "--channel", "cli", "--record", str(recording),
                                       "hello from the terminal")
        assert code == 0, out
        assert b"[redacted secret CANARY]" in recording.read_bytes()
        assert b"[redacted secret CANARY]" in out, out
        collected.append(out)
        responses += 3

        # Every route, then as many more answers as make ten thousand.
        for path in GETS:
            status, _ = get(f"{url}{path}")
            assert status in (200, 404), (path, status)
        responses += len(GETS)
        # A platform's event (POST /hooks/{name}) to a channel named by the token: refused,
        # quoting nothing.
        status, _ = post(f"{url}/hooks/{TOKEN}", {"type": "url_verification", "challenge": TOKEN})
        assert status == 401, status
        responses += 1

        def one(i):
            kind = i % 4
            if kind == 0:
                status, _ = post(f"{url}/v1/chat/completions", {
                    "model": "capstan", "user": f"load{i % 8}",
                    "messages": [{"role": "user", "content": f"hello {i}"}]})
            else:
                status, _ = get(f"{url}{GETS[(i * 7 + kind) % len(GETS)]}")
            return status

        with ThreadPoolExecutor(max_workers=8) as pool:
            statuses = list(pool.map(one, range(RESPONSES - responses)))
        assert all(s in (200, 404) for s in statuses), sorted(set(statuses))
        responses += len(statuses)
        assert responses >= RESPONSES
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=120)
        server.stdout.close()
        serve_err.close()
        model.close()
    collected.append(bytes(proxy.received))
    collected.append((deployment.base / "serve.err").read_bytes())
    # What rests on disk leaves too, read by whoever reads the files: the store (history,
    # the audit log, its write-ahead log) and the recording.
    collected.append((deployment.base / "recorded.toml").read_bytes())
    for path in sorted((deployment.base / ".capstan").rglob("*")):
        if path.is_file():
            collected.append(path.read_bytes())
    proxy.close()
    assert code == 0, (deployment.base / "serve.err").read_text()
    found = [leak for data in collected for leak in leaks(data)]
    assert not found, "\n".join(found[:10])
    deployment.dir.cleanup()
