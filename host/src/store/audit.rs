//! The audit log: one row per tool call, denials included, with secret-looking argument
//! values redacted.

use rusqlite::params;
use serde::Serialize;
use serde_json::Value;

use super::{Store, StoreError, now, retry};

/// One tool call to record.
#[derive(Debug, Clone)]
pub struct AuditRecord<'a> {
    /// The calling process, e.g. `worker:3`.
    pub process: &'a str,
    /// The tool.
    pub tool: &'a str,
    /// The effective grants, as text.
    pub grants: &'a str,
    /// The arguments as given (redacted before storing).
    pub arguments: &'a str,
    /// `ok` or the error kind.
    pub outcome: &'a str,
    /// The error message, or empty.
    pub detail: &'a str,
    /// How long the call took.
    pub duration_us: u64,
}

/// A stored audit row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AuditEntry {
    /// Unix seconds.
    pub at: i64,
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
}

/// The text that replaces a redacted value.
pub const REDACTED: &str = "[redacted]";

impl Store {
    /// Records one call.
    pub fn record_call(&self, record: &AuditRecord<'_>) -> Result<(), StoreError> {
        let arguments = redact(record.arguments);
        let at = now();
        retry::write(&mut self.conn(), |tx| {
            tx.execute(
                "INSERT INTO audit (at, process, tool, grants, arguments, outcome, detail, duration_us)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![
                    at,
                    record.process,
                    record.tool,
                    record.grants,
                    arguments,
                    record.outcome,
                    record.detail,
                    record.duration_us as i64
                ],
            )?;
            Ok(())
        })
    }

    /// The newest `limit` audit rows, newest first.
    pub fn audit_log(&self, limit: u32) -> Result<Vec<AuditEntry>, StoreError> {
        let conn = self.conn();
        let mut stmt = conn.prepare_cached(
            "SELECT at, process, tool, grants, arguments, outcome, detail, duration_us
             FROM audit ORDER BY id DESC LIMIT ?1",
        )?;
        let rows = stmt.query_map([limit], |row| {
            Ok(AuditEntry {
                at: row.get(0)?,
                process: row.get(1)?,
                tool: row.get(2)?,
                grants: row.get(3)?,
                arguments: row.get(4)?,
                outcome: row.get(5)?,
                detail: row.get(6)?,
                duration_us: row.get::<_, i64>(7)? as u64,
            })
        })?;
        Ok(rows.collect::<Result<_, _>>()?)
    }
}

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

    #[test]
    fn calls_are_recorded_newest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        for (tool, outcome) in [("file_read", "ok"), ("file_write", "denied")] {
            store
                .record_call(&AuditRecord {
                    process: "branch:1",
                    tool,
                    grants: "fs.read",
                    arguments: r#"{"path":"x","password":"hunter2"}"#,
                    outcome,
                    detail: "",
                    duration_us: 42,
                })
                .unwrap();
        }
        let log = store.audit_log(10).unwrap();
        assert_eq!(log.len(), 2);
        assert_eq!(
            (log[0].tool.as_str(), log[0].outcome.as_str()),
            ("file_write", "denied")
        );
        assert!(
            !log[0].arguments.contains("hunter2"),
            "{}",
            log[0].arguments
        );
    }
}
