//! The JSON API: conversations, their history and messages, workers, branches, tasks,
//! the policy matrix, the audit log, plugins and tools.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};

use super::app::{App, user_message};
use super::auth::Caller;
use super::error::{ApiError, ApiJson, ApiPath, ApiQuery, ErrorBody};
use crate::config::TokenScope;
use crate::ids::{ProcessId, ProcessKind};
use crate::services::{TaskFilter, TaskStatus};
use crate::tools::MatrixRow;

/// The most rows one list returns.
const MAX_PAGE: u32 = 1000;

/// A conversation.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChannelView {
    /// Its process id, e.g. `channel:main`.
    id: String,
    /// Its kind: `channel`, or `cortex` for the admin chat.
    kind: String,
    /// Its name, e.g. `main`.
    name: String,
    /// Messages stored in its history.
    messages: u64,
}

/// Every conversation with a stored history.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChannelList {
    channels: Vec<ChannelView>,
}

/// `GET /v1/channels`: every conversation with a stored history.
#[utoipa::path(get, path = "/v1/channels", tag = "state",
    responses((status = 200, body = ChannelList, description = "The conversations")))]
pub(crate) async fn channels(State(app): State<Arc<App>>) -> Result<Json<ChannelList>, ApiError> {
    let all = app.runtime.services().history.conversations().await?;
    let channels = all
        .into_iter()
        .map(|c| {
            let id = c.channel.process();
            ChannelView {
                id: id.to_string(),
                kind: id.kind().to_string(),
                name: id.name().to_owned(),
                messages: c.messages,
            }
        })
        .collect();
    Ok(Json(ChannelList { channels }))
}

/// Which conversation a path names: `main` is `channel:main`, `cortex:main` the admin
/// chat.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct KindQuery {
    /// `channel` (default) or `cortex`.
    kind: Option<String>,
}

fn conversation(name: &str, kind: &KindQuery) -> Result<ProcessId, ApiError> {
    let kind = match kind.kind.as_deref() {
        None | Some("channel") => ProcessKind::Channel,
        Some("cortex") => ProcessKind::Cortex,
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "`kind` is `channel` or `cortex`, not `{}`",
                crate::text::truncate(other, 32).escape_debug()
            ))
            .param("kind"));
        }
    };
    ProcessId::conversation(kind, name).map_err(|msg| ApiError::invalid(msg).param("name"))
}

/// A conversation's stored history.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HistoryView {
    /// The conversation, e.g. `channel:main`.
    channel: String,
    /// Its messages in order, each as the model saw it (role, content, tool calls).
    #[schema(value_type = Vec<Object>)]
    messages: Vec<Value>,
}

/// `GET /v1/channels/{name}/history`: a conversation's stored messages.
#[utoipa::path(get, path = "/v1/channels/{name}/history", tag = "state",
    params(("name" = String, Path, description = "The conversation's name, e.g. `main`"), KindQuery),
    responses((status = 200, body = HistoryView, description = "Its messages"), (status = 404, body = ErrorBody, description = "No such conversation or model")))]
pub(crate) async fn history(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(kind): ApiQuery<KindQuery>,
) -> Result<Json<HistoryView>, ApiError> {
    let id = conversation(&name, &kind)?;
    if id.kind() == ProcessKind::Cortex {
        caller.require(TokenScope::Admin)?;
    }
    let entries = app.runtime.services().history.load(&id.session()).await?;
    if entries.is_empty() {
        return Err(ApiError::not_found(format!(
            "no conversation `{id}` has a stored history; GET /v1/channels lists them"
        )));
    }
    let messages = entries
        .iter()
        .map(|entry| {
            serde_json::from_str(&entry.message)
                .unwrap_or_else(|_| Value::String(entry.message.clone()))
        })
        .collect();
    Ok(Json(HistoryView {
        channel: id.to_string(),
        messages,
    }))
}

/// A message for a conversation.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PostMessage {
    /// What the user says.
    text: String,
    /// Wait until the message's work is over (answered, the workers it started done) and
    /// stored, and return the reply; by default the message is accepted and the reply follows on `/v1/events`.
    #[serde(default)]
    wait: bool,
    /// The client's idempotency key (or the `Idempotency-Key` header): a message sent
    /// again with the key of one the conversation took is not taken again; the answer it
    /// got is given again, with `repeated`. 1 to 255 visible ASCII characters.
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// A message accepted, or answered.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct MessageResult {
    /// The conversation.
    channel: String,
    /// With `wait`: the reply (every reply of the exchange, set off by blank lines).
    #[serde(skip_serializing_if = "Option::is_none")]
    reply: Option<String>,
    /// With `wait`: what the conversation's processes did, as events.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Object>>)]
    events: Option<Vec<Value>>,
    /// With `wait`: how the exchange stands. `stored` (status 200): answered, and
    /// everything it did is stored. With status 202: `not_yet_stored` (the store refused
    /// the history; the answer is kept in the host and written once the store is back),
    /// `interrupted` (the host stopped before the work the message started was over;
    /// what was done is stored) or `pending` (the host that answers the conversation
    /// took the message; its answer comes there).
    #[serde(skip_serializing_if = "Option::is_none")]
    outcome: Option<&'static str>,
    /// What a client should know of an outcome other than `stored`.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// With `wait`: true if the message was sent before with its idempotency key (it was
    /// not taken again; this is the answer it got).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    repeated: bool,
}

/// `POST /v1/channels/{name}/messages`: says something in a conversation.
#[utoipa::path(post, path = "/v1/channels/{name}/messages", tag = "chat",
    params(("name" = String, Path, description = "The conversation's name"), KindQuery, ("Idempotency-Key" = Option<String>, Header, description = "The message's idempotency key, as `idempotency_key`")),
    request_body = PostMessage,
    responses((status = 202, body = MessageResult, description = "Accepted (the reply follows on /v1/events); with `wait`, answered but not yet stored, interrupted, or pending on another host, as `outcome` says"),
        (status = 200, body = MessageResult, description = "With `wait`: answered, and stored"),
        (status = 503, body = ErrorBody, description = "Not taken (`unavailable`, `not_taken`: nothing stored, send it again), not stored before the host stopped (`not_stored`), or interrupted before any reply (`interrupted`: the message is stored)"),
        (status = 403, body = ErrorBody, description = "The token's scope does not allow it"), (status = 413, body = ErrorBody, description = "The body is over `serve.max_request_body_kib`")))]
pub(crate) async fn post_message(
    State(app): State<Arc<App>>,
    caller: Caller,
    ApiPath(name): ApiPath<String>,
    ApiQuery(kind): ApiQuery<KindQuery>,
    headers: axum::http::HeaderMap,
    ApiJson(body): ApiJson<PostMessage>,
) -> Result<Response, ApiError> {
    let id = conversation(&name, &kind)?;
    caller.require(if id.kind() == ProcessKind::Cortex {
        TokenScope::Admin
    } else {
        TokenScope::Chat
    })?;
    if body.text.trim().is_empty() {
        return Err(ApiError::invalid("`text` is empty").param("text"));
    }
    let message = user_message(body.text, &headers, body.idempotency_key)?;
    if !body.wait {
        // The exchange goes on without this request: its answer follows on /v1/events.
        app.runtime
            .exchange(&id, message)
            .await
            .map_err(|err| ApiError::unavailable(err.to_string()))?;
        let accepted = MessageResult {
            channel: id.to_string(),
            reply: None,
            events: None,
            outcome: None,
            note: None,
            repeated: false,
        };
        return Ok((StatusCode::ACCEPTED, Json(accepted)).into_response());
    }
    let answered = app.exchange(id.clone(), message).await?;
    let status = answered.outcome.status();
    let result = MessageResult {
        channel: id.to_string(),
        reply: Some(answered.reply),
        events: Some(answered.events),
        outcome: Some(answered.outcome.name()),
        note: answered.outcome.note(),
        repeated: answered.repeated,
    };
    Ok((status, Json(result)).into_response())
}

/// Paging of a list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct ListQuery {
    /// At most this many (default 100, at most 1000).
    limit: Option<u32>,
}

fn limit(limit: Option<u32>) -> u32 {
    limit.unwrap_or(100).clamp(1, MAX_PAGE)
}

/// Workers, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct WorkerList {
    /// Each with its id, channel, task, state and outcome.
    workers: Vec<crate::services::WorkerRecord>,
}

/// `GET /v1/workers`: the workers started last, in any state, across runs.
#[utoipa::path(get, path = "/v1/workers", tag = "state", params(ListQuery),
    responses((status = 200, body = WorkerList, description = "The workers, newest first")))]
pub(crate) async fn workers(
    State(app): State<Arc<App>>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<WorkerList>, ApiError> {
    let workers = app
        .runtime
        .services()
        .ledger
        .workers(limit(query.limit))
        .await?;
    Ok(Json(WorkerList { workers }))
}

/// Branches of this host, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct BranchList {
    branches: Vec<super::branches::BranchView>,
}

/// `GET /v1/branches`: the branches this host started (branches are not stored; a
/// restarted host starts an empty list).
#[utoipa::path(get, path = "/v1/branches", tag = "state",
    responses((status = 200, body = BranchList, description = "The branches")))]
pub(crate) async fn branches(State(app): State<Arc<App>>) -> Json<BranchList> {
    Json(BranchList {
        branches: app.branches.list(),
    })
}

/// Which tasks.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TaskQuery {
    /// Only this status (`backlog`, `ready`, `in-progress`, `done`, ...).
    status: Option<String>,
    /// Only subtasks of this task.
    parent: Option<u64>,
    /// At most this many (default 100, at most 1000).
    limit: Option<u32>,
}

/// Tasks on the board.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct TaskList {
    /// Each with its number, title, status, priority, creator and metadata.
    tasks: Vec<crate::services::Task>,
}

/// `GET /v1/tasks`: the task board.
#[utoipa::path(get, path = "/v1/tasks", tag = "state", params(TaskQuery),
    responses((status = 200, body = TaskList, description = "The tasks"), (status = 400, body = ErrorBody, description = "Bad input; the message names the field and what it takes")))]
pub(crate) async fn tasks(
    State(app): State<Arc<App>>,
    ApiQuery(query): ApiQuery<TaskQuery>,
) -> Result<Json<TaskList>, ApiError> {
    let status = match &query.status {
        None => None,
        Some(text) => Some(
            text.parse::<TaskStatus>()
                .map_err(|err| ApiError::invalid(err.to_string()).param("status"))?,
        ),
    };
    let filter = TaskFilter {
        status,
        parent: query.parent,
        limit: Some(limit(query.limit)),
    };
    let tasks = app.runtime.services().tasks.list(filter).await?;
    Ok(Json(TaskList { tasks }))
}

/// One tool's row of the policy matrix.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PolicyRow {
    /// The tool.
    tool: String,
    /// Per process kind (`channel`, `branch`, `worker`, `compactor`, `cortex`): `on`, or
    /// why not (`not in the profile`, `capability fs.write not granted`, ...).
    #[schema(value_type = std::collections::BTreeMap<String, String>)]
    kinds: serde_json::Map<String, Value>,
}

/// The policy matrix: each tool, each process kind.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PolicyMatrix {
    /// The config it comes from, or `defaults`.
    source: String,
    /// The process kinds, in column order.
    kinds: Vec<String>,
    /// One row per tool.
    rows: Vec<PolicyRow>,
}

/// `GET /v1/policy`: which process kind is offered which tool, and why not.
#[utoipa::path(get, path = "/v1/policy", tag = "state",
    responses((status = 200, body = PolicyMatrix, description = "The matrix")))]
pub(crate) async fn policy(State(app): State<Arc<App>>) -> Json<PolicyMatrix> {
    let config = app.runtime.config();
    let rows = app
        .runtime
        .router()
        .catalog()
        .matrix()
        .into_iter()
        .map(|MatrixRow { tool, cells }| PolicyRow {
            tool,
            kinds: ProcessKind::ALL
                .iter()
                .zip(cells)
                .map(|(kind, decision)| (kind.to_string(), Value::String(decision.to_string())))
                .collect(),
        })
        .collect();
    Json(PolicyMatrix {
        source: config
            .source
            .as_ref()
            .map_or_else(|| "defaults".to_owned(), |p| p.display().to_string()),
        kinds: ProcessKind::ALL.iter().map(ToString::to_string).collect(),
        rows,
    })
}

/// A page of the audit log.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AuditQuery {
    /// Entries older than this id (the `next` of the previous page).
    before: Option<u64>,
    /// At most this many (default 100, at most 1000).
    limit: Option<u32>,
}

/// Audit entries, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AuditPage {
    /// Each with its id, time, process, tool, grants, redacted arguments, outcome, detail
    /// and duration.
    entries: Vec<crate::services::AuditEntry>,
    /// The `before` of the next page; absent on the last.
    next: Option<u64>,
}

/// `GET /v1/audit`: every tool call, denials included, newest first, in pages.
#[utoipa::path(get, path = "/v1/audit", tag = "state", params(AuditQuery),
    responses((status = 200, body = AuditPage, description = "A page of rows, newest first")))]
pub(crate) async fn audit(
    State(app): State<Arc<App>>,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let limit = limit(query.limit);
    // One more than asked: whether it comes says whether there is a next page.
    let mut entries = app
        .runtime
        .services()
        .audit
        .page(query.before, limit + 1)
        .await?;
    let more = entries.len() > limit as usize;
    entries.truncate(limit as usize);
    let next = more.then(|| entries.last().map(|e| e.id)).flatten();
    Ok(Json(AuditPage { entries, next }))
}

/// Which calls' costs, summed how.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct CostsQuery {
    /// What each row sums over: `conversation` (the default), `process`, `tool` or `day`.
    #[param(value_type = Option<String>)]
    by: Option<crate::services::CostsBy>,
    /// Only the calls of this conversation: `main`, or a session key (`channel:main`).
    conversation: Option<String>,
}

/// `GET /v1/audit/costs`: the receipts of tool calls (wall time, peak memory, bytes in and
/// out, outbound requests and their bytes) summed by conversation, process, tool or day,
/// with their total.
#[utoipa::path(get, path = "/v1/audit/costs", tag = "state", params(CostsQuery),
    responses((status = 200, body = crate::services::CostReport,
               description = "One row per group, ordered by it, and the total")))]
pub(crate) async fn costs(
    State(app): State<Arc<App>>,
    ApiQuery(query): ApiQuery<CostsQuery>,
) -> Result<Json<crate::services::CostReport>, ApiError> {
    let of = match query.conversation.as_deref() {
        Some(name) => crate::services::CostsOf::conversation(name)
            .map_err(|why| ApiError::invalid(format!("conversation: {why}")))?,
        None => crate::services::CostsOf::default(),
    };
    let rows = app
        .runtime
        .services()
        .audit
        .costs(query.by.unwrap_or_default(), &of)
        .await?;
    Ok(Json(crate::services::CostReport::of(rows)))
}

/// Outbound requests, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct RequestList {
    /// Each with its process, tool, method, host, port, address, status, sizes, decision
    /// and rule.
    requests: Vec<crate::services::RequestEntry>,
}

/// `GET /v1/audit/requests`: the outbound requests tools made or tried, newest first.
#[utoipa::path(get, path = "/v1/audit/requests", tag = "state", params(ListQuery),
    responses((status = 200, body = RequestList, description = "The requests, newest first")))]
pub(crate) async fn requests(
    State(app): State<Arc<App>>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<Json<RequestList>, ApiError> {
    let requests = app
        .runtime
        .services()
        .audit
        .recent_requests(limit(query.limit))
        .await?;
    Ok(Json(RequestList { requests }))
}

/// A loaded plugin.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PluginView {
    name: String,
    wit_version: String,
    tools: Vec<String>,
    imports: Vec<String>,
}

/// Plugins loaded and refused.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PluginList {
    loaded: Vec<PluginView>,
    /// Why each refused file was refused.
    refused: Vec<String>,
}

/// `GET /v1/plugins`: the plugins loaded, and the files refused with why.
#[utoipa::path(get, path = "/v1/plugins", tag = "state",
    responses((status = 200, body = PluginList, description = "The plugins")))]
pub(crate) async fn plugins(State(app): State<Arc<App>>) -> Json<PluginList> {
    let registry = app.runtime.router().registry();
    let loaded = registry
        .plugins()
        .iter()
        .map(|p| PluginView {
            name: p.name().to_owned(),
            wit_version: p.wit_version().to_owned(),
            tools: p.tools().iter().map(|t| t.name.clone()).collect(),
            imports: p.imports().to_vec(),
        })
        .collect();
    let refused = registry.refused().iter().map(ToString::to_string).collect();
    Json(PluginList { loaded, refused })
}

/// A tool and who is offered it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ToolView {
    name: String,
    description: String,
    /// The capabilities it declares.
    capabilities: Vec<String>,
    /// The JSON Schema of its arguments.
    #[schema(value_type = Object)]
    args_schema: Value,
    /// The process kinds offered it.
    offered_to: Vec<String>,
}

/// Every tool.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ToolList {
    tools: Vec<ToolView>,
}

/// `GET /v1/tools`: every tool, host and plugin, with the process kinds offered it.
#[utoipa::path(get, path = "/v1/tools", tag = "state",
    responses((status = 200, body = ToolList, description = "The tools")))]
pub(crate) async fn tools(State(app): State<Arc<App>>) -> Json<ToolList> {
    let catalog = app.runtime.router().catalog();
    let tools = catalog
        .tools()
        .iter()
        .map(|tool| ToolView {
            offered_to: catalog
                .offered_to(tool.name())
                .iter()
                .map(ToString::to_string)
                .collect(),
            name: tool.def.name.clone(),
            description: tool.def.description.clone(),
            capabilities: tool.capabilities.iter().map(ToString::to_string).collect(),
            args_schema: tool.def.parameters.clone(),
        })
        .collect();
    Json(ToolList { tools })
}
