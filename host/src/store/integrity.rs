//! Damage detection at open: SQLite's header check and `PRAGMA quick_check`, before
//! anything writes to the file, so a damaged database is refused and left as it was.

use std::path::Path;

use rusqlite::{Connection, ErrorCode};

use super::StoreError;

/// How many of quick_check's findings an error quotes.
const FINDINGS_SHOWN: usize = 3;

/// Checks the database at `path` through `conn`; reads only.
pub(crate) fn check(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let findings = quick_check(conn).map_err(|err| match err.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => StoreError::NotADatabase {
            path: path.to_owned(),
        },
        Some(ErrorCode::DatabaseCorrupt) => StoreError::Damaged {
            path: path.to_owned(),
            detail: err.to_string(),
        },
        _ => StoreError::Open {
            path: path.to_owned(),
            source: err,
        },
    })?;
    if findings.len() == 1 && findings[0] == "ok" {
        return Ok(());
    }
    let mut detail = findings
        .iter()
        .take(FINDINGS_SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join("; ");
    if findings.len() > FINDINGS_SHOWN {
        detail.push_str(&format!("; and {} more", findings.len() - FINDINGS_SHOWN));
    }
    Err(StoreError::Damaged {
        path: path.to_owned(),
        detail,
    })
}

fn quick_check(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("PRAGMA quick_check")?;
    let rows = stmt.query_map([], |row| row.get::<_, String>(0))?;
    rows.collect()
}
