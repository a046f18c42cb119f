"""Capstan as an MCP client of `servers/notes.py`, a small server written with the official
MCP Python SDK: `[mcp.notes]` starts it over stdio, `[mcp.remote]` reaches another copy of
it over streamable HTTP on loopback, with a secret the host injects. The tools are
`notes.*` and `remote.*`, granted to the worker only; the tests call them through the real
`capstan` binary (`tool call --as`, `policy`) and through `capstan mcp`, one host process
that outlives the servers' crashes."""

import asyncio
import contextlib
import json
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

SERVERS = pathlib.Path(__file__).resolve().parent / "servers"
SERVER = SERVERS / "notes.py"
DEADLINE_SECS = 8

TOOLS = {"search", "environment", "authorization", "token", "process", "slow_next_start", "big", "crash", "hang"}
TOKEN = "notes-token-0123456789abcdef"
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


def config(port, base):
    # Every string as JSON, which TOML reads as a basic string.
    q = json.dumps
    python, server, log = q(str(sys.executable)), q(str(SERVER)), q(str(base / "starts.log"))
    return f"""
[agent]
workspace = "workspace"

[provider]
kind = "scripted"
script = "script.toml"

[limits]
tool_deadline_secs = {DEADLINE_SECS}

[secrets.NOTES_TOKEN]
env = "NOTES_TOKEN"

# The most of one answer the host reads from each server, over either transport.
[net.tool.notes]
max_response_body_kib = 256

[net.tool.remote]
max_response_body_kib = 256

[mcp.notes]
command = [{python}, {server}]
env = {{ NOTES_GREETING = "hello", NOTES_START_LOG = {log} }}

[secrets.NOTES_KEY]
env = "NOTES_KEY"
hosts = ["http://127.0.0.1:{port}"]
header = "Authorization: Bearer {{NOTES_KEY}}"

[mcp.remote]
url = "http://127.0.0.1:{port}/mcp"
secrets = ["NOTES_KEY"]

# Through a shell that stays as its parent, as `npx` or a wrapper script would.
[mcp.wrapped]
command = ["/bin/sh", "-c", {q(f"{sys.executable} {SERVER}; echo done")}]
env = {{ NOTES_NAME = "wrapped", NOTES_START_LOG = {log}, NOTES_SLOW_MARKER = {q(str(base / "slow"))} }}
secrets = ["NOTES_TOKEN"]

[mcp.broken]
command = ["/nonexistent/mcp-server"]

[mcp.dies]
command = [{python}, "-c", {q("import sys; sys.stderr.write('FATAL: NOTES_TOKEN is not set'); sys.exit(1)")}]

[mcp.endless]
command = [{python}, {q(str(SERVERS / "endless.py"))}]

# Named by no profile: never started.
[mcp.idle]
command = [{python}, {server}]
env = {{ NOTES_NAME = "idle", NOTES_START_LOG = {log} }}

[profiles.worker]
tools = ["file_read", "set_status", "notes.*", "remote.*", "wrapped.*", "broken.*", "dies.*", "endless.*"]
capabilities = ["fs.read"]
"""


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
        (base / "capstan.toml").write_text(config(remote.port, base))
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
        "NOTES_TOKEN": TOKEN,
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
    assert set(rows) == {f"notes.{tool}" for tool in TOOLS}
    # Worker on; branch and the cortex (whose `*` has no dot) off.
    for row in rows.values():
        assert row.split().count("on") == 1, row
    # A server that cannot start is reported, and the others' tools are still there.
    assert "[mcp.broken]" in policy.stderr and "/nonexistent/mcp-server" in policy.stderr
    assert "check mcp.broken.command" in policy.stderr
    assert policy.stderr.count("/nonexistent/mcp-server") == 1, policy.stderr
    # `policy` reads no secret, so the server that needs one is not contacted without it.
    assert "[mcp.remote] is not started by this command, which reads no secrets (it needs NOTES_KEY)" in policy.stderr
    assert "[mcp.wrapped] is not started by this command, which reads no secrets (it needs NOTES_TOKEN)" in policy.stderr
    assert "[mcp.notes] is not started" not in policy.stderr
    # Each server, how it is reached, who may use it, and what it offers here.
    servers = {line.split()[0]: line for line in policy.stdout.split("MCP servers:")[1].splitlines()[1:]
               if line.startswith("  ") and ";" in line}
    assert f"named by worker; {len(TOOLS)} tool(s) in the matrix" in servers["notes"], servers
    assert "at http://127.0.0.1:" in servers["remote"] and "not started by this command" in servers["remote"]
    assert "named by no profile" in servers["idle"], servers

    async def listed():
        async with worker_tools(home) as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    names = asyncio.run(listed())
    assert {f"remote.{tool}" for tool in TOOLS} <= names and "file_read" in names, names

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
    assert names <= {"NOTES_GREETING", "NOTES_START_LOG", "LC_CTYPE"}, names
    # A secret a server names is its variable; the server's echo of it comes back redacted.
    token = capstan(home, "tool", "call", "wrapped.token", "{}", "--as", "worker")
    assert token.returncode == 0, token.stderr
    assert token.stdout.strip() == "[redacted secret NOTES_TOKEN]"


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


# What a call says while its server is being started again: each is bounded by the tool
# deadline, so on a busy machine a restart may take more than one call to finish.
RESTARTING = ("is still starting", "the next start is in", "did not complete its handshake")


async def once_restarted(client, tool, arguments):
    """Calls `tool` until its server has been started again (60 calls at the most)."""
    for _ in range(60):
        result = await client.call_tool(tool, arguments)
        if not (result.is_error and any(phrase in text(result) for phrase in RESTARTING)):
            return result
        await asyncio.sleep(0.2)
    return result


def test_a_server_that_crashes_is_restarted_for_the_next_call(home):
    async def run():
        async with worker_tools(home) as client:
            first = text(await client.call_tool("notes.process", {}))
            crashed = await client.call_tool("notes.crash", {})
            second = await once_restarted(client, "notes.process", {})
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
            after = await once_restarted(client, "notes.search", {"query": "after"})
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


@pytest.mark.parametrize("server", ["notes", "remote"])
def test_an_answer_over_the_size_limit_is_refused_at_once_naming_the_limit(home, server):
    # Twice the limit, in one message: a line on stdio, an event or a body over HTTP. The
    # call fails on the answer, not at the deadline, and the next call is served.
    async def run():
        async with worker_tools(home) as client:
            fits = await client.call_tool(f"{server}.big", {"size": 1000})
            over = await client.call_tool(f"{server}.big", {"size": 512 * 1024})
            after = await once_restarted(client, f"{server}.search", {"query": "after"})
            return fits, over, after

    fits, over, after = asyncio.run(run())
    assert not fits.is_error and text(fits) == "x" * 1000
    assert over.is_error, text(over)[:300]
    message = text(over)
    assert "deadline" not in message, message
    assert "256 KiB" in message and f"[net.tool.{server}] max_response_body_kib" in message, message
    assert not after.is_error and text(after) == "found 1 note about after"


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


def starts(home):
    log = home / "starts.log"
    return log.read_text().split() [0::2] if log.exists() else []


def test_a_command_starts_only_the_servers_it_needs(home):
    before = starts(home)
    read = capstan(home, "tool", "call", "file_read", '{"path": "notes.txt"}', "--grant", "fs.read",
                   "--workspace", str(home / "workspace"))
    assert read.returncode == 0, read.stderr
    assert starts(home) == before, "a plugin tool's call started an MCP server"
    one = capstan(home, "tool", "call", "notes.search", '{"query": "x"}', "--as", "worker")
    assert one.returncode == 0, one.stderr
    assert starts(home) == before + ["notes"], "only the called tool's server starts"
    policy = capstan(home, "policy")
    assert "[mcp.idle] is not started: no profile names its tools" in policy.stderr
    assert "idle" not in starts(home)


def test_a_server_that_fails_to_start_says_what_it_wrote_and_its_tools_say_why(home):
    called = capstan(home, "tool", "call", "dies.anything", "{}", "--as", "worker")
    assert called.returncode == 5, called.stderr
    assert "no tool `dies.anything` is loaded: MCP server [mcp.dies]" in called.stderr, called.stderr
    assert "it wrote: FATAL: NOTES_TOKEN is not set" in called.stderr, called.stderr


def test_a_tool_list_without_end_and_a_tool_a_plugin_could_not_offer_are_bounded(home):
    policy = capstan(home, "policy")
    assert policy.returncode == 0, policy.stderr
    rows = [line.split()[0] for line in policy.stdout.splitlines() if line.startswith("endless.")]
    assert rows == [f"endless.t{n}" for n in range(16)], rows
    assert "lists its tools in more than 16 pages" in policy.stderr, policy.stderr
    assert "tool `endless.bad` is left out" in policy.stderr, policy.stderr

    # The official client validates every schema it is given: one left out keeps it working.
    async def listed():
        async with worker_tools(home) as client:
            return {tool.name for tool in (await client.list_tools()).tools}

    names = asyncio.run(listed())
    assert "endless.t0" in names and "endless.bad" not in names and "file_read" in names


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has exited; only its parent has yet to reap it.
    stat = pathlib.Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_a_hung_server_s_whole_process_group_goes_and_its_slow_restart_is_bounded_by_the_deadline(home):
    async def run():
        async with worker_tools(home) as client:
            first = int(text(await client.call_tool("wrapped.process", {})))
            await client.call_tool("wrapped.slow_next_start", {})
            hung = await client.call_tool("wrapped.hang", {})
            # The server ran under a shell: restarting kills the shell and its child.
            for _ in range(600):
                if not alive(first):
                    break
                await asyncio.sleep(0.1)
            assert not alive(first), f"the server {first} outlived its restart"
            # The restart takes 12 s, past the 8 s deadline: this call stops at the
            # deadline and the start goes on for the calls after it.
            starting = await client.call_tool("wrapped.search", {"query": "x"})
            back = await once_restarted(client, "wrapped.process", {})
            return first, hung, starting, back

    first, hung, starting, back = asyncio.run(run())
    assert hung.is_error and "restarted for the next call" in text(hung), text(hung)
    assert starting.is_error, text(starting)
    assert f"did not answer within the {DEADLINE_SECS} s deadline" in text(starting), text(starting)
    assert "still starting" in text(starting), text(starting)
    assert not back.is_error and int(text(back)) != first, text(back)
