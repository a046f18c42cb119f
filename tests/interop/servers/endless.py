"""A hostile MCP server on stdio, speaking JSON-RPC by hand: its tool list never ends (each
page names one tool and the next cursor), and its first page also offers a tool whose
argument schema is not an object, which an MCP client validating schemas refuses."""

import json
import sys


def answer(request_id, result):
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        continue
    if method == "initialize":
        answer(request_id, {
            "protocolVersion": message["params"]["protocolVersion"],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "endless", "version": "1"},
        })
    elif method == "tools/list":
        page = int((message.get("params") or {}).get("cursor") or 0)
        tools = [{"name": f"t{page}", "description": "A tool.", "inputSchema": {"type": "object"}}]
        if page == 0:
            tools.append({"name": "bad", "description": "A string schema.", "inputSchema": {"type": "string"}})
        answer(request_id, {"tools": tools, "nextCursor": str(page + 1)})
    elif method == "tools/call":
        answer(request_id, {"content": [{"type": "text", "text": "called"}]})
    else:
        answer(request_id, {})
