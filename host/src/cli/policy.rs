//! `capstan policy`.

use std::io::Write;
use std::process::ExitCode;

use clap::Args;

use super::HostArgs;
use super::table::print_table;
use crate::config::{Config, LocationKind, Locations, McpTransport, resolve};
use crate::flow::{Effect, FlowRule, Holding, Label, Origin, Scope};
use crate::plugin::Registry;
use crate::policy::{Decision, InstanceReuse, ProcessKind};
use crate::services::AuditDestination;
use crate::tools::{MatrixRow, ToolCatalog};

#[derive(Debug, Args)]
pub(crate) struct PolicyCommand {
    #[command(flatten)]
    host: HostArgs,
    /// Explains whether a process kind's tool may make a request, and what would allow it:
    /// `--why worker http_request https://api.example.com/v1`. Without a URL, explains
    /// the flow rules a call of the tool meets: `--why worker bank.send_money`, after
    /// reading what `--read` names. Exits 1 when refused.
    #[arg(long, num_args = 2..=3, value_names = ["KIND", "TOOL", "URL"])]
    why: Option<Vec<String>>,
    /// The request's method, for --why.
    #[arg(long, default_value = "GET", requires = "why")]
    method: String,
    /// What the process has read, for --why without a URL, one part at a time:
    /// `untrusted:mcp:bank`, `untrusted:net:example.com`, `private:workspace`,
    /// `secret:NAME`. Unset: the decision after reading each kind of data.
    #[arg(long, value_name = "LABEL", requires = "why")]
    read: Vec<String>,
    /// Checks the policy for what an operator would change: tools named but never offered
    /// (dead cells), kinds that start workers with nothing to work with, loaded tools no
    /// profile names, grants no offered tool uses, and one process given untrusted input
    /// and an external effect at once. Each finding names the config line; exits 1 on
    /// any.
    #[arg(long, conflicts_with = "why")]
    lint: bool,
}

impl PolicyCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let config = self.host.config()?;
        let registry = self
            .host
            .registry_on(
                &config,
                self.host.inspecting_host(&config)?,
                Some(crate::mcp::Servers::Named),
            )
            .await?;
        let catalog = ToolCatalog::new(&registry, &config.policy);
        if self.lint {
            return print_lint(&config, &catalog);
        }
        if let Some(why) = &self.why {
            let mut out = crate::secrets::stdout();
            if let [kind, tool] = &why[..] {
                return explain_flow(&mut out, &catalog, kind, tool, &self.read);
            }
            return super::network::explain(&mut out, &config, &catalog, why, &self.method).await;
        }
        let header: Vec<&str> = std::iter::once("TOOL")
            .chain(ProcessKind::ALL.iter().map(|kind| kind.as_str()))
            .collect();
        let rows: Vec<Vec<String>> = catalog
            .matrix()
            .into_iter()
            .map(|MatrixRow { tool, cells }| {
                std::iter::once(tool)
                    .chain(cells.iter().map(cell))
                    .collect()
            })
            .collect();
        let mut out = crate::secrets::stdout();
        match &config.source {
            Some(path) => writeln!(out, "policy from {}", path.display())?,
            None => writeln!(out, "policy from the built-in defaults")?,
        }
        print_table(&mut out, &header, &rows)?;
        print_plugins(&mut out, &registry)?;
        print_mcp(&mut out, &config, &registry)?;
        print_channels(&mut out, &config, &registry).await?;
        print_reuse(&mut out, &config, &registry)?;
        print_flow(&mut out, &config, &catalog)?;
        super::network::print_network(&mut out, &config, &catalog)?;
        print_locations(&mut out, &self.host.agent_locations(&config)?)?;
        print_audit(&mut out, &config)?;
        Ok(ExitCode::SUCCESS)
    }
}

/// `--lint`: each finding, then each note, with where the key is written; exits 1 on a
/// finding.
fn print_lint(config: &Config, catalog: &ToolCatalog) -> anyhow::Result<ExitCode> {
    let lint = crate::tools::lint::lint(catalog);
    let text = match &config.source {
        Some(path) => Some((path, crate::text::read_text(path)?)),
        None => None,
    };
    // Where to change a key: its line in the config, or the config itself when the key
    // comes from the built-in defaults.
    let place = |key: &str| match &text {
        Some((path, text)) => match crate::text::toml_key_line(text, key) {
            Some(line) => format!("{}:{line}: ", path.display()),
            None => format!("{} (a default; set it there): ", path.display()),
        },
        None => String::new(),
    };
    let mut out = crate::secrets::stdout();
    match &config.source {
        Some(path) => writeln!(out, "policy from {}", path.display())?,
        None => writeln!(
            out,
            "policy from the built-in defaults (a key named below is set in capstan.toml)"
        )?,
    }
    for finding in &lint.findings {
        writeln!(out, "{}{finding}", place(&finding.key))?;
    }
    for note in &lint.notes {
        writeln!(out, "{}{note}", place(&note.key))?;
    }
    let count = lint.findings.len();
    if count == 0 {
        writeln!(out, "no findings")?;
        return Ok(ExitCode::SUCCESS);
    }
    writeln!(out, "{count} finding(s)")?;
    Ok(ExitCode::from(1))
}

/// Each `[mcp.NAME]` server: how it is reached, the process kinds whose profile names its
/// tools, and how many it offers here (or why it was not started).
fn print_mcp(out: &mut impl Write, config: &Config, registry: &Registry) -> std::io::Result<()> {
    if config.mcp.is_empty() {
        return Ok(());
    }
    writeln!(out, "\nMCP servers:")?;
    for spec in &config.mcp {
        let name = &spec.name;
        let reached = match &spec.transport {
            McpTransport::Stdio { command, .. } => format!("started: {command}"),
            McpTransport::Http { url, .. } => format!("at {url}"),
        };
        let kinds: Vec<&str> = ProcessKind::ALL
            .iter()
            .filter(|kind| config.policy.profile(**kind).names_namespace(name))
            .map(|kind| kind.as_str())
            .collect();
        let named = if kinds.is_empty() {
            "named by no profile".to_owned()
        } else {
            format!("named by {}", kinds.join(", "))
        };
        let prefix = format!("{name}.");
        let tools = registry
            .tools()
            .filter(|tool| tool.name.starts_with(&prefix))
            .count();
        let here = match registry.source_down(name) {
            Some(_) => "not started by this command (see the warning above)".to_owned(),
            None => format!("{tools} tool(s) in the matrix"),
        };
        writeln!(out, "  {name:<14}{reached}; {named}; {here}")?;
    }
    Ok(())
}

/// Each `[channels.NAME]`: its adapter as loaded here (the platform and the capabilities
/// its calls hold, or why it does not load), who may talk through it to which profile,
/// who is trusted, and how messages map to conversations.
async fn print_channels(
    out: &mut impl Write,
    config: &Config,
    registry: &Registry,
) -> std::io::Result<()> {
    if config.channels.is_empty() {
        return Ok(());
    }
    writeln!(out, "\nmessaging channels (`capstan serve` runs them):")?;
    for spec in &config.channels {
        let loaded = registry
            .host()
            .load_adapter(
                &spec.adapter,
                spec.settings.clone(),
                crate::messaging::grants_of(spec),
            )
            .await;
        let adapter = match &loaded {
            Ok(adapter) => {
                let caps: Vec<String> = adapter
                    .capabilities()
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                format!(
                    "{} adapter from {}, running with {}",
                    adapter.platform().name,
                    spec.adapter.display(),
                    if caps.is_empty() {
                        "nothing".to_owned()
                    } else {
                        caps.join(", ")
                    }
                )
            }
            Err(err) => format!("does not load: {err}"),
        };
        let list = |senders: &crate::config::Senders| {
            if senders.is_empty() {
                "nobody".to_owned()
            } else {
                senders.names().join(", ")
            }
        };
        writeln!(out, "  {:<14}{adapter}", spec.name)?;
        writeln!(
            out,
            "  {:<14}one conversation per {}; {}",
            "",
            spec.per.as_str(),
            if spec.addressed_only {
                "in rooms with others, only messages that speak to the bot"
            } else {
                "every message"
            }
        )?;
        writeln!(
            out,
            "  {:<14}channel profile: {}; cortex profile: {}",
            "",
            list(&spec.allow),
            list(&spec.admins)
        )?;
        writeln!(
            out,
            "  {:<14}trusted: {}; everyone else's messages are labelled \
             untrusted(chat:{}:SENDER)",
            "",
            list(&spec.trusted),
            spec.name
        )?;
        match &spec.hook {
            Some(crate::config::HookSignature::Slack { secret }) => writeln!(
                out,
                "  {:<14}events pushed to POST /hooks/{}, signed with Slack's signing secret \
                 (secret {secret}), checked by the host",
                "", spec.name
            )?,
            Some(crate::config::HookSignature::Discord { public_key }) => writeln!(
                out,
                "  {:<14}events pushed to POST /hooks/{}, signed with Discord's key {}, \
                 checked by the host",
                "",
                spec.name,
                crate::text::hex(public_key)
            )?,
            None => {}
        }
        if let Some(mail) = &spec.email {
            writeln!(
                out,
                "  {:<14}mailbox: reads {} on {}, sends through {} from {} (as `{}`, password \
                 from secret {}); letters go only to the senders above",
                "", mail.folder, mail.imap, mail.smtp, mail.address, mail.user, mail.password
            )?;
        }
    }
    Ok(())
}

/// Each plugin loaded and the directory it came from, in search-path order, and each file
/// hidden by one of the same name earlier on the path.
fn print_plugins(out: &mut impl Write, registry: &Registry) -> std::io::Result<()> {
    writeln!(
        out,
        "\nplugins (agent.plugins_dir, then the first-party ones unless \
         agent.first_party_plugins = false):"
    )?;
    let dir = |path: &std::path::Path| {
        path.parent()
            .map_or_else(String::new, |dir| resolve(dir).display().to_string())
    };
    for plugin in registry.plugins() {
        writeln!(out, "  {:<14}from {}", plugin.name(), dir(plugin.path()))?;
    }
    for hidden in registry.hidden() {
        let name = hidden
            .file_stem()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        writeln!(
            out,
            "  {name:<14}not loaded from {}: hidden by the file of that name earlier",
            dir(hidden)
        )?;
    }
    Ok(())
}

/// How long each plugin's instances live, per process kind ([`InstanceReuse`]).
fn print_reuse(out: &mut impl Write, config: &Config, registry: &Registry) -> std::io::Result<()> {
    writeln!(
        out,
        "\ninstances (plugins.instance_reuse, profiles.KIND.instance_reuse; \"process\": each \
         process keeps its own, per capability set, never for a call with a network grant):"
    )?;
    let reuse = config.policy.reuse();
    for plugin in registry.plugins() {
        let per_kind: Vec<(ProcessKind, InstanceReuse)> = ProcessKind::ALL
            .iter()
            .map(|kind| (*kind, reuse.decide(*kind, plugin.name())))
            .collect();
        let text = if per_kind.iter().all(|(_, r)| *r == per_kind[0].1) {
            format!("{} for every kind", per_kind[0].1)
        } else {
            per_kind
                .iter()
                .map(|(kind, r)| format!("{kind}: {r}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(out, "  {:<14}{text}", plugin.name())?;
    }
    Ok(())
}

/// `--why KIND TOOL`: what a call of the tool does, where its arguments go, how its result
/// is labelled, and the flow decision after reading `read` (each part of a label), or
/// after reading each kind of data. Exits 1 if the decision for `read` is not to allow.
fn explain_flow(
    out: &mut impl Write,
    catalog: &ToolCatalog,
    kind: &str,
    tool: &str,
    read: &[String],
) -> anyhow::Result<ExitCode> {
    let kind: ProcessKind = kind.parse().map_err(anyhow::Error::msg)?;
    let Some(facts) = catalog.flow_facts(kind, tool) else {
        anyhow::bail!(
            "no tool `{tool}` is loaded; `capstan policy` lists the tools (an MCP server's \
             as SERVER.tool)"
        );
    };
    let offered = catalog.decide(kind, tool);
    writeln!(out, "{tool} for a {kind} process:")?;
    if offered != Decision::Offered {
        writeln!(out, "  not offered: {offered}")?;
    }
    writeln!(out, "  effect: {}", facts.sink.effect)?;
    match &facts.sink.outside {
        Some(outside) => writeln!(out, "  its arguments reach {}", outside.reaches)?,
        None => writeln!(out, "  its arguments stay in the host")?,
    }
    writeln!(out, "  what it returns is labelled {}", facts.result_text())?;
    let decide =
        |context: &Label| catalog.decide_flow(kind, tool, context, &Label::trusted(), &facts.sink);
    if !read.is_empty() {
        let mut context = Label::trusted();
        for part in read {
            let part: Label = part
                .parse()
                .map_err(|err| anyhow::anyhow!("--read {part}: {err}"))?;
            context.join(&part);
        }
        let decision = decide(&context);
        let why = decision.explained(tool, &facts.sink);
        writeln!(out, "  after reading {context}: {why}")?;
        return Ok(if decision.allows() {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        });
    }
    let examples = [
        Label::trusted(),
        Label::untrusted(Origin::Net("example.com".into())),
        facts.result.clone(),
        Label::private(Scope::Workspace),
    ];
    let mut seen = Vec::new();
    for context in examples {
        if seen.contains(&context) {
            continue;
        }
        let decision = decide(&context);
        let why = decision.explained(tool, &facts.sink);
        writeln!(out, "  after reading {context}: {why}")?;
        seen.push(context);
    }
    Ok(ExitCode::SUCCESS)
}

/// Each kind's flow rules, and which tools write locally or send.
fn print_flow(out: &mut impl Write, config: &Config, catalog: &ToolCatalog) -> std::io::Result<()> {
    writeln!(
        out,
        "\ndata flow ([profiles.KIND.flow]: what a call that read data could drive where it \
         should not go meets; refuse, approve or allow):"
    )?;
    let header: Vec<&str> = std::iter::once("KIND")
        .chain(FlowRule::ALL.iter().map(|rule| rule.key()))
        .chain(["handles"])
        .collect();
    let rows: Vec<Vec<String>> = ProcessKind::ALL
        .iter()
        .map(|kind| {
            let profile = config.policy.profile(*kind);
            let rules = profile.flow();
            std::iter::once(kind.to_string())
                .chain(
                    FlowRule::ALL
                        .iter()
                        .map(|rule| rules.action(*rule).to_string()),
                )
                .chain([held_results(profile.holding())])
                .collect()
        })
        .collect();
    print_table(out, &header, &rows)?;
    for effect in [Effect::Send, Effect::WriteLocal] {
        let tools: Vec<&str> = catalog
            .tools()
            .iter()
            .filter(|tool| tool.effect() == effect)
            .map(|tool| tool.name())
            .collect();
        if !tools.is_empty() {
            writeln!(
                out,
                "  {:<13}{} (as they declare themselves)",
                format!("{effect}:"),
                tools.join(", ")
            )?;
        }
    }
    Ok(())
}

/// Which results a kind holds back as handles (`[profiles.KIND.handles]`), in a word or two.
fn held_results(holding: &Holding) -> String {
    match (holding.untrusted, holding.above_bytes) {
        (false, None) => "off".into(),
        (true, None) => "untrusted".into(),
        (false, Some(above)) => format!("above {above} B"),
        (true, Some(above)) => format!("untrusted, above {above} B"),
    }
}

/// Where the host's own files and the workspace are, whether plugins may write the
/// workspace, and any location they could write.
fn print_locations(out: &mut impl Write, locations: &Locations) -> std::io::Result<()> {
    writeln!(out, "\nlocations:")?;
    let mut rows: Vec<(&str, String)> = Vec::new();
    let has = |kind| locations.entries.iter().any(|(k, _)| *k == kind);

    if !has(LocationKind::CacheDir) {
        rows.push(("cache dir", "(none: --no-cache)".into()));
    }
    for (kind, path) in &locations.entries {
        let name = match kind {
            LocationKind::Config | LocationKind::ConfigLookup => "config",
            LocationKind::DataDir => "data dir",
            LocationKind::LockFile => "lock file",
            LocationKind::SpillFile => "spill file",
            LocationKind::CacheDir => "cache dir",
            LocationKind::PluginsDir => "plugins dir",
            LocationKind::Script => "script",
            LocationKind::Recording => "recording",
            LocationKind::WorkspaceRecord => "write record",
            LocationKind::SecretFile => "secret file",
        };
        let mut shown = resolve(path).display().to_string();
        if *kind == LocationKind::ConfigLookup {
            shown.push_str(" (absent: the built-in defaults apply)");
        }
        if *kind == LocationKind::LockFile && !path.exists() {
            shown.push_str(" (absent: no tool is pinned)");
        }
        if *kind == LocationKind::WorkspaceRecord {
            let count = locations.recorded.workspaces().len();
            shown.push_str(&format!(" (workspaces plugins were let write: {count})"));
        }
        rows.push((name, shown));
    }
    let writable = if locations.workspace_writable {
        "writable by plugins: a profile grants fs.write"
    } else {
        "not writable by plugins: no profile grants fs.write"
    };
    rows.push((
        "workspace",
        format!("{} ({writable})", resolve(&locations.workspace).display()),
    ));
    for (name, value) in rows {
        writeln!(out, "  {:<14}{value}", format!("{name}:"))?;
    }
    for problem in locations.violations() {
        writeln!(out, "refused at start: {problem}")?;
    }
    Ok(())
}

fn cell(decision: &Decision) -> String {
    match decision {
        Decision::Offered => "on".into(),
        Decision::NotInProfile => "- not in profile".into(),
        Decision::NotGranted(cap) => format!("- {cap} not granted"),
        Decision::NotLoaded => "- not loaded".into(),
        Decision::NotRunByKind => "- not run by this kind".into(),
    }
}

/// Where each command records its calls: the store, or this process's memory (`--store
/// memory`, or a call without a config file). Nothing is connected to: the store is named
/// as the config gives it.
fn print_audit(out: &mut impl Write, config: &Config) -> std::io::Result<()> {
    let store = AuditDestination::Kept(crate::app::store_location(config));
    let memory = AuditDestination::Kept("this process's memory, gone when it ends".to_owned());
    writeln!(out, "\naudit log of every tool call and request:")?;
    // The demo runs on the built-in defaults in a directory of its own, whatever the config.
    let demo = AuditDestination::Kept(
        "SQLite in the demo's directory (a temporary one, or --dir)".to_owned(),
    );
    let rows = vec![
        vec![
            "run, chat, serve, mcp, tool call".to_owned(),
            store.to_string(),
        ],
        vec![
            "mcp, tool call: --store memory, or no config file".to_owned(),
            memory.to_string(),
        ],
        vec!["demo, serve --demo".to_owned(), demo.to_string()],
    ];
    print_table(out, &["COMMAND", "AUDIT"], &rows)
}
