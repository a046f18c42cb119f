//! Numbered schema migrations. They run in one transaction that first takes a
//! transaction-scoped advisory lock (released at commit, so a connection pooler in
//! transaction mode keeps it), then reads the version: hosts starting at once apply each
//! migration exactly once between them. Released migrations are never edited.

use deadpool_postgres::Object;

use super::PgError;
use crate::services::Operation;

/// The advisory lock key of migrations: "capstan" in ASCII.
const MIGRATION_LOCK: i64 = 0x0063_6170_7374_616e;

/// The migrations, in order; the schema version is the number applied.
const MIGRATIONS: &[&str] = &[
    // 1: the first schema, as the SQLite store's after its migration 6.
    r#"
    CREATE TABLE tasks (
        number          BIGSERIAL PRIMARY KEY,
        title           TEXT NOT NULL,
        description     TEXT NOT NULL DEFAULT '',
        status          TEXT NOT NULL,
        priority        TEXT NOT NULL,
        creator         TEXT NOT NULL,
        assigned_worker TEXT,
        parent          BIGINT REFERENCES tasks(number),
        metadata        TEXT NOT NULL DEFAULT '{}',
        created_at      BIGINT NOT NULL,
        updated_at      BIGINT NOT NULL
    );
    CREATE INDEX tasks_status ON tasks(status);
    CREATE INDEX tasks_parent ON tasks(parent);

    CREATE TABLE memories (
        id          BIGSERIAL PRIMARY KEY,
        kind        TEXT NOT NULL,
        content     TEXT NOT NULL,
        importance  REAL NOT NULL,
        source      TEXT NOT NULL,
        created_at  BIGINT NOT NULL,
        -- services::memory_words of kind and content: split and lowercased by the host,
        -- so every backend finds a memory by the same words.
        words       TEXT[] NOT NULL
    );
    CREATE INDEX memories_words ON memories USING GIN (words);

    CREATE TABLE working_memory (
        key         TEXT PRIMARY KEY,
        value       TEXT NOT NULL,
        expires_at  BIGINT,
        updated_at  BIGINT NOT NULL
    );

    CREATE TABLE history_heads (
        channel     TEXT PRIMARY KEY,
        next        BIGINT NOT NULL
    );
    CREATE TABLE history (
        channel     TEXT NOT NULL,
        seq         BIGINT NOT NULL,
        message     TEXT NOT NULL,
        PRIMARY KEY (channel, seq)
    );

    CREATE TABLE counters (
        kind        TEXT PRIMARY KEY,
        last        BIGINT NOT NULL
    );

    CREATE TABLE runs (
        id          BIGSERIAL PRIMARY KEY,
        host        TEXT NOT NULL,
        pid         BIGINT NOT NULL,
        started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
        expires_at  TIMESTAMPTZ NOT NULL,
        ended_at    TIMESTAMPTZ
    );

    CREATE TABLE workers (
        id          TEXT PRIMARY KEY,
        channel     TEXT NOT NULL,
        task        TEXT NOT NULL,
        state       TEXT NOT NULL,
        outcome     TEXT,
        run         BIGINT REFERENCES runs(id),
        started     BIGSERIAL,
        started_at  BIGINT NOT NULL,
        updated_at  BIGINT NOT NULL
    );
    CREATE INDEX workers_state ON workers(state);

    CREATE TABLE audit (
        id          BIGSERIAL PRIMARY KEY,
        at          BIGINT NOT NULL,
        process     TEXT NOT NULL,
        tool        TEXT NOT NULL,
        grants      TEXT NOT NULL,
        arguments   TEXT NOT NULL,
        outcome     TEXT NOT NULL,
        detail      TEXT NOT NULL,
        duration_us BIGINT NOT NULL
    );

    CREATE TABLE net_requests (
        id              BIGSERIAL PRIMARY KEY,
        at              BIGINT NOT NULL,
        process         TEXT NOT NULL,
        tool            TEXT NOT NULL,
        method          TEXT NOT NULL,
        scheme          TEXT NOT NULL,
        host            TEXT NOT NULL,
        port            INTEGER NOT NULL,
        address         TEXT,
        status          INTEGER,
        bytes_sent      BIGINT NOT NULL,
        bytes_received  BIGINT NOT NULL,
        duration_us     BIGINT NOT NULL,
        decision        TEXT NOT NULL,
        grant_rule      TEXT NOT NULL,
        detail          TEXT NOT NULL
    );
    "#,
    // 2: which host's run owns each session (channel), and the epoch every takeover bumps.
    r#"
    CREATE TABLE sessions (
        channel     TEXT PRIMARY KEY,
        owner_run   BIGINT NOT NULL REFERENCES runs(id),
        epoch       BIGINT NOT NULL
    );
    "#,
    // 3: what hosts forward to sessions another host owns, until the owner takes it, and
    // the owner's answers; which worker holds each task description.
    r#"
    CREATE TABLE inbox (
        id          BIGSERIAL PRIMARY KEY,
        channel     TEXT NOT NULL,
        -- services::Forwarded, as JSON.
        body        TEXT NOT NULL,
        created_at  BIGINT NOT NULL,
        -- The run that took a user's message: the row goes with its answer, and is taken
        -- again if that run ends first.
        taken_run   BIGINT
    );
    CREATE INDEX inbox_channel ON inbox(channel, id);

    -- The owner's answer to a forwarded message, until the host that forwarded it takes it.
    CREATE TABLE answers (
        id          BIGINT PRIMARY KEY,
        -- services::Answer, as JSON.
        reply       TEXT NOT NULL,
        created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
    );
    CREATE INDEX answers_created_at ON answers(created_at);

    -- One worker per task description across hosts: the description (normalized) is
    -- held by a worker until it ends or its run is over.
    CREATE TABLE task_reservations (
        task        TEXT PRIMARY KEY,
        worker      TEXT NOT NULL,
        run         BIGINT NOT NULL REFERENCES runs(id)
    );
    "#,
    // 4: parked calls and their approvals, as the SQLite store's migration 7 (at most
    // one pending approval per call), and the signed chain of decisions.
    r#"
    CREATE TABLE approvals (
        id          BIGSERIAL PRIMARY KEY,
        process     TEXT NOT NULL,
        tool        TEXT NOT NULL,
        arguments   TEXT NOT NULL,
        digest      TEXT NOT NULL,
        reason      TEXT NOT NULL,
        label       TEXT NOT NULL,
        state       TEXT NOT NULL,
        requested_at BIGINT NOT NULL,
        decided_at  BIGINT,
        decided_by  TEXT,
        expires_at  BIGINT,
        uses_left   BIGINT NOT NULL DEFAULT 0
    );
    CREATE UNIQUE INDEX approvals_pending ON approvals(process, tool, digest)
        WHERE state = 'pending';
    CREATE INDEX approvals_lease ON approvals(process, tool, digest, state);

    CREATE TABLE audit_chain (
        seq         BIGINT PRIMARY KEY,
        at          BIGINT NOT NULL,
        event       TEXT NOT NULL,
        process     TEXT NOT NULL,
        tool        TEXT NOT NULL,
        digest      TEXT NOT NULL,
        approval    BIGINT,
        by_whom     TEXT NOT NULL,
        detail      TEXT NOT NULL,
        key         TEXT NOT NULL,
        prev        TEXT NOT NULL,
        hash        TEXT NOT NULL,
        signature   TEXT NOT NULL
    );
    "#,
    // 5: the handles a parked call carried, and whether a person endorsed their values (as
    // the SQLite store's migration 8).
    r#"
    ALTER TABLE approvals ADD COLUMN handles TEXT NOT NULL DEFAULT '';
    ALTER TABLE approvals ADD COLUMN endorsed BOOLEAN NOT NULL DEFAULT false;
    CREATE INDEX approvals_endorsed ON approvals(process) WHERE endorsed;
    "#,
    // 6: the label of each workspace file a process wrote, by the file's identity (as the
    // SQLite store's migration 9).
    r#"
    CREATE TABLE file_labels (
        workspace   TEXT NOT NULL,
        dev         BIGINT NOT NULL,
        ino         BIGINT NOT NULL,
        path        TEXT NOT NULL,
        len         BIGINT NOT NULL,
        ctime_ns    BIGINT NOT NULL,
        label       TEXT NOT NULL,
        PRIMARY KEY (workspace, dev, ino)
    );
    CREATE INDEX file_labels_path ON file_labels(workspace, path);
    "#,
    // 7: what went into each task and memory (as the SQLite store's migration 10).
    r#"
    ALTER TABLE tasks ADD COLUMN label TEXT NOT NULL DEFAULT '{"untrusted":["plugin:*"],"more":[0,1,0]}';
    ALTER TABLE memories ADD COLUMN label TEXT NOT NULL DEFAULT '{"untrusted":["plugin:*"],"more":[0,1,0]}';
    "#,
    // 8: what went into each working-memory entry (as the SQLite store's migration 11).
    r#"
    ALTER TABLE working_memory ADD COLUMN label TEXT NOT NULL DEFAULT '{"untrusted":["plugin:*"],"more":[0,1,0]}';
    "#,
    // 9: each call's receipt and the conversation it was part of (as the SQLite store's
    // migration 12).
    r#"
    ALTER TABLE audit ADD COLUMN conversation TEXT;
    ALTER TABLE audit ADD COLUMN peak_memory_bytes BIGINT;
    ALTER TABLE audit ADD COLUMN bytes_in BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN bytes_out BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN requests BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN requests_refused BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN request_bytes_sent BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN request_bytes_received BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE audit ADD COLUMN fuel BIGINT;
    CREATE INDEX audit_conversation ON audit(conversation);
    "#,
];

/// The schema version this build brings a database to.
pub(super) const VERSION: i64 = MIGRATIONS.len() as i64;

/// Brings the schema up to [`VERSION`]; refuses a newer one.
pub(super) async fn migrate(client: &mut Object, location: &str) -> Result<(), PgError> {
    let failed = |source| PgError::Query {
        location: location.to_owned(),
        what: Operation::StoreMigrate,
        source,
    };
    let tx = client.transaction().await.map_err(failed)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(failed)?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS capstan_schema (version BIGINT NOT NULL);
         INSERT INTO capstan_schema (version)
             SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM capstan_schema);",
    )
    .await
    .map_err(failed)?;
    let found: i64 = tx
        .query_one("SELECT version FROM capstan_schema", &[])
        .await
        .map_err(failed)?
        .get(0);
    if found > VERSION {
        return Err(PgError::NewerSchema {
            location: location.to_owned(),
            found,
            known: VERSION,
        });
    }
    let Ok(applied) = usize::try_from(found) else {
        return Err(PgError::BadSchema {
            location: location.to_owned(),
            found,
        });
    };
    for migration in &MIGRATIONS[applied..] {
        tx.batch_execute(migration).await.map_err(failed)?;
    }
    tx.execute("UPDATE capstan_schema SET version = $1", &[&VERSION])
        .await
        .map_err(failed)?;
    tx.commit().await.map_err(failed)
}
