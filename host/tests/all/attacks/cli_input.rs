//! What a person hands the binary: numeric flags and config keys are range-checked (no
//! panic on huge, negative, NaN or infinite values), tool arguments come from stdin or
//! `@FILE`, start-up errors point at the file, line and column, denials are printed once
//! without ANSI codes, and the documented exit codes are the ones returned.

use std::io::Write;
use std::path::Path;
use std::process::Stdio;

use crate::support::{capstan, capstan_command, component, stderr, stdout};

/// Asserts a clean refusal: exit 1, no panic, and every one of `expected` in the message.
fn assert_refused(out: &std::process::Output, expected: &[&str]) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(!err.contains("panicked"), "no panic: {err}");
    for part in expected {
        assert!(err.contains(part), "{part:?} not in: {err}");
    }
}

fn read_call(dir: &Path, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "tool",
        "call",
        "file_read",
        r#"{"path":"a.txt"}"#,
        "--grant",
        "fs.read",
    ];
    args.extend_from_slice(extra);
    capstan(dir, &args)
}

/// `--set` sets any config key with the names and checks of capstan.toml; what it breaks
/// is refused naming the flag and the key, and a good value takes effect.
#[test]
fn set_overrides_a_config_key_with_the_same_names_and_checks() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    for (assignment, expected) in [
        (
            "limits.tool_memory_mib=0",
            "--set limits.tool_memory_mib=0: `limits.tool_memory_mib`: must be 1 to 4096 MiB",
        ),
        (
            "limits.max_turns=0",
            "`limits.max_turns`: must be at least 1",
        ),
        ("limits.no_such_limit=3", "unknown field `no_such_limit`"),
        (
            "limits.max_turns=\"four\"",
            "`limits.max_turns`: invalid type",
        ),
        ("limits", "expected KEY=VALUE"),
        ("agent.name.first=x", "`name` is not a table"),
    ] {
        let out = read_call(ws.path(), &["--set", assignment]);
        assert_refused(&out, &[expected]);
    }
    // A good value takes effect, over --memory: at 1 MiB no plugin fits.
    let out = read_call(
        ws.path(),
        &["--memory", "4096", "--set", "limits.tool_memory_mib=1"],
    );
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("over the 1 MiB limit"),
        "{}",
        stderr(&out)
    );
    let out = read_call(ws.path(), &["--set", "limits.tool_memory_mib=2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "alpha\n");
}

#[test]
fn numeric_flags_out_of_range_are_refused_naming_the_limit() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    for value in ["1e300", "3600.5", "inf", "NaN", "0", "-1", "1e-400"] {
        let flag = format!("--deadline={value}");
        let out = read_call(ws.path(), &[&flag]);
        assert_refused(&out, &["--deadline", "at most 3600 seconds"]);
    }
    for value in [
        "0",
        "4097",
        "18446744073709551615",
        "99999999999999999999999",
        "-5",
        "1.5",
    ] {
        let flag = format!("--memory={value}");
        let out = read_call(ws.path(), &[&flag]);
        assert_refused(&out, &["--memory"]);
    }
    let out = read_call(ws.path(), &["--deadline", "3600", "--memory", "4096"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "alpha\n");
}

/// A conversation name the doors would refuse is refused on the command line too, before
/// anything is stored under it (an empty name wrote a session key no store reads back).
#[test]
fn a_channel_name_the_doors_refuse_is_refused_before_anything_is_stored() {
    let dir = tempfile::tempdir().unwrap();
    for name in ["", "a b", "x:y"] {
        let out = capstan(dir.path(), &["run", "--channel", name, "hello"]);
        assert_refused(&out, &["--channel", "not a conversation name"]);
    }
    assert!(
        !dir.path().join(".capstan").exists(),
        "nothing was stored: {:?}",
        std::fs::read_dir(dir.path()).unwrap().collect::<Vec<_>>()
    );
}

#[test]
fn numeric_config_keys_out_of_range_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("tool_deadline_secs = 1e300", "at most 3600 seconds"),
        ("tool_deadline_secs = inf", "at most 3600 seconds"),
        ("tool_deadline_secs = nan", "at most 3600 seconds"),
        ("tool_deadline_secs = -1", "at most 3600 seconds"),
        ("tool_memory_mib = 99999999999", "tool_memory_mib"),
        ("tool_memory_mib = -1", "tool_memory_mib"),
        (
            "max_workers_per_channel = 4294967296",
            "max_workers_per_channel",
        ),
        ("max_workers_per_channel = 100000", "must be at most 1024"),
        ("max_branches_per_channel = 100000", "must be at most 1024"),
        ("max_open_conversations = 0", "must be at least 1"),
        (
            "max_open_conversations = 2000000",
            "must be at most 1000000",
        ),
        ("max_turns = 4294967295", "must be at most 10000"),
        ("max_turns = -3", "max_turns"),
        ("context_window_tokens = 4294967295", "must be 512 to"),
        ("compaction_threshold = nan", "compaction_threshold"),
        ("compaction_threshold = -inf", "compaction_threshold"),
        // Beyond TOML's 64-bit integers: a syntax error, at its line.
        (
            "worker_timeout_secs = 18446744073709551615",
            "at line 2, column",
        ),
        ("worker_timeout_secs = -1", "worker_timeout_secs"),
        ("settle_ms = 1e30", "settle_ms"),
        ("dispatch_timeout_secs = 1e300", "dispatch_timeout_secs"),
        ("dispatch_hold_ms = 99999999999999", "dispatch_hold_ms"),
    ];
    for (line, expected) in cases {
        std::fs::write(
            dir.path().join("capstan.toml"),
            format!("[limits]\n{line}\n"),
        )
        .unwrap();
        let out = capstan(dir.path(), &["plugins", "list"]);
        assert_refused(&out, &["capstan.toml", expected]);
    }
}

#[test]
fn tool_arguments_come_from_stdin_or_a_file() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();

    let mut child = capstan_command(
        ws.path(),
        &["tool", "call", "file_read", "-", "--grant", "fs.read"],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(br#"{"path": "a.txt"}"#)
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "alpha\n");

    // An input far over what one command-line argument may hold (128 KiB on Linux).
    let content = "x".repeat(3 << 20);
    let args = serde_json::json!({ "path": "big.txt", "content": content }).to_string();
    let args_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(args_file.path(), &args).unwrap();
    let at = format!("@{}", args_file.path().display());
    // From elsewhere: a call granted fs.write may not run where its config is looked up.
    let elsewhere = tempfile::tempdir().unwrap();
    let ws_arg = ws.path().to_str().unwrap();
    let out = capstan(
        elsewhere.path(),
        &[
            "tool",
            "call",
            "file_write",
            &at,
            "--grant",
            "fs.write",
            "--workspace",
            ws_arg,
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        std::fs::read_to_string(ws.path().join("big.txt")).unwrap(),
        content
    );

    // The workspace is now one plugins were let write: later commands run from elsewhere.
    let out = capstan(
        elsewhere.path(),
        &["tool", "call", "file_read", "@/nonexistent/args.json"],
    );
    assert_refused(&out, &["/nonexistent/args.json"]);

    let huge = tempfile::NamedTempFile::new().unwrap();
    huge.as_file().set_len(17 << 20).unwrap();
    let at = format!("@{}", huge.path().display());
    let out = capstan(elsewhere.path(), &["tool", "call", "file_read", &at]);
    assert_refused(&out, &["16 MiB", &huge.path().display().to_string()]);

    let help = stdout(&capstan(elsewhere.path(), &["tool", "call", "--help"]));
    assert!(
        help.contains("@FILE") && help.contains("standard input"),
        "{help}"
    );
}

#[test]
fn a_config_that_is_not_toml_or_not_utf8_is_reported_at_its_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("capstan.toml");
    std::fs::write(&config, "[agent]\nname = \"x\"\n[limits\nmax_turns = 3\n").unwrap();
    let out = capstan(dir.path(), &["plugins", "list"]);
    assert_refused(&out, &["capstan.toml", "not valid TOML at line 3, column"]);

    std::fs::write(&config, b"[agent]\nname = \"caf\xe9\"\n").unwrap();
    let out = capstan(dir.path(), &["plugins", "list"]);
    assert_refused(
        &out,
        &["capstan.toml", "not valid UTF-8 at line 2, column 12"],
    );
}

#[test]
fn a_script_that_is_not_toml_or_not_utf8_is_reported_at_its_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[provider]\nkind = \"scripted\"\nscript = \"script.toml\"\n",
    )
    .unwrap();
    let script = dir.path().join("script.toml");
    std::fs::write(&script, "[[step]]\nprocess = \"channel\"\nreply = \n").unwrap();
    let out = capstan(dir.path(), &["run", "hi"]);
    assert_refused(&out, &["script.toml", "not valid TOML at line 3, column"]);

    std::fs::write(
        &script,
        b"[[step]]\nprocess = \"channel\"\nreply = \"\xff\"\n",
    )
    .unwrap();
    let out = capstan(dir.path(), &["run", "hi"]);
    assert_refused(
        &out,
        &["script.toml", "not valid UTF-8 at line 3, column 10"],
    );
}

#[test]
fn a_bad_tool_glob_shows_the_valid_syntax() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("capstan.toml"),
        "[profiles.branch]\ntools = [\"file_[\"]\n",
    )
    .unwrap();
    let out = capstan(dir.path(), &["policy"]);
    assert_refused(
        &out,
        &[
            "profiles.branch.tools",
            "`file_[`",
            "`*` matches any characters",
            "\"file_*\"",
        ],
    );
}

#[test]
fn a_denial_is_printed_once_and_without_ansi_codes() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    for log in ["warn", "info"] {
        let out = capstan_command(
            ws.path(),
            &[
                "tool",
                "call",
                "file_write",
                r#"{"path":"a.txt","content":"x"}"#,
                "--grant",
                "fs.read",
            ],
        )
        .env("CAPSTAN_LOG", log)
        .output()
        .unwrap();
        assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(
            err.matches("needs capability `fs.write`").count(),
            1,
            "{err}"
        );
        assert!(!err.contains('\x1b'), "no ANSI codes into a pipe: {err:?}");
    }
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "alpha\n"
    );
}

#[test]
fn the_documented_exit_codes_are_the_ones_returned() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    let probe_dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        component("fixtures", "probe"),
        probe_dir.path().join("probe.wasm"),
    )
    .unwrap();
    let probe = probe_dir.path().to_str().unwrap();
    let cases: [(&[&str], i32); 9] = [
        (
            &["file_read", r#"{"path":"a.txt"}"#, "--grant", "fs.read"],
            0,
        ),
        (&["file_read", r#"{"path": 1}"#, "--grant", "fs.read"], 3),
        (&["file_read", "[1]", "--grant", "fs.read"], 3),
        (&["file_write", r#"{"path":"a.txt","content":"x"}"#], 4),
        (&["no_such_tool", "{}"], 5),
        (&["panic", "{}", "--plugins-dir", probe], 6),
        (&["file_read", "{}", "--no-such-flag"], 1),
        (&["file_read", "{}", "--grant", "fs.root"], 1),
        (&["file_read", "{}", "--as", "janitor"], 1),
    ];
    for (args, code) in cases {
        let mut full = vec!["tool", "call"];
        full.extend_from_slice(args);
        let out = capstan(ws.path(), &full);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {}", stderr(&out));
        assert!(
            !stderr(&out).contains("thread '"),
            "no host panic: {}",
            stderr(&out)
        );
    }
    let help = capstan(ws.path(), &["--help"]);
    assert_eq!(help.status.code(), Some(0));
    let bad_config = tempfile::tempdir().unwrap();
    std::fs::write(bad_config.path().join("capstan.toml"), "[agent\n").unwrap();
    assert_eq!(
        capstan(bad_config.path(), &["tool", "call", "file_read", "{}"])
            .status
            .code(),
        Some(1)
    );
    let out = capstan(
        ws.path(),
        &["plugins", "list", "--plugins-dir", "/nonexistent/plugins"],
    );
    assert_refused(&out, &["/nonexistent/plugins"]);
}

/// A config that never ends (a device) is cut off at the size cap, not read into memory
/// without end.
#[test]
fn an_endless_config_is_refused_at_the_size_cap() {
    let dir = tempfile::tempdir().unwrap();
    let out = capstan(dir.path(), &["policy", "--config", "/dev/zero"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("/dev/zero") && err.contains("16 MiB"), "{err}");
}
