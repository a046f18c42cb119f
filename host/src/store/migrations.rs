//! Numbered schema migrations. Each runs once, in a transaction, and sets `user_version`.

use std::path::Path;

use rusqlite::Connection;

use super::StoreError;

/// The migrations, in order; the schema version is the number applied.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema.
    r#"
    CREATE TABLE tasks (
        number          INTEGER PRIMARY KEY AUTOINCREMENT,
        title           TEXT NOT NULL,
        description     TEXT NOT NULL DEFAULT '',
        status          TEXT NOT NULL,
        priority        TEXT NOT NULL,
        creator         TEXT NOT NULL,
        assigned_worker TEXT,
        parent          INTEGER REFERENCES tasks(number),
        metadata        TEXT NOT NULL DEFAULT '{}',
        created_at      INTEGER NOT NULL,
        updated_at      INTEGER NOT NULL
    );
    CREATE INDEX tasks_status ON tasks(status);
    CREATE INDEX tasks_parent ON tasks(parent);

    CREATE TABLE memories (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        kind        TEXT NOT NULL,
        content     TEXT NOT NULL,
        importance  REAL NOT NULL,
        source      TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE VIRTUAL TABLE memories_fts USING fts5(
        content, kind, content='memories', content_rowid='id'
    );
    CREATE TRIGGER memories_ai AFTER INSERT ON memories BEGIN
        INSERT INTO memories_fts(rowid, content, kind) VALUES (new.id, new.content, new.kind);
    END;
    CREATE TRIGGER memories_ad AFTER DELETE ON memories BEGIN
        INSERT INTO memories_fts(memories_fts, rowid, content, kind)
            VALUES ('delete', old.id, old.content, old.kind);
    END;

    CREATE TABLE working_memory (
        key         TEXT PRIMARY KEY,
        value       TEXT NOT NULL,
        expires_at  INTEGER,
        updated_at  INTEGER NOT NULL
    );

    CREATE TABLE history (
        channel     TEXT NOT NULL,
        seq         INTEGER NOT NULL,
        message     TEXT NOT NULL,
        PRIMARY KEY (channel, seq)
    );

    CREATE TABLE workers (
        id          TEXT PRIMARY KEY,
        channel     TEXT NOT NULL,
        task        TEXT NOT NULL,
        state       TEXT NOT NULL,
        outcome     TEXT,
        started_at  INTEGER NOT NULL,
        updated_at  INTEGER NOT NULL
    );

    CREATE TABLE audit (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        at          INTEGER NOT NULL,
        process     TEXT NOT NULL,
        tool        TEXT NOT NULL,
        grants      TEXT NOT NULL,
        arguments   TEXT NOT NULL,
        outcome     TEXT NOT NULL,
        detail      TEXT NOT NULL,
        duration_us INTEGER NOT NULL
    );
    "#,
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Brings the database at `path` up to [`SCHEMA_VERSION`].
pub(crate) fn apply(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    let current: u32 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
    if current > SCHEMA_VERSION {
        return Err(StoreError::TooNew {
            path: path.to_owned(),
            found: current,
            supported: SCHEMA_VERSION,
        });
    }
    for (index, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let version = index as u32 + 1;
        let failed = |source| StoreError::Migration {
            path: path.to_owned(),
            version,
            source,
        };
        let tx = conn.transaction().map_err(failed)?;
        tx.execute_batch(sql).map_err(failed)?;
        tx.pragma_update(None, "user_version", version)
            .map_err(failed)?;
        tx.commit().map_err(failed)?;
    }
    Ok(())
}
