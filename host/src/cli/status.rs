//! `capstan status`: where the store is, and on PostgreSQL, the hosts' runs and which run
//! owns each conversation.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::SystemTime;

use clap::Args;

use super::HostArgs;
use super::table::print_table;
use crate::app::{StoreStatus, store_status};

/// The most runs listed.
const RUNS_SHOWN: u32 = 20;

#[derive(Debug, Args)]
pub(crate) struct StatusCommand {
    #[command(flatten)]
    host: HostArgs,
}

impl StatusCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.host.config()?;
        let mut out = crate::secrets::stdout();
        let (location, runs, sessions) = match store_status(&config, RUNS_SHOWN).await? {
            StoreStatus::Sqlite { file } => {
                writeln!(out, "store: SQLite, {} (one host)", file.display())?;
                return Ok(ExitCode::SUCCESS);
            }
            StoreStatus::Postgres {
                location,
                runs,
                sessions,
            } => (location, runs, sessions),
        };
        writeln!(out, "store: PostgreSQL, {location}")?;
        let now = SystemTime::now();
        let runs: Vec<Vec<String>> = runs
            .into_iter()
            .map(|run| {
                let lease = match (run.live, run.ended_at) {
                    (true, _) => format!("live, {} s left", seconds(now, run.expires_at)),
                    (false, Some(_)) => "ended".to_owned(),
                    (false, None) => "expired (its host stopped renewing)".to_owned(),
                };
                vec![run.run.to_string(), run.host, run.pid.to_string(), lease]
            })
            .collect();
        writeln!(out, "\nruns, newest first:")?;
        print_table(&mut out, &["RUN", "HOST", "PID", "LEASE"], &runs)?;
        let sessions: Vec<Vec<String>> = sessions
            .into_iter()
            .map(|s| vec![s.channel, s.owner.to_string(), s.epoch.get().to_string()])
            .collect();
        writeln!(out, "\nsessions:")?;
        print_table(&mut out, &["SESSION", "OWNER", "EPOCH"], &sessions)?;
        Ok(ExitCode::SUCCESS)
    }
}

/// Whole seconds from `now` to `then`, 0 if past (the two clocks may differ a little).
fn seconds(now: SystemTime, then: SystemTime) -> u64 {
    then.duration_since(now).map_or(0, |left| left.as_secs())
}
