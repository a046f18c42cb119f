//! The audit log: one entry per tool call, denials included, with secret-looking argument
//! values redacted before they are kept.

use std::pin::Pin;

use async_trait::async_trait;
use serde::Serialize;
use serde_json::Value;

use super::ServiceError;
use super::receipt::{Costs, CostsBy, CostsOf, Receipt, day_of};

/// Where every tool call is recorded.
///
/// ```
/// use capstan_host::services::{AuditRecord, Receipt, Services};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let services = Services::in_memory();
/// let call = AuditRecord {
///     conversation: Some("channel:main".into()),
///     process: "branch:1".into(),
///     tool: "file_read".into(),
///     grants: "fs.read".into(),
///     arguments: r#"{"path":"a.txt","token":"hunter2"}"#.into(),
///     outcome: "ok".into(),
///     detail: String::new(),
///     duration_us: 42,
///     receipt: Receipt { bytes_in: 35, ..Receipt::default() },
/// };
/// services.audit.record(call).await.unwrap();
/// let log = services.audit.recent(10).await.unwrap();
/// assert!(!log[0].arguments.contains("hunter2"));
/// # });
/// ```
#[async_trait]
pub trait AuditSink: Send + Sync {
    /// Records one call, its arguments [`redact`]ed.
    async fn record(&self, call: AuditRecord) -> Result<(), ServiceError>;

    /// Hands one call over to be recorded and returns before it need be committed: calls
    /// handed over together may share one commit, made when the first of them is waited
    /// for. [`Committing::wait`] returns once this one is committed; a row whose
    /// [`Committing`] is dropped unwaited is still written. The default records the call
    /// before it returns.
    async fn record_soon(&self, call: AuditRecord) -> Committing {
        Committing::done(self.record(call).await)
    }

    /// The newest `limit` entries, newest first.
    async fn recent(&self, limit: u32) -> Result<Vec<AuditEntry>, ServiceError> {
        self.page(None, limit).await
    }

    /// Up to `limit` entries older than entry `before` (all, without it), newest first:
    /// the next page starts before the last entry of this one.
    async fn page(&self, before: Option<u64>, limit: u32) -> Result<Vec<AuditEntry>, ServiceError>;

    /// The receipts of the calls `of` holds, summed by `by`, ordered by key (calls of no
    /// conversation first). The default reads every row through [`AuditSink::page`];
    /// a database sums where the rows are.
    async fn costs(&self, by: CostsBy, of: &CostsOf) -> Result<Vec<Costs>, ServiceError> {
        let mut entries = Vec::new();
        let mut before = None;
        loop {
            let page = self.page(before, COSTS_PAGE).await?;
            let Some(last) = page.last() else { break };
            before = Some(last.id);
            entries.extend(
                page.into_iter()
                    .filter(|e| of.holds(e.conversation.as_deref())),
            );
        }
        Ok(sum_costs(&entries, by, of))
    }

    /// Records one outbound request a tool made or tried to make.
    async fn record_request(&self, request: RequestRecord) -> Result<(), ServiceError>;

    /// The newest `limit` requests, newest first.
    async fn recent_requests(&self, limit: u32) -> Result<Vec<RequestEntry>, ServiceError>;

    /// Where the log is kept, or that it is not: what `capstan policy` shows.
    fn destination(&self) -> AuditDestination;
}

/// Rows read per page by the default [`AuditSink::costs`].
const COSTS_PAGE: u32 = 1000;

/// Where an [`AuditSink`] keeps what it records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditDestination {
    /// Kept: the database, or "memory" for a sink that forgets at exit.
    Kept(String),
    /// Not kept: the sink is [`AuditSink::disabled`](trait.AuditSink.html#method.disabled),
    /// for this reason.
    Disabled(&'static str),
}

impl std::fmt::Display for AuditDestination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AuditDestination::Kept(place) => write!(f, "kept in {place}"),
            AuditDestination::Disabled(why) => write!(f, "disabled: {why}"),
        }
    }
}

impl dyn AuditSink {
    /// The sink of a host built without a store: it keeps nothing, and says so where the
    /// log's destination is shown. A host never goes without a sink; this is the explicit
    /// way to have none.
    ///
    /// ```
    /// use capstan_host::services::{AuditDestination, AuditSink};
    ///
    /// let sink = <dyn AuditSink>::disabled();
    /// assert!(matches!(sink.destination(), AuditDestination::Disabled(_)));
    /// ```
    pub fn disabled() -> std::sync::Arc<dyn AuditSink> {
        std::sync::Arc::new(DisabledAudit)
    }
}

/// Why [`AuditSink::disabled`](trait.AuditSink.html#method.disabled) keeps nothing.
pub const NO_STORE: &str = "this host was built without a store, so no call is recorded";

/// See `<dyn AuditSink>::disabled`.
struct DisabledAudit;

#[async_trait]
impl AuditSink for DisabledAudit {
    async fn record(&self, _call: AuditRecord) -> Result<(), ServiceError> {
        Ok(())
    }

    async fn page(
        &self,
        _before: Option<u64>,
        _limit: u32,
    ) -> Result<Vec<AuditEntry>, ServiceError> {
        Ok(Vec::new())
    }

    async fn record_request(&self, _request: RequestRecord) -> Result<(), ServiceError> {
        Ok(())
    }

    async fn recent_requests(&self, _limit: u32) -> Result<Vec<RequestEntry>, ServiceError> {
        Ok(Vec::new())
    }

    fn destination(&self) -> AuditDestination {
        AuditDestination::Disabled(NO_STORE)
    }
}

/// A row handed over to be written: [`Committing::wait`] returns once it is committed,
/// or with the reason it was not.
#[must_use = "the row is committed for sure only once waited for"]
pub struct Committing(Pin<Box<dyn Future<Output = Result<(), ServiceError>> + Send>>);

impl Committing {
    /// A row whose commit `waited` waits for.
    pub fn new(waited: impl Future<Output = Result<(), ServiceError>> + Send + 'static) -> Self {
        Committing(Box::pin(waited))
    }

    /// A row already written (or refused) with `outcome`.
    pub fn done(outcome: Result<(), ServiceError>) -> Self {
        Committing::new(std::future::ready(outcome))
    }

    /// Waits until the row is committed.
    pub async fn wait(self) -> Result<(), ServiceError> {
        self.0.await
    }
}

impl std::fmt::Debug for Committing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Committing")
    }
}

/// What the host decided about one outbound request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum RequestDecision {
    /// Sent, and a response came back (any status).
    Allowed,
    /// Not sent: a grant or a limit refused it.
    Refused,
    /// Sent (or tried), but the connection, the server or a limit on the response ended it.
    Failed,
}

impl RequestDecision {
    /// `allowed`, `refused` or `failed`.
    pub fn as_str(self) -> &'static str {
        match self {
            RequestDecision::Allowed => "allowed",
            RequestDecision::Refused => "refused",
            RequestDecision::Failed => "failed",
        }
    }

    /// The decision named by [`RequestDecision::as_str`].
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Allowed, Self::Refused, Self::Failed]
            .into_iter()
            .find(|d| d.as_str() == text)
    }
}

/// One outbound request to record. It never holds a path, a query, a header or a body:
/// those may carry what the audit log must not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RequestRecord {
    /// The process whose tool made it, e.g. `worker:3`.
    pub process: String,
    /// The tool.
    pub tool: String,
    /// `GET`, `POST`, ...
    pub method: String,
    /// `http` or `https`.
    pub scheme: String,
    /// The host, canonical.
    pub host: String,
    /// The port.
    pub port: u16,
    /// The address connected to, if it got that far.
    pub address: Option<String>,
    /// The response status, if one came.
    pub status: Option<u16>,
    /// Request body bytes sent.
    pub bytes_sent: u64,
    /// Response body bytes received.
    pub bytes_received: u64,
    /// From the request to its end.
    pub duration_us: u64,
    /// Allowed, refused or failed.
    pub decision: RequestDecision,
    /// The rule that allowed it (declared and granted), or empty.
    pub grant: String,
    /// Why it was refused or failed, or empty; secrets redacted.
    pub detail: String,
}

/// A stored request row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct RequestEntry {
    /// Unix seconds.
    pub at: i64,
    /// The request.
    #[serde(flatten)]
    pub request: RequestRecord,
}

/// One tool call to record.
#[derive(Debug, Clone)]
pub struct AuditRecord {
    /// The conversation whose work the call was, by its session (`channel:main`): a
    /// worker's or branch's is the conversation that started it. `None` for a door's
    /// calls (`capstan tool call`, `capstan mcp`).
    pub conversation: Option<String>,
    /// The calling process, e.g. `worker:3`.
    pub process: String,
    /// The tool.
    pub tool: String,
    /// The effective grants, as text.
    pub grants: String,
    /// The arguments as given; the sink stores them [`redact`]ed.
    pub arguments: String,
    /// `ok` or the error kind.
    pub outcome: String,
    /// The error message, or empty.
    pub detail: String,
    /// How long the call took.
    pub duration_us: u64,
    /// What else it used.
    pub receipt: Receipt,
}

/// A stored audit row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct AuditEntry {
    /// Its number: increasing, never reused.
    pub id: u64,
    /// Unix seconds.
    pub at: i64,
    /// The conversation whose work the call was; `None` for a door's calls.
    pub conversation: Option<String>,
    /// The calling process.
    pub process: String,
    /// The tool.
    pub tool: String,
    /// The effective grants.
    pub grants: String,
    /// The arguments, redacted.
    pub arguments: String,
    /// `ok` or the error kind.
    pub outcome: String,
    /// The error message, or empty.
    pub detail: String,
    /// Microseconds.
    pub duration_us: u64,
    /// What else it used.
    #[serde(flatten)]
    pub receipt: Receipt,
}

/// Sums `entries` that `of` holds by `by`, ordered by key (calls of no conversation
/// first). What a store that cannot sum by itself answers.
///
/// ```
/// use capstan_host::services::{AuditEntry, Costs, CostsBy, CostsOf, Receipt, sum_costs};
///
/// let call = |tool: &str, requests| AuditEntry {
///     id: 1, at: 0, conversation: Some("channel:main".into()), process: "worker:1".into(),
///     tool: tool.into(), grants: String::new(), arguments: "{}".into(),
///     outcome: "ok".into(), detail: String::new(), duration_us: 10,
///     receipt: Receipt { requests, ..Receipt::default() },
/// };
/// let rows = sum_costs(&[call("fetch", 2), call("fetch", 1), call("read", 0)],
///                      CostsBy::Tool, &CostsOf::default());
/// assert_eq!(rows[0].key.as_deref(), Some("fetch"));
/// assert_eq!((rows[0].calls, rows[0].requests, rows[0].duration_us), (2, 3, 20));
/// assert_eq!(rows[1].calls, 1);
/// ```
pub fn sum_costs(entries: &[AuditEntry], by: CostsBy, of: &CostsOf) -> Vec<Costs> {
    let mut groups: std::collections::BTreeMap<Option<String>, Costs> = Default::default();
    for entry in entries
        .iter()
        .filter(|e| of.holds(e.conversation.as_deref()))
    {
        let key = match by {
            CostsBy::Conversation => entry.conversation.clone(),
            CostsBy::Process => Some(entry.process.clone()),
            CostsBy::Tool => Some(entry.tool.clone()),
            CostsBy::Day => Some(day_of(entry.at)),
        };
        groups
            .entry(key.clone())
            .or_insert_with(|| Costs {
                key,
                ..Costs::default()
            })
            .add(&entry.receipt, entry.outcome == "ok", entry.duration_us);
    }
    groups.into_values().collect()
}

/// The text that replaces a redacted value.
pub const REDACTED: &str = "[redacted]";

/// `arguments` with secret-looking values replaced by [`REDACTED`]: values under keys that
/// name secrets (`password`, `api_key`, `token`, ...) and strings shaped like credentials
/// (`sk-...`, `ghp_...`, `Bearer ...`, AWS key ids). Text that is not JSON is kept only as
/// its length.
pub fn redact(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(mut value) => {
            redact_value(&mut value);
            value.to_string()
        }
        Err(_) => format!("(not JSON, {} bytes)", arguments.len()),
    }
}

fn redact_value(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, item) in map.iter_mut() {
                if secret_key(key) && !item.is_null() {
                    *item = Value::String(REDACTED.into());
                } else {
                    redact_value(item);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact_value),
        Value::String(text) if secret_shaped(text) => *text = REDACTED.into(),
        _ => {}
    }
}

fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase().replace(['-', '_'], "");
    [
        "password",
        "passwd",
        "secret",
        "token",
        "apikey",
        "authorization",
        "credential",
        "privatekey",
    ]
    .iter()
    .any(|word| key.contains(word))
}

fn secret_shaped(text: &str) -> bool {
    let t = text.trim();
    let prefixed = [
        "sk-",
        "ghp_",
        "gho_",
        "github_pat_",
        "xoxb-",
        "xoxp-",
        "AKIA",
        "Bearer ",
    ]
    .iter()
    .any(|p| t.starts_with(p) && t.len() >= p.len() + 12);
    prefixed || t.starts_with("-----BEGIN") && t.contains("PRIVATE KEY")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_looking_values_are_redacted_and_the_rest_kept() {
        let args = r#"{"path":"a.txt","api_key":"abc","nested":{"Password":"p","n":1},
                       "headers":["Bearer abcdefghijklmnop"],"token":null,"note":"sk-live-1234567890abcdef"}"#;
        let out: Value = serde_json::from_str(&redact(args)).unwrap();
        assert_eq!(out["path"], "a.txt");
        assert_eq!(out["api_key"], REDACTED);
        assert_eq!(out["nested"]["Password"], REDACTED);
        assert_eq!(out["nested"]["n"], 1);
        assert_eq!(out["headers"][0], REDACTED);
        assert_eq!(out["token"], Value::Null);
        assert_eq!(out["note"], REDACTED);
        assert_eq!(redact("not json sk-123"), "(not JSON, 15 bytes)");
    }
}
