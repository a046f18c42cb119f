//! The config's store as the doors name it, without opening it, and what `capstan status`
//! reads of it: the one place above the backends that knows which one is configured.

use std::path::PathBuf;

use crate::config::{Config, DatabaseUrl, StoreSettings};
use crate::postgres::{Postgres, RunStatus, SessionStatus};
use crate::services::ServiceError;
use crate::store::DATABASE_FILE;

/// Where `config`'s `[store]` keeps the services, named without a password and without
/// connecting: `SQLite at /data/capstan.db`, `PostgreSQL at postgresql://capstan@db:5432/x`.
///
/// ```
/// use capstan_host::config::Config;
///
/// let config = Config::defaults(std::path::Path::new("/srv/agent"));
/// let location = capstan_host::app::store_location(&config);
/// assert!(location.starts_with("SQLite at /srv/agent/"), "{location}");
/// ```
pub fn store_location(config: &Config) -> String {
    match &config.store {
        StoreSettings::Sqlite => format!(
            "SQLite at {}",
            config.agent.data_dir.join(DATABASE_FILE).display()
        ),
        StoreSettings::Postgres { url, .. } => match url {
            DatabaseUrl::Env(name) => format!("PostgreSQL at the URL in ${name} (store.url_env)"),
            DatabaseUrl::Literal(url) => match Postgres::location_of_url(url) {
                Ok(location) => format!("PostgreSQL at {location}"),
                Err(_) => "PostgreSQL at store.url (which does not parse)".to_owned(),
            },
        },
    }
}

/// The SQLite database file `config` keeps its services in, if its store is SQLite.
pub fn sqlite_file(config: &Config) -> Option<PathBuf> {
    match config.store {
        StoreSettings::Sqlite => Some(config.agent.data_dir.join(DATABASE_FILE)),
        StoreSettings::Postgres { .. } => None,
    }
}

/// What `capstan status` shows of a store.
#[derive(Debug)]
pub enum StoreStatus {
    /// One host's SQLite file.
    Sqlite {
        /// The database file.
        file: PathBuf,
    },
    /// A database several hosts share.
    Postgres {
        /// Where it is, without a password.
        location: String,
        /// The newest runs, newest first.
        runs: Vec<RunStatus>,
        /// Which run owns each session.
        sessions: Vec<SessionStatus>,
    },
}

/// Reads what `capstan status` shows of `config`'s store: nothing is opened for SQLite;
/// PostgreSQL is connected to as it is (no migration) for its newest `runs` runs and its
/// sessions' owners.
pub async fn store_status(config: &Config, runs: u32) -> Result<StoreStatus, ServiceError> {
    let url = match &config.store {
        StoreSettings::Sqlite => {
            let file = config.agent.data_dir.join(DATABASE_FILE);
            return Ok(StoreStatus::Sqlite { file });
        }
        StoreSettings::Postgres { url, .. } => url.value().map_err(ServiceError::Invalid)?,
    };
    let db = Postgres::connect_as_is(&url).await?;
    Ok(StoreStatus::Postgres {
        location: db.location().to_owned(),
        runs: db.runs(runs).await?,
        sessions: db.sessions().await?,
    })
}
