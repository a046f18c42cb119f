"""The audit rule under a crash: a tool result leaves the host only after its audit row has
committed, so `capstan serve` killed with SIGKILL in the middle of a burst of calls (whose
rows share transactions) has a row for every answer a client received, and its database
opens again.

The client is the official MCP Python SDK over `/mcp`; the calls are the probe's `echo`."""

import asyncio
import contextlib
import json
import os
import signal
import sqlite3

from mcp import ClientSession, types
from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

from test_mcp import CHAT_TOKEN, Deployment

CALLS = 300
# Answers received before the kill: the rest are in flight, queued or not yet sent.
KILL_AFTER = 60


def audited_texts(deployment):
    """The `text` argument of every audited echo call, from the real SQLite file."""
    with contextlib.closing(sqlite3.connect(deployment.base / ".capstan" / "capstan.db")) as db:
        rows = db.execute("SELECT arguments FROM audit WHERE tool = 'echo'").fetchall()
    return {json.loads(row[0])["text"] for row in rows}


async def burst_then_kill(deployment, url, received):
    """Makes CALLS concurrent calls and kills the server after KILL_AFTER answers; the text
    of each answer received goes into `received`."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {CHAT_TOKEN}"})
    info = types.Implementation(name="durability", version="1.0")
    async with http:
        async with streamable_http_client(f"{url}/mcp/worker", http_client=http) as (read, write, *_):
            async with ClientSession(read, write, client_info=info) as client:
                await client.initialize()
                calls = [
                    asyncio.ensure_future(client.call_tool("echo", {"text": f"durable {n}"}))
                    for n in range(CALLS)
                ]
                for next_done in asyncio.as_completed(calls):
                    try:
                        result = await next_done
                    except Exception:
                        continue
                    if not result.is_error:
                        received.append("".join(b.text for b in result.content if b.type == "text"))
                    if len(received) == KILL_AFTER:
                        os.kill(deployment.server.pid, signal.SIGKILL)
                        deployment.server.wait(timeout=60)
                        break
                for call in calls:
                    call.cancel()
                await asyncio.gather(*calls, return_exceptions=True)


def test_every_answer_a_client_received_has_its_audit_row_after_a_kill_9():
    deployment = Deployment()
    try:
        url = deployment.serve()
        received = []
        with contextlib.suppress(Exception):
            # The session's teardown talks to a dead server; what was received is kept.
            asyncio.run(burst_then_kill(deployment, url, received))
        assert len(received) >= KILL_AFTER, received
        assert deployment.server.returncode == -signal.SIGKILL
        deployment.server.stdout.close()
        deployment.stderr.close()
        audited = audited_texts(deployment)
        missing = [text for text in received if text not in audited]
        assert not missing, f"answered but not audited: {missing[:5]} (of {len(missing)})"
        # The database opens again (the host checks it on open) and serves.
        deployment.serve()
    finally:
        deployment.close()
