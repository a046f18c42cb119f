"""The official MCP Python SDK (`mcp` from PyPI) as a client of Capstan's tools: `capstan mcp`
over stdio and `capstan serve`'s `/mcp` over streamable HTTP. Each test runs on both.

The plugins are the first-party ones and the probe fixture (`echo`, `spin`, which loops until
stopped, `panic`, which traps, and `flood`, which returns as many bytes as asked), granted to
the worker profile by the config below."""

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import urllib.request

import pytest
from mcp import Client, ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client
from mcp.shared.exceptions import MCPError

from conftest import BINARY, PLUGINS, ROOT

FIXTURES = ROOT / "target" / "fixtures"
CHAT_TOKEN = "mcp-chat-token-0123456789abcdef"
READ_TOKEN = "mcp-read-token-0123456789abcdef"
CLIENT = "capstan-interop"

CONFIG = """
[agent]
plugins_dir = "plugins"
workspace = "workspace"

[limits]
# Far past any wait of these tests: a call that ends sooner was stopped by its client.
tool_deadline_secs = 300

[profiles.worker]
tools = ["file_read", "file_list", "file_write", "task_create", "task_list", "echo", "spin", "panic", "flood"]
capabilities = ["fs.read", "fs.write", "tasks.read", "tasks.write-own"]

[serve.tokens.chat]
env = "CAPSTAN_MCP_CHAT"
scope = "chat"

[serve.tokens.reader]
env = "CAPSTAN_MCP_READ"
scope = "read"
"""


class Deployment:
    """A directory with a config, a workspace holding notes.txt, and the plugins."""

    def __init__(self):
        self.dir = tempfile.TemporaryDirectory(prefix="capstan-mcp-")
        self.base = pathlib.Path(self.dir.name)
        (self.base / "workspace").mkdir()
        (self.base / "workspace" / "notes.txt").write_text("a note\n")
        plugins = self.base / "plugins"
        plugins.mkdir()
        for plugin in [*PLUGINS.glob("*.wasm"), FIXTURES / "probe.wasm"]:
            shutil.copy(plugin, plugins / plugin.name)
        (self.base / "capstan.toml").write_text(CONFIG)
        assert BINARY.is_file(), f"{BINARY} is missing: run `cargo build` (or scripts/test) first"
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.base),
            "CAPSTAN_CACHE_DIR": str(ROOT / "target" / "test-component-cache"),
            "CAPSTAN_STATE_DIR": str(self.base / "state"),
            "CAPSTAN_MCP_CHAT": CHAT_TOKEN,
            "CAPSTAN_MCP_READ": READ_TOKEN,
        }
        self.server = None

    def serve(self):
        """Starts `capstan serve` on a port the system picks; returns its URL."""
        self.stderr = open(self.base / "serve.err", "w")
        self.server = subprocess.Popen(
            [str(BINARY), "serve", "--config", str(self.base / "capstan.toml"), "--addr", "127.0.0.1:0"],
            cwd=self.base, env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=self.stderr, text=True,
        )
        first = self.server.stdout.readline()
        prefix = "capstan serve: listening on "
        if not first.startswith(prefix):
            self.server.kill()
            raise RuntimeError(f"capstan serve did not start: {first!r} {self.errors()}")
        return first[len(prefix):].strip().rstrip("/")

    def errors(self):
        return (self.base / "serve.err").read_text() if (self.base / "serve.err").exists() else ""

    def audit(self):
        """Every audit row, oldest first, from the real SQLite file."""
        with contextlib.closing(sqlite3.connect(self.base / ".capstan" / "capstan.db")) as db:
            rows = db.execute("SELECT process, tool, outcome, detail FROM audit ORDER BY id").fetchall()
        return [dict(zip(("process", "tool", "outcome", "detail"), row)) for row in rows]

    def close(self):
        if self.server is not None:
            self.server.send_signal(signal.SIGTERM)
            code = self.server.wait(timeout=60)
            self.server.stdout.close()
            self.stderr.close()
            assert code == 0, f"capstan serve exited {code}: {self.errors()}"
        self.dir.cleanup()


@pytest.fixture(scope="module")
def deployment():
    deployed = Deployment()
    yield deployed
    deployed.close()


@pytest.fixture(scope="module")
def url(deployment):
    return deployment.serve()


def stdio_server(deployment, profile):
    """`capstan mcp` on `profile`'s tools, as a client starts it."""
    return StdioServerParameters(
        command=str(BINARY),
        args=["mcp", "--profile", profile, "--config", str(deployment.base / "capstan.toml")],
        env=deployment.env,
        cwd=str(deployment.base),
    )


@contextlib.asynccontextmanager
async def session(deployment, transport, profile="worker", token=CHAT_TOKEN):
    """An initialized MCP client session on `profile`'s tools."""
    info = types.Implementation(name=CLIENT, version="1.0")
    if transport == "stdio":
        streams = stdio_client(stdio_server(deployment, profile))
    else:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        streams = _http_streams(http, f"{deployment.url_for_tests}/mcp/{profile}")
    async with streams as (read, write, *_):
        async with ClientSession(read, write, client_info=info) as client:
            await client.initialize()
            yield client


@contextlib.asynccontextmanager
async def stateless(deployment, transport, profile="worker", token=CHAT_TOKEN):
    """A client of MCP's stateless revision (2026-07-28): no handshake; each request carries
    its protocol version and the client's name itself."""
    info = types.Implementation(name=CLIENT, version="1.0")
    if transport == "stdio":
        server = stdio_server(deployment, profile)
        async with Client(server, mode=STATELESS, client_info=info) as client:
            yield client
    else:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
        async with http:
            url = f"{deployment.url_for_tests}/mcp/{profile}"
            transport = streamable_http_client(url, http_client=http)
            async with Client(transport, mode=STATELESS, client_info=info) as client:
                yield client


STATELESS = "2026-07-28"


@contextlib.asynccontextmanager
async def _http_streams(http, url):
    async with http:
        async with streamable_http_client(url, http_client=http) as streams:
            yield streams


TRANSPORTS = ["stdio", "http"]


@pytest.fixture(params=TRANSPORTS)
def transport(request, deployment):
    if request.param == "http":
        deployment.url_for_tests = request.getfixturevalue("url")
    return request.param


def caller(transport):
    return f"mcp:{CLIENT}" if transport == "stdio" else f"mcp:{CLIENT}@chat"


def text(result):
    return "".join(block.text for block in result.content if block.type == "text")


def rows_of(deployment, transport, tool):
    return [row for row in deployment.audit() if row["process"] == caller(transport) and row["tool"] == tool]


def test_the_profile_s_tools_are_listed_with_their_schemas(deployment, transport):
    async def run():
        async with session(deployment, transport) as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            async with session(deployment, transport, profile="branch") as branch:
                branch_tools = {tool.name for tool in (await branch.list_tools()).tools}
        return tools, branch_tools

    tools, branch_tools = asyncio.run(run())
    assert {"echo", "spin", "panic", "file_read", "file_write"} <= set(tools)
    # Not offered: host tools need a running agent; web tools need a network grant.
    assert not {"spawn_worker", "set_status", "web_fetch", "http_request"} & set(tools)
    assert tools["echo"].input_schema["properties"]["text"]["type"] == "string"
    assert "text" in tools["echo"].input_schema["required"]
    assert "file_read" in branch_tools and "file_write" not in branch_tools


def test_an_allowed_call_runs_sandboxed_with_progress_and_is_audited(deployment, transport):
    progress = []

    async def run():
        async with session(deployment, transport) as client:
            async def on_progress(done, total, message):
                progress.append((done, total, message))

            read = await client.call_tool("file_read", {"path": "notes.txt"}, progress_callback=on_progress)
            escape = await client.call_tool("file_read", {"path": "../capstan.toml"})
            return read, escape

    read, escape = asyncio.run(run())
    assert not read.is_error and text(read) == "a note\n"
    assert progress and progress[-1][0] == progress[-1][1] == 1.0
    # The sandbox holds: the config beside the workspace is not read.
    assert escape.is_error and "leaves the workspace" in text(escape)
    assert "plugins_dir" not in text(escape)
    outcomes = [row["outcome"] for row in rows_of(deployment, transport, "file_read")]
    assert "ok" in outcomes and "denied" in outcomes


def test_the_stateless_revision_lists_and_calls_and_is_audited_by_the_client_s_name(
    deployment, transport
):
    async def run():
        async with stateless(deployment, transport) as client:
            tools = {tool.name for tool in (await client.list_tools()).tools}
            echoed = await client.call_tool("echo", {"text": "no handshake"})
            return tools, echoed

    tools, echoed = asyncio.run(run())
    assert {"echo", "file_read"} <= tools
    assert not echoed.is_error and text(echoed) == "no handshake"
    # The name comes from each request, not from a handshake there was not.
    last = deployment.audit()[-1]
    assert (last["process"], last["tool"], last["outcome"]) == (caller(transport), "echo", "ok")


def test_a_denied_call_is_a_tool_error_with_the_reason(deployment, transport):
    async def run():
        async with session(deployment, transport, profile="branch") as branch:
            denied = await branch.call_tool("file_write", {"path": "x.txt", "content": "no"})
            # The session goes on after the refusal.
            listed = await branch.call_tool("file_list", {"path": "."})
            return denied, listed

    denied, listed = asyncio.run(run())
    assert denied.is_error
    assert "not offered to a branch process" in text(denied)
    assert not listed.is_error and "notes.txt" in text(listed)
    assert not (deployment.base / "workspace" / "x.txt").exists()
    branch_caller = caller(transport)
    denials = [r for r in deployment.audit() if r["process"] == branch_caller and r["tool"] == "file_write"]
    assert any(r["outcome"] == "denied" for r in denials)


def test_a_trap_is_a_tool_error_and_the_server_goes_on(deployment, transport):
    async def run():
        async with session(deployment, transport) as client:
            trapped = await client.call_tool("panic", {})
            after = await client.call_tool("echo", {"text": "still here"})
            return trapped, after

    trapped, after = asyncio.run(run())
    assert trapped.is_error and "panicked on purpose" in text(trapped)
    assert not after.is_error and text(after) == "still here"
    assert any(r["outcome"] == "failed" for r in rows_of(deployment, transport, "panic"))


def test_a_slow_call_the_client_cancels_is_stopped_and_audited(deployment, transport):
    before = len(rows_of(deployment, transport, "spin"))

    async def run():
        async with session(deployment, transport) as client:
            with pytest.raises(MCPError):
                # The client gives up after 1 s and sends notifications/cancelled.
                await client.call_tool("spin", {}, read_timeout_seconds=1)
            after = await client.call_tool("echo", {"text": "after the cancel"})
            # The cancelled call's row is written when its sandbox is dropped; wait for
            # that event, far short of the 300 s deadline that would also end it.
            for _ in range(600):
                rows = rows_of(deployment, transport, "spin")
                if len(rows) > before:
                    return after, rows[-1]
                await asyncio.sleep(0.1)
            raise AssertionError("the cancelled call was never audited")

    after, row = asyncio.run(run())
    assert not after.is_error and text(after) == "after the cancel"
    assert row["outcome"] == "failed"
    assert "cancelled by its caller" in row["detail"], row


def test_fifty_concurrent_calls_each_get_their_own_answer(deployment, transport):
    before = len(rows_of(deployment, transport, "echo"))

    async def run():
        async with session(deployment, transport) as client:
            calls = [client.call_tool("echo", {"text": f"call {n}"}) for n in range(50)]
            return await asyncio.gather(*calls)

    results = asyncio.run(run())
    assert [text(r) for r in results] == [f"call {n}" for n in range(50)]
    assert not any(r.is_error for r in results)
    rows = rows_of(deployment, transport, "echo")[before:]
    assert len(rows) == 50 and all(r["outcome"] == "ok" for r in rows)


def refusal(run):
    """The MCPError `run` raised, out of the task groups the SDK wraps it in."""
    with pytest.raises(BaseException) as raised:
        asyncio.run(run)
    found = [raised.value]
    while found and not isinstance(found[0], MCPError):
        error = found.pop(0)
        found.extend(getattr(error, "exceptions", ()))
    assert found, f"no MCPError in {raised.value!r}"
    return str(found[0])


def test_a_result_past_one_message_is_cut_to_fit_the_sdk_s_default_limit(deployment, transport):
    # 3 MB of output: the host keeps 1 MiB of it (limits.tool_output_kib), which with the
    # message around it is past the 1 MiB event the SDK reads by default; the result is cut
    # again to fit (that note replacing the first), and says so, naming the key.
    async def run():
        async with session(deployment, transport) as client:
            return await client.call_tool("flood", {"bytes": 3_000_000})

    result = asyncio.run(run())
    assert not result.is_error
    body = text(result)
    assert body.startswith("x" * 1000)
    assert body.endswith("(limits.mcp_message_kib); ask for less, or a page of it at a time]"), body[-300:]
    assert len(json.dumps(body)) < 1024 * 1024


def test_http_needs_a_token_with_the_chat_scope(deployment, url):
    deployment.url_for_tests = url
    wrong = refusal(_list(deployment, "worker", token="wrong-token-0123456789abcdef"))
    assert "not one of this server's tokens" in wrong
    assert 'scope "read"' in refusal(_list(deployment, "worker", token=READ_TOKEN))
    # The cortex's tools need the admin scope.
    assert 'needs "admin"' in refusal(_list(deployment, "cortex"))
    # The API's audit shows the calls made over HTTP, naming the client and the token.
    request = urllib.request.Request(
        f"{url}/v1/audit?limit=200", headers={"Authorization": f"Bearer {READ_TOKEN}"}
    )
    with urllib.request.urlopen(request) as response:
        rows = json.load(response)["entries"]
    assert any(row["process"] == f"mcp:{CLIENT}@chat" for row in rows)


async def _list(deployment, profile, token=CHAT_TOKEN):
    async with session(deployment, "http", profile=profile, token=token) as client:
        return await client.list_tools()


def raw_post(url, body, headers, token=CHAT_TOKEN):
    """One POST to `/mcp/worker` as a client of the stateless revision sends it, with
    `headers` laid over the ones it requires; the HTTP status and the JSON-RPC answer."""
    sent = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": STATELESS,
        "Mcp-Method": body["method"],
        **({"Mcp-Name": body["params"]["name"]} if "name" in body.get("params", {}) else {}),
    }
    for name, value in headers.items():
        if value is None:
            sent.pop(name, None)
        else:
            sent[name] = value
    request = urllib.request.Request(f"{url}/mcp/worker", data=json.dumps(body).encode(), headers=sent)
    try:
        with urllib.request.urlopen(request) as response:
            status, text = response.status, response.read().decode()
    except urllib.error.HTTPError as refused:
        status, text = refused.code, refused.read().decode()
    # An answer is JSON, or one SSE event carrying it.
    data = [line[len("data:"):] for line in text.splitlines() if line.startswith("data:")]
    return status, json.loads(data[-1] if data else text)


def envelope(version=STATELESS):
    return {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientInfo": {"name": "raw-client", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }


def test_the_stateless_revision_s_required_headers_are_checked_before_any_tool_runs(deployment, url):
    """2026-07-28 requires `Mcp-Method` and `Mcp-Name` to say what the body says, so a proxy
    that routes or authorizes on headers cannot be told one call while the server runs
    another; a header that disagrees is refused (-32020) before anything runs. So is an
    unknown revision (-32022), and a retry answering input this server never asked for."""
    deployment.url_for_tests = url
    marker = deployment.base / "workspace" / "smuggled.txt"
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "file_write", "arguments": {"path": "smuggled.txt", "content": "x"}, "_meta": envelope()}}
    before = len(deployment.audit())

    status, answer = raw_post(url, call, {"Mcp-Name": "file_read"})
    assert status == 400 and answer["error"]["code"] == -32020, (status, answer)
    assert "Mcp-Name" in answer["error"]["message"], answer
    status, answer = raw_post(url, call, {"Mcp-Method": "tools/list"})
    assert status == 400 and answer["error"]["code"] == -32020, (status, answer)
    status, answer = raw_post(url, call, {"Mcp-Method": None})
    assert status == 400 and answer["error"]["code"] == -32020, (status, answer)
    status, answer = raw_post(url, call, {"MCP-Protocol-Version": "2025-11-25"})
    assert status == 400 and answer["error"]["code"] == -32020, (status, answer)
    assert not marker.exists(), "a refused request ran its tool"
    assert len(deployment.audit()) == before, "nothing ran, so nothing was audited"

    # A revision the server does not speak: refused, naming the ones it does.
    unknown = {**call, "params": {**call["params"], "_meta": envelope("2099-01-01")}}
    status, answer = raw_post(url, unknown, {"MCP-Protocol-Version": "2099-01-01"})
    assert answer["error"]["code"] == -32022, (status, answer)
    assert "2026-07-28" in json.dumps(answer["error"]), answer

    # This server never asks for input, so a retry answering a request it never sent is
    # refused rather than run.
    retry = {**call, "params": {**call["params"], "requestState": "forged",
                                "inputResponses": {"approval": {"action": "accept"}}}}
    status, answer = raw_post(url, retry, {})
    assert answer["error"]["code"] == -32602 and "asked for no input" in answer["error"]["message"], answer
    assert not marker.exists(), "a refused retry ran its tool"

    # The same request with its headers right runs, and is audited by the client's name.
    status, answer = raw_post(url, call, {})
    assert status == 200 and "result" in answer, (status, answer)
    assert marker.read_text() == "x"
    assert any(row["process"] == "mcp:raw-client@chat" and row["tool"] == "file_write"
               for row in deployment.audit()), deployment.audit()[-3:]


def test_an_auth_refusal_at_the_stateless_revision_is_a_message_the_sdk_shows(deployment, url):
    deployment.url_for_tests = url

    async def listed(token):
        async with stateless(deployment, "http", token=token) as client:
            return await client.list_tools()

    assert "not one of this server's tokens" in refusal(listed("wrong-token-0123456789abcdef"))
    assert 'scope "read"' in refusal(listed(READ_TOKEN))
    status, answer = raw_post(url, {"jsonrpc": "2.0", "id": 1, "method": "tools/list",
                                    "params": {"_meta": envelope()}}, {}, token="")
    assert status == 401 and "error" in answer, (status, answer)


def test_with_store_memory_the_calls_touch_no_stored_data(deployment):
    """`capstan mcp --store memory`: a client may try the task tools on a throwaway store;
    the configured one gains no task and no audit row."""
    database = deployment.base / ".capstan" / "capstan.db"

    def stored():
        if not database.exists():
            return 0, 0
        with contextlib.closing(sqlite3.connect(database)) as db:
            tasks = db.execute("SELECT count(*) FROM tasks WHERE title = 'a throwaway task'").fetchone()[0]
            audit = db.execute("SELECT count(*) FROM audit").fetchone()[0]
        return tasks, audit

    before = stored()
    params = stdio_server(deployment, "worker")
    params.args = [*params.args, "--store", "memory"]

    async def run():
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as client:
                await client.initialize()
                first = await client.call_tool("task_create", {"title": "a throwaway task"})
                listed = await client.call_tool("task_list", {})
                return first, listed

    first, listed = asyncio.run(run())
    assert not first.is_error and not listed.is_error, (first, listed)
    assert "a throwaway task" in text(listed)
    assert stored() == before
