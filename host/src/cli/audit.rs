//! `capstan audit`: what tool calls did and cost, and the signed chain of approvals,
//! denials and flow refusals. `calls` lists the calls with their receipts and `costs` sums
//! the receipts, from the store the config names; `verify` checks every row of the chain
//! against the one before and the keys it trusts; `key` prints this host's public key, to
//! trust on the machine that verifies.

use std::io::Write as _;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::HostArgs;
use crate::services::{AuditSink, CostReport, Costs, CostsBy, CostsOf, Verifier, day_of};
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
    /// List tool calls, newest first, each with its receipt: wall time, peak memory,
    /// argument and result bytes, outbound requests and their bytes.
    Calls {
        /// Only the calls of this conversation (`main`, or `channel:main` as `costs` lists
        /// them).
        #[arg(long, value_name = "CONVERSATION")]
        conversation: Option<String>,
        /// At most this many (1 or more).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
        limit: u32,
    },
    /// Sum the receipts of tool calls by conversation, process, tool or day, with a total.
    Costs {
        /// What each row sums over.
        #[arg(long, value_enum, default_value_t = By::Conversation)]
        by: By,
        /// Only the calls of this conversation (`main`, or `channel:main`).
        #[arg(long, value_name = "CONVERSATION")]
        conversation: Option<String>,
        /// Print JSON: the rows and the total, as `GET /v1/audit/costs` answers.
        #[arg(long)]
        json: bool,
    },
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

/// What `capstan audit costs` sums by.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum By {
    Conversation,
    Process,
    Tool,
    Day,
}

impl From<By> for CostsBy {
    fn from(by: By) -> Self {
        match by {
            By::Conversation => CostsBy::Conversation,
            By::Process => CostsBy::Process,
            By::Tool => CostsBy::Tool,
            By::Day => CostsBy::Day,
        }
    }
}

/// Rows read per page.
const PAGE: u32 = 1000;

impl AuditCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.host.config()?;
        let mut out = crate::secrets::stdout();
        let (trust, expect, rows) = match self.command {
            AuditVerb::Calls {
                conversation,
                limit,
            } => {
                let services = crate::app::open_services(&config).await?;
                let of = conversation_of(conversation.as_deref())?;
                print_calls(&mut out, &*services.audit, &of, limit).await?;
                return Ok(ExitCode::SUCCESS);
            }
            AuditVerb::Costs {
                by,
                conversation,
                json,
            } => {
                let services = crate::app::open_services(&config).await?;
                let of = conversation_of(conversation.as_deref())?;
                let rows = services.audit.costs(by.into(), &of).await?;
                if json {
                    let report = CostReport::of(rows);
                    writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
                } else {
                    print_costs(&mut out, by.into(), &rows)?;
                }
                return Ok(ExitCode::SUCCESS);
            }
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

/// Prints up to `limit` calls `of` holds, newest first, a line each.
async fn print_calls(
    out: &mut impl std::io::Write,
    audit: &dyn AuditSink,
    of: &CostsOf,
    limit: u32,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:>6}  {:<10}  {:<18}  {:<14}  {:<18}  {:<8}  {RECEIPT_HEADER}",
        "id", "day", "conversation", "process", "tool", "outcome"
    )?;
    let mut shown = 0;
    let mut before = None;
    while shown < limit {
        let page = audit.page(before, PAGE).await?;
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        for entry in page
            .iter()
            .filter(|e| of.holds(e.conversation.as_deref()))
            .take((limit - shown) as usize)
        {
            let mut one = Costs::default();
            one.add(&entry.receipt, entry.outcome == "ok", entry.duration_us);
            writeln!(
                out,
                "{:>6}  {:<10}  {:<18}  {:<14}  {:<18}  {:<8}  {}",
                entry.id,
                day_of(entry.at),
                one_line(entry.conversation.as_deref().unwrap_or("-")),
                one_line(&entry.process),
                one_line(&entry.tool),
                entry.outcome,
                receipt_columns(&one),
            )?;
            shown += 1;
        }
    }
    if shown == 0 {
        writeln!(out, "no tool call is recorded{}", scope_of(of))?;
    }
    Ok(())
}

/// Prints `rows` summed by `by`, then their total.
fn print_costs(out: &mut impl std::io::Write, by: CostsBy, rows: &[Costs]) -> anyhow::Result<()> {
    writeln!(
        out,
        "{:<20}  {:>6}  {:>6}  {RECEIPT_HEADER}",
        by.as_str(),
        "calls",
        "failed"
    )?;
    let report = CostReport::of(rows.to_vec());
    let total = ("total", &report.total);
    let named = rows
        .iter()
        .map(|row| (row.key.as_deref().unwrap_or("(no conversation)"), row));
    for (key, c) in named.chain([total]) {
        writeln!(
            out,
            "{:<20}  {:>6}  {:>6}  {}",
            one_line(key),
            c.calls,
            c.failed,
            receipt_columns(c)
        )?;
    }
    Ok(())
}

/// The heads of [`receipt_columns`].
const RECEIPT_HEADER: &str = "     time   peak mem         in        out       fuel  requests";

/// What `c`'s calls used, in columns under [`RECEIPT_HEADER`]: one call's, or a sum's.
fn receipt_columns(c: &Costs) -> String {
    format!(
        "{:>9}  {:>9}  {:>9}  {:>9}  {:>9}  {}",
        micros(c.duration_us),
        c.peak_memory_bytes.map_or_else(|| "-".to_owned(), size),
        size(c.bytes_in),
        size(c.bytes_out),
        fuel(c.fuel),
        requests(
            c.requests,
            c.requests_refused,
            c.request_bytes_sent,
            c.request_bytes_received
        ),
    )
}

/// The calls `--conversation` names, or all.
fn conversation_of(name: Option<&str>) -> anyhow::Result<CostsOf> {
    match name {
        Some(name) => CostsOf::conversation(name)
            .map_err(|why| anyhow::anyhow!("--conversation {}: {why}", one_line(name))),
        None => Ok(CostsOf::default()),
    }
}

/// ` in CONVERSATION`, or nothing.
fn scope_of(of: &CostsOf) -> String {
    of.conversation
        .as_deref()
        .map(|c| format!(" in {}", one_line(c)))
        .unwrap_or_default()
}

/// `12.3 ms`, `850 µs`, `2.10 s`.
fn micros(us: u64) -> String {
    match us {
        0..1_000 => format!("{us} µs"),
        1_000..1_000_000 => format!("{:.1} ms", us as f64 / 1e3),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}

/// `512 B`, `3.4 KiB`, `2.0 MiB`.
fn size(bytes: u64) -> String {
    match bytes {
        0..1024 => format!("{bytes} B"),
        1024..1_048_576 => format!("{:.1} KiB", bytes as f64 / 1024.0),
        _ => format!("{:.1} MiB", bytes as f64 / 1_048_576.0),
    }
}

/// `1.2 M` instructions, or `-` when not counted (`limits.tool_fuel` off).
fn fuel(fuel: Option<u64>) -> String {
    match fuel {
        None => "-".to_owned(),
        Some(n @ 0..10_000) => n.to_string(),
        Some(n @ 10_000..10_000_000) => format!("{:.1} k", n as f64 / 1e3),
        Some(n) => format!("{:.1} M", n as f64 / 1e6),
    }
}

/// `2 (1 refused), 14 B out, 1.0 MiB in`, or `-` for none.
fn requests(sent: u64, refused: u64, bytes_sent: u64, bytes_received: u64) -> String {
    if sent == 0 && refused == 0 {
        return "-".to_owned();
    }
    let refused = if refused > 0 {
        format!(" ({refused} refused)")
    } else {
        String::new()
    };
    format!(
        "{sent}{refused}, {} sent, {} received",
        size(bytes_sent),
        size(bytes_received)
    )
}
