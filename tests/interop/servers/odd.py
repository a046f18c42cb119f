"""A stdio MCP server speaking JSON-RPC by hand that claims a protocol revision no client
speaks (ODD_VERSION) in its `initialize` answer, and knows no `server/discover`."""

import json
import os
import sys

for line in sys.stdin:
    message = json.loads(line)
    method, request_id = message.get("method"), message.get("id")
    if request_id is None:
        continue
    if method == "initialize":
        result = {
            "protocolVersion": os.environ.get("ODD_VERSION", "2099-01-01"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "odd", "version": "1"},
        }
        reply = {"jsonrpc": "2.0", "id": request_id, "result": result}
    else:
        error = {"code": -32601, "message": "Method not found"}
        reply = {"jsonrpc": "2.0", "id": request_id, "error": error}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
