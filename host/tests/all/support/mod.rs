//! Shared set-up for the integration tests: where the built plugins are, a host with the
//! first-party plugins and the probe fixture loaded, throwaway workspaces, and the built
//! binary ([`binary`]).
//!
//! The components come from `bash scripts/setup`; a missing one fails the test with that
//! instruction rather than skipping it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use capstan_host::agent::{Event, Runtime};
use capstan_host::app::AgentBuilder;
use capstan_host::config::Config;
use capstan_host::llm::{
    AnswerSink, BoxFuture, Completion, CompletionRequest, Provider, ProviderError, Script,
    ScriptedProvider,
};
use capstan_host::plugin::{
    ArtifactCache, CallLog, CallRequest, Limits, PluginHost, Registry, ToolError,
};
use capstan_host::policy::Grants;
use capstan_host::store::Store;
use tokio::sync::mpsc;

pub mod accounting;
mod binary;
pub mod http_server;
pub mod ids;
pub mod matrix;
pub mod scripted_api;
pub mod serve_host;
pub mod telegram;

pub use binary::*;

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ sits in the repository")
        .to_owned()
}

/// A built component under `target/<group>/<name>.wasm`, checked to exist.
pub fn component(group: &str, name: &str) -> PathBuf {
    let path = repo_root()
        .join("target")
        .join(group)
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: build the plugins with `bash scripts/setup`",
        path.display()
    );
    path
}

/// The first-party plugins directory.
pub fn plugins_dir() -> PathBuf {
    component("plugins", "files").parent().unwrap().to_owned()
}

/// The artifact cache shared by the tests, so each component compiles once per run.
pub fn test_cache() -> ArtifactCache {
    ArtifactCache::new(repo_root().join("target/test-component-cache"))
}

/// A host with `limits`, the first-party plugins and the probe fixture.
pub async fn registry(limits: Limits) -> Registry {
    registry_on(PluginHost::new(limits, test_cache()).expect("host")).await
}

/// A host whose `tasks` and `memory` imports are backed by `store`.
pub async fn registry_with_store(store: Arc<Store>) -> Registry {
    let host = PluginHost::new(Limits::default(), test_cache()).expect("host");
    registry_on(host.with_services(store.services())).await
}

/// Another handle on the SQLite database `rt` keeps its services in (its data dir), to
/// read back what the runtime wrote to the file.
pub fn stored(rt: &Runtime) -> Store {
    Store::open(&rt.config().agent.data_dir).expect("the runtime's database opens")
}

/// Where calls on `host` are recorded as the agent records them: with the host's services
/// (nowhere, for a host without), redacted by its secrets.
pub fn call_log_of(host: &PluginHost) -> CallLog {
    CallLog::new(
        host.audit().clone(),
        host.network().secrets().redactor().clone(),
    )
}

/// `host` with the first-party plugins and the probe fixture loaded, its calls recorded
/// by [`call_log_of`].
pub async fn registry_on(host: PluginHost) -> Registry {
    let log = call_log_of(&host);
    let mut registry = Registry::load_dir(Arc::new(host), log, &plugins_dir())
        .await
        .expect("plugins dir");
    registry
        .add_file(&component("fixtures", "probe"))
        .await
        .expect("the probe fixture loads");
    assert!(registry.refused().is_empty(), "{:?}", registry.refused());
    registry
}

/// A host with the default limits.
pub async fn default_registry() -> Registry {
    registry(Limits::default()).await
}

/// A temporary directory holding `workspace/` (the workspace) and `outside/` with
/// `secret.txt`, which no call may read or change.
pub struct Workspace {
    root: tempfile::TempDir,
}

/// The text of `outside/secret.txt`.
pub const SECRET: &str = "the secret outside the workspace\n";

impl Workspace {
    pub fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("workspace")).unwrap();
        std::fs::create_dir(root.path().join("outside")).unwrap();
        std::fs::write(root.path().join("outside/secret.txt"), SECRET).unwrap();
        Workspace { root }
    }

    pub fn path(&self) -> PathBuf {
        self.root.path().join("workspace")
    }

    pub fn outside(&self) -> PathBuf {
        self.root.path().join("outside")
    }

    /// Writes `content` to `rel` in the workspace.
    pub fn put(&self, rel: &str, content: &str) {
        let path = self.path().join(rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, content).unwrap();
    }

    /// The bytes of `rel` in the workspace.
    pub fn read(&self, rel: &str) -> Vec<u8> {
        std::fs::read(self.path().join(rel)).unwrap()
    }

    /// Fails unless `outside/` still holds exactly `secret.txt` with its original text,
    /// and nothing new appeared beside the workspace.
    pub fn assert_outside_untouched(&self) {
        let names: Vec<_> = std::fs::read_dir(self.outside())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            ["secret.txt"],
            "files appeared outside the workspace"
        );
        assert_eq!(
            std::fs::read_to_string(self.outside().join("secret.txt")).unwrap(),
            SECRET
        );
        let mut top: Vec<_> = std::fs::read_dir(self.root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        top.sort();
        assert_eq!(
            top,
            ["outside", "workspace"],
            "files appeared beside the workspace"
        );
    }
}

impl Default for Workspace {
    fn default() -> Self {
        Self::new()
    }
}

/// Calls `tool` with `args` (JSON) and `grants` (comma-separated), in `workspace`.
pub async fn call(
    registry: &Registry,
    tool: &str,
    args: serde_json::Value,
    grants: &str,
    workspace: &Path,
) -> Result<String, ToolError> {
    call_by(registry, "test", tool, args, grants, workspace).await
}

/// [`call`] made by process `caller` (e.g. `worker:1`).
pub async fn call_by(
    registry: &Registry,
    caller: &str,
    tool: &str,
    args: serde_json::Value,
    grants: &str,
    workspace: &Path,
) -> Result<String, ToolError> {
    let grants: Grants = grants.parse().expect("grants");
    registry
        .call(CallRequest {
            tool,
            args_json: &args.to_string(),
            grants: &grants,
            workspace: Some(workspace),
            caller: &ids::by(caller),
            instances: None,
        })
        .await
}

/// Unwraps an error of `kind`, failing with the actual outcome otherwise.
pub fn expect_error(result: Result<String, ToolError>, kind: &str) -> String {
    match result {
        Err(err) if err.kind() == kind => err.message().to_owned(),
        other => panic!("expected a {kind} error, got {other:?}"),
    }
}

/// An agent runtime on `config` (its workspace created, its store opened), with the
/// first-party plugins (and the probe fixture if `probe`), talking to `provider`.
pub async fn agent_runtime(
    config: Config,
    provider: Arc<dyn Provider>,
    probe: bool,
) -> (Arc<Runtime>, mpsc::UnboundedReceiver<Event>) {
    let mut builder = AgentBuilder::new(config)
        .plugins_dir(plugins_dir())
        .cache(test_cache())
        .provider(provider);
    if probe {
        builder = builder.plugin_file(component("fixtures", "probe"));
    }
    let agent = builder.build().await.expect("the agent starts");
    assert!(
        agent.registry.refused().is_empty(),
        "{:?}",
        agent.registry.refused()
    );
    (agent.runtime, agent.events)
}

/// The incoming message that makes [`Recording`] panic, as a buggy provider might.
pub const PANIC_TRIGGER: &str = "PANIC NOW";

/// Plays a script and keeps a copy of every request it answered; panics on a request
/// whose incoming message contains [`PANIC_TRIGGER`].
pub struct Recording {
    script: ScriptedProvider,
    requests: Mutex<Vec<CompletionRequest>>,
}

impl Recording {
    /// A recording provider playing `script` (TOML).
    pub fn new(script: &str) -> Arc<Self> {
        Arc::new(Recording {
            script: ScriptedProvider::new(Script::parse(script, "test").unwrap(), "test"),
            requests: Mutex::new(Vec::new()),
        })
    }

    /// The requests answered so far, in order.
    pub fn requests(&self) -> Vec<CompletionRequest> {
        self.requests.lock().unwrap().clone()
    }

    /// The requests of process kind `process` answered so far.
    pub fn requests_of(&self, process: &str) -> Vec<CompletionRequest> {
        let mut all = self.requests();
        all.retain(|r| r.process == process);
        all
    }
}

impl Provider for Recording {
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
        sink: &'a dyn AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        let incoming = request.messages.last().map(|m| m.content.as_str());
        if incoming.is_some_and(|m| m.contains(PANIC_TRIGGER)) {
            panic!("the provider panicked on purpose");
        }
        Box::pin(async move {
            let answer = self.script.complete(request, sink).await?;
            self.requests.lock().unwrap().push(request.clone());
            Ok(answer)
        })
    }

    fn name(&self) -> String {
        self.script.name()
    }
}

/// Polls `done` every few milliseconds until it holds. The two-minute cap only guards
/// against a hang (it fails with `what`); no test relies on how long anything takes.
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !done() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Polls `check` every few milliseconds until it gives a value, for a state another
/// process reaches (a row in a database, say). The two-minute cap only guards against a
/// hang (it fails with `what` and the last state `check` described); no test relies on how
/// long anything takes.
pub async fn until<T>(what: &str, mut check: impl AsyncFnMut() -> Result<T, String>) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        match check().await {
            Ok(done) => return done,
            Err(last) => assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}: {last}"
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A provider that hands every request to the test and answers only when the test says
/// so, with what it says: the explicit gate that forces one interleaving of a race.
pub struct Gated {
    requests: mpsc::UnboundedSender<Pending>,
}

/// A request held at the [`Gated`] provider until the test answers it.
pub struct Pending {
    /// The request as the host sent it.
    pub request: CompletionRequest,
    answer: tokio::sync::oneshot::Sender<Result<Completion, ProviderError>>,
}

impl Gated {
    /// The provider, and the stream of requests it holds.
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<Pending>) {
        let (requests, held) = mpsc::unbounded_channel();
        (Arc::new(Gated { requests }), held)
    }
}

impl Pending {
    /// Whether the request's messages hold one with exactly `text`.
    pub fn holds(&self, text: &str) -> bool {
        self.request.messages.iter().any(|m| m.content == text)
    }

    /// Whether any of the request's messages contains `text`.
    pub fn mentions(&self, text: &str) -> bool {
        self.request
            .messages
            .iter()
            .any(|m| m.content.contains(text))
    }

    /// How many of the request's messages are exactly `text`.
    pub fn count(&self, text: &str) -> usize {
        self.request
            .messages
            .iter()
            .filter(|m| m.content == text)
            .count()
    }

    /// Answers with one call of `tool` with `arguments` (JSON).
    pub fn call(self, tool: &str, arguments: serde_json::Value) {
        let mut message = capstan_host::llm::Message::assistant("");
        message.tool_calls.push(capstan_host::llm::ToolCall {
            id: format!("call-{tool}").into(),
            name: tool.to_owned(),
            arguments: arguments.to_string(),
        });
        let _ = self.answer.send(Ok(Completion {
            message,
            tokens: None,
            usage: Default::default(),
        }));
    }

    /// Answers with the text `reply`.
    pub fn reply(self, reply: &str) {
        let _ = self.answer.send(Ok(Completion {
            message: capstan_host::llm::Message::assistant(reply),
            tokens: None,
            usage: Default::default(),
        }));
    }

    /// Fails the request, as an unreachable model would.
    pub fn fail(self, why: &str) {
        let _ = self
            .answer
            .send(Err(ProviderError::ScriptExhausted(why.to_owned())));
    }
}

/// The requests a [`Gated`] provider holds, taken in the order a test wants them rather
/// than the order they came in (two processes asking at once come in either order).
pub struct Held {
    requests: mpsc::UnboundedReceiver<Pending>,
    stash: Vec<Pending>,
}

impl Held {
    /// The requests that come in on `requests`.
    pub fn new(requests: mpsc::UnboundedReceiver<Pending>) -> Self {
        Held {
            requests,
            stash: Vec::new(),
        }
    }

    /// The first request held that `matches`, waiting for it; the others stay held.
    pub async fn next_where(&mut self, matches: impl Fn(&Pending) -> bool) -> Pending {
        if let Some(at) = self.stash.iter().position(&matches) {
            return self.stash.remove(at);
        }
        loop {
            let pending = self
                .requests
                .recv()
                .await
                .expect("the agent asks the model");
            if matches(&pending) {
                return pending;
            }
            self.stash.push(pending);
        }
    }

    /// Every request held now and not taken yet.
    pub fn rest(mut self) -> Vec<Pending> {
        while let Ok(pending) = self.requests.try_recv() {
            self.stash.push(pending);
        }
        self.stash
    }
}

impl Provider for Gated {
    fn complete<'a>(
        &'a self,
        request: &'a CompletionRequest,
        _sink: &'a dyn capstan_host::llm::AnswerSink,
    ) -> BoxFuture<'a, Result<Completion, ProviderError>> {
        Box::pin(async move {
            let (answer, answered) = tokio::sync::oneshot::channel();
            let pending = Pending {
                request: request.clone(),
                answer,
            };
            if self.requests.send(pending).is_err() {
                return Err(ProviderError::ScriptExhausted(
                    "the test stopped answering".into(),
                ));
            }
            answered.await.unwrap_or_else(|_| {
                Err(ProviderError::ScriptExhausted(
                    "the test dropped the request".into(),
                ))
            })
        })
    }

    fn name(&self) -> String {
        "gated".into()
    }
}
