//! What can go wrong talking to PostgreSQL, each naming the database and what to do.

use crate::services::Operation;
use crate::services::ServiceError;

/// An error of the PostgreSQL services.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The URL does not parse.
    #[error(
        "the PostgreSQL URL does not parse ({reason}); write it as postgres://USER[:PASSWORD]@HOST:PORT/DATABASE, an @ or : in the password percent-encoded (%40, %3A)"
    )]
    Url {
        /// Why.
        reason: String,
    },
    /// No connection could be had.
    #[error(
        "{location}: cannot connect ({reason}); check that the server runs and the URL's host, port, user and database"
    )]
    Pool {
        /// The database.
        location: String,
        /// Why.
        reason: String,
    },
    /// A statement failed.
    #[error("{location}: {what} failed: {}", describe(.source))]
    Query {
        /// The database.
        location: String,
        /// The operation, e.g. `history.append`.
        what: Operation,
        /// The server's or the connection's error.
        source: tokio_postgres::Error,
    },
    /// The database's schema version is not one a capstan writes.
    #[error(
        "{location}: the schema version is {found}, which no capstan writes; restore the database from a backup"
    )]
    BadSchema {
        /// The database.
        location: String,
        /// The version found.
        found: i64,
    },
    /// The database's schema is newer than this build knows.
    #[error(
        "{location}: the schema is at version {found}, newer than this capstan knows ({known}); run a capstan at least as new as the one that migrated it"
    )]
    NewerSchema {
        /// The database.
        location: String,
        /// The version found.
        found: i64,
        /// The newest this build knows.
        known: i64,
    },
}

/// The server's message with its detail, hint and what to do; or the connection's error
/// with every cause (tokio-postgres's own text is only "db error" or "connection closed").
pub(super) fn describe(err: &tokio_postgres::Error) -> String {
    let Some(db) = err.as_db_error() else {
        return chain(err);
    };
    let mut text = db.message().to_owned();
    // A server may send an empty detail or hint: shown, it would read as "()" or "hint: ".
    if let Some(detail) = db.detail().map(str::trim).filter(|d| !d.is_empty()) {
        text.push_str(&format!(" ({detail})"));
    }
    if let Some(hint) = db.hint().map(str::trim).filter(|h| !h.is_empty()) {
        text.push_str(&format!("; hint: {hint}"));
    }
    let advice = match db.code().code() {
        "28P01" | "28000" => Some("check the user and password in the URL"),
        "3D000" => Some("create the database (createdb), or name an existing one in the URL"),
        "42501" => Some(
            "the user needs CREATE on the database's schema (GRANT CREATE ON SCHEMA public TO ...)",
        ),
        "53300" => {
            Some("the server has no connection left: raise max_connections, or run fewer hosts")
        }
        _ => None,
    };
    if let Some(advice) = advice {
        text.push_str(&format!("; {advice}"));
    }
    text
}

/// `err` and each of its causes, joined; a server's error anywhere in it is described with
/// its advice ([`describe`]), whether it came wrapped (the pool's first connection) or
/// not (a connection of its own, made later), so each path says the same.
pub(super) fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    if let Some(pg) = err.downcast_ref::<tokio_postgres::Error>()
        && pg.as_db_error().is_some()
    {
        return describe(pg);
    }
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(next) = cause {
        if let Some(db) = next.downcast_ref::<tokio_postgres::Error>() {
            text.push_str(&format!(": {}", describe(db)));
            return text;
        }
        text.push_str(&format!(": {next}"));
        cause = next.source();
    }
    text
}

impl From<PgError> for ServiceError {
    fn from(err: PgError) -> Self {
        ServiceError::Backend(Box::new(err))
    }
}
