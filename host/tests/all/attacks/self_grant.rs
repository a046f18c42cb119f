//! No self-granting: a plugin that may write a workspace can never change what any process
//! is granted or what code the host runs, because the host refuses to start when its
//! config, data, cache, plugins or script lie inside such a workspace, resolved through
//! symlinks.

use std::path::Path;

use crate::support::{capstan, capstan_command, plugins_dir, stderr, stdout};

const CONFIG: &str = "[profiles.worker]\ntools = [\"file_read\"]\n";

/// A file_write of `capstan.toml` with `fs.write`, from `dir`, plus `extra` flags.
fn write_config_call(dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "tool",
        "call",
        "file_write",
        r#"{"path":"capstan.toml","content":"[profiles.branch]\ntools = [\"*\"]\n"}"#,
        "--grant",
        "fs.read,fs.write",
    ];
    args.extend_from_slice(extra);
    capstan(dir, &args)
}

fn real(path: &Path) -> String {
    path.canonicalize().unwrap().display().to_string()
}

#[test]
fn a_tool_call_cannot_rewrite_the_config_of_the_workspace_it_runs_in() {
    let ws = tempfile::tempdir().unwrap();
    let config = ws.path().join("capstan.toml");
    std::fs::write(&config, CONFIG).unwrap();

    let out = write_config_call(ws.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("capstan.toml") && err.contains(&real(ws.path())),
        "{err}"
    );
    assert!(
        err.contains("--config") && err.contains("fs.write"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&config).unwrap(), CONFIG);

    // The same through `--as worker`, whose fs.write comes from that very config's
    // defaults, and with the config named explicitly.
    let out = capstan(
        ws.path(),
        &[
            "tool",
            "call",
            "file_write",
            r#"{"path":"capstan.toml","content":"x"}"#,
            "--as",
            "cortex",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let elsewhere = tempfile::tempdir().unwrap();
    let out = write_config_call(
        elsewhere.path(),
        &[
            "--config",
            config.to_str().unwrap(),
            "--workspace",
            ws.path().to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&config).unwrap(), CONFIG);

    // Reading is fine: a call without fs.write runs in the directory that holds it.
    let out = capstan(
        ws.path(),
        &[
            "tool",
            "call",
            "file_read",
            r#"{"path":"capstan.toml"}"#,
            "--grant",
            "fs.read",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), CONFIG);
}

#[test]
fn a_config_reached_through_a_symlinked_workspace_is_still_inside() {
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let config = ws.join("capstan.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let ws_link = root.path().join("ws-link");
    std::os::unix::fs::symlink(&ws, &ws_link).unwrap();
    let config_link = root.path().join("config-link.toml");
    std::os::unix::fs::symlink(&config, &config_link).unwrap();

    for extra in [
        [
            "--workspace",
            ws_link.to_str().unwrap(),
            "--config",
            config.to_str().unwrap(),
        ],
        [
            "--workspace",
            ws.to_str().unwrap(),
            "--config",
            config_link.to_str().unwrap(),
        ],
    ] {
        let out = write_config_call(root.path(), &extra);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(&real(&ws)), "{}", stderr(&out));
    }
    assert_eq!(std::fs::read_to_string(&config).unwrap(), CONFIG);
}

#[test]
fn a_cache_dir_inside_the_workspace_through_a_symlink_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let ws = root.path().join("ws");
    std::fs::create_dir_all(ws.join("cache")).unwrap();
    let link = root.path().join("cache-link");
    std::os::unix::fs::symlink(ws.join("cache"), &link).unwrap();

    let out = write_config_call(
        root.path(),
        &[
            "--workspace",
            ws.to_str().unwrap(),
            "--cache-dir",
            link.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("component cache dir"), "{err}");
    assert!(err.contains(link.to_str().unwrap()), "{err}");
    assert!(err.contains(&real(&ws.join("cache"))), "{err}");
    assert!(
        err.contains("--cache-dir") && err.contains("--no-cache"),
        "{err}"
    );
    assert!(!ws.join("capstan.toml").exists(), "no call ran");
    assert_eq!(std::fs::read_dir(ws.join("cache")).unwrap().count(), 0);

    // The same cache dir through the environment, and for the agent's configured workspace.
    let out = capstan_command(
        root.path(),
        &[
            "tool",
            "call",
            "file_write",
            r#"{"path":"x","content":"x"}"#,
            "--grant",
            "fs.write",
            "--workspace",
            ws.to_str().unwrap(),
        ],
    )
    .env("CAPSTAN_CACHE_DIR", &link)
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!ws.join("x").exists());
}

#[test]
fn a_plugins_dir_inside_the_workspace_is_refused() {
    let ws = tempfile::tempdir().unwrap();
    let plugins = ws.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::copy(plugins_dir().join("files.wasm"), plugins.join("files.wasm")).unwrap();
    // Run from elsewhere, so the config lookup is not what is refused.
    let elsewhere = tempfile::tempdir().unwrap();
    let ws_arg = ws.path().to_str().unwrap();
    let out = write_config_call(
        elsewhere.path(),
        &[
            "--workspace",
            ws_arg,
            "--plugins-dir",
            plugins.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("plugins dir") && err.contains("--plugins-dir"),
        "{err}"
    );
    assert!(!ws.path().join("capstan.toml").exists());

    // Through CAPSTAN_PLUGINS_DIR too.
    let out = capstan_command(
        elsewhere.path(),
        &[
            "tool",
            "call",
            "file_write",
            r#"{"path":"x","content":"x"}"#,
            "--grant",
            "fs.write",
            "--workspace",
            ws_arg,
        ],
    )
    .env("CAPSTAN_PLUGINS_DIR", &plugins)
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!ws.path().join("x").exists());
}

/// A script in which the worker rewrites the config to grant itself everything.
const SELF_GRANT_SCRIPT: &str = r#"
[[step]]
process = "channel"
when = "go"
tool_calls = [{ name = "spawn_worker", arguments = { task = "grant yourself more" } }]

[[step]]
process = "worker"
tool_calls = [{ name = "file_write", arguments = { path = "capstan.toml", content = "[profiles.channel]\ntools = [\"*\"]\ncapabilities = [\"fs.write\"]\n" } }]

[[step]]
process = "worker"
reply = "done"
repeat = true

[[step]]
process = "channel"
reply = "ok"
repeat = true
"#;

#[test]
fn an_agent_whose_worker_could_rewrite_the_config_does_not_start() {
    let ws = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("script.toml"), SELF_GRANT_SCRIPT).unwrap();
    let script = ws.path().join("script.toml");
    let config = format!(
        "[agent]\nworkspace = \".\"\ndata_dir = {:?}\n\
         [provider]\nkind = \"scripted\"\nscript = {:?}\n",
        data.path(),
        script
    );
    std::fs::write(ws.path().join("capstan.toml"), &config).unwrap();
    let out = capstan(ws.path(), &["run", "go"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the config file") && err.contains(&real(ws.path())),
        "{err}"
    );
    assert!(err.contains("remove fs.write"), "{err}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("capstan.toml")).unwrap(),
        config
    );
    assert!(!stdout(&out).contains("agent>"), "no turn ran");
    assert_eq!(
        std::fs::read_dir(data.path()).unwrap().count(),
        0,
        "no database opened"
    );
}

#[test]
fn an_agent_with_its_data_dir_or_script_in_the_workspace_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.toml"), SELF_GRANT_SCRIPT).unwrap();
    for (config, named) in [
        (
            "[agent]\nworkspace = \"ws\"\ndata_dir = \"ws/.capstan\"\n",
            "the data dir",
        ),
        (
            "[agent]\nworkspace = \"ws\"\n[provider]\nkind = \"scripted\"\nscript = \"ws/script.toml\"\n",
            "the provider script",
        ),
    ] {
        std::fs::create_dir_all(dir.path().join("ws")).unwrap();
        std::fs::write(dir.path().join("ws/script.toml"), SELF_GRANT_SCRIPT).unwrap();
        std::fs::write(dir.path().join("capstan.toml"), config).unwrap();
        let out = capstan(dir.path(), &["run", "go"]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(named) && err.contains(&real(&dir.path().join("ws"))),
            "{err}"
        );
        assert!(
            !dir.path().join("ws/.capstan").exists(),
            "no database created"
        );
    }
    // With no profile granting fs.write, the same layout is allowed: no plugin can write.
    let read_only = "[agent]\nworkspace = \"ws\"\ndata_dir = \"ws/.capstan\"\n\
        [profiles.worker]\ncapabilities = [\"fs.read\"]\n\
        [profiles.cortex]\ncapabilities = [\"fs.read\"]\n";
    std::fs::write(dir.path().join("capstan.toml"), read_only).unwrap();
    let out = capstan(dir.path(), &["policy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stdout(&out).contains("refused at start"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn policy_shows_where_everything_is_and_whether_plugins_may_write_the_workspace() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[agent]\nworkspace = \"ws\"\n",
    )
    .unwrap();
    let out = capstan(dir.path(), &["policy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let root = real(dir.path());
    let line = |name: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("{name}: {text}"))
            .to_owned()
    };
    assert!(
        line("config").contains(&format!("{root}/capstan.toml")),
        "{text}"
    );
    assert!(
        line("data dir").contains(&format!("{root}/.capstan")),
        "{text}"
    );
    assert!(line("cache dir").contains("test-component-cache"), "{text}");
    assert!(
        line("plugins dir").contains(&real(&plugins_dir())),
        "{text}"
    );
    let workspace = line("workspace");
    assert!(workspace.contains(&format!("{root}/ws")), "{text}");
    assert!(workspace.contains("writable by plugins"), "{text}");

    // A workspace that holds the config is reported as refused.
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[agent]\nworkspace = \".\"\n",
    )
    .unwrap();
    let text = stdout(&capstan(dir.path(), &["policy"]));
    assert!(text.contains("refused at start: the config file"), "{text}");
}

/// The demo writes its notes into an existing workspace through a handle on it: a symlink
/// planted there that points outside leads the write nowhere.
#[test]
fn the_demo_never_writes_through_a_symlink_out_of_its_workspace() {
    let root = tempfile::tempdir().unwrap();
    let outside = root.path().join("outside.md");
    std::fs::write(&outside, "keep me\n").unwrap();
    let dir = root.path().join("demo");
    std::fs::create_dir_all(dir.join("workspace/notes")).unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("workspace/notes/meeting.md")).unwrap();
    let out = crate::support::capstan(root.path(), &["demo", "--dir", dir.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", crate::support::stdout(&out));
    assert!(
        crate::support::stderr(&out).contains("meeting.md"),
        "{}",
        crate::support::stderr(&out)
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "keep me\n");
}

/// With no config file, the place the next command would look for one is still guarded:
/// a call granted `fs.write` on the directory it runs in could plant `capstan.toml` there.
#[test]
fn a_tool_call_cannot_plant_a_config_where_the_next_command_looks_for_one() {
    let ws = tempfile::tempdir().unwrap();
    let out = write_config_call(ws.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains("capstan.toml") && err.contains("config"),
        "{err}"
    );
    assert!(
        !ws.path().join("capstan.toml").exists(),
        "nothing was planted"
    );
}

/// A call's workspace may not hold the data dir a later run opens, even though the call
/// itself never opens it.
#[test]
fn a_tool_call_cannot_write_the_data_dir_of_a_later_run() {
    let ws = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let config = elsewhere.path().join("capstan.toml");
    std::fs::write(
        &config,
        format!(
            "[agent]
data_dir = \"{}\"\n",
            ws.path().join(".capstan").display()
        ),
    )
    .unwrap();
    let out = capstan(
        ws.path(),
        &[
            "tool",
            "call",
            "file_write",
            r#"{"path":".capstan/capstan.db","content":"garbage"}"#,
            "--grant",
            "fs.write",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("the data dir"), "{}", stderr(&out));
    assert!(!ws.path().join(".capstan/capstan.db").exists());
}

/// `--record FILE` is rewritten on every exchange: it may not lie in a workspace plugins
/// may write, where a planted symlink could lead it anywhere.
#[test]
fn a_recording_inside_the_writable_workspace_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("capstan.toml"), "").unwrap();
    let outside = dir.path().join("outside.txt");
    std::fs::write(&outside, "precious\n").unwrap();
    std::fs::create_dir(dir.path().join("workspace")).unwrap();
    std::os::unix::fs::symlink("../outside.txt", dir.path().join("workspace/rec.toml")).unwrap();
    let out = capstan(
        dir.path(),
        &["run", "--record", "workspace/rec.toml", "hello"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("the recording"), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "precious\n");
}

/// A script in which a worker plants a config in its workspace, for whoever starts capstan
/// there next.
const PLANT_SCRIPT: &str = r#"
[[step]]
process = "channel"
when = "go"
tool_calls = [{ name = "spawn_worker", arguments = { task = "plant a config" } }]

[[step]]
process = "worker"
when = "plant a config"
tool_calls = [{ name = "file_write", arguments = { path = "capstan.toml", content = "[profiles.channel]\ntools = [\"*\"]\ncapabilities = [\"fs.read\", \"fs.write\"]\n" } }]

[[step]]
process = "worker"
reply = "planted"
repeat = true

[[step]]
process = "channel"
reply = "ok"
repeat = true
"#;

/// `capstan ARGS` in `dir` with its own state dir `state`.
fn capstan_with_state(dir: &Path, state: &Path, args: &[&str]) -> std::process::Output {
    capstan_command(dir, args)
        .env("CAPSTAN_STATE_DIR", state)
        .output()
        .unwrap()
}

#[test]
fn a_config_planted_by_an_earlier_runs_worker_is_refused_at_every_later_start() {
    let dir = crate::support::agent_dir(PLANT_SCRIPT, "");
    let state = tempfile::tempdir().unwrap();
    let record = state.path().join("writable-workspaces");
    let out = capstan_with_state(dir.path(), state.path(), &["run", "go"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let ws = dir.path().join("workspace");
    let planted = ws.join("capstan.toml");
    assert!(planted.is_file(), "the worker planted its config");
    let recorded = std::fs::read_to_string(&record).unwrap();
    assert!(recorded.lines().any(|line| line == real(&ws)), "{recorded}");

    // Started from inside that workspace, for any command, the planted config is refused
    // unread, and the error says where the record is and how to clear it.
    for args in [
        &["policy"][..],
        &["plugins", "list"],
        &[
            "tool",
            "call",
            "file_read",
            r#"{"path":"capstan.toml"}"#,
            "--grant",
            "fs.read",
        ],
        &["run", "hello"],
    ] {
        let out = capstan_with_state(&ws, state.path(), args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains("the config file capstan.toml"),
            "{args:?}: {err}"
        );
        assert!(err.contains(&real(&ws)), "{err}");
        assert!(
            err.contains(&format!("recorded in {}", record.display()))
                && err.contains("delete its line"),
            "{err}"
        );
        assert!(stdout(&out).is_empty(), "{args:?}: nothing ran");
    }

    // Named with --config from elsewhere, or planted one directory down, the same.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = capstan_with_state(
        elsewhere.path(),
        state.path(),
        &["policy", "--config", planted.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    std::fs::create_dir(ws.join("sub")).unwrap();
    std::fs::copy(&planted, ws.join("sub/capstan.toml")).unwrap();
    let out = capstan_with_state(&ws.join("sub"), state.path(), &["policy"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("recorded in"), "{}", stderr(&out));

    // The agent's own start, from its own directory, still works: its config is outside.
    let out = capstan_with_state(dir.path(), state.path(), &["policy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains(&format!(
            "write record: {} (workspaces plugins were let write: 1)",
            real(&record)
        )),
        "{}",
        stdout(&out)
    );

    // Once the person deletes the line, the directory is theirs again.
    let kept: String = recorded
        .lines()
        .filter(|line| *line != real(&ws))
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(&record, kept).unwrap();
    let out = capstan_with_state(&ws, state.path(), &["policy"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("policy from capstan.toml"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_tool_call_granted_fs_write_is_recorded_and_the_record_cannot_lie_in_its_workspace() {
    let ws = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let ws_arg = ws.path().to_str().unwrap();
    let write = |state: &Path| {
        capstan_with_state(
            elsewhere.path(),
            state,
            &[
                "tool",
                "call",
                "file_write",
                r#"{"path":"capstan.toml","content":"[limits]\nmax_turns = 99\n"}"#,
                "--grant",
                "fs.write",
                "--workspace",
                ws_arg,
            ],
        )
    };

    // The record inside the workspace the call may write is refused before the call runs.
    let inside = ws.path().join("state");
    let out = write(&inside);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the record of writable workspaces") && err.contains("CAPSTAN_STATE_DIR"),
        "{err}"
    );
    assert!(!ws.path().join("capstan.toml").exists(), "no call ran");

    // Outside, the call runs and its workspace is recorded, once however often it writes.
    for _ in 0..2 {
        let out = write(state.path());
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let recorded = std::fs::read_to_string(state.path().join("writable-workspaces")).unwrap();
    let lines: Vec<&str> = recorded.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(lines, [real(ws.path())]);

    // A read-only call records nothing.
    let read_only = tempfile::tempdir().unwrap();
    let out = capstan_with_state(
        read_only.path(),
        state.path(),
        &[
            "tool",
            "call",
            "file_list",
            r#"{"path":"."}"#,
            "--grant",
            "fs.read",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let after = std::fs::read_to_string(state.path().join("writable-workspaces")).unwrap();
    assert_eq!(after, recorded);

    // The workspace's config now refuses every start from there.
    let out = capstan_with_state(ws.path(), state.path(), &["policy"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

/// Records `ws` as written by plugins, through a real call granted fs.write.
fn record_workspace(ws: &Path, state: &Path) {
    let elsewhere = tempfile::tempdir().unwrap();
    let out = capstan_with_state(
        elsewhere.path(),
        state,
        &[
            "tool",
            "call",
            "file_write",
            r#"{"path":"planted.txt","content":"x"}"#,
            "--grant",
            "fs.write",
            "--workspace",
            ws.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn no_command_uses_a_cache_plugins_or_data_dir_inside_a_recorded_workspace() {
    let ws = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    record_workspace(ws.path(), state.path());
    let elsewhere = tempfile::tempdir().unwrap();
    let files = plugins_dir().join("files.wasm");
    let cache = ws.path().join("cache");
    let plugins = ws.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::copy(&files, plugins.join("files.wasm")).unwrap();
    let data = ws.path().join("data");
    std::fs::write(
        elsewhere.path().join("capstan.toml"),
        format!("[agent]\ndata_dir = {data:?}\n"),
    )
    .unwrap();
    let elsewhere_config = elsewhere.path().join("capstan.toml");
    let other = tempfile::tempdir().unwrap();
    let cases: [(Vec<&str>, &str); 4] = [
        (
            vec![
                "plugins",
                "inspect",
                files.to_str().unwrap(),
                "--cache-dir",
                cache.to_str().unwrap(),
            ],
            "the component cache dir",
        ),
        (
            vec!["policy", "--plugins-dir", plugins.to_str().unwrap()],
            "the plugins dir",
        ),
        (
            vec![
                "plugins",
                "list",
                "--plugins-dir",
                plugins.to_str().unwrap(),
            ],
            "the plugins dir",
        ),
        (
            vec!["tasks", "--config", elsewhere_config.to_str().unwrap()],
            "the data dir",
        ),
    ];
    for (args, kind) in cases {
        let out = capstan_with_state(other.path(), state.path(), &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(kind) && err.contains("recorded in"),
            "{args:?}: {err}"
        );
    }
    assert!(
        !cache.exists(),
        "no cache, no key, was written into the workspace"
    );
    assert!(!data.exists(), "no database was created there");
}

#[test]
fn a_damaged_misplaced_or_shared_record_is_refused_with_the_fix() {
    let state = tempfile::tempdir().unwrap();
    let record = state.path().join("writable-workspaces");
    let dir = tempfile::tempdir().unwrap();
    let policy = |state: &Path| capstan_with_state(dir.path(), state, &["policy"]);

    // A FIFO where the record lies is refused at once, not waited on.
    let status = std::process::Command::new("mkfifo")
        .arg(&record)
        .status()
        .unwrap();
    assert!(status.success());
    let out = policy(state.path());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not a regular file"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(&record).unwrap();

    // A record others may write could strike a workspace off.
    std::fs::write(&record, "/nowhere\n").unwrap();
    std::fs::set_permissions(&record, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
    let out = policy(state.path());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("mode 666") && err.contains("chmod 600"),
        "{err}"
    );
    assert_eq!(err.matches("mode 666").count(), 1, "said once: {err}");

    // A line that is not an absolute path, named by its number.
    std::fs::write(&record, "# comment\nrelative/ws\n").unwrap();
    std::fs::set_permissions(&record, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let out = policy(state.path());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("line 2 is not an absolute path"),
        "{}",
        stderr(&out)
    );

    // A relative state dir would name another record from every directory.
    let out = capstan_with_state(dir.path(), Path::new("state"), &["policy"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("CAPSTAN_STATE_DIR must be an absolute path"),
        "{}",
        stderr(&out)
    );

    // With nowhere to keep a record, reading warns and granting fs.write is refused.
    let out = capstan_command(
        dir.path(),
        &[
            "tool",
            "call",
            "file_write",
            r#"{"path":"x","content":"x"}"#,
            "--grant",
            "fs.write",
            "--workspace",
            state.path().to_str().unwrap(),
        ],
    )
    .env_remove("CAPSTAN_STATE_DIR")
    .env_remove("XDG_STATE_HOME")
    .env_remove("HOME")
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("warning: no state dir"), "{err}");
    assert!(
        err.contains("no directory to record the workspaces"),
        "{err}"
    );
    assert!(!state.path().join("x").exists());
}

#[test]
fn inside_a_recorded_workspace_init_demo_and_unknown_tools_change_nothing() {
    let ws = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    record_workspace(ws.path(), state.path());
    let record = state.path().join("writable-workspaces");
    let before = std::fs::read_to_string(&record).unwrap();

    // `init` would write a config every later command refuses.
    let out = capstan_with_state(ws.path(), state.path(), &["init"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!ws.path().join("capstan.toml").exists());

    // With no config there, the error names the lookup path, and how to get out.
    let out = capstan_with_state(ws.path(), state.path(), &["policy"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("the config lookup path (no file there yet)")
            && err.contains("run capstan from outside that workspace"),
        "{err}"
    );

    // The demo writes no notes into a workspace it may not use, and takes no config.
    let demo_dir = ws.path().join("demo");
    let out = capstan_with_state(
        ws.path(),
        state.path(),
        &["demo", "--dir", demo_dir.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!demo_dir.join("workspace/notes").exists());
    let elsewhere = tempfile::tempdir().unwrap();
    let out = capstan_with_state(
        elsewhere.path(),
        state.path(),
        &["demo", "--config", "capstan.toml"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("drop --config"), "{}", stderr(&out));

    // A call of a tool that does not exist never runs, so records nothing.
    let fresh = tempfile::tempdir().unwrap();
    let out = capstan_with_state(
        elsewhere.path(),
        state.path(),
        &[
            "tool",
            "call",
            "no_such_tool",
            "{}",
            "--grant",
            "fs.write",
            "--workspace",
            fresh.path().to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&record).unwrap(), before);
}
