//! What tool calls cost: each call's [`Receipt`], kept on its audit row, and their sums
//! ([`Costs`]) by conversation, process, tool or day.

use serde::{Deserialize, Serialize};

use crate::ids::{ProcessId, ProcessKind};
use crate::text::one_line;

/// What one tool call used, as the host measured it (never as the tool reports it). The
/// wall time is the row's `duration_us`.
///
/// ```
/// use capstan_host::services::Receipt;
///
/// let receipt = Receipt { bytes_in: 12, bytes_out: 3, ..Receipt::default() };
/// assert_eq!(receipt.peak_memory_bytes, None);
/// assert_eq!(receipt.requests, 0);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Receipt {
    /// The most linear memory the call's instance held during the call, all its memories
    /// together, in bytes (an instance kept from an earlier call counts what it held when
    /// the call began). `None`: no instance ran (a refusal, a host tool, an external one).
    pub peak_memory_bytes: Option<u64>,
    /// Bytes of the arguments.
    pub bytes_in: u64,
    /// Bytes of what the call gave back: its result, or its error's message.
    pub bytes_out: u64,
    /// Outbound requests the host let out (answered or failed).
    pub requests: u32,
    /// Outbound requests the host refused before sending anything.
    pub requests_refused: u32,
    /// Request body bytes its requests sent.
    pub request_bytes_sent: u64,
    /// Response body bytes its requests received.
    pub request_bytes_received: u64,
    /// The instructions it ran, as wasmtime's fuel counts them (about one unit per Wasm
    /// instruction), when `limits.tool_fuel` is on; `None` otherwise, or when no
    /// instance ran.
    pub fuel: Option<u64>,
}

impl Receipt {
    /// Each figure by its name (as its column is named), `None` where it was not measured.
    pub fn figures(&self) -> [(&'static str, Option<u64>); 8] {
        [
            ("peak_memory_bytes", self.peak_memory_bytes),
            ("bytes_in", Some(self.bytes_in)),
            ("bytes_out", Some(self.bytes_out)),
            ("requests", Some(u64::from(self.requests))),
            ("requests_refused", Some(u64::from(self.requests_refused))),
            ("request_bytes_sent", Some(self.request_bytes_sent)),
            ("request_bytes_received", Some(self.request_bytes_received)),
            ("fuel", self.fuel),
        ]
    }
}

/// What [`Costs`] are summed by: each value of it is one row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CostsBy {
    /// The conversation whose work the call was (`channel:main`); a door's calls (`cli`,
    /// `mcp:...`) have none.
    #[default]
    Conversation,
    /// The calling process (`worker:3`) or client.
    Process,
    /// The tool.
    Tool,
    /// The day the call was recorded, UTC (`2026-12-02`).
    Day,
}

impl CostsBy {
    /// `conversation`, `process`, `tool` or `day`.
    pub fn as_str(self) -> &'static str {
        match self {
            CostsBy::Conversation => "conversation",
            CostsBy::Process => "process",
            CostsBy::Tool => "tool",
            CostsBy::Day => "day",
        }
    }

    /// The grouping [`CostsBy::as_str`] names.
    pub fn parse(text: &str) -> Option<Self> {
        [Self::Conversation, Self::Process, Self::Tool, Self::Day]
            .into_iter()
            .find(|by| by.as_str() == text)
    }
}

/// The UTC day of Unix time `at`, `YYYY-MM-DD`: how every store names a day.
pub fn day_of(at: i64) -> String {
    chrono::DateTime::from_timestamp(at, 0).map_or_else(
        || "(out of range)".to_owned(),
        |t| t.date_naive().to_string(),
    )
}

/// The summed receipts of a group of calls.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Costs {
    /// The group's value (a conversation, process, tool or day); `None`: calls of no
    /// conversation, or the total.
    pub key: Option<String>,
    /// Calls.
    pub calls: u64,
    /// Of them, those that did not end `ok` (refusals included).
    pub failed: u64,
    /// Their wall time, summed, in microseconds.
    pub duration_us: u64,
    /// The highest peak memory of any of them, in bytes; `None`: no instance ran.
    pub peak_memory_bytes: Option<u64>,
    /// Argument bytes, summed.
    pub bytes_in: u64,
    /// Result and error bytes, summed.
    pub bytes_out: u64,
    /// Outbound requests let out, summed.
    pub requests: u64,
    /// Outbound requests refused, summed.
    pub requests_refused: u64,
    /// Request body bytes sent, summed.
    pub request_bytes_sent: u64,
    /// Response body bytes received, summed.
    pub request_bytes_received: u64,
    /// Fuel, summed over the calls that counted it; `None`: none did.
    pub fuel: Option<u64>,
}

impl Costs {
    /// Adds one call that took `duration_us`, ended `ok` or not, and used `r`.
    pub fn add(&mut self, r: &Receipt, ok: bool, duration_us: u64) {
        self.calls += 1;
        self.failed += u64::from(!ok);
        self.duration_us += duration_us;
        self.peak_memory_bytes = self.peak_memory_bytes.max(r.peak_memory_bytes);
        self.bytes_in += r.bytes_in;
        self.bytes_out += r.bytes_out;
        self.requests += u64::from(r.requests);
        self.requests_refused += u64::from(r.requests_refused);
        self.request_bytes_sent += r.request_bytes_sent;
        self.request_bytes_received += r.request_bytes_received;
        self.fuel = add_counted(self.fuel, r.fuel);
    }

    /// Adds a group's sums: what a total over groups is.
    pub fn merge(&mut self, other: &Costs) {
        self.calls += other.calls;
        self.failed += other.failed;
        self.duration_us += other.duration_us;
        self.peak_memory_bytes = self.peak_memory_bytes.max(other.peak_memory_bytes);
        self.bytes_in += other.bytes_in;
        self.bytes_out += other.bytes_out;
        self.requests += other.requests;
        self.requests_refused += other.requests_refused;
        self.request_bytes_sent += other.request_bytes_sent;
        self.request_bytes_received += other.request_bytes_received;
        self.fuel = add_counted(self.fuel, other.fuel);
    }
}

/// `a + b` where either was counted: `None` only when neither was.
fn add_counted(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

/// Sums by some grouping and their total: what `capstan audit costs --json` prints and
/// `GET /v1/audit/costs` answers.
///
/// ```
/// use capstan_host::services::{CostReport, Costs};
///
/// let one = Costs { key: Some("read".into()), calls: 2, ..Costs::default() };
/// let two = Costs { key: Some("fetch".into()), calls: 3, requests: 4, ..Costs::default() };
/// let report = CostReport::of(vec![one, two]);
/// assert_eq!((report.total.calls, report.total.requests), (5, 4));
/// assert_eq!(report.total.key, None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CostReport {
    /// One row per value of the grouping, ordered by it.
    pub rows: Vec<Costs>,
    /// The rows together.
    pub total: Costs,
}

impl CostReport {
    /// `rows`, and their total.
    pub fn of(rows: Vec<Costs>) -> Self {
        let mut total = Costs::default();
        for row in &rows {
            total.merge(row);
        }
        CostReport { rows, total }
    }
}

/// Which calls [`Costs`] are summed over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostsOf {
    /// Only the calls of this conversation (`channel:main`).
    pub conversation: Option<String>,
}

impl CostsOf {
    /// The calls of the conversation `name`: a session key (`channel:main`,
    /// `cortex:main`), or a bare name for a user channel (`main`); refused, saying why,
    /// unless the name is one a conversation can have.
    ///
    /// ```
    /// use capstan_host::services::CostsOf;
    ///
    /// let of = |name| CostsOf::conversation(name).map(|of| of.conversation.unwrap());
    /// assert_eq!(of("main").unwrap(), "channel:main");
    /// assert_eq!(of("cortex:main").unwrap(), "cortex:main");
    /// assert!(of("").is_err() && of("main' OR 1=1").is_err() && of("nobody:main").is_err());
    /// ```
    pub fn conversation(name: &str) -> Result<Self, String> {
        let (kind, name) = match name.split_once(':') {
            Some((kind, name)) => (
                kind.parse::<ProcessKind>()
                    .map_err(|_| format!("`{}` is not a process kind", one_line(kind)))?,
                name,
            ),
            None => (ProcessKind::Channel, name),
        };
        let id = ProcessId::conversation(kind, name)?;
        Ok(CostsOf {
            conversation: Some(id.session().as_str().to_owned()),
        })
    }

    /// Whether a call of `conversation` (`None`: of none) is one of these calls.
    pub fn holds(&self, conversation: Option<&str>) -> bool {
        self.conversation
            .as_deref()
            .is_none_or(|c| conversation == Some(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_has_its_span_key_spelled_right() {
        for (name, _) in Receipt::default().figures() {
            let key = crate::telemetry::spans::receipt_key(name);
            assert_eq!(key, format!("capstan.receipt.{name}"));
        }
    }
}
