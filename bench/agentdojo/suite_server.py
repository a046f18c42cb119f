"""One AgentDojo suite's tools as an MCP server (the official `mcp` SDK, streamable HTTP).

Each tool keeps AgentDojo's name, description and JSON schema (`$defs` included), and a
call runs AgentDojo's own `FunctionsRuntime` on the environment the runner swapped in,
formatting the result as AgentDojo's tool executor does (`tool_result_to_str`: YAML).
Every call is recorded, refused ones included, as AgentDojo's trace would hold it.
"""

import threading

import mcp_types as types
from agentdojo.agent_pipeline.tool_execution import tool_result_to_str
from agentdojo.functions_runtime import FunctionCall, FunctionsRuntime
from mcp.server.lowlevel import Server

import effects


class SuiteServer:
    """The tools of `suite` over MCP, on whatever environment is current."""

    def __init__(self, suite):
        effects.check(suite.name, [tool.name for tool in suite.tools])
        self.suite = suite
        self.runtime = FunctionsRuntime(suite.tools)
        self.tools = [
            types.Tool(
                name=tool.name,
                description=tool.description,
                input_schema=tool.parameters.model_json_schema(),
                annotations=types.ToolAnnotations(read_only_hint=effects.is_read_only(suite.name, tool.name)),
            )
            for tool in suite.tools
        ]
        # The runner swaps the environment between pairs while no call runs; the lock
        # keeps a late call (a worker the runner gave up on) off a half-swapped state.
        self._lock = threading.Lock()
        self._environment = None
        self._calls: list[FunctionCall] = []
        self.server = Server(suite.name, on_list_tools=self._list_tools, on_call_tool=self._call_tool)

    def app(self):
        """The ASGI app, serving MCP at /mcp."""
        return self.server.streamable_http_app(streamable_http_path="/mcp")

    def swap(self, environment) -> None:
        """Makes `environment` the one calls run on, with an empty trace."""
        with self._lock:
            self._environment = environment
            self._calls = []

    def trace(self) -> list[FunctionCall]:
        """The calls since the last swap, in order."""
        with self._lock:
            return list(self._calls)

    async def _list_tools(self, ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.tools)

    async def _call_tool(self, ctx, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        # Runs on the server's loop: AgentDojo's tools are quick, pure-Python and run one at
        # a time, so there is nothing to gain from a thread.
        with self._lock:
            self._calls.append(FunctionCall(function=params.name, args=arguments))
            if self._environment is None:
                return _error("no environment is loaded")
            result, error = self.runtime.run_function(self._environment, params.name, arguments)
        if error is not None:
            return _error(error)
        return types.CallToolResult(content=[types.TextContent(text=tool_result_to_str(result))])


def _error(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
