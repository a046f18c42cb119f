//! `capstan run`, `chat`, `demo` and `tasks`: the agent from the terminal.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;
use tokio::sync::mpsc;

use super::HostArgs;
use super::follow::{Session, Tally};
use super::table::print_table;
use crate::agent::{Event, NotSaved, Runtime};
use crate::app::{Agent, AgentBuilder};
use crate::config::{Config, LocationKind, Locations};
use crate::ids::{ProcessId, ProcessKind};
use crate::services::TaskFilter;
use crate::text::one_line;

/// The built-in demo script, played when the scripted provider has no script file.
const DEMO_SCRIPT: &str = include_str!("../../../examples/demo/script.toml");
/// The demo's input files, written into the workspace's `notes/`.
const DEMO_NOTES: &[(&str, &str)] = &[
    (
        "meeting.md",
        include_str!("../../../examples/demo/notes/meeting.md"),
    ),
    (
        "todo.txt",
        include_str!("../../../examples/demo/notes/todo.txt"),
    ),
];
/// What the demo's user says, in order.
const DEMO_CONVERSATION: &[&str] = &[
    "Gather the open items from the notes in notes/ and summarize them.",
    "yes, create the tasks",
    "Which item is the most urgent?",
    "Save that conclusion to a file, please.",
];

/// Options shared by the agent commands.
#[derive(Debug, Clone, Args)]
pub(crate) struct AgentArgs {
    /// The channel (conversation) to talk in.
    #[arg(long, default_value = "main")]
    channel: String,
    /// Talk to the cortex (the admin chat, with the cortex profile's tools) instead of a
    /// channel.
    #[arg(long)]
    cortex: bool,
    #[command(flatten)]
    launch: Launch,
}

/// How an agent is started: the host's options and the recording; shared by the agent
/// commands and `capstan serve`.
#[derive(Debug, Clone, Args)]
pub(crate) struct Launch {
    /// Save every model exchange as a script the scripted provider can replay.
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) host: HostArgs,
}

impl Launch {
    /// Opens the store, loads the plugins on a host backed by it, and starts a runtime for
    /// one session at the terminal (run, chat, demo): it answers what is forwarded to its
    /// own conversations, and takes over no other host's.
    async fn start(
        &self,
        config: Config,
    ) -> anyhow::Result<(Arc<Runtime>, mpsc::UnboundedReceiver<Event>)> {
        let agent = self.start_agent(config).await?;
        agent.runtime.adopt_conversations(false);
        for event in agent.runtime.found_at_start() {
            crate::say!("  {}", one_line(&event.to_string()));
        }
        Ok((agent.runtime, agent.events))
    }

    /// `start`, with the registry.
    pub(crate) async fn start_agent(&self, config: Config) -> anyhow::Result<Agent> {
        let locations = self.locations(&config)?;
        locations.check()?;
        crate::config::make_workspace(&config.agent.workspace)?;
        // Recorded once it exists, as the path it resolves to.
        super::record_if_writable(locations)?;
        let plugins_dirs = self.host.plugins_dirs(&config)?;
        let mut builder = AgentBuilder::new(config)
            .plugins_dirs(plugins_dirs)
            .cache(self.host.cache()?)
            .default_script(DEMO_SCRIPT, "demo");
        if let Some(path) = &self.record {
            builder = builder.record(path);
        }
        let agent = builder.build().await?;
        super::warn_refused(&agent.registry);
        Ok(agent)
    }

    /// Every location of the host, with the recording (`--record`).
    fn locations(&self, config: &Config) -> anyhow::Result<Locations> {
        let mut locations = self.host.agent_locations(config)?;
        if let Some(path) = &self.record {
            // The recording is rewritten on every exchange: a planted symlink must not
            // lead it anywhere.
            locations.add(LocationKind::Recording, path);
        }
        Ok(locations)
    }

    /// The demo's config: the built-in defaults in `dir` (else a new temporary directory),
    /// with the demo's notes written into its workspace. `command` names the command in
    /// the refusal of a `--config`.
    pub(crate) fn demo_config(&self, dir: Option<&Path>, command: &str) -> anyhow::Result<Config> {
        let dir = match dir {
            Some(dir) => dir.to_owned(),
            None => tempdir_path()?,
        };
        anyhow::ensure!(
            self.host.config.is_none(),
            "{command} runs on the built-in defaults and reads no config; drop --config"
        );
        let config = Config::defaults_with(&dir, &self.host.overrides()?)?;
        // Before the notes are written into a workspace the host may not use.
        self.check_locations(&config)?;
        write_demo_notes(&config.agent.workspace)?;
        Ok(config)
    }

    /// Refuses to start when plugins could write any of the host's files.
    fn check_locations(&self, config: &Config) -> anyhow::Result<()> {
        Ok(self.locations(config)?.check()?)
    }
}

impl AgentArgs {
    /// The conversation the messages go to: the channel, or the admin chat with
    /// `--cortex`, which is a process of its own.
    fn conversation(&self) -> anyhow::Result<ProcessId> {
        let kind = if self.cortex {
            ProcessKind::Cortex
        } else {
            ProcessKind::Channel
        };
        ProcessId::conversation(kind, &self.channel)
            .map_err(|why| anyhow::anyhow!("--channel: {why}"))
    }
}

/// Exit codes of run, chat and demo beyond 0 (done) and 1 (an error of the host).
pub(crate) mod exit {
    /// A model request failed or timed out, or a history could not be saved.
    pub(crate) const FAILED: u8 = 2;
    /// Stopped by SIGINT.
    pub(super) const INTERRUPTED: u8 = 130;
    /// Stopped by SIGTERM.
    pub(super) const TERMINATED: u8 = 143;
    /// Stopped because the host's run lease was lost (another host may answer now).
    pub(crate) const LEASE_LOST: u8 = 3;
}

/// Reads the runtime's event stream to its end, which comes once every process has
/// finished: what the session shows comes from its exchanges; this stream is for
/// observers (`capstan serve`'s `/v1/events`).
async fn events_ended(mut events: mpsc::UnboundedReceiver<Event>) {
    while events.recv().await.is_some() {}
}

/// Says that `lost`'s conversation stopped with its history not stored, and where what it
/// held is (the spill file), or that it is lost.
pub(crate) fn say_not_saved(lost: &NotSaved) {
    match &lost.spilled {
        Some(spill) => crate::say!(
            "error: {} was not stored: the store refused its history to the end ({}); it is \
             kept in the spill file {} and stored at the next start",
            lost.conversation,
            one_line(&lost.error),
            spill.display()
        ),
        None => crate::say!(
            "error: {} was not stored: the store refused its history to the end ({}); what it \
             did since its last stored exchange is lost",
            lost.conversation,
            one_line(&lost.error)
        ),
    }
}

/// What stopped a session: a signal, or the loss of the host's run lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    Interrupt,
    Terminate,
    LeaseLost,
}

/// What a host says when its run lease was lost.
pub(crate) const LEASE_LOST: &str = "error: this host's run lease expired before it was \
    renewed (the host was paused, or cut off from the database, for longer than the lease): \
    another host may answer its conversations now, so it stopped them and stored nothing \
    more. Start it again to serve.";

/// SIGINT and SIGTERM, caught from the moment they are installed: a signal that arrives
/// before anything waits for it is still seen, instead of killing the process at once.
pub(crate) struct StopSignals {
    #[cfg(unix)]
    interrupt: tokio::signal::unix::Signal,
    #[cfg(unix)]
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers now.
    pub(crate) fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            StopSignals {
                interrupt: signal(SignalKind::interrupt()).expect("installing the SIGINT handler"),
                terminate: signal(SignalKind::terminate()).expect("installing the SIGTERM handler"),
            }
        }
        #[cfg(not(unix))]
        StopSignals {}
    }

    /// The next SIGINT or SIGTERM.
    pub(crate) async fn next(&mut self) -> Stop {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.interrupt.recv() => Stop::Interrupt,
                _ = self.terminate.recv() => Stop::Terminate,
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            Stop::Interrupt
        }
    }
}

/// Runs `work` until it ends or a signal arrives. On a signal the runtime stops
/// gracefully (workers end interrupted, histories are stored); a second signal exits at
/// once.
async fn until_stopped(runtime: &Arc<Runtime>, work: impl Future<Output = ()>) -> Option<Stop> {
    // Installed before the work starts: a signal sent once a worker has started (another
    // thread may start it before this one polls anything but the work) is caught, never
    // the default action that kills the process unsaved.
    let mut signals = StopSignals::install();
    let stop = tokio::select! {
        () = work => return None,
        () = runtime.lease_lost() => {
            // The runtime is stopping its processes already.
            crate::say!("{LEASE_LOST}");
            return Some(Stop::LeaseLost);
        }
        stop = signals.next() => stop,
    };
    crate::say!(
        "(stopping: running workers are interrupted and the histories written to the \
         store; the last line says whether all are stored; a second signal quits at once)"
    );
    runtime.interrupt();
    tokio::spawn(async move {
        let again = signals.next().await;
        std::process::exit(i32::from(exit_code_of(Some(again), Tally::default())));
    });
    Some(stop)
}

/// The exit code of a session that ended by `stop` with `tally`.
pub(crate) fn exit_code_of(stop: Option<Stop>, tally: Tally) -> u8 {
    match stop {
        Some(Stop::Interrupt) => exit::INTERRUPTED,
        Some(Stop::Terminate) => exit::TERMINATED,
        Some(Stop::LeaseLost) => exit::LEASE_LOST,
        None if tally.failures > 0 => exit::FAILED,
        None => 0,
    }
}

/// Shuts `runtime` down, waits for its processes to finish and for `session`'s exchanges
/// to be shown, reports each conversation whose history could not be stored, and gives
/// the exit code with how the session went.
async fn finish(
    runtime: Arc<Runtime>,
    events: tokio::task::JoinHandle<()>,
    stop: Option<Stop>,
    session: Session,
) -> (ExitCode, Tally) {
    let report = runtime.stop_report();
    runtime.shutdown();
    let services = runtime.services().clone();
    drop(runtime);
    // The session's opener holds the runtime: it ends first, then the event stream can.
    let mut tally = session.end().await;
    let _ = events.await;
    let not_saved = report.ended().await;
    not_saved.iter().for_each(say_not_saved);
    tally.failures += not_saved.len();
    if stop.is_some() {
        match not_saved.len() {
            0 => crate::say!("(stopped: every conversation's history is stored)"),
            n => crate::say!("(stopped: {n} conversation(s) not stored, listed above)"),
        }
    }
    // The run ended with the runtime; other hosts learn it before this process exits.
    services.ledger.settle().await;
    (ExitCode::from(exit_code_of(stop, tally)), tally)
}

#[derive(Debug, Args)]
pub(crate) struct RunCommand {
    /// The message.
    message: String,
    #[command(flatten)]
    agent: AgentArgs,
}

impl RunCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let conversation = self.agent.conversation()?;
        let config = self.agent.launch.host.config()?;
        let (runtime, events) = self.agent.launch.start(config).await?;
        let events = tokio::spawn(events_ended(events));
        let session = Session::start(&runtime, &conversation);
        let stop = until_stopped(&runtime, async {
            session.converse(self.message).await;
        })
        .await;
        let (code, _) = finish(runtime, events, stop, session).await;
        Ok(code)
    }
}

#[derive(Debug, Args)]
pub(crate) struct ChatCommand {
    #[command(flatten)]
    agent: AgentArgs,
}

impl ChatCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let conversation = self.agent.conversation()?;
        let config = self.agent.launch.host.config()?;
        let (runtime, events) = self.agent.launch.start(config).await?;
        let events = tokio::spawn(events_ended(events));
        crate::say!(
            "capstan chat on channel `{}`: type messages (they go in as you type, even while \
             workers run), or /quit",
            self.agent.channel
        );
        let (lines_tx, mut lines) = mpsc::unbounded_channel();
        // Stdin is blocking: read it on its own thread.
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Each line goes in as it is typed, even while workers run: a follow-up for a busy
        // worker can be routed to it. Replies show as they come, whichever message's work
        // they are.
        let session = Session::start(&runtime, &conversation);
        let stop = until_stopped(&runtime, async {
            while let Some(line) = lines.recv().await {
                let line = line.trim().to_owned();
                if line == "/quit" || line == "/exit" {
                    break;
                }
                if !line.is_empty() {
                    session.send(line);
                }
            }
            crate::say!("(finishing the work in progress)");
            session.settled().await;
        })
        .await;
        let (code, _) = finish(runtime, events, stop, session).await;
        Ok(code)
    }
}

#[derive(Debug, Args)]
pub(crate) struct DemoCommand {
    /// Where to put the demo's workspace and database [default: a new temporary directory].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    #[command(flatten)]
    agent: AgentArgs,
}

impl DemoCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let conversation = self.agent.conversation()?;
        let config = self
            .agent
            .launch
            .demo_config(self.dir.as_deref(), "capstan demo")?;
        let workspace = config.agent.workspace.clone();
        let database = crate::app::sqlite_file(&config)
            .context("the demo keeps its store in SQLite, in its own directory")?;
        // The tasks are read back from the store after the run, as `capstan tasks` would.
        let demo_config = config.clone();
        // Written with errors returned, not println!: a reader that stops early
        // (`capstan demo | head`) ends the demo quietly instead of a panic.
        let mut out = crate::secrets::stdout();
        writeln!(out, "Capstan demo")?;
        writeln!(out, "  workspace: {}", workspace.display())?;
        writeln!(out, "  database:  {}", database.display())?;
        let (runtime, events) = self.agent.launch.start(config).await?;
        writeln!(out, "  model:     {}\n", runtime.provider_name())?;
        let events = tokio::spawn(events_ended(events));
        let session = Session::start(&runtime, &conversation);
        let mut sent = Ok(());
        let stop = until_stopped(&runtime, async {
            for message in DEMO_CONVERSATION {
                if let Err(err) = writeln!(crate::secrets::stdout(), "you> {message}") {
                    sent = Err(err);
                    return;
                }
                let message = (*message).to_owned();
                session.converse(message).await;
                let _ = writeln!(crate::secrets::stdout());
            }
        })
        .await;
        let (code, tally) = finish(runtime, events, stop, session).await;
        sent?;
        if stop.is_some() {
            return Ok(code);
        }
        let Tally {
            workers, branches, ..
        } = tally;
        writeln!(
            out,
            "hops: {workers} workers and {branches} branches were delegated to"
        )?;
        writeln!(
            out,
            "analysis file: {}",
            workspace.join("analysis.md").display()
        )?;
        writeln!(out, "\ntasks, read back from {}:", database.display())?;
        print_tasks(&crate::app::open_services(&demo_config).await?).await?;
        Ok(code)
    }
}

/// Writes the demo's notes into `workspace/notes/` through a handle on the workspace, so
/// a symlink planted in an existing workspace (`--dir`) cannot lead a write outside it.
fn write_demo_notes(workspace: &Path) -> anyhow::Result<()> {
    crate::config::make_workspace(workspace)?;
    let dir = cap_std::fs::Dir::open_ambient_dir(workspace, cap_std::ambient_authority())
        .with_context(|| format!("opening the workspace {}", workspace.display()))?;
    let notes = workspace.join("notes");
    dir.create_dir_all("notes")
        .with_context(|| format!("creating {}", notes.display()))?;
    for (name, text) in DEMO_NOTES {
        dir.write(format!("notes/{name}"), text)
            .with_context(|| format!("writing {}", notes.join(name).display()))?;
    }
    Ok(())
}

/// A fresh directory under the system temp dir, kept after the demo for inspection.
fn tempdir_path() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    for n in 0..1000u32 {
        let dir = base.join(format!("capstan-demo-{}-{n}", std::process::id()));
        if std::fs::create_dir(&dir).is_ok() {
            return Ok(dir);
        }
    }
    anyhow::bail!("cannot create a demo directory in {}", base.display())
}

#[derive(Debug, Args)]
pub(crate) struct TasksCommand {
    #[command(flatten)]
    host: HostArgs,
}

impl TasksCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.host.config()?;
        print_tasks(&crate::app::open_services(&config).await?).await?;
        Ok(ExitCode::SUCCESS)
    }
}

async fn print_tasks(services: &crate::services::Services) -> anyhow::Result<()> {
    let filter = TaskFilter {
        limit: Some(1000),
        ..TaskFilter::default()
    };
    let tasks = services.tasks.list(filter).await?;
    let mut out = crate::secrets::stdout();
    if tasks.is_empty() {
        writeln!(out, "(no tasks)")?;
        return Ok(());
    }
    let rows: Vec<Vec<String>> = tasks
        .iter()
        .map(|t| {
            vec![
                format!("#{}", t.number),
                t.status.to_string(),
                t.priority.as_str().to_owned(),
                one_line(&t.title).into_owned(),
                one_line(&t.creator.to_string()).into_owned(),
            ]
        })
        .collect();
    print_table(
        &mut out,
        &["TASK", "STATUS", "PRIORITY", "TITLE", "CREATED BY"],
        &rows,
    )?;
    Ok(())
}
