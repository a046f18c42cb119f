//! [`Registry`]: the loaded plugins of a directory, and calls routed by tool name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use capstan_caps::Capability;
use serde::de::IgnoredAny;

use super::admission::{admit_plugin, admit_tools};
use super::call_log::CallLog;
use super::error::{HostError, LoadError, ToolError};
use super::external::ExternalTools;
use super::host::{Invocation, PluginHost};
use super::loaded::{LoadedPlugin, ToolInfo};
use super::settle::{Preferences, Shadowed, settle};
use super::touched::{CallTrace, Ran, Touched};
use super::trust::{Lock, ServerPin};
use super::warm::ProcessInstances;
use crate::ids::{Caller, SessionKey};
use crate::net::GrantSource;
use crate::policy::{Grants, InstanceReuse};
use crate::services::{AuditRecord, Committing, Receipt};
use crate::telemetry::spans::{self, ToolSite};
use crate::telemetry::{DenialReason, UNKNOWN_TOOL};
use crate::text::{MAX_ECHOED_NAME, echo_name, one_line};

/// One tool call: which tool, its arguments, and the caller's grants.
#[derive(Debug, Clone, Copy)]
pub struct CallRequest<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The arguments, a JSON object.
    pub args_json: &'a str,
    /// What the caller holds; the call runs with the tool's declared capabilities that
    /// these allow, or is refused.
    pub grants: &'a Grants,
    /// The directory file capabilities apply to.
    pub workspace: Option<&'a Path>,
    /// Who is calling, e.g. `cli` or `worker:7`; passed to the tool and logged.
    pub caller: &'a Caller,
    /// The calling process's own instances: given, a plugin whose instances the process
    /// reuses (as its caller's policy says, for a call the
    /// [`ToolRouter`](crate::tools::ToolRouter) sends; [`Registry::call`] reuses every
    /// plugin's) runs in the one kept there. `None`: a fresh instance.
    pub instances: Option<&'a ProcessInstances>,
}

/// A call that has ended, whose audit row may not be committed yet
/// (`Registry::call_offered`, `Registry::refuse_call`).
#[derive(Debug)]
#[must_use = "the result may leave the host only once its audit row is committed"]
pub struct Recorded {
    result: Result<String, ToolError>,
    audit: Option<Committing>,
    touched: Touched,
}

impl Recorded {
    /// What the call touched beyond its arguments (nothing, for a call that never ran a
    /// plugin).
    pub fn touched(&self) -> &Touched {
        &self.touched
    }

    /// The result, once the audit row is committed. A row that cannot be written is
    /// logged as an error; the result is returned all the same.
    pub async fn committed(self) -> Result<String, ToolError> {
        let (result, audit) = self.into_parts();
        if let Some(audit) = audit {
            committed(audit).await;
        }
        result
    }

    /// The result now, and the audit row's commit, to wait for ([`committed`]) before
    /// the result leaves the host.
    pub fn into_parts(self) -> (Result<String, ToolError>, Option<Committing>) {
        (self.result, self.audit)
    }
}

/// Waits for an audit row's commit; a row that cannot be written is logged as an error.
pub async fn committed(audit: Committing) {
    if let Err(err) = audit.wait().await {
        tracing::error!("cannot write the audit log: {err}");
    }
}

/// The plugins loaded from a directory, and the ones refused with why.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::path::Path;
/// use capstan_host::ids::Caller;
/// use capstan_host::plugin::{ArtifactCache, CallLog, CallRequest, Limits, PluginHost, Registry};
/// use capstan_host::policy::Grants;
///
/// let host = PluginHost::new(Limits::default(), ArtifactCache::disabled())?;
/// let log = CallLog::disabled();
/// let registry = Registry::load_dir(host.into(), log, Path::new("target/plugins")).await?;
/// let grants: Grants = "fs.read".parse()?;
/// let text = registry
///     .call(CallRequest {
///         tool: "file_read",
///         args_json: r#"{"path": "README.md"}"#,
///         grants: &grants,
///         workspace: Some(Path::new(".")),
///         caller: &Caller::client("example", None),
///         instances: None,
///     })
///     .await?;
/// println!("{text}");
/// # Ok(())
/// # }
/// ```
pub struct Registry {
    host: Arc<PluginHost>,
    /// Where each call is recorded, its arguments redacted.
    log: CallLog,
    plugins: Vec<Arc<LoadedPlugin>>,
    /// Tool name -> (plugin, index into its tools).
    tools: HashMap<String, (Arc<LoadedPlugin>, usize)>,
    refused: Vec<LoadError>,
    shadowed: Vec<Shadowed>,
    /// Plugin files not loaded: a file of the same name comes earlier on the search path.
    hidden: Vec<PathBuf>,
    /// The tools of external sources (MCP servers), in the order they were added.
    external: Vec<ExternalTool>,
    /// Namespaced tool name -> index into `external`.
    external_index: HashMap<String, usize>,
    /// What went wrong adding external sources, a line each.
    external_problems: Vec<String>,
    /// External sources that offer no tools, and why: named when one of their tools is
    /// called.
    sources_down: HashMap<String, String>,
    next_call: AtomicU64,
}

/// One tool of an external source.
struct ExternalTool {
    source: Arc<dyn ExternalTools>,
    /// The source's own name for it.
    remote: String,
    /// As the policy and the model see it: named `SOURCE.remote`.
    info: ToolInfo,
}

impl Registry {
    /// An empty registry whose calls run on `host` and are recorded in `log`.
    pub fn new(host: Arc<PluginHost>, log: CallLog) -> Self {
        Registry {
            host,
            log,
            plugins: Vec::new(),
            tools: HashMap::new(),
            refused: Vec::new(),
            shadowed: Vec::new(),
            hidden: Vec::new(),
            external: Vec::new(),
            external_index: HashMap::new(),
            external_problems: Vec::new(),
            sources_down: HashMap::new(),
            next_call: AtomicU64::new(1),
        }
    }

    /// Loads every `*.wasm` file in `dir`. A file that fails a check is refused (see
    /// [`Registry::refused`]) and the others still load; only an unreadable directory is an
    /// error. A tool name several plugins declare refuses each of them (see
    /// [`Registry::load_dir_preferring`] to settle it).
    pub async fn load_dir(
        host: Arc<PluginHost>,
        log: CallLog,
        dir: &Path,
    ) -> Result<Self, HostError> {
        Registry::load_dir_preferring(host, log, dir, &Preferences::new()).await
    }

    /// Loads every `*.wasm` file in `dir`, then settles the tool names several plugins
    /// declare by `prefer`, never by file-name order: the preferred plugin provides the
    /// tool and the others' tool of that name is not offered (see [`Registry::shadowed`]);
    /// an unsettled name refuses every plugin that declares it, naming the others and the
    /// config key. Entries that are not regular files are refused with what they are.
    pub async fn load_dir_preferring(
        host: Arc<PluginHost>,
        log: CallLog,
        dir: &Path,
        prefer: &Preferences,
    ) -> Result<Self, HostError> {
        Registry::load_dirs_preferring(host, log, &[dir.to_owned()], prefer).await
    }

    /// [`Registry::load_dir_preferring`] over a search path: every `*.wasm` file of `dirs`,
    /// where a file in an earlier directory hides a file of the same name in a later one
    /// (a plugin is named by its file). Tool names that plugins of different directories
    /// both declare are settled by `prefer` as within one.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), capstan_host::plugin::HostError> {
    /// use std::path::PathBuf;
    /// use std::sync::Arc;
    /// use capstan_host::plugin::{ArtifactCache, CallLog, Limits, PluginHost, Preferences, Registry};
    ///
    /// let host = Arc::new(PluginHost::new(Limits::default(), ArtifactCache::disabled())?);
    /// let dirs = [PathBuf::from("my-plugins"), PathBuf::from("target/plugins")];
    /// let registry =
    ///     Registry::load_dirs_preferring(host, CallLog::disabled(), &dirs, &Preferences::new()).await?;
    /// for plugin in registry.plugins() {
    ///     println!("{} from {}", plugin.name(), plugin.path().display());
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn load_dirs_preferring(
        host: Arc<PluginHost>,
        log: CallLog,
        dirs: &[PathBuf],
        prefer: &Preferences,
    ) -> Result<Self, HostError> {
        let mut registry = Registry::new(host, log);
        let mut files: Vec<PathBuf> = Vec::new();
        for dir in dirs {
            let list_error = |source| HostError::PluginsDir {
                path: dir.to_owned(),
                source,
            };
            // Not only regular files: a FIFO or directory named `*.wasm` is refused by
            // name rather than skipped in silence.
            let mut here: Vec<PathBuf> = std::fs::read_dir(dir)
                .map_err(list_error)?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|path| path.extension().is_some_and(|ext| ext == "wasm"))
                .collect();
            here.sort();
            for path in here {
                let earlier = files.iter().find(|f| f.file_name() == path.file_name());
                match earlier {
                    Some(earlier) => {
                        tracing::info!(
                            "{} is hidden by {}, earlier on the plugin search path",
                            path.display(),
                            earlier.display()
                        );
                        registry.hidden.push(path);
                    }
                    None => files.push(path),
                }
            }
        }
        let pins_dir = dirs.first().map(PathBuf::as_path).unwrap_or(Path::new("."));
        registry.refuse_missing_pins(pins_dir, &files);
        // Compiled (or taken from the cache) on blocking threads, as many at once as there
        // are cores, so a slow compile never holds up the executor nor a describe() running
        // on it; then described in file order, so the outcome does not depend on which
        // ended first.
        let parallel = std::thread::available_parallelism().map_or(1, |n| n.get());
        let permits = Arc::new(tokio::sync::Semaphore::new(parallel));
        let prepares: Vec<_> = files
            .into_iter()
            .map(|path| {
                let host = registry.host.clone();
                let permits = permits.clone();
                tokio::spawn(async move {
                    let _permit = permits.acquire_owned().await;
                    let prepare = {
                        let path = path.clone();
                        tokio::task::spawn_blocking(move || host.prepare(&path))
                    };
                    prepare.await.unwrap_or_else(|err| {
                        Err(LoadError::Invalid {
                            path,
                            reason: format!("the host failed while loading it (a bug): {err}"),
                        })
                    })
                })
            })
            .collect();
        let mut loaded = Vec::with_capacity(prepares.len());
        for prepare in prepares {
            let prepared = prepare.await.expect("a prepare task is never cancelled");
            match async { registry.admit(registry.host.finish(prepared?).await?) }.await {
                Ok(plugin) => loaded.push(plugin),
                Err(err) => registry.refuse(err),
            }
        }
        let settled = settle(loaded, prefer);
        for err in settled.refused {
            registry.refuse(err);
        }
        for shadowed in settled.shadowed {
            tracing::warn!("{shadowed}");
            registry.shadowed.push(shadowed);
        }
        for plugin in settled.accepted {
            registry
                .add(plugin)
                .expect("settled plugins declare each tool name once");
        }
        Ok(registry)
    }

    /// Loads one component file; on failure records the refusal and returns it. A tool name
    /// already offered refuses the file: a plugin added later never shadows one before it.
    pub async fn add_file(&mut self, path: &Path) -> Result<(), &LoadError> {
        let result = match self.host.load(path).await {
            Ok(plugin) => self.admit(plugin).and_then(|plugin| self.add(plugin)),
            Err(err) => Err(err),
        };
        match result {
            Ok(()) => Ok(()),
            Err(err) => {
                self.refuse(err);
                Err(self.refused.last().expect("just pushed"))
            }
        }
    }

    /// `plugin`, if the host's lock (if any) lets it in as it is.
    fn admit(&self, plugin: LoadedPlugin) -> Result<LoadedPlugin, LoadError> {
        match &self.host.trust().pins {
            Some(pins) => admit_plugin(pins, plugin),
            None => Ok(plugin),
        }
    }

    /// Refuses each plugin the host's lock pins whose file is not among `files` of `dir`.
    fn refuse_missing_pins(&mut self, dir: &Path, files: &[PathBuf]) {
        let host = self.host.clone();
        let Some(pins) = &host.trust().pins else {
            return;
        };
        // By name as plugins are named: lossily, for a file name that is not UTF-8.
        let present: std::collections::HashSet<_> = files
            .iter()
            .filter_map(|path| path.file_stem())
            .map(|stem| stem.to_string_lossy())
            .collect();
        for plugin in pins.lock().plugins.keys() {
            if !present.contains(plugin.as_str()) {
                self.refuse(LoadError::PinnedMissing {
                    path: dir.join(format!("{plugin}.wasm")),
                    plugin: plugin.clone(),
                    lock: pins.path().to_owned(),
                });
            }
        }
    }

    fn refuse(&mut self, err: LoadError) {
        tracing::warn!("plugin refused: {err}");
        self.refused.push(err);
    }

    /// Adds a loaded plugin unless one of its tool names is taken.
    fn add(&mut self, plugin: LoadedPlugin) -> Result<(), LoadError> {
        for tool in plugin.tools() {
            if let Some((other, _)) = self.tools.get(&tool.name) {
                return Err(LoadError::DuplicateTool {
                    path: plugin.path.clone(),
                    tool: tool.name.clone(),
                    others: vec![other.path.clone()],
                    choices: vec![other.name.to_string(), plugin.name.to_string()],
                    preferred: None,
                });
            }
        }
        let plugin = Arc::new(plugin);
        for (index, tool) in plugin.tools().iter().enumerate() {
            self.tools
                .insert(tool.name.clone(), (plugin.clone(), index));
        }
        self.plugins.push(plugin);
        Ok(())
    }

    /// The lock that pins every plugin loaded and every external tool offered now: what
    /// `capstan plugins lock` writes.
    pub fn lock(&self) -> Lock {
        let mut lock = Lock::default();
        for plugin in &self.plugins {
            lock.plugins
                .insert(plugin.name().to_owned(), plugin.pin().clone());
        }
        for tool in &self.external {
            let server = lock
                .mcp
                .entry(tool.source.name().to_owned())
                .or_insert_with(|| ServerPin::of::<String>(&tool.source.identity(), []));
            server.tools.insert(tool.remote.clone(), tool.info.pin());
        }
        lock
    }

    /// The tools a plugin declares but does not provide, because the config prefers
    /// another plugin for the name.
    pub fn shadowed(&self) -> &[Shadowed] {
        &self.shadowed
    }

    /// The plugin files not loaded because a file of the same name comes earlier on the
    /// search path ([`Registry::load_dirs_preferring`]).
    pub fn hidden(&self) -> &[PathBuf] {
        &self.hidden
    }

    /// The host the plugins run on.
    pub fn host(&self) -> &Arc<PluginHost> {
        &self.host
    }

    /// The loaded plugins, in load order.
    pub fn plugins(&self) -> &[Arc<LoadedPlugin>] {
        &self.plugins
    }

    /// The files refused at load, each with why.
    pub fn refused(&self) -> &[LoadError] {
        &self.refused
    }

    /// A tool and the plugin that provides it.
    pub fn tool(&self, name: &str) -> Option<(&LoadedPlugin, &ToolInfo)> {
        self.tools
            .get(name)
            .map(|(plugin, index)| (&**plugin, &plugin.tools[*index]))
    }

    /// Adds the tools of an external source: each `(remote, info)` is the source's own
    /// name for a tool and the tool as policy and models see it, named
    /// `SOURCE.remote`. A name already taken is skipped and returned. Where the host has
    /// a lock, a tool it does not pin as it is, or every tool of a source that is not
    /// pinned or moved, is left out, each with why in [`Registry::external_problems`].
    pub fn add_external(
        &mut self,
        source: Arc<dyn ExternalTools>,
        tools: Vec<(String, ToolInfo)>,
    ) -> Vec<String> {
        let host = self.host.clone();
        let tools = match &host.trust().pins {
            Some(pins) => {
                let (admitted, refused) = admit_tools(pins, &*source, tools);
                self.external_problems.extend(refused);
                admitted
            }
            None => tools,
        };
        let mut skipped = Vec::new();
        for (remote, info) in tools {
            if self.tools.contains_key(&info.name) || self.external_index.contains_key(&info.name) {
                skipped.push(info.name);
                continue;
            }
            self.external_index
                .insert(info.name.clone(), self.external.len());
            self.external.push(ExternalTool {
                source: source.clone(),
                remote,
                info,
            });
        }
        skipped
    }

    /// Records what went wrong adding an external source (a server that did not start, a
    /// tool left out), for [`Registry::external_problems`].
    pub fn add_external_problem(&mut self, problem: String) {
        self.external_problems.push(problem);
    }

    /// Records that the external source `source` offers no tools, and why: a call of one
    /// of its tools (`source.tool`) says so rather than that no such tool is loaded.
    pub fn add_source_down(&mut self, source: &str, why: String) {
        self.sources_down.insert(source.to_owned(), why.clone());
        self.external_problems.push(why);
    }

    /// Why the external source `source` offers no tools, if it was recorded down.
    pub fn source_down(&self, source: &str) -> Option<&str> {
        self.sources_down.get(source).map(String::as_str)
    }

    /// What went wrong adding external sources, a line each.
    pub fn external_problems(&self) -> &[String] {
        &self.external_problems
    }

    /// Every tool: each plugin's in load order, then each external source's.
    pub fn tools(&self) -> impl Iterator<Item = &ToolInfo> {
        let plugins = self.plugins.iter().flat_map(|plugin| plugin.tools());
        plugins.chain(self.external.iter().map(|tool| &tool.info))
    }

    /// Every external source's tools, each with its source's name, in the order added.
    pub fn external_tools(&self) -> impl Iterator<Item = (&str, &ToolInfo)> {
        self.external
            .iter()
            .map(|tool| (tool.source.name(), &tool.info))
    }

    /// A tool by name, a plugin's or an external source's.
    pub fn tool_info(&self, name: &str) -> Option<&ToolInfo> {
        match self.tool(name) {
            Some((_, info)) => Some(info),
            None => self.external_tool(name).map(|tool| &tool.info),
        }
    }

    fn external_tool(&self, name: &str) -> Option<&ExternalTool> {
        self.external_index.get(name).map(|i| &self.external[*i])
    }

    /// Runs one call: finds the tool, checks the grants, checks that the arguments are a
    /// JSON object, then runs it in a fresh sandbox holding exactly the effective
    /// capabilities. Every outcome is logged with the caller, grants and duration.
    pub async fn call(&self, request: CallRequest<'_>) -> Result<String, ToolError> {
        let reuse = |_: &str| InstanceReuse::Process;
        // Labels are the router's: a call made here (the CLI, a test) has no process.
        let trace = CallTrace::default();
        let run = || self.run_call(&request, GrantSource::Flag, reuse, &trace);
        self.audited(&request, None, run).await.committed().await
    }

    /// Runs one call its caller's policy offers: the
    /// [`ToolRouter`](crate::tools::ToolRouter) decided it (the one place a call is
    /// decided), and refuses through [`Registry::refuse_call`] what is not offered.
    /// `request.grants` are the kind's profile grants, named by `source` in a refusal of
    /// the network; `reuse` says which plugins' instances the caller keeps; `trace` holds
    /// what the caller put into the call and gets what the call touches, however it ends.
    /// Stopped when `cancelled` completes first: the call's instance is dropped, and the
    /// call fails (and is audited) as cancelled by its caller.
    ///
    /// It returns as soon as the call has ended and its audit row is handed to the store:
    /// the row may not be committed yet. The result must not
    /// leave the host before [`Recorded::committed`] (or the row's own wait) returns;
    /// rows of calls made one after another and waited for together share a commit.
    ///
    /// Only a plugin tool that declares nothing but reads returns before its row is
    /// committed: a call that may have changed something (a file, a task, a memory, a
    /// request sent, an external server's tool) is in the log when it returns, so a crash
    /// before the round's commit loses no record of a change.
    pub(crate) async fn call_offered(
        &self,
        request: CallRequest<'_>,
        source: GrantSource,
        reuse: impl Fn(&str) -> InstanceReuse,
        trace: &CallTrace,
        cancelled: impl Future<Output = ()>,
    ) -> Recorded {
        let run = || async {
            tokio::select! {
                ran = self.run_call(&request, source, reuse, trace) => ran,
                () = cancelled => Ran {
                    result: Err(ToolError::Failed(format!(
                        "tool `{}` was cancelled by its caller",
                        echo_name(request.tool, MAX_ECHOED_NAME)
                    ))),
                    touched: trace.touched(),
                    receipt: Receipt::default(),
                    denied_by: None,
                },
            }
        };
        let recorded = self
            .audited(&request, trace.conversation.as_ref(), run)
            .await;
        if self.only_reads(request.tool) {
            return recorded;
        }
        let Recorded {
            result,
            audit,
            touched,
        } = recorded;
        if let Some(audit) = audit {
            committed(audit).await;
        }
        Recorded {
            result,
            audit: None,
            touched,
        }
    }

    /// Whether `tool` is a plugin tool that declares only capabilities that read.
    fn only_reads(&self, tool: &str) -> bool {
        self.tool(tool)
            .is_some_and(|(_, info)| info.capabilities.iter().all(Capability::only_reads))
    }

    /// Records `request` as refused with `err` before anything of it ran (a tool its
    /// caller is not offered, or a host tool's name asked of a door that runs none), like
    /// any refusal: audited, as part of `conversation`'s work when it is, and counted as a
    /// denial for `reason` when it is one. Returns as soon
    /// as the row is handed to the store: wait for [`Recorded::committed`] before the
    /// refusal leaves the host.
    pub(crate) async fn refuse_call(
        &self,
        request: CallRequest<'_>,
        conversation: Option<&SessionKey>,
        reason: Option<DenialReason>,
        err: ToolError,
    ) -> Recorded {
        let run = || async { Ran::refused(err, reason) };
        self.audited(&request, conversation, run).await
    }

    /// Runs the call `run` starts and records the outcome: a tracing event, and a row
    /// handed to the [`CallLog`]'s audit sink (which may be the explicit disabled one), with
    /// the call's receipt and the conversation whose work it was. Denials are recorded like
    /// any other outcome.
    ///
    /// `run` makes the call's future here, in place: a future passed in by value would be
    /// held twice in this one's state (as the argument and as the future awaited), and a
    /// call's future is tens of kilobytes, copied as it moves.
    async fn audited<F: Future<Output = Ran>>(
        &self,
        request: &CallRequest<'_>,
        conversation: Option<&SessionKey>,
        run: impl FnOnce() -> F,
    ) -> Recorded {
        let mut span = spans::tool(request.tool, None, ToolSite::Extension);
        let started = Instant::now();
        let Ran {
            result,
            touched,
            mut receipt,
            denied_by,
        } = span.parent().scope(run()).await;
        let took = started.elapsed();
        let duration_us = took.as_micros() as u64;
        receipt.bytes_in = request.args_json.len() as u64;
        receipt.bytes_out = match &result {
            Ok(output) => output.len(),
            Err(err) => err.message().len(),
        } as u64;
        let (outcome, detail) = match &result {
            Ok(_) => ("ok", ""),
            Err(err) => (err.kind(), err.message()),
        };
        let figures = receipt.figures();
        spans::tool_ended(&mut span, outcome, &figures);
        spans::tool_content(
            &mut span,
            || {
                self.log
                    .redactor()
                    .redact_json_text(request.args_json)
                    .into_owned()
            },
            || match &result {
                Ok(output) => self.log.redactor().redact(output).into_owned(),
                Err(_) => self.log.redactor().redact(detail).into_owned(),
            },
        );
        drop(span);
        let metrics = crate::telemetry::metrics();
        let info = self.tool_info(request.tool);
        metrics.tool_call(
            info.map_or(UNKNOWN_TOOL, |tool| tool.name.as_str()),
            outcome,
            took,
        );
        if matches!(result, Err(ToolError::Denied(_))) {
            metrics.denied(denied_by.unwrap_or(DenialReason::Tool));
        }
        let effective = info
            .and_then(|tool| {
                request
                    .grants
                    .effective(&tool.name, &tool.capabilities)
                    .ok()
            })
            .map_or_else(|| "(none)".into(), |caps| joined(&caps));
        tracing::info!(
            target: "capstan::audit",
            tool = request.tool,
            caller = %request.caller,
            grants = %request.grants,
            effective,
            outcome,
            duration_us,
            "tool call"
        );
        // The sink keeps the executor free (it never waits for SQLite's lock here), so a
        // database another process holds locked delays this call's audit entry only.
        let call = AuditRecord {
            conversation: conversation.map(|c| c.as_str().to_owned()),
            process: request.caller.to_string(),
            tool: request.tool.to_owned(),
            grants: effective,
            arguments: self
                .log
                .redactor()
                .redact_json_text(request.args_json)
                .into_owned(),
            outcome: outcome.to_owned(),
            detail: detail.to_owned(),
            duration_us,
            receipt,
        };
        let audit = Some(self.log.audit().record_soon(call).await);
        Recorded {
            result,
            audit,
            touched,
        }
    }

    /// Runs a call of a plugin's tool (or an external one's), in an instance of the
    /// caller's own where `reuse` says the plugin's instances live for the process.
    async fn run_call(
        &self,
        request: &CallRequest<'_>,
        grant_source: GrantSource,
        reuse: impl Fn(&str) -> InstanceReuse,
        trace: &CallTrace,
    ) -> Ran {
        let call_id = format!("call-{}", self.next_call.fetch_add(1, Ordering::Relaxed));
        let Some((plugin, index)) = self.tools.get(request.tool) else {
            let result = match self.external_tool(request.tool) {
                // Boxed: its future would otherwise be part of every plugin call's.
                Some(tool) => Box::pin(self.run_external(tool, request)).await,
                None => Err(self.unknown_tool(request.tool)),
            };
            return Ran::without_instance(result);
        };
        let tool = &plugin.tools[*index];
        let checked = request
            .grants
            .effective(&tool.name, &tool.capabilities)
            .map_err(|denial| ToolError::Denied(denial.to_string()))
            .and_then(|capabilities| {
                check_args_object(request.tool, request.args_json).map(|()| capabilities)
            });
        let capabilities = match checked {
            Ok(capabilities) => capabilities,
            Err(err) => return Ran::refused(err, Some(DenialReason::Capability)),
        };
        let call = Invocation {
            tool: &tool.name,
            args_json: request.args_json,
            caller: request.caller,
            call_id,
            capabilities,
            workspace: request.workspace,
            declared: &tool.capabilities,
            granted: request.grants.net_rules().cloned().collect(),
            grant_source,
            trace,
            instances: request
                .instances
                .filter(|_| reuse(&plugin.name) == InstanceReuse::Process),
        };
        self.host.invoke(plugin, call).await
    }

    /// Runs a call of an external source's tool: the grants (it declares no capability,
    /// so the profile naming it is the grant), the arguments' shape, then the source,
    /// starting included, bounded by the tool deadline; what it returns, an error's
    /// message included, is redacted and capped as a plugin's output is.
    async fn run_external(
        &self,
        tool: &ExternalTool,
        request: &CallRequest<'_>,
    ) -> Result<String, ToolError> {
        request
            .grants
            .effective(&tool.info.name, &tool.info.capabilities)
            .map_err(|denial| ToolError::Denied(denial.to_string()))?;
        check_args_object(request.tool, request.args_json)?;
        let redactor = self.log.redactor();
        let clean = |text: String| self.host.cap_output(redactor.redact_owned(text));
        let deadline = self.host.limits().deadline;
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(deadline, tool.source.call(&tool.remote, request.args_json))
            .await
        {
            Ok(Ok(output)) => Ok(clean(output)),
            // A source's own timeout that ends with the deadline (an HTTP server's request
            // is bounded by it too) may be woken first: past the deadline, the deadline
            // is the reason.
            Ok(Err(err)) if started.elapsed() < deadline => Err(err.map_message(clean)),
            Ok(Err(_)) | Err(_) => {
                let next = tool.source.abandoned(&tool.remote);
                Err(ToolError::Failed(format!(
                    "tool `{}` did not answer within the {} s deadline \
                     (limits.tool_deadline_secs); {next}",
                    tool.info.name,
                    deadline.as_secs_f64(),
                )))
            }
        }
    }

    /// The error for a call of `name`, which no plugin or external server provides:
    /// why its server is down if it is an external server's, else the tools loaded.
    pub(crate) fn unknown_tool(&self, name: &str) -> ToolError {
        if let Some(why) = name
            .split_once('.')
            .and_then(|(source, _)| self.sources_down.get(source))
        {
            return ToolError::NotFound(format!(
                "no tool `{}` is loaded: {}",
                echo_name(name, MAX_ECHOED_NAME),
                one_line(why)
            ));
        }
        let mut known: Vec<&str> = self.tools.keys().map(String::as_str).collect();
        known.sort_unstable();
        ToolError::NotFound(format!(
            "no tool `{}` is loaded; loaded tools: {}",
            echo_name(name, MAX_ECHOED_NAME),
            if known.is_empty() {
                "none".to_owned()
            } else {
                known.join(", ")
            }
        ))
    }
}

/// The names of `capabilities`, comma-separated, as an audit row lists them.
fn joined(capabilities: &[Capability]) -> String {
    use std::fmt::Write;
    let mut names = String::new();
    for (i, capability) in capabilities.iter().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        write!(names, "{comma}{capability}").expect("writing to a String");
    }
    names
}

/// Refuses arguments that are not one JSON object, naming `tool`, before any instance is
/// created: every plugin and MCP tool takes an object.
pub fn check_args_object(tool: &str, args_json: &str) -> Result<(), ToolError> {
    if let Err(err) = serde_json::from_str::<IgnoredAny>(args_json) {
        return Err(ToolError::InvalidArgs(format!(
            "{tool}: arguments are not valid JSON: {err}"
        )));
    }
    if !args_json.trim_start().starts_with('{') {
        return Err(ToolError::InvalidArgs(format!(
            "{tool}: arguments must be a JSON object, like {{\"path\": \"notes.md\"}}"
        )));
    }
    Ok(())
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("plugins", &self.plugins)
            .field("refused", &self.refused)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_must_be_one_json_object() {
        assert!(check_args_object("t", r#" {"a": 1} "#).is_ok());
        for bad in ["", "{", "[1]", "3", r#"{"a":1} x"#, "null"] {
            let err = check_args_object("t", bad).unwrap_err();
            assert_eq!(err.kind(), "invalid-args", "{bad}: {err}");
        }
    }
}
