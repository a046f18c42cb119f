//! `capstan tool call`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Subcommand;

use super::HostArgs;
use crate::plugin::{CallRequest, ToolError};
use crate::policy::Grants;

#[derive(Debug, Subcommand)]
pub(crate) enum ToolCommand {
    /// Run one tool call and print its result, or its error on stderr.
    ///
    /// Exit codes: 0 ok, 3 invalid-args, 4 denied, 5 not-found, 6 failed, 1 a host error.
    Call {
        /// The tool's name, e.g. file_read.
        name: String,
        /// The arguments, a JSON object.
        args_json: String,
        /// Capabilities to grant, comma-separated (e.g. fs.read,fs.write). None by default.
        #[arg(long, value_name = "CAP[,CAP...]", default_value = "")]
        grant: String,
        /// The workspace the fs capabilities apply to [default: the current directory].
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// Print the outcome as JSON: {"ok": TEXT} or {"error": {"kind", "message"}}.
        #[arg(long)]
        json: bool,
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
            workspace,
            json,
            host,
        } = self;
        let grants: Grants = grant.parse().context("--grant")?;
        let workspace = match workspace {
            Some(dir) => dir,
            None => std::env::current_dir().context("reading the current directory")?,
        };
        let registry = host.registry().await?;
        let result = registry
            .call(CallRequest {
                tool: &name,
                args_json: &args_json,
                grants: &grants,
                workspace: Some(&workspace),
                caller: "cli",
            })
            .await;
        let mut out = std::io::stdout().lock();
        if json {
            let value = match &result {
                Ok(text) => serde_json::json!({ "ok": text }),
                Err(err) => serde_json::json!({ "error": err }),
            };
            writeln!(out, "{value}")?;
        } else {
            match &result {
                Ok(text) if text.ends_with('\n') => write!(out, "{text}")?,
                Ok(text) => writeln!(out, "{text}")?,
                Err(err) => eprintln!("error[{}]: {}", err.kind(), err.message()),
            }
        }
        Ok(exit_code(&result))
    }
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
