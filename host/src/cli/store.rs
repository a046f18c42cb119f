//! `--store`: which services a command that runs tools outside an agent opens.

use clap::{Args, ValueEnum};

use crate::config::Config;
use crate::services::Services;

/// Where the tasks, memories and audit rows of the calls go.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum StoreChoice {
    /// The store the config names (`[store]`: SQLite in `agent.data_dir`, or PostgreSQL).
    #[default]
    Configured,
    /// A throwaway store in this process's memory, gone when the command ends: to try a
    /// tasks or memory tool without touching any data.
    Memory,
}

/// The `--store` flag.
#[derive(Debug, Clone, Args)]
pub(crate) struct StoreArgs {
    /// The store the calls' host imports (tasks, memory) and audit rows use: the
    /// configured one, or `memory`, a throwaway one.
    #[arg(long, value_enum, value_name = "configured|memory", default_value_t)]
    store: StoreChoice,
}

impl StoreArgs {
    /// The services `--store` names, opened.
    pub(crate) async fn open(&self, config: &Config) -> anyhow::Result<Services> {
        Ok(match self.store {
            StoreChoice::Configured => crate::app::open_services(config).await?,
            StoreChoice::Memory => Services::in_memory(),
        })
    }
}
