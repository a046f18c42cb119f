//! `capstan audit`: the signed chain of approvals, denials and flow refusals. `verify` reads
//! it from the store the config names and checks every row against the one before and the
//! keys it trusts; `key` prints this host's public key, to trust on the machine that
//! verifies.

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::HostArgs;
use crate::services::{unhex, verify};
use crate::text::one_line;

#[derive(Debug, Args)]
pub(crate) struct AuditCommand {
    #[command(subcommand)]
    command: AuditVerb,
    #[command(flatten)]
    host: HostArgs,
}

#[derive(Debug, Subcommand)]
enum AuditVerb {
    /// Check the audit chain: each row follows the one before, its hash is its content's,
    /// and its signature is valid by a trusted key. Exit 1 at the first row that does not
    /// hold, naming it.
    Verify {
        /// Also trust this public key (hex, as `capstan audit key` prints it): another
        /// host's on the same database, or this host's before its key was replaced.
        /// Repeatable.
        #[arg(long, value_name = "KEY")]
        trust: Vec<String>,
        /// Print each row as it is checked.
        #[arg(long)]
        rows: bool,
    },
    /// Print this host's public key (the data dir's `host.key`).
    Key,
}

/// Rows read per page.
const PAGE: u32 = 1000;

impl AuditCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.host.config()?;
        let key = crate::app::host_key(&config.agent.data_dir)?;
        let mut out = crate::secrets::stdout();
        let (trust, rows) = match self.command {
            AuditVerb::Key => {
                writeln!(out, "{}", key.public_hex())?;
                return Ok(ExitCode::SUCCESS);
            }
            AuditVerb::Verify { trust, rows } => (trust, rows),
        };
        for extra in &trust {
            if unhex(extra).is_none_or(|bytes| bytes.len() != 32) {
                anyhow::bail!(
                    "--trust {}: not a public key (64 hex digits, as `capstan audit key` prints)",
                    crate::text::truncate(extra, 80)
                );
            }
        }
        let mut trusted: Vec<String> = trust.iter().map(|k| k.to_ascii_lowercase()).collect();
        trusted.push(key.public_hex());
        let services = crate::app::open_services(&config).await?;
        let mut from = None;
        let mut keys: Vec<String> = Vec::new();
        loop {
            let after = from.map_or(0, |(seq, _)| seq);
            let page = services.chain.entries(after, PAGE).await?;
            if page.is_empty() {
                break;
            }
            let checked = match verify(&page, &trusted, from) {
                Ok(checked) => checked,
                Err(broken) => {
                    writeln!(out, "{broken}")?;
                    return Ok(ExitCode::FAILURE);
                }
            };
            if rows {
                for row in &page {
                    writeln!(
                        out,
                        "{:>6}  {}  {:<9}  {}  {}  {}",
                        row.seq,
                        row.at,
                        row.event.as_str(),
                        row.process,
                        one_line(&row.tool),
                        row.approval.map(|n| format!("#{n}")).unwrap_or_default()
                    )?;
                }
            }
            for key in checked.keys {
                if !keys.contains(&key) {
                    keys.push(key);
                }
            }
            from = Some((checked.rows, checked.head));
        }
        let count = from.map_or(0, |(seq, _)| seq);
        writeln!(
            out,
            "the audit chain holds: {count} row(s), each following the one before, signed by {} \
             trusted key(s)",
            keys.len()
        )?;
        Ok(ExitCode::SUCCESS)
    }
}
