//! The `capstan` binary.

use std::process::ExitCode;

use capstan_host::cli::Cli;
use clap::Parser;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("CAPSTAN_LOG")
                // rmcp's own lines repeat, without the config key to fix, what the host
                // reports of an MCP server; `CAPSTAN_LOG=rmcp=debug` shows them.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,rmcp=off")),
        )
        // Each line passes the redactor of every value the host holds.
        .with_writer(capstan_host::secrets::stderr)
        // Colour codes only for a person at a terminal, never into a file or a pipe.
        .with_ansi(capstan_host::secrets::stderr().is_terminal())
        .init();
    // A panic's message may quote what the host held: it is said as every line of
    // standard error is, redacted.
    std::panic::set_hook(Box::new(|info| {
        capstan_host::say!("capstan panicked (a bug; please report it): {info}");
        let trace = std::backtrace::Backtrace::capture();
        if trace.status() == std::backtrace::BacktraceStatus::Captured {
            capstan_host::say!("{trace}");
        }
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            // Help and version are answers; a bad flag is an error of the invocation, which
            // the README documents as exit code 1 (clap's own default is 2).
            return if err.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            capstan_host::say!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(cli.run()) {
        Ok(code) => code,
        // A closed pipe (`capstan plugins list | head`) is the reader's choice, not an error.
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            // Redacted as every line of standard error is.
            capstan_host::say!("error: {}", report(&err));
            ExitCode::FAILURE
        }
    };
    // The last spans go out from their own thread, before the process ends.
    capstan_host::telemetry::shutdown_traces();
    // A tool stopped at its deadline can leave a blocking thread in a read that never
    // returns (a FIFO in the workspace): give blocking work a moment to end, never more.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// `err` and its causes, each said once: an error whose message already quotes its cause
/// (`cannot read X: permission denied`) does not repeat it.
fn report(err: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
