//! Unique identities: process ids never repeat across runs, so a new run never overwrites
//! an old worker's record and a scope such as "tasks this worker wrote" never covers
//! another run's rows; the admin chat (cortex) is a process of its own, never sharing a
//! history or a session with the user channel of the same name.

use crate::support::{agent_dir, agent_store, capstan_command, stderr, stored_history};

/// Each run starts a worker: the first creates a task, the second tries to update task #1
/// with the worker profile's `tasks.write-own`.
const TWO_RUNS: &str = r#"
[[step]]
process = "channel"
when = "first run"
tool_calls = [{ name = "spawn_worker", arguments = { task = "create the release task" } }]

[[step]]
process = "channel"
when = "second run"
tool_calls = [{ name = "spawn_worker", arguments = { task = "close the release task" } }]

[[step]]
process = "worker"
when = "create the release task"
tool_calls = [{ name = "task_create", arguments = { title = "Ship the release" } }]

[[step]]
process = "worker"
when = "close the release task"
tool_calls = [{ name = "task_update", arguments = { number = 1, status = "done" } }]

[[step]]
process = "worker"
repeat = true
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "finished" } }]

[[step]]
process = "channel"
repeat = true
tool_calls = [{ name = "skip" }]
"#;

#[test]
fn a_second_run_gets_new_ids_and_cannot_act_as_the_first_runs_worker() {
    let dir = agent_dir(TWO_RUNS, "");
    for message in ["first run", "second run"] {
        let out = capstan_command(dir.path(), &["run", message])
            .output()
            .unwrap();
        assert!(out.status.success(), "{message}: {}", stderr(&out));
    }
    let store = agent_store(dir.path());
    let first = store
        .get_worker(&crate::support::ids::pid("worker:1"))
        .unwrap()
        .expect("worker:1");
    let second = store
        .get_worker(&crate::support::ids::pid("worker:2"))
        .unwrap()
        .expect("worker:2");
    assert_eq!(first.task, "create the release task", "not overwritten");
    assert_eq!(second.task, "close the release task");

    let task = store.get_task(1).unwrap();
    assert_eq!(task.creator.to_string(), "worker:1");
    assert_ne!(
        task.status.as_str(),
        "done",
        "worker:2 of the second run is not worker:1 and may not update its task"
    );
    let denied = store
        .audit_log(100)
        .unwrap()
        .into_iter()
        .find(|entry| entry.tool == "task_update")
        .expect("the update is audited");
    assert_eq!(
        (denied.process.as_str(), denied.outcome.as_str()),
        ("worker:2", "denied")
    );
}

const ADMIN_AND_USER: &str = r#"
[[step]]
process = "channel"
tool_calls = [{ name = "reply", arguments = { text = "noted, heron" } }]

[[step]]
process = "cortex"
tool_calls = [{ name = "reply", arguments = { text = "admin here" } }]
"#;

#[test]
fn the_cortex_never_shares_a_history_or_session_with_the_user_channel() {
    let dir = agent_dir(ADMIN_AND_USER, "");
    let out = capstan_command(dir.path(), &["run", "The code word is heron."])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let out = capstan_command(dir.path(), &["run", "--cortex", "What did the user say?"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let user = stored_history(dir.path(), "channel:main");
    let admin = stored_history(dir.path(), "cortex:main");
    assert!(user.iter().any(|m| m.contains("heron")), "{user:?}");
    assert!(
        user.iter().all(|m| !m.contains("What did the user say")),
        "the admin chat's message is not in the user's history: {user:?}"
    );
    assert!(
        admin.iter().all(|m| !m.contains("heron")),
        "the user's message is not in the admin chat's history: {admin:?}"
    );
    assert!(admin.iter().any(|m| m.contains("admin here")), "{admin:?}");
}
