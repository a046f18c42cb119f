//! What a plugin hands the host is checked before anyone sees it: its `describe()` output
//! (names, counts, sizes, schemas), its claim to a tool name another plugin declares
//! (never settled by file-name order), and the text it writes to logs and errors.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use capstan_host::plugin::{ArtifactCache, Limits, LoadError, PluginHost, Preferences, Registry};

use crate::support::{
    capstan, component, plugins_dir, plugins_with, stderr, stdout, test_cache_dir,
};

const FILE_TOOLS: [&str; 4] = ["file_read", "file_list", "file_write", "file_edit"];

fn host(limits: Limits) -> Arc<PluginHost> {
    Arc::new(PluginHost::new(limits, ArtifactCache::new(test_cache_dir())).unwrap())
}

fn refusal(registry: &Registry, file: &str) -> String {
    registry
        .refused()
        .iter()
        .find(|err| err.path().file_name().unwrap() == file)
        .unwrap_or_else(|| panic!("{file} was not refused: {:?}", registry.refused()))
        .to_string()
}

fn provider<'a>(registry: &'a Registry, tool: &str) -> Option<&'a str> {
    registry.tool(tool).map(|(plugin, _)| plugin.name())
}

#[tokio::test]
async fn a_copy_of_files_under_any_name_never_shadows_it_and_both_are_named() {
    let files = component("plugins", "files");
    // `aaa` sorts before `files`, `zzz` after: neither order decides.
    for copy in ["aaa", "zzz"] {
        let file = format!("{copy}.wasm");
        let dir = plugins_with(&[(&file, files.clone())]);
        let registry = Registry::load_dir(
            host(Limits::default()),
            capstan_host::plugin::CallLog::disabled(),
            dir.path(),
        )
        .await
        .unwrap();
        for tool in FILE_TOOLS {
            assert_eq!(provider(&registry, tool), None, "{copy}: {tool} was taken");
        }
        for (refused, other) in [(file.as_str(), "files.wasm"), ("files.wasm", file.as_str())] {
            let err = refusal(&registry, refused);
            assert!(
                err.contains(refused) && err.contains(other),
                "names both files: {err}"
            );
            assert!(err.contains("plugins.prefer."), "names the key: {err}");
        }
        assert!(
            provider(&registry, "task_list").is_some(),
            "the others load"
        );
    }
}

#[tokio::test]
async fn the_configured_plugin_provides_a_shared_tool_name_in_either_order() {
    let files = component("plugins", "files");
    for copy in ["aaa", "zzz"] {
        let file = format!("{copy}.wasm");
        for winner in ["files", copy] {
            let dir = plugins_with(&[(&file, files.clone())]);
            let prefer: Preferences = FILE_TOOLS.iter().map(|t| (*t, winner)).collect();
            let registry = Registry::load_dir_preferring(
                host(Limits::default()),
                capstan_host::plugin::CallLog::disabled(),
                dir.path(),
                &prefer,
            )
            .await
            .unwrap();
            assert!(registry.refused().is_empty(), "{:?}", registry.refused());
            for tool in FILE_TOOLS {
                assert_eq!(provider(&registry, tool), Some(winner), "{copy}: {tool}");
            }
            let loser = if winner == "files" {
                file.as_str()
            } else {
                "files.wasm"
            };
            assert_eq!(registry.shadowed().len(), 4);
            for shadowed in registry.shadowed() {
                let text = shadowed.to_string();
                assert!(
                    text.contains(loser)
                        && text.contains("is not offered")
                        && text.contains(&format!("= \"{winner}\"")),
                    "says which won and why: {text}"
                );
            }
        }
    }
}

#[test]
fn the_prefer_key_settles_a_shadowing_attempt_through_the_binary() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&[("aaa.wasm", component("plugins", "files"))]);
    let plugins_arg = plugins.path().to_str().unwrap();

    let out = capstan(
        dir.path(),
        &["plugins", "list", "--plugins-dir", plugins_arg],
    );
    let (listed, err) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{err}");
    assert!(
        !listed.contains("file_read"),
        "an unsettled name is offered by no one: {listed}"
    );
    assert!(
        err.contains("aaa.wasm") && err.contains("files.wasm") && err.contains("plugins.prefer"),
        "{err}"
    );

    std::fs::write(
        dir.path().join("capstan.toml"),
        "[plugins]\nprefer = { file_read = \"files\", file_list = \"files\", \
         file_write = \"files\", file_edit = \"files\" }\n",
    )
    .unwrap();
    let out = capstan(
        dir.path(),
        &["plugins", "list", "--plugins-dir", plugins_arg],
    );
    let (listed, err) = (stdout(&out), stderr(&out));
    assert!(out.status.success(), "{err}");
    let row = listed
        .lines()
        .find(|line| line.starts_with("file_read "))
        .unwrap_or_else(|| panic!("file_read is listed: {listed}"));
    assert!(
        row.contains("files.wasm") && !row.contains("aaa.wasm"),
        "{row}"
    );
    assert!(
        err.contains("aaa.wasm") && err.contains("is not offered"),
        "{err}"
    );
}

#[tokio::test]
async fn oversized_and_invalid_describe_output_is_refused_and_the_rest_load() {
    let fixtures = [
        "describe_many",
        "describe_huge_description",
        "describe_huge_schema",
        "describe_bad_schema",
        "describe_bad_name",
    ];
    let extra: Vec<(String, PathBuf)> = fixtures
        .iter()
        .map(|name| (format!("{name}.wasm"), component("fixtures", name)))
        .collect();
    let extra: Vec<(&str, PathBuf)> = extra.iter().map(|(n, p)| (n.as_str(), p.clone())).collect();
    let dir = plugins_with(&extra);
    let registry = Registry::load_dir(
        host(Limits::default()),
        capstan_host::plugin::CallLog::disabled(),
        dir.path(),
    )
    .await
    .unwrap();

    let many = refusal(&registry, "describe_many.wasm");
    assert!(
        many.contains("65 tools") && many.contains("limit of 64"),
        "{many}"
    );
    let wordy = refusal(&registry, "describe_huge_description.wasm");
    assert!(
        wordy.contains("tool `wordy`")
            && wordy.contains("description is 102400 bytes")
            && wordy.contains("limit of 4096"),
        "{wordy}"
    );
    let sprawling = refusal(&registry, "describe_huge_schema.wasm");
    assert!(
        sprawling.contains("tool `sprawling`")
            && sprawling.contains("args-schema is")
            && sprawling.contains("limit of 32768"),
        "{sprawling}"
    );
    let typo = refusal(&registry, "describe_bad_schema.wasm");
    assert!(
        typo.contains("tool `misspelled`")
            && typo.contains("not a valid JSON Schema")
            && typo.contains("properties.path.type"),
        "{typo}"
    );
    let name = refusal(&registry, "describe_bad_name.wasm");
    assert!(
        name.contains("invalid name") && name.contains(r"file_read\n\u{1b}[31mFORGED"),
        "{name}"
    );
    assert!(
        !name.contains('\n') && !name.contains('\u{1b}'),
        "escaped: {name:?}"
    );

    assert_eq!(
        registry.refused().len(),
        fixtures.len(),
        "{:?}",
        registry.refused()
    );
    for tool in FILE_TOOLS {
        assert_eq!(
            provider(&registry, tool),
            Some("files"),
            "{tool} still loads"
        );
    }
    assert!(provider(&registry, "file_read\n\u{1b}[31mFORGED").is_none());
}

#[tokio::test]
async fn a_memory_that_starts_over_the_limit_names_the_key_that_raises_it() {
    let big = component("fixtures", "big_memory");
    let err = host(Limits::default()).load(&big).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            err,
            LoadError::OverLimit { .. } | LoadError::Describe { .. }
        ),
        "{text}"
    );
    assert!(
        text.contains("big_memory.wasm")
            && text.contains("64 MiB limit")
            && text.contains("limits.tool_memory_mib"),
        "{text}"
    );

    let roomy = Limits {
        memory_bytes: 128 << 20,
        ..Limits::default()
    };
    let plugin = host(roomy)
        .load(&big)
        .await
        .expect("loads under a raised limit");
    assert_eq!(plugin.tools()[0].name, "peek");
}

#[test]
fn guest_text_cannot_forge_log_lines_or_terminal_output() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    std::fs::copy(
        component("fixtures", "probe"),
        plugins.path().join("probe.wasm"),
    )
    .unwrap();
    let out = crate::support::capstan_command(
        dir.path(),
        &[
            "tool",
            "call",
            "forge",
            "{}",
            "--plugins-dir",
            plugins.path().to_str().unwrap(),
        ],
    )
    .env("CAPSTAN_LOG", "info")
    .output()
    .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(6), "{err}");
    assert!(
        !err.contains('\u{1b}'),
        "no escape byte reaches the terminal: {err:?}"
    );
    assert!(!err.contains('\r'), "no carriage return: {err:?}");
    for line in err.lines() {
        assert!(
            !line.starts_with("2026-01-01T00:00:00Z"),
            "forged line: {err}"
        );
    }
    // The text is still there, visibly escaped: in the log lines and in the panic quote.
    let escaped = r"ok\n2026-01-01T00:00:00Z ERROR forged\r\u{1b}[31mred";
    assert!(err.matches(escaped).count() >= 3, "{err}");
    assert!(err.contains("panicked"), "{err}");
}

#[tokio::test]
async fn unknown_tool_names_are_echoed_on_one_line_and_cut() {
    let registry = Registry::load_dir(
        host(Limits::default()),
        capstan_host::plugin::CallLog::disabled(),
        &plugins_dir(),
    )
    .await
    .unwrap();
    let name = format!("evil\n\u{1b}[2J{}", "x".repeat(10_000));
    let grants = capstan_host::policy::Grants::none();
    let err = registry
        .call(capstan_host::plugin::CallRequest {
            tool: &name,
            args_json: "{}",
            grants: &grants,
            workspace: Some(Path::new(".")),
            caller: &crate::support::ids::by("test"),
            instances: None,
        })
        .await
        .unwrap_err();
    let msg = err.message();
    assert_eq!(err.kind(), "not-found");
    assert!(
        msg.contains(r"evil\n\u{1b}[2J") && msg.contains("(10009 bytes)"),
        "{msg}"
    );
    assert!(!msg.contains('\n') && !msg.contains('\u{1b}'), "{msg:?}");
    assert!(msg.len() < 1000, "cut: {} bytes", msg.len());
}

/// Text a guest or a model wrote reaches the terminal with its escape sequences shown,
/// not obeyed: a task title from a plugin in `capstan tasks`, a reply in `capstan run`.
#[test]
fn guest_and_model_text_cannot_forge_the_cli_output() {
    let dir = crate::support::agent_dir(
        "[[step]]\nprocess = \"channel\"\nreply = \"hi\\u001b]0;PWNED\\u0007\\u001b[2J\"\n",
        "",
    );
    let services = std::sync::Arc::new(crate::support::agent_store(dir.path())).services();
    let forged = "real\n#99    done     high      forged row\u{1b}[31m";
    let worker = crate::support::ids::by("worker:1");
    let created = services
        .tasks
        .create(&worker, capstan_host::store::NewTask::titled(forged));
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(created)
        .unwrap();
    drop(services);

    let out = capstan(dir.path(), &["tasks"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(!text.contains('\u{1b}'), "{text:?}");
    assert!(!text.lines().any(|l| l.starts_with("#99")), "{text}");

    let out = capstan(dir.path(), &["run", "hello"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text:?}"
    );
    assert!(text.starts_with("agent> hi"), "{text}");
}
