//! The `capstan` binary as a user runs it, against the plugins `scripts/setup` built.

use std::path::Path;
use std::process::{Command, Output};

use crate::support::{repo_root, stderr, stdout};

/// `capstan ARGS` in `dir` with the tests' cache and state, and no plugins-dir override:
/// these tests find the plugins as a user would.
fn capstan_command(dir: &Path, args: &[&str]) -> Command {
    assert!(
        repo_root().join("target/plugins/files.wasm").is_file(),
        "build the plugins first: bash scripts/setup"
    );
    let mut command = crate::support::capstan_command(dir, args);
    command.env_remove("CAPSTAN_PLUGINS_DIR");
    command
}

/// Runs `capstan ARGS` in `dir` to its end.
fn capstan(dir: &Path, args: &[&str]) -> Output {
    capstan_command(dir, args)
        .output()
        .expect("running capstan")
}

/// Starts `capstan ARGS` in `dir` with its standard streams piped.
fn spawn_capstan(dir: &Path, args: &[&str]) -> std::process::Child {
    capstan_command(dir, args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("starting capstan")
}

#[test]
fn plugins_list_finds_the_first_party_plugins_without_flags() {
    let elsewhere = tempfile::tempdir().unwrap();
    for dir in [repo_root(), elsewhere.path().to_owned()] {
        let out = capstan(&dir, &["plugins", "list"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        assert!(text.starts_with("TOOL"), "{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("file_edit"))
            .expect("file_edit listed");
        assert!(row.contains("files.wasm") && row.contains("0.2.1"), "{row}");
        assert!(row.contains("fs.read,fs.write"), "{row}");
    }
}

#[test]
fn your_plugins_directories_come_first_and_the_first_party_plugins_stay_unless_the_config_says() {
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    let first_party = repo_root().join("target/plugins");
    // Your own copy of a first-party plugin, and a plugin of your own.
    std::fs::copy(first_party.join("memory.wasm"), own.join("memory.wasm")).unwrap();
    std::fs::copy(
        repo_root().join("target/examples/word_count.wasm"),
        own.join("word_count.wasm"),
    )
    .unwrap();
    let own_shown = own.canonicalize().unwrap().display().to_string();
    let first_shown = first_party.canonicalize().unwrap().display().to_string();
    let config = dir.path().join("capstan.toml");

    std::fs::write(&config, "[agent]\nplugins_dir = \"own\"\n").unwrap();
    let out = capstan(dir.path(), &["policy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = |name: &str, from: &str| format!("  {name:<14}from {from}");
    for expected in [
        line("memory", &own_shown),
        line("word_count", &own_shown),
        line("files", &first_shown),
        line("web", &first_shown),
        format!("  {:<14}not loaded from {first_shown}: hidden", "memory"),
    ] {
        assert!(text.contains(&expected), "{expected}\n{text}");
    }
    // The first directory holds the tool the matrix offers.
    let loaded = |text: &str, tool: &str| {
        text.lines()
            .any(|l| l.starts_with(&format!("{tool} ")) && !l.contains("not loaded"))
    };
    assert!(
        loaded(&text, "word_count") && loaded(&text, "file_read"),
        "{text}"
    );

    std::fs::write(
        &config,
        "[agent]\nplugins_dir = [\"own\"]\nfirst_party_plugins = false\n",
    )
    .unwrap();
    let text = stdout(&capstan(dir.path(), &["policy"]));
    assert!(text.contains(&line("word_count", &own_shown)), "{text}");
    assert!(!text.contains(&first_shown), "{text}");
    assert!(!loaded(&text, "file_read"), "{text}");

    // --plugins-dir, repeatable, replaces the config's list; the first-party ones follow.
    std::fs::write(&config, "[agent]\nplugins_dir = \"missing\"\n").unwrap();
    let text = stdout(&capstan(
        dir.path(),
        &["policy", "--plugins-dir", own.to_str().unwrap()],
    ));
    assert!(text.contains(&line("word_count", &own_shown)), "{text}");
    assert!(text.contains(&line("files", &first_shown)), "{text}");

    std::fs::write(&config, "[agent]\nplugins_dir = 3\n").unwrap();
    let out = capstan(dir.path(), &["policy"]);
    let said = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(
        said.contains("capstan.toml:2:")
            && said.contains("`agent.plugins_dir`: must be a directory or a list of directories"),
        "{said}"
    );
}

#[test]
fn tool_call_prints_the_result_and_exits_zero() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    let out = capstan(
        ws.path(),
        &[
            "tool",
            "call",
            "file_read",
            r#"{"path":"a.txt"}"#,
            "--grant",
            "fs.read",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "alpha\n");
}

#[test]
fn a_denied_call_exits_4_names_the_capability_and_changes_nothing() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    let ws_arg = ws.path().to_str().unwrap();
    let out = capstan(
        &repo_root(),
        &[
            "tool",
            "call",
            "file_write",
            r#"{"path":"a.txt","content":"x"}"#,
            "--grant",
            "fs.read",
            "--workspace",
            ws_arg,
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.starts_with("error[denied]:") && err.contains("`fs.write`"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "alpha\n"
    );
}

#[test]
fn json_output_carries_the_error_kind_and_exit_codes_follow_it() {
    let ws = tempfile::tempdir().unwrap();
    let cases = [
        (r#"{"path": 1}"#, "invalid-args", 3),
        (r#"{"path": "missing.txt"}"#, "not-found", 5),
    ];
    for (args, kind, code) in cases {
        let out = capstan(
            ws.path(),
            &[
                "tool",
                "call",
                "file_read",
                args,
                "--grant",
                "fs.read",
                "--json",
            ],
        );
        assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
        let value: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
        assert_eq!(value["error"]["kind"], kind, "{value}");
    }
    let out = capstan(ws.path(), &["tool", "call", "no_such_tool", "{}"]);
    assert_eq!(out.status.code(), Some(5));
}

#[test]
fn inspect_shows_a_component_or_why_it_is_refused() {
    let root = repo_root();
    let out = capstan(&root, &["plugins", "inspect", "target/plugins/files.wasm"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("wit:     capstan:plugin@0.2.1"), "{text}");
    assert!(text.contains("file_write  [fs.write]"), "{text}");
    assert!(text.contains("wasi:filesystem/preopens@"), "{text}");

    let out = capstan(
        &root,
        &["plugins", "inspect", "target/fixtures/unknown_import.wasm"],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("unknown_import.wasm") && err.contains("capstan:evil/model"),
        "{err}"
    );
}

#[test]
fn bad_flags_get_a_specific_error() {
    let out = capstan(
        &repo_root(),
        &["tool", "call", "file_read", "{}", "--grant", "fs.root"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("unknown capability `fs.root`"),
        "{}",
        stderr(&out)
    );

    let out = capstan(
        &repo_root(),
        &["plugins", "list", "--plugins-dir", "/nonexistent/dir"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("/nonexistent/dir"),
        "{}",
        stderr(&out)
    );

    let out = capstan(&repo_root(), &["plugins", "list", "--deadline", "0"]);
    assert!(stderr(&out).contains("--deadline"), "{}", stderr(&out));
}

#[test]
fn policy_prints_the_matrix_with_a_reason_for_every_cell_that_is_off() {
    let out = capstan(&repo_root(), &["policy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let header = text.lines().nth(1).unwrap();
    assert!(
        header.starts_with("TOOL") && header.contains("channel") && header.contains("cortex"),
        "{header}"
    );
    let row = |tool: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("{tool} ")))
            .unwrap_or_else(|| panic!("{tool}: {text}"));
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .skip(1)
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    // channel, branch, worker, compactor, cortex
    assert_eq!(
        row("file_read"),
        ["- not in profile", "on", "on", "- not in profile", "on"]
    );
    assert_eq!(
        row("file_write"),
        [
            "- not in profile",
            "- not in profile",
            "on",
            "- not in profile",
            "on"
        ]
    );
    assert_eq!(
        row("task_create"),
        ["- not in profile", "on", "on", "- not in profile", "on"]
    );
    assert_eq!(
        row("memory_recall"),
        [
            "- not in profile",
            "on",
            "- not in profile",
            "- not in profile",
            "on"
        ]
    );
    assert_eq!(row("spawn_worker")[..3], ["on", "on", "- not in profile"]);
    assert_eq!(row("set_status")[2], "on");
    assert_eq!(row("reply")[1], "- not in profile");
}

#[test]
fn policy_names_where_each_command_records_its_calls() {
    let dir = tempfile::tempdir().unwrap();
    let out = capstan(dir.path(), &["policy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let line = |command: &str| {
        text.lines()
            .find(|l| l.starts_with(command))
            .unwrap_or_else(|| panic!("{command}: {text}"))
            .to_owned()
    };
    let database = dir.path().join(".capstan").join("capstan.db");
    assert!(
        line("run, chat, serve, mcp, tool call")
            .contains(&format!("kept in SQLite at {}", database.display())),
        "{text}"
    );
    assert!(
        line("mcp, tool call: --store memory").contains("kept in this process's memory"),
        "{text}"
    );
    assert!(
        line("demo, serve --demo").contains("the demo's directory"),
        "{text}"
    );
    assert!(!database.exists(), "policy opens no store");

    // A shared database is named without its password, and not connected to.
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[store]\nkind = \"postgres\"\nurl = \"postgres://capstan:hunter2@db.invalid:5433/tasks\"\n",
    )
    .unwrap();
    let out = capstan(dir.path(), &["policy", "--config", "capstan.toml"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("kept in PostgreSQL at postgresql://capstan@db.invalid:5433/tasks"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "{text}");
}

#[test]
fn a_command_that_loads_no_secret_still_prints_none() {
    // A task a model titled with a key (pasted by a user), printed by `capstan tasks`,
    // which runs no call: the terminal's redactor knows every value it can read.
    let dir = tempfile::tempdir().unwrap();
    let key = "sk-tasks-0123456789abcdef";
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[secrets.API_KEY]\nenv = \"CAPSTAN_TEST_API_KEY\"\n",
    )
    .unwrap();
    let services = capstan_host::store::Store::open(&dir.path().join(".capstan"))
        .map(|store| std::sync::Arc::new(store).services())
        .unwrap();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let task = capstan_host::services::NewTask::titled(&format!("rotate {key} tonight"));
        services
            .tasks
            .create(&crate::support::ids::by("worker:1"), task)
            .await
            .unwrap();
    });
    drop(services);
    let out = capstan_command(dir.path(), &["tasks", "--config", "capstan.toml"])
        .env("CAPSTAN_TEST_API_KEY", key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("rotate [redacted secret API_KEY] tonight"),
        "{text}"
    );
    assert!(!text.contains(key) && !stderr(&out).contains(key), "{text}");
}

#[test]
fn policy_shows_a_capability_the_profile_does_not_grant() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[profiles.branch]\ncapabilities = [\"memory.read\"]\n",
    )
    .unwrap();
    let out = capstan(dir.path(), &["policy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("capstan.toml"), "{text}");
    let line = text.lines().find(|l| l.starts_with("file_read ")).unwrap();
    assert!(line.contains("- fs.read not granted"), "{line}");
}

#[test]
fn tool_call_as_a_profile_uses_its_grants_and_its_tool_list() {
    let ws = tempfile::tempdir().unwrap();
    let write = r#"{"path":"b.txt","content":"from worker"}"#;
    let out = capstan(
        ws.path(),
        &["tool", "call", "file_write", write, "--as", "branch"],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not offered to a branch process"),
        "{}",
        stderr(&out)
    );
    assert!(!ws.path().join("b.txt").exists());

    // A worker holds fs.write: it runs from elsewhere, so no config lookup lies in its
    // workspace.
    let elsewhere = tempfile::tempdir().unwrap();
    let ws_arg = ws.path().to_str().unwrap();
    let out = capstan(
        elsewhere.path(),
        &[
            "tool",
            "call",
            "file_write",
            write,
            "--as",
            "worker",
            "--workspace",
            ws_arg,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(ws.path().join("b.txt")).unwrap(),
        "from worker"
    );

    // Plugins were let write the workspace, so later commands start elsewhere too.
    let out = capstan(
        elsewhere.path(),
        &[
            "tool",
            "call",
            "file_read",
            r#"{"path":"b.txt"}"#,
            "--as",
            "channel",
            "--workspace",
            ws_arg,
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));

    let out = capstan(
        elsewhere.path(),
        &["tool", "call", "file_read", "{}", "--as", "janitor"],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "a bad flag is a host error (exit 1, as documented)"
    );
    assert!(
        stderr(&out).contains("unknown process kind `janitor`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn init_writes_a_config_that_loads_and_will_not_overwrite_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = capstan(dir.path(), &["init"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let written = std::fs::read_to_string(dir.path().join("capstan.toml")).unwrap();
    assert!(written.contains("[profiles.worker]"));
    assert!(capstan(dir.path(), &["policy"]).status.success());

    let again = capstan(dir.path(), &["init"]);
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("--force"), "{}", stderr(&again));
}

#[test]
fn a_bad_config_fails_at_start_naming_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[limits]\ntool_memory_mib = 0\n",
    )
    .unwrap();
    let out = capstan(dir.path(), &["plugins", "list"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("capstan.toml:2:1: `limits.tool_memory_mib`: must be 1 to 4096 MiB"),
        "{err}"
    );
}

/// A workspace path that is a file is refused the same way, saying so and what to change,
/// by every command that works in one: those that make it and a call that opens it.
#[test]
fn a_workspace_that_is_a_file_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("ws"), "a file").unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[agent]\nworkspace = \"ws\"\n[provider]\nkind = \"scripted\"\nscript = \"s.toml\"\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("s.toml"), "").unwrap();
    let call = [
        "tool",
        "call",
        "file_read",
        r#"{"path":"a.txt"}"#,
        "--grant",
        "fs.read",
        "--workspace",
        "ws",
    ];
    for args in [
        &["run", "hello"][..],
        &["chat"][..],
        &["serve", "--addr", "127.0.0.1:0"][..],
        &["mcp", "--profile", "worker"][..],
        &call[..],
    ] {
        let out = capstan(dir.path(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("ws is a file, not a directory")
                && err.contains("point agent.workspace (or --workspace) at a directory"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn the_demo_runs_from_any_directory_and_ends_with_the_tasks_from_sqlite() {
    let elsewhere = tempfile::tempdir().unwrap();
    let dir = elsewhere.path().join("demo");
    let out = capstan(elsewhere.path(), &["demo", "--dir", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("hops: 2 workers and 2 branches"), "{text}");
    assert!(
        text.contains("#2    backlog  high      Fix the failing nightly backup job"),
        "{text}"
    );
    assert!(text.contains("A branch cannot write files"), "{text}");
    let status = stderr(&out);
    assert!(
        status.contains(
            "[branch:2] file_write denied: tool `file_write` is not offered to a branch process"
        ),
        "{status}"
    );
    assert!(dir.join("workspace/analysis.md").is_file());

    // The taskboard persists for later commands.
    std::fs::write(dir.join("capstan.toml"), "").unwrap();
    let tasks = capstan(&dir, &["tasks"]);
    assert!(tasks.status.success(), "{}", stderr(&tasks));
    assert_eq!(stdout(&tasks).lines().count(), 4, "{}", stdout(&tasks));
}

/// After the demo, `capstan audit` lists its calls with their receipts and sums them by
/// conversation, tool and day, from the SQLite file; the JSON total is the rows' sum.
#[test]
fn audit_lists_and_sums_the_receipts_of_the_demo_calls() {
    let elsewhere = tempfile::tempdir().unwrap();
    let dir = elsewhere.path().join("demo");
    let out = capstan(elsewhere.path(), &["demo", "--dir", dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    std::fs::write(dir.join("capstan.toml"), "").unwrap();

    let costs = capstan(&dir, &["audit", "costs"]);
    assert!(costs.status.success(), "{}", stderr(&costs));
    let text = stdout(&costs);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("conversation") && lines[0].contains("peak mem"),
        "{text}"
    );
    assert!(lines[1].starts_with("channel:main"), "{text}");
    assert!(lines.last().unwrap().starts_with("total"), "{text}");

    let json = capstan(&dir, &["audit", "costs", "--by", "tool", "--json"]);
    assert!(json.status.success(), "{}", stderr(&json));
    let report: serde_json::Value = serde_json::from_str(&stdout(&json)).unwrap();
    let rows = report["rows"].as_array().unwrap();
    let tools: Vec<&str> = rows.iter().map(|r| r["key"].as_str().unwrap()).collect();
    assert!(
        tools.contains(&"file_read") && tools.contains(&"task_create"),
        "{tools:?}"
    );
    let sum = |field: &str| rows.iter().map(|r| r[field].as_u64().unwrap()).sum::<u64>();
    for field in ["calls", "failed", "duration_us", "bytes_in", "bytes_out"] {
        assert_eq!(
            report["total"][field].as_u64().unwrap(),
            sum(field),
            "{field}"
        );
    }
    let calls = report["total"]["calls"].as_u64().unwrap();
    assert!(
        calls >= 5,
        "the demo's workers and branches call tools: {calls}"
    );
    assert!(report["total"]["peak_memory_bytes"].as_u64().unwrap() > 0);

    let listed = capstan(
        &dir,
        &["audit", "calls", "--conversation", "main", "--limit", "3"],
    );
    assert!(listed.status.success(), "{}", stderr(&listed));
    let text = stdout(&listed);
    assert_eq!(text.lines().count(), 4, "a header and three calls: {text}");
    assert!(
        text.lines().skip(1).all(|l| l.contains("channel:main")),
        "{text}"
    );
    let none = capstan(&dir, &["audit", "calls", "--conversation", "elsewhere"]);
    assert!(
        stdout(&none).contains("no tool call is recorded in channel:elsewhere"),
        "{}",
        stdout(&none)
    );
    let bad = capstan(
        &dir,
        &["audit", "costs", "--conversation", "main' OR 1=1--"],
    );
    assert!(!bad.status.success());
    assert!(
        stderr(&bad).contains("is not a conversation name"),
        "{}",
        stderr(&bad)
    );
}

#[test]
fn run_sends_one_message_and_prints_the_reply() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("script.toml"),
        "[[step]]\nprocess = \"channel\"\nwhen = \"ping\"\nreply = \"pong\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[provider]\nkind = \"scripted\"\nscript = \"script.toml\"\n",
    )
    .unwrap();
    let out = capstan(dir.path(), &["run", "ping?"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "agent> pong\n");

    // A script with no answer: the failure is reported, not a hang or a panic.
    let out = capstan(dir.path(), &["run", "something else"]);
    assert_eq!(out.status.code(), Some(2), "a failed model request exits 2");
    assert!(
        stderr(&out).contains("no step left for a channel request"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn the_cortex_admin_chat_has_every_tool() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("script.toml"),
        r#"
[[step]]
process = "cortex"
when = "tidy"
tool_calls = [
  { name = "file_write", arguments = { path = "admin.txt", content = "written by the cortex" } },
  { name = "task_create", arguments = { title = "Review the cortex's note" } },
]

[[step]]
process = "cortex"
when = "Review the cortex"
reply = "Wrote admin.txt and created task #1."
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[provider]\nkind = \"scripted\"\nscript = \"script.toml\"\n",
    )
    .unwrap();
    let out = capstan(dir.path(), &["run", "--cortex", "tidy up"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        stdout(&out),
        "agent> Wrote admin.txt and created task #1.\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("workspace/admin.txt")).unwrap(),
        "written by the cortex"
    );
    let tasks = stdout(&capstan(dir.path(), &["tasks"]));
    assert!(
        tasks.contains("Review the cortex's note") && tasks.contains("main"),
        "{tasks}"
    );
}

#[test]
fn chat_reads_messages_from_stdin_and_shows_status_lines() {
    use std::io::Write as _;
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().to_str().unwrap().to_owned();
    let mut child = capstan(dir.path(), &["demo", "--dir", &out_dir]);
    assert!(child.status.success(), "{}", stderr(&child));
    // Chat in the demo's directory, on its built-in script: the first message again.
    std::fs::write(dir.path().join("capstan.toml"), "").unwrap();
    let mut chat = spawn_capstan(dir.path(), &["chat", "--channel", "second"]);
    chat.stdin
        .take()
        .unwrap()
        .write_all(b"Gather the open items from the notes in notes/ and summarize them.\n/quit\n")
        .unwrap();
    child = chat.wait_with_output().unwrap();
    assert!(child.status.success(), "{}", stderr(&child));
    let status = stderr(&child);
    assert!(
        // The demo's run had workers 1 and 2: ids never repeat across runs.
        status.contains("[worker:3] started:") && status.contains("[worker:3] file_list ok"),
        "{status}"
    );
    assert!(
        stdout(&child).contains("agent> There are 3 open items"),
        "{}",
        stdout(&child)
    );
}

/// Lines pasted at once go in as typed, one exchange each, opened in order: whether the
/// conversation answers them in one turn or two, each reply shown is shown once, and the
/// last one always.
#[test]
fn chat_shows_each_reply_of_pasted_lines_once() {
    use std::io::Write as _;
    let script = "[[step]]\nprocess = \"channel\"\nwhen = \"first\"\nreply = \"reply to first\"\n\
                  [[step]]\nprocess = \"channel\"\nwhen = \"second\"\nreply = \"reply to second\"\n";
    let dir = crate::support::agent_dir(script, "");
    let mut chat = spawn_capstan(dir.path(), &["chat"]);
    chat.stdin
        .take()
        .unwrap()
        .write_all(b"first\nsecond\n/quit\n")
        .unwrap();
    let out = chat.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let count = |reply: &str| text.matches(&format!("agent> {reply}")).count();
    assert_eq!(count("reply to second"), 1, "{text}");
    assert!(count("reply to first") <= 1, "{text}");
}

/// Tried as a new user would: start a job in `capstan chat`, then, while its worker runs,
/// type a follow-up. The channel routes it, and the running worker gets it at its next
/// turn boundary.
#[test]
fn chat_routes_a_follow_up_to_a_running_worker() {
    use std::io::{BufRead as _, Write as _};
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("script.toml"),
        r#"
[[step]]
process = "channel"
when = "start the report"
tool_calls = [
  { name = "spawn_worker", arguments = { task = "Write the report." } },
  { name = "reply", arguments = { text = "A worker is writing the report." } },
]

[[step]]
process = "channel"
when = "also add the totals"
tool_calls = [
  { name = "route", arguments = { worker = "worker:1", message = "Add the totals too." } },
  { name = "reply", arguments = { text = "Passed that on to worker:1." } },
]

[[step]]
process = "channel"
when = "[worker:1] finished"
reply = "The report is written, with the totals."

[[step]]
process = "worker"
when = "write the report"
delay_ms = 800
tool_calls = [{ name = "set_status", arguments = { state = "progress", message = "drafting" } }]

[[step]]
process = "worker"
when = "continue with the messages"
tool_calls = [{ name = "set_status", arguments = { state = "done", message = "report written, with the totals" } }]
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[provider]\nkind = \"scripted\"\nscript = \"script.toml\"\n",
    )
    .unwrap();
    let mut chat = spawn_capstan(dir.path(), &["chat"]);
    let mut stdin = chat.stdin.take().unwrap();
    let stderr_pipe = chat.stderr.take().unwrap();
    let (lines_tx, lines) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr_pipe).lines() {
            let Ok(line) = line else { break };
            let _ = lines_tx.send(line.clone());
        }
    });
    let mut status = Vec::new();
    let mut wait_for = |needle: &str| loop {
        let line = lines
            .recv_timeout(std::time::Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no `{needle}` in: {status:#?}"));
        let found = line.contains(needle);
        status.push(line);
        if found {
            break;
        }
    };
    stdin.write_all(b"Please start the report.\n").unwrap();
    wait_for("[worker:1] started: Write the report.");
    // The worker is still waiting for its model's first answer.
    stdin.write_all(b"Also add the totals.\n").unwrap();
    wait_for("[worker:1] 1 routed message(s) injected");
    stdin.write_all(b"/quit\n").unwrap();
    let out = chat.wait_with_output().unwrap();
    reader.join().unwrap();
    status.extend(lines.try_iter());
    assert!(out.status.success(), "{status:#?}");
    let said = stdout(&out);
    assert!(
        said.contains("agent> A worker is writing the report.")
            && said.contains("agent> Passed that on to worker:1.")
            && said.contains("agent> The report is written, with the totals."),
        "{said}"
    );
    assert!(
        status
            .iter()
            .any(|l| l.contains("[worker:1] done: report written, with the totals")),
        "{status:#?}"
    );
}

#[test]
fn a_reader_that_stops_early_ends_the_demo_quietly() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let demo_dir = dir.path().join("demo");
    let mut child = spawn_capstan(dir.path(), &["demo", "--dir", demo_dir.to_str().unwrap()]);
    drop(child.stdin.take());
    let mut first = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert_eq!(first, "Capstan demo\n");
    // The reader is gone (as `| head -1` would be): every later line finds the pipe closed.
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.code(), Some(0), "{err}");
}

#[test]
fn status_names_the_sqlite_store() {
    let dir = tempfile::tempdir().unwrap();
    let out = capstan(dir.path(), &["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let shown = stdout(&out);
    assert!(
        shown.starts_with("store: SQLite, ") && shown.contains("capstan.db (one host)"),
        "{shown}"
    );
}
