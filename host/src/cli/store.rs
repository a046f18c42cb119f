//! `--store`: which services a command that runs tools outside an agent opens.

use anyhow::Context as _;
use clap::{Args, ValueEnum};

use crate::config::Config;
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

    /// The services `--store` names, opened. (A workspace the calls may write is checked
    /// against the data dir before this, as for every command.)
    pub(crate) async fn open(&self, config: &Config) -> anyhow::Result<Services> {
        match self.choice(config) {
            StoreChoice::Memory => Ok(Services::in_memory()),
            StoreChoice::Configured => crate::app::open_services(config)
                .await
                .context("opening the configured store (pass --store memory for a throwaway one)"),
        }
    }
}
