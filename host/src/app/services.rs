//! Opening the services the config's `[store]` names.

use crate::config::{Config, StoreSettings};
use crate::postgres::{Lease, Postgres};
use crate::services::{ServiceError, Services};
use crate::store::Store;

/// The services of `config`: the SQLite store in `agent.data_dir`, or the PostgreSQL
/// database `[store]` names (its schema brought up to date), their audit chain signed by
/// the host's key in `agent.data_dir` ([`host_key`](super::host_key())).
///
/// ```no_run
/// use capstan_host::config::Config;
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let config = Config::defaults(std::path::Path::new("."));
/// let services = capstan_host::app::open_services(&config).await.unwrap();
/// # drop(services);
/// # });
/// ```
pub async fn open_services(config: &Config) -> Result<Services, ServiceError> {
    let services = match &config.store {
        StoreSettings::Sqlite => Store::open_services(&config.agent.data_dir).await?,
        StoreSettings::Postgres { url, lease } => {
            let url = url.value().map_err(ServiceError::Invalid)?;
            Postgres::open_services(&url, Lease::new(*lease)).await?
        }
    };
    let key = super::host_key(&config.agent.data_dir)?;
    Ok(services.signed_by(key))
}
