//! `--store`: which services a command that runs tools outside an agent opens.

use std::path::Path;

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};

use capstan_caps::Capability;

use crate::config::{Config, StoreSettings};
use crate::policy::Grants;
use crate::services::Services;

/// Where the tasks, memories and audit rows of the calls go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum StoreChoice {
    /// The store the config names (`[store]`: SQLite in `agent.data_dir`, or PostgreSQL).
    Configured,
    /// A throwaway store in this process's memory, gone when the command ends: to try a
    /// tasks or memory tool without touching any data.
    Memory,
}

/// The `--store` flag.
#[derive(Debug, Clone, Args)]
pub(crate) struct StoreArgs {
    /// The store the calls' host imports (tasks, memory) and audit rows use: `configured`,
    /// or `memory`, a throwaway one [default: configured when a config file is in use,
    /// else memory].
    #[arg(long, value_enum, value_name = "configured|memory")]
    store: Option<StoreChoice>,
}

impl StoreArgs {
    /// The store `--store` names: without the flag, the configured one when a config file
    /// is in use, else a throwaway one (tried without a config, nothing is written).
    pub(crate) fn choice(&self, config: &Config) -> StoreChoice {
        self.store.unwrap_or(match config.source {
            Some(_) => StoreChoice::Configured,
            None => StoreChoice::Memory,
        })
    }

    /// The services for calls on `workspace` with `grants`, opened. A SQLite store inside
    /// a workspace the calls may read or write is refused: a tool could read its tasks,
    /// memories and audit rows, and the host's signing key beside them.
    pub(crate) async fn open(
        &self,
        config: &Config,
        workspace: &Path,
        grants: &Grants,
    ) -> anyhow::Result<Services> {
        match self.choice(config) {
            StoreChoice::Memory => Ok(Services::in_memory()),
            StoreChoice::Configured => {
                let files =
                    grants.allows(&Capability::FsRead) || grants.allows(&Capability::FsWrite);
                if files && config.store == StoreSettings::Sqlite {
                    let data = crate::config::resolve(&config.agent.data_dir);
                    let work = crate::config::resolve(workspace);
                    if data.starts_with(&work) {
                        bail!(
                            "the store ({}) lies inside the workspace this call may read ({}): a \
                             tool could read its tasks, memories, audit rows and the host's key. \
                             Pass --store memory, --workspace DIR elsewhere, or set \
                             agent.data_dir outside the workspace",
                            data.display(),
                            work.display()
                        );
                    }
                }
                crate::app::open_services(config).await.context(
                    "opening the configured store (pass --store memory for a throwaway one)",
                )
            }
        }
    }
}
