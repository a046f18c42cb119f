//! `[store]`: where tasks, memories, history, worker records and the audit log are kept.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::error::{KeyError, key_error};

/// `[store]`: the services' backend.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum StoreSettings {
    /// A SQLite file in `agent.data_dir`: one host.
    #[default]
    Sqlite,
    /// A PostgreSQL database several hosts share.
    Postgres {
        /// Where the URL comes from.
        url: DatabaseUrl,
        /// How long a host's run lease lasts unrenewed (`lease_secs`): how long a host
        /// cut off from the database goes on serving, and how soon another host may
        /// answer its conversations after it died.
        lease: Duration,
    },
}

/// Where a PostgreSQL URL comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum DatabaseUrl {
    /// Written in the config (`url`).
    Literal(String),
    /// Read from this environment variable when the store opens (`url_env`), for a URL
    /// holding a password.
    Env(String),
}

impl DatabaseUrl {
    /// The URL; a missing variable is an error naming it and the key.
    ///
    /// ```
    /// use capstan_host::config::DatabaseUrl;
    ///
    /// let url = DatabaseUrl::Literal("postgres://capstan@db:5432/capstan".into());
    /// assert_eq!(url.value().unwrap(), "postgres://capstan@db:5432/capstan");
    /// let missing = DatabaseUrl::Env("CAPSTAN_NO_SUCH_VARIABLE".into());
    /// assert!(missing.value().unwrap_err().contains("store.url_env"));
    /// ```
    pub fn value(&self) -> Result<String, String> {
        match self {
            DatabaseUrl::Literal(url) => Ok(url.clone()),
            DatabaseUrl::Env(name) => std::env::var(name).map_err(|_| {
                format!(
                    "store.url_env names the environment variable {name}, which is not set: \
                     set it to the database's postgres:// URL"
                )
            }),
        }
    }
}

impl std::fmt::Debug for DatabaseUrl {
    /// Never the URL itself: it may hold a password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DatabaseUrl::Literal(_) => f.write_str("Literal(..)"),
            DatabaseUrl::Env(name) => write!(f, "Env({name})"),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    kind: String,
    url: Option<String>,
    url_env: Option<String>,
    lease_secs: Option<u64>,
    spill_file: Option<PathBuf>,
}

/// The run lease unless `lease_secs` says otherwise.
const DEFAULT_LEASE_SECS: u64 = 15;
/// What `lease_secs` may be: long enough to renew it thrice with room for a slow
/// statement, short enough that a dead host's conversations are not held for long.
const LEASE_SECS: std::ops::RangeInclusive<u64> = 6..=600;

impl RawStore {
    /// The backend, and the spill file (`spill_file`, resolved with `resolve`).
    pub(super) fn check(
        mut self,
        resolve: impl Fn(PathBuf) -> PathBuf,
    ) -> Result<(StoreSettings, Option<PathBuf>), KeyError> {
        if self
            .spill_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(key_error(
                "store.spill_file",
                "must not be empty: a file's path, or leave the key out",
            ));
        }
        let spill = self.spill_file.take().map(resolve);
        Ok((self.backend()?, spill))
    }

    fn backend(self) -> Result<StoreSettings, KeyError> {
        let lease = match self.lease_secs {
            Some(_) if self.kind != "postgres" => {
                return Err(key_error(
                    "store.lease_secs",
                    "is for kind = \"postgres\"; a SQLite store has one host and no lease",
                ));
            }
            Some(secs) if !LEASE_SECS.contains(&secs) => {
                return Err(key_error(
                    "store.lease_secs",
                    format!(
                        "must be {} to {} seconds, got {secs}",
                        LEASE_SECS.start(),
                        LEASE_SECS.end()
                    ),
                ));
            }
            secs => Duration::from_secs(secs.unwrap_or(DEFAULT_LEASE_SECS)),
        };
        match (self.kind.as_str(), self.url, self.url_env) {
            ("sqlite", None, None) => Ok(StoreSettings::Sqlite),
            ("sqlite", _, _) => Err(key_error(
                "store.url",
                "is for kind = \"postgres\"; the SQLite store lives in agent.data_dir",
            )),
            ("postgres", Some(url), None) => {
                if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                    return Err(key_error(
                        "store.url",
                        "must be a postgres:// URL, e.g. postgres://capstan@127.0.0.1:5432/capstan",
                    ));
                }
                Ok(StoreSettings::Postgres {
                    url: DatabaseUrl::Literal(url),
                    lease,
                })
            }
            ("postgres", None, Some(name)) if !name.trim().is_empty() => {
                Ok(StoreSettings::Postgres {
                    url: DatabaseUrl::Env(name),
                    lease,
                })
            }
            ("postgres", Some(_), Some(_)) => Err(key_error(
                "store.url",
                "and store.url_env are both set; keep one",
            )),
            ("postgres", _, _) => Err(key_error(
                "store.url",
                "is needed for kind = \"postgres\": the URL, or url_env naming the environment \
                 variable that holds it",
            )),
            (other, _, _) => Err(key_error(
                "store.kind",
                format!("must be \"sqlite\" or \"postgres\", got {other:?}"),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn store(toml: &str) -> Result<StoreSettings, String> {
        Config::parse(toml, Path::new("/etc/capstan/capstan.toml"))
            .map(|config| config.store)
            .map_err(|err| err.to_string())
    }

    #[test]
    fn sqlite_is_the_default_and_postgres_takes_a_url_or_a_variable() {
        assert_eq!(store("").unwrap(), StoreSettings::Sqlite);
        let url = "postgres://capstan@db:5432/capstan";
        let literal = store(&format!("[store]\nkind = \"postgres\"\nurl = \"{url}\"")).unwrap();
        assert_eq!(
            literal,
            StoreSettings::Postgres {
                url: DatabaseUrl::Literal(url.into()),
                lease: Duration::from_secs(15),
            }
        );
        let env =
            store("[store]\nkind = \"postgres\"\nurl_env = \"DB_URL\"\nlease_secs = 30").unwrap();
        assert_eq!(
            env,
            StoreSettings::Postgres {
                url: DatabaseUrl::Env("DB_URL".into()),
                lease: Duration::from_secs(30),
            }
        );
        assert_eq!(
            format!("{literal:?}"),
            "Postgres { url: Literal(..), lease: 15s }",
            "no URL in logs"
        );
    }

    #[test]
    fn a_bad_store_is_refused_naming_the_key_and_the_fix() {
        for (toml, key, says) in [
            (
                "[store]\nkind = \"mysql\"",
                "store.kind",
                "\"sqlite\" or \"postgres\"",
            ),
            ("[store]\nkind = \"postgres\"", "store.url", "url_env"),
            (
                "[store]\nkind = \"postgres\"\nurl = \"mysql://x\"",
                "store.url",
                "postgres://",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl = \"postgres://a@b/c\"\nurl_env = \"X\"",
                "store.url",
                "keep one",
            ),
            (
                "[store]\nkind = \"sqlite\"\nurl = \"postgres://a@b/c\"",
                "store.url",
                "data_dir",
            ),
            (
                "[store]\nkind = \"postgres\"\nurl_env = \"X\"\nlease_secs = 2",
                "store.lease_secs",
                "6 to 600 seconds, got 2",
            ),
            ("[store]\nlease_secs = 30", "store.lease_secs", "no lease"),
            (
                "[store]\nkind = \"sqlite\"\nhost = \"db\"",
                "host",
                "unknown",
            ),
        ] {
            let err = store(toml).unwrap_err();
            assert!(err.contains(key) && err.contains(says), "{toml}: {err}");
            assert!(err.contains("/etc/capstan/capstan.toml"), "{err}");
        }
    }
}
