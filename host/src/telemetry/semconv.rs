//! The names the spans use, pinned: OpenTelemetry semantic conventions 1.41.0, the last
//! release holding the GenAI and MCP conventions (in development status) before they moved
//! to their own repository. Written out here rather than taken from a crate that marks
//! them deprecated for the move: the names are what a receiver reads, and these are the
//! ones its GenAI views expect.

/// The schema of every span: [`SCHEMA_URL`]'s version of the conventions.
pub const SCHEMA_URL: &str = "https://opentelemetry.io/schemas/1.41.0";

// GenAI.
pub const GEN_AI_OPERATION_NAME: &str = "gen_ai.operation.name";
pub const GEN_AI_PROVIDER_NAME: &str = "gen_ai.provider.name";
pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
pub const GEN_AI_USAGE_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
pub const GEN_AI_USAGE_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
pub const GEN_AI_AGENT_NAME: &str = "gen_ai.agent.name";
pub const GEN_AI_AGENT_ID: &str = "gen_ai.agent.id";
pub const GEN_AI_CONVERSATION_ID: &str = "gen_ai.conversation.id";
pub const GEN_AI_TOOL_NAME: &str = "gen_ai.tool.name";
pub const GEN_AI_TOOL_TYPE: &str = "gen_ai.tool.type";
pub const GEN_AI_TOOL_CALL_ID: &str = "gen_ai.tool.call.id";
pub const GEN_AI_TOOL_CALL_ARGUMENTS: &str = "gen_ai.tool.call.arguments";
pub const GEN_AI_TOOL_CALL_RESULT: &str = "gen_ai.tool.call.result";

// MCP.
pub const MCP_METHOD_NAME: &str = "mcp.method.name";

// HTTP, network, errors and resources (stable).
pub const HTTP_REQUEST_METHOD: &str = "http.request.method";
pub const HTTP_RESPONSE_STATUS_CODE: &str = "http.response.status_code";
pub const SERVER_ADDRESS: &str = "server.address";
pub const SERVER_PORT: &str = "server.port";
pub const NETWORK_TRANSPORT: &str = "network.transport";
pub const ERROR_TYPE: &str = "error.type";
pub const TELEMETRY_SDK_NAME: &str = "telemetry.sdk.name";
pub const PROCESS_PID: &str = "process.pid";
pub const SERVICE_NAME: &str = "service.name";
pub const TELEMETRY_SDK_LANGUAGE: &str = "telemetry.sdk.language";
pub const TELEMETRY_SDK_VERSION: &str = "telemetry.sdk.version";
