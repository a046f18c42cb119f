//! What can go wrong talking to PostgreSQL, each naming the database and what to do.

use crate::services::ServiceError;

/// An error of the PostgreSQL services.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    /// The URL does not parse.
    #[error(
        "the PostgreSQL URL does not parse ({source}); write it as postgres://USER[:PASSWORD]@HOST:PORT/DATABASE"
    )]
    Url {
        /// Why.
        source: tokio_postgres::Error,
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
        what: &'static str,
        /// The server's or the connection's error.
        source: tokio_postgres::Error,
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

/// The server's message with its detail and hint, or the connection's error.
fn describe(err: &tokio_postgres::Error) -> String {
    match err.as_db_error() {
        Some(db) => {
            let mut text = db.message().to_owned();
            if let Some(detail) = db.detail() {
                text.push_str(&format!(" ({detail})"));
            }
            text
        }
        None => err.to_string(),
    }
}

impl From<PgError> for ServiceError {
    fn from(err: PgError) -> Self {
        ServiceError::Backend(Box::new(err))
    }
}
