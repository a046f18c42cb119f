//! `capstan serve`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;

use super::agent::{LEASE_LOST, Launch, StopSignals, exit, say_not_saved};
use crate::config::parse_addr;
use crate::messaging::Channels;
use crate::serve::{Server, openapi_json};

/// How long a stopping server waits for its conversations to store their histories and
/// end, once the requests are over.
const STOP_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Debug, Args)]
pub(crate) struct ServeCommand {
    /// The address to listen on, IP:PORT [default: serve.addr, 127.0.0.1:8787]. Any
    /// address but loopback needs a token ([serve.tokens]).
    #[arg(long, value_name = "IP:PORT", value_parser = parse_addr)]
    addr: Option<SocketAddr>,
    /// Serve the demo: its notes in a new directory (or --dir) and its scripted model, on
    /// the built-in defaults.
    #[arg(long)]
    demo: bool,
    /// With --demo: where to put the demo's workspace and database.
    #[arg(long, value_name = "DIR", requires = "demo")]
    dir: Option<PathBuf>,
    /// Print the service's OpenAPI document and exit.
    #[arg(long)]
    openapi: bool,
    #[command(flatten)]
    launch: Launch,
}

impl ServeCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        if self.openapi {
            writeln!(crate::secrets::stdout(), "{}", openapi_json())?;
            return Ok(ExitCode::SUCCESS);
        }
        let config = if self.demo {
            self.launch
                .demo_config(self.dir.as_deref(), "capstan serve --demo")?
        } else {
            self.launch.host.config()?
        };
        let mut settings = config.serve.clone();
        if let Some(addr) = self.addr {
            settings.addr = addr;
        }
        let workspace = config.agent.workspace.clone();
        let channel_specs = config.channels.clone();
        let data_dir = config.agent.data_dir.clone();
        let agent = self.launch.start_agent(config).await?;
        let plugin_host = agent.registry.host().clone();
        // A channel that cannot run as configured stops the start, naming its table.
        Channels::check(&plugin_host, &channel_specs).await?;
        let provider = agent.runtime.provider_name();
        let services = agent.runtime.services().clone();
        let runtime = agent.runtime.clone();
        let report = runtime.stop_report();
        let channel_names: Vec<String> = channel_specs.iter().map(|c| c.name.clone()).collect();
        let server = Server::bind(&settings, agent.runtime.clone(), agent.events).await?;
        // The messaging channels start once the server is bound: a message they take is
        // answered by the same runtime the HTTP doors use.
        let channels = Channels::start(
            agent.runtime,
            plugin_host,
            channel_specs,
            data_dir,
            server.hooks(),
        );
        // Caught before the banner: a supervisor may signal as soon as it reads it.
        let mut signals = StopSignals::install();
        // The first line is for programs too: the URL, with the port the system chose. A
        // reader that goes away after it (`capstan serve | head -1`) does not stop the server.
        let _ = print_banner(&server, &provider, &workspace, &channel_names);
        let lost = Arc::new(AtomicBool::new(false));
        let stop = {
            let lost = lost.clone();
            async move {
                tokio::select! {
                    _ = signals.next() => crate::say!(
                        "(stopping: new connections refused, running workers interrupted, \
                         histories written to the store; the last line says whether all \
                         are stored; a second signal quits at once)"
                    ),
                    () = runtime.lease_lost() => {
                        crate::say!("{LEASE_LOST}");
                        lost.store(true, Ordering::SeqCst);
                    }
                }
                // No new message is taken once the host stops; one being answered ends
                // with the runtime, its cursor not moved, so it comes again.
                channels.stop().await;
                drop(runtime);
                tokio::spawn(async move {
                    signals.next().await;
                    std::process::exit(1);
                });
            }
        };
        server.run(stop).await?;
        let (not_saved, all_ended) = match report.ended_within(STOP_LIMIT).await {
            Ok(not_saved) => (not_saved, true),
            Err(so_far) => {
                crate::say!(
                    "error: some conversations had not stopped {} s after the server did \
                     (their histories may still be on their way to the store): what they \
                     held since their last stored exchange may be lost",
                    STOP_LIMIT.as_secs()
                );
                (so_far, false)
            }
        };
        not_saved.iter().for_each(say_not_saved);
        // The run ended with the runtime; other hosts learn it before this process exits.
        services.ledger.settle().await;
        let whole = not_saved.is_empty() && all_ended;
        if whole {
            crate::say!("(stopped: every conversation's history is stored)");
        } else {
            crate::say!(
                "(stopped: {} conversation(s) not stored{}, listed above)",
                not_saved.len(),
                if all_ended { "" } else { ", others not known" }
            );
        }
        Ok(if lost.load(Ordering::SeqCst) {
            ExitCode::from(exit::LEASE_LOST)
        } else if whole {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(exit::FAILED)
        })
    }
}

/// Where the server listens and what it serves.
fn print_banner(
    server: &Server,
    provider: &str,
    workspace: &std::path::Path,
    channels: &[String],
) -> std::io::Result<()> {
    let addr = server.local_addr();
    let mut out = crate::secrets::stdout();
    writeln!(out, "capstan serve: listening on http://{addr}/")?;
    out.flush()?;
    writeln!(out, "  page:      http://{addr}/")?;
    writeln!(out, "  API:       http://{addr}/v1 (GET /v1/openapi.json)")?;
    writeln!(
        out,
        "  OpenAI:    http://{addr}/v1/chat/completions, model `capstan`"
    )?;
    writeln!(out, "  model:     {provider}")?;
    writeln!(out, "  workspace: {}", workspace.display())?;
    if !channels.is_empty() {
        writeln!(out, "  channels:  {}", channels.join(", "))?;
    }
    if server.needs_token() {
        writeln!(out, "  tokens:    required (Authorization: Bearer TOKEN)")?;
    } else {
        writeln!(out, "  tokens:    none configured; loopback clients only")?;
    }
    out.flush()
}
