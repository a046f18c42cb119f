"""Capstan as an MCP client of `servers/notes.py`, a small server written with the official
MCP Python SDK: `[mcp.notes]` starts it over stdio, `[mcp.remote]` reaches another copy of
it over streamable HTTP on loopback, with a secret the host injects. The tools are
`notes.*` and `remote.*`, granted to the worker only; the tests call them through the real
`capstan` binary (`tool call --as`, `policy`) and through `capstan mcp`, one host process
that outlives the servers' crashes."""

import asyncio
import contextlib
import os
import pathlib
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time

import pytest
from mcp import ClientSession, types
from mcp.client.stdio import StdioServerParameters, stdio_client

from conftest import BINARY, PLUGINS, ROOT

SERVER = pathlib.Path(__file__).resolve().parent / "servers" / "notes.py"
DEADLINE_SECS = 8

TOOLS = {"search", "environment", "authorization", "process", "crash", "hang"}
# The key the host sends the HTTP server; the server checks it, nothing else may hold it.
KEY = "notes-key-0123456789abcdef"


# A worker and a branch, each asked to search the notes: the worker is granted the
# server's tools, the branch is not.
SCRIPT = """
[[step]]
process = "channel"
when = "ask a worker"
repeat = true
tool_calls = [
  { name = "spawn_worker", arguments = { task = "Search the notes for rust." } },
  { name = "skip" },
]

[[step]]
process = "worker"
when = "search the notes for rust"
repeat = true
tool_calls = [{ name = "remote.search", arguments = { query = "rust" } }]

[[step]]
process = "worker"
when = "found 1 note about rust"
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "the notes hold one on rust" } }]

[[step]]
process = "channel"
when = "the notes hold one on rust"
repeat = true
reply = "The worker found one note on rust."

[[step]]
process = "channel"
when = "ask a branch"
repeat = true
tool_calls = [
  { name = "branch", arguments = { question = "Search the notes for wasm." } },
  { name = "skip" },
]

[[step]]
process = "branch"
when = "search the notes for wasm"
repeat = true
tool_calls = [{ name = "notes.search", arguments = { query = "wasm" } }]

[[step]]
process = "branch"
when = "error[denied]"
repeat = true
reply = "The notes are not offered to a branch."

[[step]]
process = "channel"
when = "not offered to a branch"
repeat = true
reply = "A branch may not search the notes."
"""


def config(port):
    return f"""
[agent]
workspace = "workspace"

[provider]
kind = "scripted"
script = "script.toml"

[limits]
tool_deadline_secs = {DEADLINE_SECS}

[mcp.notes]
command = [{str(sys.executable)!r}, {str(SERVER)!r}]
env = {{ NOTES_GREETING = "hello" }}

[secrets.NOTES_KEY]
env = "NOTES_KEY"
hosts = ["http://127.0.0.1:{port}"]
header = "Authorization: Bearer {{NOTES_KEY}}"

[mcp.remote]
url = "http://127.0.0.1:{port}/mcp"
secrets = ["NOTES_KEY"]

[profiles.worker]
tools = ["file_read", "set_status", "notes.*", "remote.*"]
capabilities = ["fs.read"]

[mcp.broken]
command = ["/nonexistent/mcp-server"]
""".replace("'", '"')


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class HttpServer:
    """notes.py serving streamable HTTP on a loopback port; restartable on that port."""

    def __init__(self):
        self.port = free_port()
        self.process = None

    def start(self):
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), "http", str(self.port)],
            env={"PATH": os.environ.get("PATH", ""), "NOTES_EXPECTED_KEY": KEY},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        # Up when it accepts a connection; a server that exits fails at once.
        while True:
            assert self.process.poll() is None, "notes.py http exited"
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port)):
                return
            time.sleep(0.05)

    def kill(self):
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def remote():
    server = HttpServer()
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def home(remote):
    with tempfile.TemporaryDirectory(prefix="capstan-mcp-client-") as name:
        base = pathlib.Path(name)
        (base / "workspace").mkdir()
        (base / "workspace" / "notes.txt").write_text("a note\n")
        (base / "capstan.toml").write_text(config(remote.port))
        (base / "script.toml").write_text(SCRIPT)
        yield base


def env(home):
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "CAPSTAN_CACHE_DIR": str(ROOT / "target" / "test-component-cache"),
        "CAPSTAN_STATE_DIR": str(home / "state"),
        "CAPSTAN_PLUGINS_DIR": str(PLUGINS),
        # In the host's environment only: the stdio server must never see it.
        "HOST_ONLY_SECRET": "s3cr3t-of-the-host",
        "NOTES_KEY": KEY,
    }


def capstan(home, *args):
    return subprocess.run(
        [str(BINARY), *args, "--config", str(home / "capstan.toml")],
        cwd=home, env=env(home), capture_output=True, text=True, timeout=120,
    )


def database(home):
    return home / ".capstan" / "capstan.db"


def audit(home):
    with contextlib.closing(sqlite3.connect(database(home))) as db:
        return db.execute("SELECT process, tool, outcome, detail FROM audit ORDER BY id").fetchall()


def test_the_server_s_tools_are_namespaced_and_granted_per_profile(home):
    policy = capstan(home, "policy")
    assert policy.returncode == 0, policy.stderr
    rows = {line.split()[0]: line for line in policy.stdout.splitlines()
            if line.startswith(("notes.", "remote."))}
    assert set(rows) == {f"{server}.{tool}" for server in ("notes", "remote") for tool in TOOLS}
    # Worker on; branch and the cortex (whose `*` has no dot) off.
    for row in rows.values():
        assert row.split().count("on") == 1, row
    # The server that cannot start is reported, and the others' tools are still there.
    assert "[mcp.broken]" in policy.stderr and "/nonexistent/mcp-server" in policy.stderr
    assert "check mcp.broken.command" in policy.stderr
    assert policy.stderr.count("/nonexistent/mcp-server") == 1, policy.stderr

    worker = capstan(home, "tool", "call", "notes.search", '{"query": "rust"}', "--as", "worker")
    assert worker.returncode == 0, worker.stderr
    assert worker.stdout.strip() == "found 1 note about rust"
    branch = capstan(home, "tool", "call", "notes.search", '{"query": "rust"}', "--as", "branch")
    assert branch.returncode == 4
    assert "not offered to a branch process" in branch.stderr
    over_http = capstan(home, "tool", "call", "remote.search", '{"query": "wasm"}', "--as", "worker")
    assert over_http.returncode == 0, over_http.stderr
    assert over_http.stdout.strip() == "found 1 note about wasm"
    branch = capstan(home, "tool", "call", "remote.search", '{"query": "x"}', "--as", "branch")
    assert branch.returncode == 4 and "not offered to a branch process" in branch.stderr


def test_an_agent_s_worker_calls_a_server_s_tool_and_its_branch_is_refused(home):
    worker = capstan(home, "run", "ask a worker to search the notes")
    assert worker.returncode == 0, worker.stderr
    assert "The worker found one note on rust." in worker.stdout, worker.stdout
    branch = capstan(home, "run", "ask a branch to search the notes")
    assert branch.returncode == 0, branch.stderr
    assert "A branch may not search the notes." in branch.stdout, branch.stdout
    rows = [(p.split(":")[0], t, o) for p, t, o, _ in audit(home) if t.startswith(("notes.", "remote."))]
    assert ("worker", "remote.search", "ok") in rows, rows
    assert ("branch", "notes.search", "denied") in rows, rows


def test_the_server_gets_only_the_environment_its_config_lists(home):
    result = capstan(home, "tool", "call", "notes.environment", "{}", "--as", "worker")
    assert result.returncode == 0, result.stderr
    names = set(result.stdout.split())
    assert "NOTES_GREETING" in names
    # Python adds LC_CTYPE itself (PEP 538); nothing else of the host's reaches it.
    assert names <= {"NOTES_GREETING", "LC_CTYPE"}, names


@contextlib.asynccontextmanager
async def worker_tools(home):
    params = StdioServerParameters(
        command=str(BINARY),
        args=["mcp", "--profile", "worker", "--config", str(home / "capstan.toml")],
        env=env(home), cwd=str(home),
    )
    async with stdio_client(params) as (read, write):
        info = types.Implementation(name="client-test", version="1.0")
        async with ClientSession(read, write, client_info=info) as client:
            await client.initialize()
            yield client


def text(result):
    return "".join(block.text for block in result.content if block.type == "text")


def test_a_server_that_crashes_is_restarted_for_the_next_call(home):
    async def run():
        async with worker_tools(home) as client:
            first = text(await client.call_tool("notes.process", {}))
            crashed = await client.call_tool("notes.crash", {})
            second = await client.call_tool("notes.process", {})
            return first, crashed, second

    first, crashed, second = asyncio.run(run())
    assert crashed.is_error and "stopped during the call" in text(crashed)
    assert not second.is_error and text(second) != first
    rows = [(t, o) for p, t, o, _ in audit(home) if p == "mcp:client-test"]
    assert ("notes.crash", "failed") in rows


def test_a_hung_server_hits_the_deadline_and_never_blocks_other_tools(home):
    async def run():
        async with worker_tools(home) as client:
            hung = asyncio.ensure_future(client.call_tool("notes.hang", {}))
            # While the server is stuck, a plugin tool answers.
            read = await client.call_tool("file_read", {"path": "notes.txt"})
            assert not hung.done()
            hung = await hung
            after = await client.call_tool("notes.search", {"query": "after"})
            return read, hung, after

    read, hung, after = asyncio.run(run())
    assert not read.is_error and text(read) == "a note\n"
    assert hung.is_error
    assert f"did not answer within the {DEADLINE_SECS} s deadline" in text(hung)
    assert "limits.tool_deadline_secs" in text(hung)
    assert not after.is_error and text(after) == "found 1 note about after"


def test_an_http_server_gets_its_key_and_nothing_the_host_keeps_holds_it(home):
    async def run():
        async with worker_tools(home) as client:
            return text(await client.call_tool("remote.authorization", {}))

    answer = asyncio.run(run())
    # The server saw the key; its echo of the header came back redacted.
    assert answer.startswith("the key matches: Bearer [redacted secret NOTES_KEY]"), answer
    assert KEY not in answer
    with contextlib.closing(sqlite3.connect(database(home))) as db:
        requests = db.execute(
            "SELECT process, tool, method, host, status, decision FROM net_requests ORDER BY id"
        ).fetchall()
    # Each HTTP request of the session (handshake, list, calls) is one row of the server's.
    assert requests and {row[0] for row in requests} == {"mcp:remote"}, requests
    assert all(row[2] in ("POST", "DELETE") and row[5] == "allowed" for row in requests), requests
    calls = [(t, o) for p, t, o, _ in audit(home) if p == "mcp:client-test"]
    assert ("remote.authorization", "ok") in calls
    for path in home.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path


def test_an_http_server_that_hangs_hits_the_deadline_and_the_next_call_is_answered(home):
    async def run():
        async with worker_tools(home) as client:
            hung = await client.call_tool("remote.hang", {})
            after = await client.call_tool("remote.search", {"query": "after"})
            return hung, after

    hung, after = asyncio.run(run())
    assert hung.is_error and f"did not answer within the {DEADLINE_SECS} s deadline" in text(hung)
    assert not after.is_error and text(after) == "found 1 note about after"


def test_an_http_server_that_goes_away_is_reported_and_reached_again_when_back(home, remote):
    async def run():
        async with worker_tools(home) as client:
            first = text(await client.call_tool("remote.process", {}))
            remote.kill()
            gone = await client.call_tool("remote.search", {"query": "x"})
            remote.start()
            back = await client.call_tool("remote.process", {})
            return first, gone, back

    first, gone, back = asyncio.run(run())
    assert gone.is_error and "remote" in text(gone), text(gone)
    assert not back.is_error and text(back) != first, text(back)
