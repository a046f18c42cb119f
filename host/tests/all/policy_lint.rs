//! `capstan policy --lint` through the real binary, with the first-party plugins: each
//! finding a policy can hold, named with the config line to change, exit 1; the built-in
//! defaults lint clean.

use crate::support::{capstan, stderr, stdout};

/// Lints `config` (written as `capstan.toml` in a directory of its own): the exit code and
/// the lines printed.
fn lint(config: &str) -> (Option<i32>, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("capstan.toml"), config).unwrap();
    let out = capstan(
        dir.path(),
        &["policy", "--lint", "--config", "capstan.toml"],
    );
    assert!(
        stderr(&out).is_empty() || out.status.code().is_some(),
        "{}",
        stderr(&out)
    );
    let lines = stdout(&out).lines().map(str::to_owned).collect();
    (out.status.code(), lines)
}

/// The one line that starts with `start`, or a panic showing all of them.
fn line<'a>(lines: &'a [String], start: &str) -> &'a str {
    let found: Vec<&String> = lines.iter().filter(|l| l.starts_with(start)).collect();
    assert_eq!(found.len(), 1, "{start}: {lines:#?}");
    found[0]
}

/// Every profile, each empty: a policy that offers nothing and names nothing.
const QUIET: &str = "[profiles.branch]\ntools = []\ncapabilities = []\n\
    [profiles.compactor]\ntools = []\ncapabilities = []\n\
    [profiles.cortex]\ntools = [\"*\"]\ncapabilities = [\"fs.read\", \"fs.write\", \"tasks.read\", \"tasks.write\", \"memory.read\", \"memory.write\"]\n";

#[test]
fn the_built_in_defaults_lint_clean_and_note_the_web_tools_waiting_for_a_network_grant() {
    let dir = tempfile::tempdir().unwrap();
    let out = capstan(dir.path(), &["policy", "--lint"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}{}", stderr(&out));
    assert!(text.contains("no findings"), "{text}");
    for tool in ["web_fetch", "http_request"] {
        assert!(
            text.contains(&format!(
                "note: profiles.worker.net: `{tool}` is named in profiles.worker.tools and \
                 offered once a network rule is granted"
            )),
            "{text}"
        );
    }
}

#[test]
fn each_finding_names_the_line_to_change_and_the_lint_exits_1() {
    let config = format!(
        "[profiles.channel]\n\
         tools = [\"reply\", \"spawn_worker\", \"set_status\"]\n\
         capabilities = [\"fs.read\"]\n\
         [profiles.worker]\n\
         tools = [\"file_read\", \"file_write\", \"set_status\", \"web_fetch\", \"http_request\"]\n\
         capabilities = [\"fs.read\"]\n\
         net = [\"*\"]\n\
         {QUIET}"
    );
    let (code, lines) = lint(&config);
    assert_eq!(code, Some(1), "{lines:#?}");
    // A host tool named for a kind that does not run it.
    assert!(
        line(
            &lines,
            "capstan.toml:2: dead-cell: profiles.channel.tools: `set_status`"
        )
        .contains("a host tool a channel does not run (only worker)"),
        "{lines:#?}"
    );
    // A tool named but never granted what it needs: the line of the list that lacks it.
    assert!(
        line(
            &lines,
            "capstan.toml:6: dead-cell: profiles.worker.capabilities: `file_write`"
        )
        .contains("it needs fs.write, which profiles.worker.capabilities does not grant"),
        "{lines:#?}"
    );
    // A grant nothing offered uses.
    line(
        &lines,
        "capstan.toml:3: unused-grant: profiles.channel.capabilities: grants fs.read, but no \
         tool a channel is offered uses it",
    );
    // Untrusted input and an external effect in one process.
    assert!(
        line(
            &lines,
            "capstan.toml:5: untrusted-input-with-effect: profiles.worker.tools"
        )
        .contains("reads what outsiders wrote (web_fetch, http_request)"),
        "{lines:#?}"
    );
    // Loaded tools that no profile names (the cortex names every tool, so none here).
    assert!(
        !lines.iter().any(|l| l.contains("offered-to-nobody")),
        "{lines:#?}"
    );
    let count = lines
        .iter()
        .filter(|l| l.starts_with("capstan.toml:"))
        .count();
    assert_eq!(
        lines.last().unwrap(),
        &format!("{count} finding(s)"),
        "{lines:#?}"
    );
}

#[test]
fn a_worker_with_nothing_to_work_with_and_tools_no_profile_names_are_found() {
    let config = "[profiles.channel]\n\
         tools = [\"reply\", \"spawn_worker\"]\n\
         capabilities = []\n\
         [profiles.worker]\n\
         tools = [\"set_status\"]\n\
         capabilities = []\n\
         [profiles.branch]\ntools = [\"memory_*\", \"file_reed\"]\ncapabilities = [\"memory.read\", \"memory.write\"]\n\
         [profiles.compactor]\ntools = []\ncapabilities = []\n\
         [profiles.cortex]\ntools = [\"reply\"]\ncapabilities = []\n";
    let (code, lines) = lint(config);
    assert_eq!(code, Some(1), "{lines:#?}");
    assert!(
        line(
            &lines,
            "capstan.toml:5: delegation-dead-end: profiles.worker.tools"
        )
        .contains("a channel can start workers (`spawn_worker`), but a worker is offered no tool"),
        "{lines:#?}"
    );
    // The file tools are loaded and named by no profile: each found once, at the first
    // profile's line.
    for tool in ["file_read", "file_write", "task_create", "web_fetch"] {
        assert!(
            line(
                &lines,
                &format!("capstan.toml:1: offered-to-nobody: profiles: `{tool}`")
            )
            .contains("is loaded but named by no profile"),
            "{lines:#?}"
        );
    }
    assert!(
        !lines.iter().any(|l| l.contains("`memory_save`")),
        "the branch names the memory tools by a glob: {lines:#?}"
    );
    // A name nothing provides.
    assert!(
        line(
            &lines,
            "capstan.toml:8: unknown-tool: profiles.branch.tools: `file_reed`"
        )
        .contains("no plugin, MCP server or host tool provides it"),
        "{lines:#?}"
    );
}
