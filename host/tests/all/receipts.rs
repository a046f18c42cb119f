//! Each tool call's receipt, as the host measures it: the peak linear memory of the
//! instance that ran it (a kept one's included), the bytes in and out, the outbound
//! requests and their bytes (reconciled with what a loopback server counted), and the
//! conversation it was part of, summed by the store where the rows are.

use std::time::Duration;

use capstan_host::agent::Event;
use capstan_host::config::Config;
use capstan_host::plugin::{CallRequest, Limits, PluginHost, ProcessInstances, Registry};
use capstan_host::policy::Grants;
use capstan_host::services::{AuditEntry, CostsBy, CostsOf, Services, sum_costs};
use serde_json::json;

use crate::support::http_server::TestServer;
use crate::support::{Workspace, registry_on, test_cache};

const MIB: u64 = 1 << 20;

async fn registry_recording_into(services: &Services) -> Registry {
    registry_metering(services, false).await
}

async fn registry_metering(services: &Services, fuel: bool) -> Registry {
    let limits = Limits {
        deadline: Duration::from_secs(5),
        memory_bytes: 48 << 20,
        fuel,
        ..Limits::default()
    };
    let host = PluginHost::new(limits, test_cache())
        .unwrap()
        .with_services(services.clone());
    registry_on(host).await
}

async fn grow(registry: &Registry, instances: Option<&ProcessInstances>, ws: &Workspace, mib: u32) {
    let grants = Grants::default();
    let args = json!({ "mib": mib }).to_string();
    registry
        .call(CallRequest {
            tool: "grow",
            args_json: &args,
            grants: &grants,
            workspace: Some(&ws.path()),
            caller: &crate::support::ids::by("worker:1"),
            instances,
        })
        .await
        .unwrap();
}

/// Oldest first.
async fn calls(services: &Services) -> Vec<AuditEntry> {
    let mut rows = services.audit.recent(100).await.unwrap();
    rows.reverse();
    rows
}

#[tokio::test]
async fn the_peak_memory_is_the_instances_and_a_kept_one_counts_what_it_held() {
    let services = Services::in_memory();
    let registry = registry_recording_into(&services).await;
    let ws = Workspace::new();
    grow(&registry, None, &ws, 16).await;
    let mine = ProcessInstances::new();
    grow(&registry, Some(&mine), &ws, 8).await;
    grow(&registry, Some(&mine), &ws, 8).await;
    let rows = calls(&services).await;
    let peaks: Vec<u64> = rows
        .iter()
        .map(|row| row.receipt.peak_memory_bytes.expect("an instance ran"))
        .collect();
    // The fresh call's instance held its start-up memory and then 16 MiB more.
    assert!((16 * MIB..40 * MIB).contains(&peaks[0]), "{peaks:?}");
    // The kept instance's second call began holding the first call's 8 MiB: its peak is
    // the 8 MiB it grew (and the allocator's page of bookkeeping) above the first's.
    assert!(
        (8 * MIB..9 * MIB).contains(&(peaks[2] - peaks[1])),
        "{peaks:?}"
    );
    assert!(peaks[1] < peaks[0], "{peaks:?}");
    for row in &rows {
        assert_eq!(row.receipt.bytes_in, row.arguments.len() as u64);
        assert_eq!(row.receipt.requests, 0);
        assert_eq!(row.receipt.fuel, None, "limits.tool_fuel is off");
        assert_eq!(row.conversation, None, "a call from no conversation");
    }
}

/// With `limits.tool_fuel` on, each call's instructions are counted exactly: the same call
/// in two fresh instances runs the same count, and a kept instance's next call, with no
/// start-up to run, fewer.
#[tokio::test]
async fn with_fuel_on_each_call_counts_its_own_instructions() {
    let services = Services::in_memory();
    let registry = registry_metering(&services, true).await;
    let ws = Workspace::new();
    grow(&registry, None, &ws, 1).await;
    grow(&registry, None, &ws, 1).await;
    let mine = ProcessInstances::new();
    grow(&registry, Some(&mine), &ws, 1).await;
    grow(&registry, Some(&mine), &ws, 1).await;
    let fuel: Vec<u64> = calls(&services)
        .await
        .iter()
        .map(|row| row.receipt.fuel.expect("fuel is counted"))
        .collect();
    assert!(fuel[0] > 0, "{fuel:?}");
    assert_eq!(
        fuel[0], fuel[1],
        "the same call in a fresh instance: {fuel:?}"
    );
    assert!(fuel[3] < fuel[2], "the kept instance's next call: {fuel:?}");
}

#[tokio::test]
async fn a_refused_call_ran_no_instance_and_says_so() {
    let services = Services::in_memory();
    let registry = registry_recording_into(&services).await;
    let grants = Grants::default();
    let args = r#"{"url": "http://127.0.0.1:9/"}"#;
    let refused = registry
        .call(CallRequest {
            tool: "http_request",
            args_json: args,
            grants: &grants,
            workspace: None,
            caller: &crate::support::ids::by("worker:1"),
            instances: None,
        })
        .await
        .unwrap_err();
    let row = &calls(&services).await[0];
    assert_eq!(row.outcome, "denied");
    assert_eq!(row.receipt.peak_memory_bytes, None);
    assert_eq!(row.receipt.bytes_in, args.len() as u64);
    assert_eq!(row.receipt.bytes_out, refused.message().len() as u64);
}

/// Through an agent run on SQLite: a worker's three requests (two sent, one refused by
/// its grant) are on its calls' receipts exactly as the loopback server counted them,
/// each row names the conversation that started the worker, and the store's sums by
/// conversation and by tool agree with the rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_receipts_reconcile_with_the_server_and_sum_under_its_conversation() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let host = format!("http://{}", server.addr);
    let config = Config::parse(
        // The flow rules would park the second request for a person: the worker has read
        // the first answer. That is the flow tests' subject, not this one's.
        &format!(
            "[profiles.worker]\nnet = [\"{host}\"]\n\
             [profiles.worker.flow]\nuntrusted_send = \"allow\"\n"
        ),
        &dir.path().join("capstan.toml"),
    )
    .unwrap();
    let big = server.url("/big?bytes=5000");
    let echo = server.url("/echo-body");
    let body = "b".repeat(300);
    let script = format!(
        r#"
[[step]]
process = "channel"
when = "fetch them"
tool_calls = [{{ name = "spawn_worker", arguments = {{ task = "Fetch the pages." }} }}]

[[step]]
process = "worker"
when = "fetch the pages"
tool_calls = [{{ name = "http_request", arguments = {{ method = "GET", url = "{big}" }} }}]

[[step]]
process = "worker"
tool_calls = [{{ name = "http_request", arguments = {{ method = "POST", url = "{echo}", body = "{body}" }} }}]

[[step]]
process = "worker"
tool_calls = [{{ name = "http_request", arguments = {{ method = "GET", url = "http://192.0.2.1/" }} }}]

[[step]]
process = "worker"
tool_calls = [{{ name = "set_status", arguments = {{ state = "done", message = "fetched" }} }}]

[[step]]
process = "channel"
repeat = true
tool_calls = [{{ name = "skip" }}]
"#
    );
    let recording = crate::support::Recording::new(&script);
    let (rt, mut events) = crate::support::agent_runtime(config, recording, false).await;
    rt.send_user_message("main", "fetch them").await.unwrap();
    while let Some(event) = events.recv().await {
        if matches!(event, Event::WorkerEnded { .. }) {
            break;
        }
    }
    rt.wait_idle("main").await;

    let seen = server.seen();
    assert_eq!(
        seen.len(),
        2,
        "the refused request never reached the server"
    );
    let sent_bodies: usize = seen.iter().map(|s| s.body_len).sum();
    assert_eq!(sent_bodies, 300);

    let services = rt.services();
    let rows: Vec<AuditEntry> = calls(services)
        .await
        .into_iter()
        .filter(|row| row.tool == "http_request")
        .collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    for row in &rows {
        assert_eq!(row.conversation.as_deref(), Some("channel:main"));
        assert_eq!(row.process, "worker:1");
        let peak = row.receipt.peak_memory_bytes.expect("an instance ran");
        assert!(peak > 0 && peak <= 64 * MIB, "{peak}");
        assert!(row.receipt.bytes_in > 0);
    }
    let receipts: Vec<_> = rows.iter().map(|row| row.receipt).collect();
    assert_eq!(
        receipts
            .iter()
            .map(|r| (
                r.requests,
                r.requests_refused,
                r.request_bytes_sent,
                r.request_bytes_received
            ))
            .collect::<Vec<_>>(),
        [(1, 0, 0, 5000), (1, 0, 300, 300), (0, 1, 0, 0)],
        "each call's requests as the server counted them"
    );
    assert!(
        receipts[0].bytes_out > 5000,
        "the answer holds the 5000-byte body"
    );
    assert!(receipts[0].bytes_in > big.len() as u64);

    // The database's sums agree with the rows, and the conversation's holds all three.
    let all = calls(services).await;
    let main = CostsOf::conversation("main").unwrap();
    for by in [
        CostsBy::Conversation,
        CostsBy::Tool,
        CostsBy::Process,
        CostsBy::Day,
    ] {
        let summed = services.audit.costs(by, &main).await.unwrap();
        assert_eq!(summed, sum_costs(&all, by, &main), "by {by:?}");
    }
    let by_tool = services.audit.costs(CostsBy::Tool, &main).await.unwrap();
    let fetches = by_tool
        .iter()
        .find(|row| row.key.as_deref() == Some("http_request"))
        .unwrap();
    assert_eq!(
        (
            fetches.calls,
            fetches.requests,
            fetches.requests_refused,
            fetches.request_bytes_sent,
            fetches.request_bytes_received
        ),
        (3, 2, 1, 300, 5300)
    );
    rt.shutdown();
}
