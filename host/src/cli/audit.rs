//! `capstan audit`: the signed chain of approvals, denials and flow refusals. `verify` reads
//! it from the store the config names and checks every row against the one before and the
//! keys it trusts; `key` prints this host's public key, to trust on the machine that
//! verifies.

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::HostArgs;
use crate::services::Verifier;
use crate::text::one_line;
use crate::text::unhex;

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
        /// The head hash an earlier verify printed: fail unless the chain still holds
        /// that row (rows removed from the end, or an older copy of the store, do not).
        #[arg(long, value_name = "HASH")]
        expect: Option<String>,
    },
    /// Print this host's public key (the data dir's `host.key`).
    Key,
}

/// Rows read per page.
const PAGE: u32 = 1000;

impl AuditCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.host.config()?;
        let mut out = crate::secrets::stdout();
        let (trust, expect, rows) = match self.command {
            AuditVerb::Key => {
                let key = crate::app::host_key(&config.agent.data_dir)?;
                writeln!(out, "{}", key.public_hex())?;
                return Ok(ExitCode::SUCCESS);
            }
            AuditVerb::Verify {
                trust,
                expect,
                rows,
            } => (trust, expect, rows),
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
        // This host's key, if it has one: verifying makes none.
        let key_file = config.agent.data_dir.join(crate::app::HOST_KEY_FILE);
        if key_file.exists() {
            trusted.push(crate::app::host_key(&config.agent.data_dir)?.public_hex());
        }
        let services = crate::app::open_services(&config).await?;
        let mut verifier = Verifier::new(trusted);
        let mut expected_seen = expect.is_none();
        loop {
            let page = services.chain.entries(verifier.rows(), PAGE).await?;
            if page.is_empty() {
                break;
            }
            if let Err(broken) = verifier.check(&page) {
                writeln!(out, "{broken}")?;
                return Ok(ExitCode::FAILURE);
            }
            if let Some(expect) = &expect {
                expected_seen |= page.iter().any(|row| row.hash.eq_ignore_ascii_case(expect));
            }
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
        }
        if !expected_seen {
            writeln!(
                out,
                "the audit chain does not reach the head you recorded ({}): rows were removed \
                 from its end, or the store was restored from an older copy",
                expect.as_deref().unwrap_or_default()
            )?;
            return Ok(ExitCode::FAILURE);
        }
        writeln!(
            out,
            "the audit chain holds: {} row(s), each following the one before, signed by {} \
             trusted key(s); head {} (keep it, and check later with --expect that the chain \
             still reaches it)",
            verifier.rows(),
            verifier.keys().len(),
            verifier.head()
        )?;
        Ok(ExitCode::SUCCESS)
    }
}
