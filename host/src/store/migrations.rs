//! Numbered schema migrations. Each runs once, in an immediate transaction that re-reads
//! `user_version` first, so processes opening a new database at once apply each migration
//! exactly once between them. Released migrations are never edited: a change is a new one.

use std::path::Path;

use rusqlite::{Connection, TransactionBehavior};

use super::{StoreError, retry};

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
    // 2: persisted counters, for process numbers unique across runs and processes.
    r#"
    CREATE TABLE counters (
        kind        TEXT PRIMARY KEY,
        last        INTEGER NOT NULL
    );
    "#,
    // 3: runs, and which run owns each worker, so a killed run's workers can be found.
    r#"
    CREATE TABLE runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        pid         INTEGER NOT NULL,
        started_at  INTEGER NOT NULL
    );
    ALTER TABLE workers ADD COLUMN run INTEGER REFERENCES runs(id);
    CREATE INDEX workers_state ON workers(state);
    "#,
    // 4: typed ids. Conversations are stored under their session key (`channel:main`,
    // `cortex:main`), and the counters start past every number an earlier capstan
    // handed out (from one counter shared by all kinds), so no id is used twice.
    r#"
    UPDATE history SET channel = 'channel:' || channel WHERE instr(channel, ':') = 0;
    UPDATE workers SET channel = 'channel:' || channel WHERE instr(channel, ':') = 0;
    INSERT INTO counters (kind, last)
    SELECT kinds.kind, used.n
    FROM (SELECT 'worker' AS kind UNION ALL SELECT 'branch' UNION ALL SELECT 'compactor') AS kinds,
         (SELECT COALESCE(MAX(CAST(substr(id, instr(id, ':') + 1) AS INTEGER)), 0) AS n
          FROM (SELECT id FROM workers
                UNION ALL SELECT creator FROM tasks
                UNION ALL SELECT assigned_worker FROM tasks WHERE assigned_worker IS NOT NULL
                UNION ALL SELECT process FROM audit)
          WHERE id GLOB 'worker:[0-9]*' OR id GLOB 'branch:[0-9]*'
             OR id GLOB 'compactor:[0-9]*') AS used
    WHERE used.n > 0
    ON CONFLICT(kind) DO UPDATE SET last = max(counters.last, excluded.last);
    "#,
    // 5: outbound requests, one row each (allowed, refused or failed).
    r#"
    CREATE TABLE net_requests (
        id              INTEGER PRIMARY KEY AUTOINCREMENT,
        at              INTEGER NOT NULL,
        process         TEXT NOT NULL,
        tool            TEXT NOT NULL,
        method          TEXT NOT NULL,
        scheme          TEXT NOT NULL,
        host            TEXT NOT NULL,
        port            INTEGER NOT NULL,
        address         TEXT,
        status          INTEGER,
        bytes_sent      INTEGER NOT NULL,
        bytes_received  INTEGER NOT NULL,
        duration_us     INTEGER NOT NULL,
        decision        TEXT NOT NULL,
        grant_rule      TEXT NOT NULL,
        detail          TEXT NOT NULL
    );
    CREATE INDEX net_requests_process ON net_requests(process);
    "#,
    // 6: audit rows numbered without AUTOINCREMENT, which wrote a second page (its
    // counter in sqlite_sequence) at every commit. Rows are never deleted, so an id is
    // still one more than the last.
    r#"
    CREATE TABLE audit_v6 (
        id          INTEGER PRIMARY KEY,
        at          INTEGER NOT NULL,
        process     TEXT NOT NULL,
        tool        TEXT NOT NULL,
        grants      TEXT NOT NULL,
        arguments   TEXT NOT NULL,
        outcome     TEXT NOT NULL,
        detail      TEXT NOT NULL,
        duration_us INTEGER NOT NULL
    );
    INSERT INTO audit_v6 (id, at, process, tool, grants, arguments, outcome, detail, duration_us)
        SELECT id, at, process, tool, grants, arguments, outcome, detail, duration_us FROM audit;
    DROP TABLE audit;
    ALTER TABLE audit_v6 RENAME TO audit;
    "#,
    // 7: parked calls and their approvals, and the signed chain of decisions.
    r#"
    CREATE TABLE approvals (
        id          INTEGER PRIMARY KEY,
        process     TEXT NOT NULL,
        tool        TEXT NOT NULL,
        arguments   TEXT NOT NULL,
        digest      TEXT NOT NULL,
        reason      TEXT NOT NULL,
        label       TEXT NOT NULL,
        state       TEXT NOT NULL,
        requested_at INTEGER NOT NULL,
        decided_at  INTEGER,
        decided_by  TEXT,
        expires_at  INTEGER,
        uses_left   INTEGER NOT NULL DEFAULT 0
    );
    CREATE INDEX approvals_call ON approvals(process, tool, digest, state);
    CREATE INDEX approvals_state ON approvals(state);

    CREATE TABLE audit_chain (
        seq         INTEGER PRIMARY KEY,
        at          INTEGER NOT NULL,
        event       TEXT NOT NULL,
        process     TEXT NOT NULL,
        tool        TEXT NOT NULL,
        digest      TEXT NOT NULL,
        approval    INTEGER,
        by_whom     TEXT NOT NULL,
        detail      TEXT NOT NULL,
        key         TEXT NOT NULL,
        prev        TEXT NOT NULL,
        hash        TEXT NOT NULL,
        signature   TEXT NOT NULL
    );
    "#,
    // 8: the handles a parked call carried, and whether a person endorsed their values.
    r#"
    ALTER TABLE approvals ADD COLUMN handles TEXT NOT NULL DEFAULT '';
    ALTER TABLE approvals ADD COLUMN endorsed INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX approvals_endorsed ON approvals(process) WHERE endorsed = 1;
    "#,
    // 9: the label of each workspace file a process wrote, by the file's identity.
    r#"
    CREATE TABLE file_labels (
        workspace   TEXT NOT NULL,
        dev         INTEGER NOT NULL,
        ino         INTEGER NOT NULL,
        path        TEXT NOT NULL,
        len         INTEGER NOT NULL,
        ctime_ns    INTEGER NOT NULL,
        label       TEXT NOT NULL,
        PRIMARY KEY (workspace, dev, ino)
    );
    CREATE INDEX file_labels_path ON file_labels(workspace, path);
    "#,
    // 10: what went into each task and memory; rows from before are of unknown origin.
    r#"
    ALTER TABLE tasks ADD COLUMN label TEXT NOT NULL DEFAULT '{"untrusted":["plugin:*"],"more":[0,1,0]}';
    ALTER TABLE memories ADD COLUMN label TEXT NOT NULL DEFAULT '{"untrusted":["plugin:*"],"more":[0,1,0]}';
    "#,
    // 11: what went into each working-memory entry; entries from before are of unknown origin.
    r#"
    ALTER TABLE working_memory ADD COLUMN label TEXT NOT NULL DEFAULT '{"untrusted":["plugin:*"],"more":[0,1,0]}';
    "#,
    // 12: each call's receipt and the conversation it was part of; rows from before have
    // none (zeros, and no conversation).
    r#"
    ALTER TABLE audit ADD COLUMN conversation TEXT;
    ALTER TABLE audit ADD COLUMN peak_memory_bytes INTEGER;
    ALTER TABLE audit ADD COLUMN bytes_in INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN bytes_out INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN requests INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN requests_refused INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN request_bytes_sent INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN request_bytes_received INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN fuel INTEGER;
    CREATE INDEX audit_conversation ON audit(conversation);
    "#,
];

/// The schema version this binary writes.
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// Brings the database at `path` up to [`SCHEMA_VERSION`], one immediate transaction per
/// migration; a migration another process applied meanwhile is skipped.
pub(crate) fn apply(conn: &mut Connection, path: &Path) -> Result<(), StoreError> {
    loop {
        let applied = retry::retry_busy(|| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let current: u32 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
            if current > SCHEMA_VERSION {
                return Err(StoreError::TooNew {
                    path: path.to_owned(),
                    found: current,
                    supported: SCHEMA_VERSION,
                });
            }
            let Some(sql) = MIGRATIONS.get(current as usize) else {
                return Ok(false);
            };
            let version = current + 1;
            let failed = |source| StoreError::Migration {
                path: path.to_owned(),
                version,
                source,
            };
            tx.execute_batch(sql).map_err(failed)?;
            tx.pragma_update(None, "user_version", version)
                .map_err(failed)?;
            tx.commit().map_err(failed)?;
            Ok(true)
        })?;
        if !applied {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{DATABASE_FILE, Store};

    /// A database written by a capstan with only the first schema: bare channel names,
    /// ids from one counter shared by all kinds.
    fn version_one(dir: &Path) {
        let conn = Connection::open(dir.join(DATABASE_FILE)).unwrap();
        conn.execute_batch(MIGRATIONS[0]).unwrap();
        conn.execute_batch(
            "INSERT INTO history VALUES ('main', 0, '{\"role\":\"user\",\"content\":\"hi\"}');
             INSERT INTO workers VALUES ('worker:7', 'main', 'old job', 'done', NULL, 0, 0);
             INSERT INTO working_memory VALUES ('plan', 'from before labels', NULL, 0);
             INSERT INTO memories (kind, content, importance, source, created_at)
                 VALUES ('fact', 'an old memory', 0.5, 'worker:7', 0);
             INSERT INTO audit (at, process, tool, grants, arguments, outcome, detail, duration_us)
                 VALUES (0, 'branch:9', 'file_read', '', '{}', 'ok', '', 1);",
        )
        .unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
    }

    #[test]
    fn old_conversations_move_to_their_session_keys_and_numbers_never_repeat() {
        let dir = tempfile::tempdir().unwrap();
        version_one(dir.path());
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        assert_eq!(store.load_history("channel:main").unwrap().len(), 1);
        assert!(store.load_history("main").unwrap().is_empty());
        assert_eq!(
            store
                .get_worker(&crate::ids::testing::pid("worker:7"))
                .unwrap()
                .unwrap()
                .channel,
            crate::ids::testing::pid("channel:main")
        );
        // The old counter reached 9 (branch:9): every kind goes on past it.
        use crate::ids::ProcessKind::{Branch, Compactor, Worker};
        for kind in [Worker, Branch, Compactor] {
            assert_eq!(store.next_process_number(kind).unwrap(), 10, "{kind}");
        }
    }

    #[test]
    fn audit_rows_keep_their_ids_and_new_ones_follow_the_last() {
        let dir = tempfile::tempdir().unwrap();
        version_one(dir.path());
        let store = Store::open(dir.path()).unwrap();
        let record = crate::services::AuditRecord {
            process: "worker:1".into(),
            tool: "echo".into(),
            grants: String::new(),
            arguments: "{}".into(),
            outcome: "ok".into(),
            detail: String::new(),
            duration_us: 1,
            conversation: None,
            receipt: crate::services::Receipt::default(),
        };
        store.record_call(&record).unwrap();
        let ids: Vec<(u64, String)> = store
            .audit_log(10)
            .unwrap()
            .into_iter()
            .map(|entry| (entry.id, entry.process))
            .collect();
        assert_eq!(ids, [(2, "worker:1".into()), (1, "branch:9".into())]);
        let conn = Connection::open(dir.path().join(DATABASE_FILE)).unwrap();
        let counters: i64 = conn
            .query_row(
                "SELECT count(*) FROM sqlite_sequence WHERE name = 'audit'",
                [],
                |row| row.get(0),
            )
            .unwrap();
        assert_eq!(counters, 0, "no AUTOINCREMENT counter is kept for audit");
    }

    #[test]
    fn what_was_stored_before_labels_reads_back_as_of_unknown_origin() {
        use crate::flow::Label;
        let dir = tempfile::tempdir().unwrap();
        version_one(dir.path());
        let store = Store::open(dir.path()).unwrap();
        let entry = store.working_get("plan").unwrap().unwrap();
        assert_eq!(entry.value, "from before labels");
        assert_eq!(entry.label, Label::unknown());
        let recalled = store.recall("old memory", 5).unwrap();
        assert_eq!(recalled[0].label, Label::unknown());
    }
}
