//! Plugins that misbehave: each is stopped with a `failed` error naming the cause, and the
//! next ordinary call succeeds.

use std::time::{Duration, Instant};

use crate::support::{Workspace, call, expect_error, registry};
use capstan_host::plugin::{Limits, Registry};
use serde_json::json;

async fn echo_works(registry: &Registry) {
    let ws = Workspace::new();
    let out = call(
        registry,
        "echo",
        json!({"text": "still here"}),
        "",
        &ws.path(),
    )
    .await;
    assert_eq!(out.unwrap(), "still here");
}

async fn run(registry: &Registry, tool: &str, args: serde_json::Value) -> String {
    let ws = Workspace::new();
    expect_error(call(registry, tool, args, "", &ws.path()).await, "failed")
}

#[tokio::test]
async fn an_infinite_loop_is_stopped_at_the_deadline() {
    let limits = Limits {
        deadline: Duration::from_millis(300),
        ..Limits::default()
    };
    let registry = registry(limits).await;
    let started = Instant::now();
    let msg = run(&registry, "spin", json!({})).await;
    assert!(msg.contains("deadline") && msg.contains("spin"), "{msg}");
    assert!(msg.contains("0.3 s"), "names the limit: {msg}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    echo_works(&registry).await;
}

#[tokio::test]
async fn the_default_deadline_is_ten_seconds() {
    assert_eq!(Limits::default().deadline, Duration::from_secs(10));
    assert_eq!(Limits::default().memory_bytes, 64 << 20);
}

#[tokio::test]
async fn looping_plugins_do_not_starve_other_calls() {
    // One executor thread: a spinning plugin must yield, or the echo could not finish first.
    let limits = Limits {
        deadline: Duration::from_secs(3),
        ..Limits::default()
    };
    let registry = std::sync::Arc::new(registry(limits).await);
    let spinner = {
        let registry = registry.clone();
        tokio::spawn(async move { run(&registry, "spin", json!({})).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    echo_works(&registry).await;
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "echo waited for the spinner"
    );
    assert!(spinner.await.unwrap().contains("deadline"));
}

#[tokio::test]
async fn unbounded_allocation_is_stopped_at_the_memory_limit() {
    let limits = Limits {
        memory_bytes: 32 << 20,
        ..Limits::default()
    };
    let registry = registry(limits).await;
    let msg = run(&registry, "hog", json!({})).await;
    assert!(
        msg.contains("out of memory") && msg.contains("32 MiB limit"),
        "{msg}"
    );
    echo_works(&registry).await;
}

#[tokio::test]
async fn a_100_mb_output_is_refused_and_a_large_one_is_capped() {
    let registry = registry(Limits::default()).await;
    let msg = run(&registry, "flood", json!({"bytes": 100_000_000})).await;
    assert!(
        msg.contains("out of memory") && msg.contains("64 MiB limit"),
        "{msg}"
    );
    echo_works(&registry).await;

    let ws = Workspace::new();
    let out = call(
        &registry,
        "flood",
        json!({"bytes": 3_000_000}),
        "",
        &ws.path(),
    )
    .await
    .unwrap();
    let marker = "\n[output cut by the host: 3000000 bytes, over the 1024 KiB of limits.tool_output_kib; ask for less]";
    assert!(out.ends_with(marker), "{}", &out[out.len() - 100..]);
    assert_eq!(out.len(), (1 << 20) + marker.len());
}

#[tokio::test]
async fn a_panic_is_a_failure_quoting_the_panic_message() {
    let registry = registry(Limits::default()).await;
    let msg = run(&registry, "panic", json!({})).await;
    assert!(
        msg.contains("panicked") && msg.contains("the probe panicked on purpose"),
        "{msg}"
    );
    echo_works(&registry).await;
}

#[tokio::test]
async fn calls_beyond_the_pool_wait_for_a_slot_instead_of_failing() {
    let limits = Limits {
        max_concurrent_calls: 2,
        ..Limits::default()
    };
    let registry = std::sync::Arc::new(registry(limits).await);
    let calls: Vec<_> = (0..24)
        .map(|n| {
            let registry = registry.clone();
            tokio::spawn(async move {
                let ws = Workspace::new();
                call(
                    &registry,
                    "echo",
                    json!({"text": n.to_string()}),
                    "",
                    &ws.path(),
                )
                .await
            })
        })
        .collect();
    for (n, handle) in calls.into_iter().enumerate() {
        assert_eq!(handle.await.unwrap().unwrap(), n.to_string());
    }
}

#[tokio::test]
async fn a_guest_exit_is_reported_with_its_status() {
    let registry = registry(Limits::default()).await;
    // WASI 0.2's `exit` carries success or failure: any non-zero status arrives as 1.
    for (code, status) in [(0, 0), (1, 1), (3, 1)] {
        let msg = run(&registry, "exit", json!({ "code": code })).await;
        assert!(
            msg.contains("tool `exit`") && msg.contains(&format!("exited with status {status}")),
            "{msg}"
        );
    }
    echo_works(&registry).await;
}

#[tokio::test]
async fn a_stack_overflow_is_reported_as_one_not_as_a_raw_trap() {
    let registry = registry(Limits::default()).await;
    // Small frames exhaust the engine's call stack; large ones run the guest's own stack
    // (in linear memory) past its start.
    for frame in [0, 16 * 1024] {
        let msg = run(&registry, "recurse", json!({ "frame": frame })).await;
        assert!(msg.contains("stack overflow"), "frame {frame}: {msg}");
        assert!(
            !msg.contains("out of bounds") && !msg.contains("backtrace"),
            "frame {frame}: {msg}"
        );
    }
    echo_works(&registry).await;
}

/// An external source whose call holds its thread past the deadline, then fails as an
/// HTTP server's request does when its own timeout (equal to the deadline) ends it.
struct Overrunning {
    hold: Duration,
}

#[async_trait::async_trait]
impl capstan_host::plugin::ExternalTools for Overrunning {
    fn name(&self) -> &str {
        "slow"
    }
    async fn call(
        &self,
        _tool: &str,
        _args: &str,
    ) -> Result<String, capstan_host::plugin::ToolError> {
        // Blocking on purpose: the deadline's timer cannot win, so the error comes first.
        std::thread::sleep(self.hold);
        Err(capstan_host::plugin::ToolError::Failed(
            "MCP server `slow` stopped during the call (Transport closed)".into(),
        ))
    }
    fn abandoned(&self, _tool: &str) -> String {
        "the call was cancelled".into()
    }
}

#[tokio::test]
async fn an_external_error_after_the_deadline_is_reported_as_the_deadline() {
    let deadline = Duration::from_millis(200);
    let mut registry = registry(Limits {
        deadline,
        ..Limits::default()
    })
    .await;
    let tool = |name: &str| capstan_host::plugin::ToolInfo {
        name: format!("slow.{name}"),
        description: "holds".into(),
        args_schema: json!({"type": "object"}),
        capabilities: Vec::new(),
        effect: None,
    };
    registry.add_external(
        std::sync::Arc::new(Overrunning { hold: deadline }),
        vec![("late".into(), tool("late"))],
    );
    let msg = run(&registry, "slow.late", json!({})).await;
    assert!(
        msg.contains("did not answer within the 0.2 s deadline") && msg.contains("cancelled"),
        "{msg}"
    );
}
