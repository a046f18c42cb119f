//! `capstan tool call`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Subcommand;

use super::HostArgs;
use super::store::StoreArgs;
use crate::ids::Caller;
use crate::plugin::{CallRequest, ToolError};
use crate::policy::{Grants, ProcessKind};
use crate::tools::{HostTool, ToolCatalog, ToolRouter};

#[derive(Debug, Subcommand)]
pub(crate) enum ToolCommand {
    /// Run one tool call and print its result, or its error on stderr.
    ///
    /// The arguments are a JSON object given inline, or read from standard input (`-`) or
    /// a file (`@FILE`): `capstan tool call file_write @args.json --grant fs.write`.
    ///
    /// A call granted fs.write is refused before it runs if the config file, the component
    /// cache or the plugins directory lies inside its workspace: a plugin could rewrite
    /// them.
    ///
    /// The call's host imports (tasks, memory) and its audit row use the configured store
    /// when a config file is in use, else (or with `--store memory`) a throwaway one that
    /// is gone when the call ends.
    ///
    /// Exit codes: 0 ok, 3 invalid-args, 4 denied, 5 not-found, 6 failed, 1 a host error.
    Call {
        /// The tool's name, e.g. file_read.
        name: String,
        /// The arguments: a JSON object, `-` to read it from standard input, or `@FILE` to
        /// read it from FILE (for large inputs; at most 16 MiB).
        #[arg(value_name = "ARGS_JSON | - | @FILE")]
        args_json: String,
        /// Capabilities to grant, comma-separated (e.g. fs.read,fs.write). None by default.
        #[arg(long, value_name = "CAP[,CAP...]", conflicts_with = "as_profile")]
        grant: Option<String>,
        /// Call as a process of this kind: with its profile's grants, and only if its
        /// profile offers the tool (channel, branch, worker, compactor, cortex).
        #[arg(long = "as", value_name = "PROFILE")]
        as_profile: Option<ProcessKind>,
        /// The workspace the fs capabilities apply to [default: the current directory].
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// Print the outcome as JSON: {"ok": TEXT} or {"error": {"kind", "message"}}.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        store: StoreArgs,
        #[command(flatten)]
        host: HostArgs,
    },
}

impl ToolCommand {
    pub(crate) async fn run(self) -> anyhow::Result<ExitCode> {
        let ToolCommand::Call {
            name,
            args_json,
            grant,
            as_profile,
            workspace,
            json,
            store,
            host,
        } = self;
        let config = host.config()?;
        let grants: Grants = match (&grant, as_profile) {
            (_, Some(kind)) => config.policy.profile(kind).grants_for(&name).into_owned(),
            (Some(list), None) => list.parse().context("--grant")?,
            (None, None) => Grants::none(),
        };
        let workspace = match workspace {
            Some(dir) => dir,
            None => std::env::current_dir().context("reading the current directory")?,
        };
        crate::config::check_workspace(&workspace)?;
        let locations = host.check_call_locations(&config, &workspace, &grants)?;
        let args_json = read_args(&args_json)?;
        let services = store.open(&config).await?;
        let registry = host
            .registry_on(
                &config,
                host.one_call_host(&config)?.with_services(services),
                Some(crate::mcp::Servers::OfTool(&name)),
            )
            .await?;
        // Recorded only for a tool that exists: an unknown name writes nothing.
        if registry.tool_info(&name).is_some() {
            super::record_if_writable(locations)?;
        }
        let result = match as_profile {
            // Offered, granted and refused exactly as to an agent's process of that kind.
            Some(kind) => {
                let catalog = Arc::new(ToolCatalog::new(&registry, &config.policy));
                let router = ToolRouter::new(Arc::new(registry), catalog, workspace);
                let pending = std::future::pending();
                let caller = Caller::client("cli", Some(kind.as_str()));
                let ran = router.run(kind, &caller, None, &name, &args_json, pending);
                ran.await.committed().await
            }
            None if HostTool::named(&name).is_some() => Err(ToolError::Denied(format!(
                "`{name}` is a host tool: it acts on a running agent's processes, so only an \
                 agent runs it (`capstan run`, `capstan chat`)"
            ))),
            None => {
                let request = CallRequest {
                    tool: &name,
                    args_json: &args_json,
                    grants: &grants,
                    workspace: Some(&workspace),
                    caller: &Caller::client("cli", None),
                    instances: None,
                };
                registry.call(request).await
            }
        };
        let mut out = crate::secrets::stdout();
        if json {
            let value = match &result {
                Ok(text) => serde_json::json!({ "ok": text }),
                Err(err) => serde_json::json!({ "error": err }),
            };
            writeln!(out, "{value}")?;
        } else {
            // A result is data: piped, it passes byte for byte; on a terminal, escape
            // sequences in it are shown, not obeyed.
            let shown = |text: &str| {
                if crate::secrets::stdout().is_terminal() {
                    crate::text::printable(text).into_owned()
                } else {
                    text.to_owned()
                }
            };
            match &result {
                Ok(text) if text.ends_with('\n') => write!(out, "{}", shown(text))?,
                Ok(text) => writeln!(out, "{}", shown(text))?,
                Err(err) => crate::say!("error[{}]: {}", err.kind(), err.message()),
            }
        }
        Ok(exit_code(&result))
    }
}

/// The most argument text read from standard input or a file.
const MAX_ARGS_BYTES: u64 = 16 << 20;

/// The arguments as given, or read from standard input (`-`) or a file (`@FILE`).
fn read_args(given: &str) -> anyhow::Result<String> {
    let (origin, reader): (String, Box<dyn Read>) = if given == "-" {
        (
            "standard input".to_owned(),
            Box::new(std::io::stdin().lock()),
        )
    } else if let Some(path) = given.strip_prefix('@') {
        let file = std::fs::File::open(Path::new(path))
            .with_context(|| format!("reading the arguments from {path}"))?;
        (path.to_owned(), Box::new(file))
    } else {
        return Ok(given.to_owned());
    };
    let mut bytes = Vec::new();
    reader
        .take(MAX_ARGS_BYTES + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading the arguments from {origin}"))?;
    anyhow::ensure!(
        bytes.len() as u64 <= MAX_ARGS_BYTES,
        "the arguments from {origin} are over the {} MiB limit; pass a smaller input",
        MAX_ARGS_BYTES >> 20
    );
    String::from_utf8(bytes).map_err(|err| {
        anyhow::anyhow!(
            "the arguments from {origin} are not UTF-8 (invalid byte at offset {})",
            err.utf8_error().valid_up_to()
        )
    })
}

fn exit_code(result: &Result<String, ToolError>) -> ExitCode {
    ExitCode::from(match result {
        Ok(_) => 0,
        Err(ToolError::InvalidArgs(_)) => 3,
        Err(ToolError::Denied(_)) => 4,
        Err(ToolError::NotFound(_)) => 5,
        Err(ToolError::Failed(_)) => 6,
    })
}
