//! `capstan approvals`: the calls parked for a person, and deciding them. It works on the
//! store the config names, so a person approves from any machine that reaches it, while
//! the host whose process waits reads the decision there.

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::HostArgs;
use super::table::print_table;
use crate::services::{Approval, ApprovalId, Lease, Services, Verdict};
use crate::text::{one_line, truncate};

#[derive(Debug, Args)]
pub(crate) struct ApprovalsCommand {
    #[command(subcommand)]
    decide: Option<Decide>,
    /// List every approval, decided ones too, not only those waiting.
    #[arg(long)]
    all: bool,
    /// Print JSON (one object per approval) instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(flatten)]
    host: HostArgs,
}

#[derive(Debug, Subcommand)]
enum Decide {
    /// Show one approval whole: the tool, the canonical arguments, their digest, the
    /// labels that required it, and its state.
    Show {
        /// The approval, e.g. `3` or `#3`.
        id: String,
    },
    /// Approve a parked call: the waiting process runs it. The approval covers only that
    /// process, that tool and arguments with the same digest.
    Approve {
        /// The approval, e.g. `3` or `#3`.
        id: String,
        /// How many calls with these exact arguments it covers (1 to 1000).
        #[arg(long, default_value_t = 1)]
        uses: u32,
        /// How long it holds, in seconds (at most a week).
        #[arg(long, value_name = "SECS", default_value_t = 600)]
        ttl: u64,
        /// Who approves, as the record keeps it [default: $USER, else `cli`].
        #[arg(long)]
        by: Option<String>,
        /// Also vouch for the handles' values the call carries (`handles:` in `show`):
        /// every later use of them by the process is trusted, whatever the arguments.
        #[arg(long)]
        endorse: bool,
    },
    /// Deny a parked call: the waiting process is told a person refused it.
    Deny {
        /// The approval, e.g. `3` or `#3`.
        id: String,
        /// Who denies, as the record keeps it [default: $USER, else `cli`].
        #[arg(long)]
        by: Option<String>,
    },
}

impl ApprovalsCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.host.config()?;
        let services = crate::app::open_services(&config).await?;
        let mut out = crate::secrets::stdout();
        match self.decide {
            None => {
                let listed = services.approvals.list(!self.all, 1000).await?;
                if self.json {
                    for approval in &listed {
                        writeln!(out, "{}", serde_json::to_string(approval)?)?;
                    }
                } else {
                    print_list(&mut out, &listed, self.all)?;
                }
            }
            Some(Decide::Show { id }) => {
                let approval = services.approvals.get(id.parse()?).await?;
                print_one(&mut out, &approval, self.json)?;
            }
            Some(Decide::Approve {
                id,
                uses,
                ttl,
                by,
                endorse,
            }) => {
                let lease = Lease {
                    ttl_seconds: ttl,
                    uses,
                };
                let verdict = if endorse {
                    Verdict::Endorse(lease)
                } else {
                    Verdict::Approve(lease)
                };
                let approval = decide(&services, &id, verdict, by).await?;
                print_one(&mut out, &approval, self.json)?;
            }
            Some(Decide::Deny { id, by }) => {
                let approval = decide(&services, &id, Verdict::Deny, by).await?;
                print_one(&mut out, &approval, self.json)?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

async fn decide(
    services: &Services,
    id: &str,
    verdict: Verdict,
    by: Option<String>,
) -> anyhow::Result<Approval> {
    let id: ApprovalId = id.parse()?;
    let by = by
        .or_else(|| std::env::var("USER").ok().filter(|user| !user.is_empty()))
        .unwrap_or_else(|| "cli".to_owned());
    Ok(services.approvals.decide(id, verdict, &by).await?)
}

fn print_list(
    out: &mut impl std::io::Write,
    listed: &[Approval],
    all: bool,
) -> std::io::Result<()> {
    if listed.is_empty() {
        let none = if all {
            "(no approvals)"
        } else {
            "(no calls wait for approval; `--all` lists decided ones)"
        };
        return writeln!(out, "{none}");
    }
    let rows: Vec<Vec<String>> = listed
        .iter()
        .map(|a| {
            vec![
                a.id.to_string(),
                a.state.to_string(),
                a.process.to_string(),
                one_line(&a.tool).into_owned(),
                truncate(&one_line(&a.arguments), 60).to_owned(),
                one_line(&a.label).into_owned(),
            ]
        })
        .collect();
    print_table(
        out,
        &[
            "APPROVAL",
            "STATE",
            "PROCESS",
            "TOOL",
            "ARGUMENTS",
            "BECAUSE",
        ],
        &rows,
    )?;
    if !all {
        writeln!(
            out,
            "decide with `capstan approvals approve N` or `capstan approvals deny N`; \
             `capstan approvals show N` shows one whole"
        )?;
    }
    Ok(())
}

fn print_one(out: &mut impl std::io::Write, a: &Approval, json: bool) -> anyhow::Result<()> {
    if json {
        writeln!(out, "{}", serde_json::to_string(a)?)?;
        return Ok(());
    }
    writeln!(out, "approval {}: {}", a.id, a.state)?;
    writeln!(out, "  process:   {}", a.process)?;
    writeln!(out, "  tool:      {}", one_line(&a.tool))?;
    writeln!(out, "  arguments: {}", a.arguments)?;
    writeln!(out, "  digest:    sha256:{}", a.digest)?;
    writeln!(out, "  because:   {}", a.label)?;
    writeln!(out, "  reason:    {}", one_line(&a.reason))?;
    if !a.handles.is_empty() {
        let handles: Vec<String> = a.handles.iter().map(|h| h.handle.to_string()).collect();
        let vouched = if a.endorsed {
            "endorsed: trusted in every later use"
        } else {
            "the process's results held back; `approve N --endorse` vouches for them"
        };
        writeln!(out, "  handles:   {} ({vouched})", handles.join(", "))?;
    }
    if let Some(by) = &a.decided_by {
        writeln!(out, "  decided by {by}")?;
    }
    if let Some(expires) = a.expires_at {
        let left = expires - crate::services::now();
        writeln!(
            out,
            "  covers {} more call(s) with these arguments, for {}s",
            a.uses_left,
            left.max(0)
        )?;
    }
    Ok(())
}
