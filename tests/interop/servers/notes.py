"""A small MCP server written with the official Python SDK, for Capstan to be a client of:
`python notes.py` serves on stdio; `python notes.py http PORT` serves streamable HTTP on
127.0.0.1:PORT at /mcp.

With NOTES_START_LOG set, each start appends a line to that file; with NOTES_SLOW_MARKER
set, a start after `slow_next_start` was called waits 12 s before it serves."""

import os
import pathlib
import sys
import time

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("notes")


@server.tool()
def search(query: str) -> str:
    """Searches the notes for a query."""
    return f"found 1 note about {query}"


@server.tool()
def environment() -> str:
    """The names of the variables in this server's environment, sorted."""
    return " ".join(sorted(os.environ))


@server.tool()
def authorization(ctx: Context) -> str:
    """Whether the request carried the expected key, and the header as it came."""
    got = (ctx.headers or {}).get("authorization", "")
    expected = "Bearer " + os.environ.get("NOTES_EXPECTED_KEY", "unset")
    verdict = "the key matches" if got == expected else "no key"
    return f"{verdict}: {got}"


@server.tool()
def process() -> str:
    """This server's process id."""
    return str(os.getpid())


@server.tool()
def token() -> str:
    """The value of NOTES_TOKEN, as this server was given it."""
    return os.environ.get("NOTES_TOKEN", "(unset)")


@server.tool()
def slow_next_start() -> str:
    """Makes the next start of this server take 12 s."""
    pathlib.Path(os.environ["NOTES_SLOW_MARKER"]).write_text("slow")
    return "the next start is slow"


@server.tool()
def big(size: int) -> str:
    """`size` bytes of text, in one answer."""
    return "x" * size


@server.tool()
def crash() -> str:
    """Exits the server at once, mid-call."""
    os._exit(3)


@server.tool()
def hang() -> str:
    """Blocks the whole server."""
    time.sleep(3600)
    return "woke"


if __name__ == "__main__":
    if os.environ.get("NOTES_START_LOG"):
        with open(os.environ["NOTES_START_LOG"], "a") as log:
            log.write(f"{os.environ.get('NOTES_NAME', 'notes')} {os.getpid()}\n")
    marker = os.environ.get("NOTES_SLOW_MARKER")
    if marker and os.path.exists(marker):
        os.remove(marker)
        time.sleep(12)
    if len(sys.argv) > 2 and sys.argv[1] == "http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
