//! Components the host must refuse, each with the file and the reason, while the other
//! plugins in the same directory still load.

use std::path::Path;
use std::sync::Arc;

use crate::support::{capstan, component, plugins_dir, stderr, test_cache};
use capstan_host::plugin::{
    ArtifactCache, CacheOutcome, Limits, LoadError, PluginHost, Registry, contract::WIT_VERSION,
};

fn host() -> Arc<PluginHost> {
    Arc::new(PluginHost::new(Limits::default(), test_cache()).unwrap())
}

/// A plugins directory with the first-party plugins and `extra` files (name, bytes).
fn plugins_with(extra: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(plugins_dir()).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    for (name, bytes) in extra {
        std::fs::write(dir.path().join(name), bytes).unwrap();
    }
    dir
}

fn refusal<'a>(registry: &'a Registry, file: &str) -> &'a LoadError {
    registry
        .refused()
        .iter()
        .find(|err| err.path().file_name().unwrap() == file)
        .unwrap_or_else(|| panic!("{file} was not refused: {:?}", registry.refused()))
}

#[tokio::test]
async fn bad_components_are_refused_by_name_and_the_rest_still_load() {
    let files = std::fs::read(component("plugins", "files")).unwrap();
    let truncated = files[..files.len() / 2].to_vec();
    // The smallest valid core module: magic and version, no sections.
    let core_module = b"\0asm\x01\0\0\0".to_vec();
    let dir = plugins_with(&[
        ("core-module.wasm", core_module),
        ("truncated.wasm", truncated),
        ("script.wasm", b"#!/bin/sh\necho hi\n".to_vec()),
        (
            "unknown-import.wasm",
            std::fs::read(component("fixtures", "unknown_import")).unwrap(),
        ),
        (
            "wit-v1.wasm",
            std::fs::read(component("fixtures", "wit_v1")).unwrap(),
        ),
    ]);
    let registry = Registry::load_dir(
        host(),
        capstan_host::plugin::CallLog::disabled(),
        dir.path(),
    )
    .await
    .unwrap();

    let core = refusal(&registry, "core-module.wasm").to_string();
    assert!(
        core.contains("core-module.wasm") && core.contains("not a component"),
        "{core}"
    );
    assert!(core.contains("wasm32-wasip2"), "says how to fix it: {core}");

    let cut = refusal(&registry, "truncated.wasm").to_string();
    assert!(
        cut.contains("truncated.wasm") && cut.contains("not a valid component"),
        "{cut}"
    );

    let junk = refusal(&registry, "script.wasm").to_string();
    assert!(junk.contains("not a WebAssembly file"), "{junk}");

    let import = refusal(&registry, "unknown-import.wasm").to_string();
    assert!(import.contains("unknown-import.wasm"), "{import}");
    assert!(import.contains("`capstan:evil/model@0.1.0`"), "{import}");
    assert!(import.contains("does not provide"), "{import}");

    let version = refusal(&registry, "wit-v1.wasm").to_string();
    assert!(version.contains("wit-v1.wasm"), "{version}");
    assert!(
        version.contains("capstan:plugin@1.0.0"),
        "names theirs: {version}"
    );
    assert!(
        version.contains("capstan:plugin@0.2.1"),
        "names ours: {version}"
    );

    assert_eq!(registry.refused().len(), 5, "{:?}", registry.refused());
    for tool in ["file_read", "file_list", "file_write", "file_edit"] {
        assert!(registry.tool(tool).is_some(), "{tool} still loads");
    }
}

#[tokio::test]
async fn a_plugin_built_for_an_older_contract_is_refused_naming_both_versions() {
    // Its imports of our interfaces carry its version: that is what is refused, as the
    // contract it was built for, not as a stray dependency.
    let wasm = wat::parse_str(
        r#"(component
            (import "capstan:plugin/log@0.1.0" (instance))
            (import "wasi:io/streams@0.2.6" (instance))
        )"#,
    )
    .unwrap();
    let dir = plugins_with(&[]);
    let path = dir.path().join("old.wasm");
    std::fs::write(&path, wasm).unwrap();
    let err = host().load(&path).await.unwrap_err().to_string();
    assert!(
        err.contains("old.wasm")
            && err.contains("capstan:plugin@0.1.0")
            && err.contains(&format!("capstan:plugin@{WIT_VERSION}"))
            && err.contains("rebuild it"),
        "{err}"
    );
}

/// `bytes` with every name of our contract's interfaces moved to version `to`: a component
/// as a toolchain building against that version of the WIT would have made it.
fn with_contract_version(bytes: &[u8], to: &str) -> Vec<u8> {
    assert_eq!(
        to.len(),
        WIT_VERSION.len(),
        "a name of another length would shift the binary"
    );
    let mut out = bytes.to_vec();
    let mut moved = 0;
    for interface in ["types", "log", "tasks", "memory", "secrets", "tool"] {
        let from = format!("capstan:plugin/{interface}@{WIT_VERSION}");
        let into = format!("capstan:plugin/{interface}@{to}");
        let mut at = 0;
        while let Some(found) = out[at..]
            .windows(from.len())
            .position(|window| window == from.as_bytes())
        {
            let start = at + found;
            out[start..start + from.len()].copy_from_slice(into.as_bytes());
            at = start + from.len();
            moved += 1;
        }
    }
    assert!(moved > 0, "the component names no interface of ours");
    out
}

#[test]
fn a_plugin_built_for_another_contract_is_refused_with_both_versions_and_the_fix() {
    let original = std::fs::read(component("examples", "word_count")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (version, words) in [
        ("0.1.0", "but this host speaks"),
        ("0.3.0", "a newer contract"),
    ] {
        let path = dir.path().join(format!("built-for-{version}.wasm"));
        std::fs::write(&path, with_contract_version(&original, version)).unwrap();
        let out = capstan(dir.path(), &["plugins", "inspect", path.to_str().unwrap()]);
        let said = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{said}");
        let fix = "`capstan plugins build DIR --update-wit`";
        assert!(
            said.contains(&format!(
                "built-for-{version}.wasm: built for capstan:plugin@{version}"
            )) && said.contains(words)
                && said.contains(&format!("capstan:plugin@{WIT_VERSION}"))
                && said.contains(fix),
            "{said}"
        );
    }
    // The same bytes at our version load: only the version was refused.
    let path = dir.path().join("ours.wasm");
    std::fs::write(&path, with_contract_version(&original, WIT_VERSION)).unwrap();
    let out = capstan(dir.path(), &["plugins", "inspect", path.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[tokio::test]
async fn a_component_importing_what_the_host_never_gives_is_refused_uncompiled_naming_each_import()
{
    // Three imports no plugin is given, among two it may have: every offender is named,
    // and nothing was compiled (a compiled component would be in the cache).
    let wasm = wat::parse_str(
        r#"(component
            (import "wasi:filesystem/types@0.2.6" (instance))
            (import "capstan:evil/model@0.1.0" (instance))
            (import "wasi:cli/run@0.2.6" (instance))
            (import "wasi:io/streams@0.2.6" (instance))
            (import "my:own/thing" (instance))
        )"#,
    )
    .unwrap();
    let cache_dir = tempfile::tempdir().unwrap();
    let host = PluginHost::new(
        Limits::default(),
        capstan_host::plugin::ArtifactCache::new(cache_dir.path()),
    )
    .unwrap();
    let dir = plugins_with(&[]);
    let path = dir.path().join("grabby.wasm");
    std::fs::write(&path, wasm).unwrap();
    let err = host.load(&path).await.unwrap_err().to_string();
    assert!(err.contains("grabby.wasm"), "{err}");
    assert!(
        err.contains("imports `capstan:evil/model@0.1.0`, `wasi:cli/run@0.2.6` and `my:own/thing`, which this host does not provide"),
        "{err}"
    );
    let refused = err.split("(allowed:").next().unwrap();
    assert!(
        !refused.contains("wasi:io/streams") && !refused.contains("wasi:filesystem"),
        "an allowed import is not named: {err}"
    );
    let cached: Vec<_> = walk(cache_dir.path());
    assert!(
        cached
            .iter()
            .all(|p| p.extension().is_none_or(|e| e != "cwasm")),
        "the refused component was compiled: {cached:?}"
    );
}

#[tokio::test]
async fn a_component_using_the_async_component_abi_is_refused_naming_it_and_the_fix() {
    // Tools are synchronous exports: the engine leaves the component model's async ABI
    // off (a call into a kept instance is cheaper without its task machinery), so a
    // component built for it is refused at load with what to do, not at its first call.
    let wasm = wat::parse_str(format!(
        r#"(component
            (core func $new (canon waitable-set.new))
            (core module $m (import "" "new" (func (result i32))))
            (core instance (instantiate $m (with "" (instance (export "new" (func $new))))))
            (instance $tool)
            (export "capstan:plugin/tool@{}" (instance $tool))
        )"#,
        WIT_VERSION
    ))
    .unwrap();
    let dir = plugins_with(&[]);
    let path = dir.path().join("eager.wasm");
    std::fs::write(&path, wasm).unwrap();
    let err = host().load(&path).await.unwrap_err().to_string();
    assert!(err.contains("eager.wasm"), "{err}");
    assert!(
        err.contains("async") && err.contains("synchronous"),
        "says what is refused and what to build instead: {err}"
    );
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

#[tokio::test]
async fn a_second_plugin_with_a_taken_tool_name_is_refused() {
    let files = std::fs::read(component("plugins", "files")).unwrap();
    // Name order no longer decides: neither plugin shadows the other, both are refused
    // naming each other, until `plugins.prefer` settles it.
    let dir = plugins_with(&[("files2.wasm", files)]);
    let registry = Registry::load_dir(
        host(),
        capstan_host::plugin::CallLog::disabled(),
        dir.path(),
    )
    .await
    .unwrap();
    let err = refusal(&registry, "files2.wasm").to_string();
    assert!(
        err.contains("also declared by") && err.contains("files.wasm"),
        "{err}"
    );
    let err = refusal(&registry, "files.wasm").to_string();
    assert!(err.contains("files2.wasm"), "{err}");
    assert!(registry.tool("file_read").is_none());
}

#[tokio::test]
async fn a_missing_plugins_directory_is_an_error_naming_it() {
    let err = Registry::load_dir(
        host(),
        capstan_host::plugin::CallLog::disabled(),
        Path::new("/nonexistent/capstan-plugins"),
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("/nonexistent/capstan-plugins"), "{err}");
}

#[tokio::test]
async fn loaded_plugins_report_version_imports_and_tools() {
    let registry = Registry::load_dir(
        host(),
        capstan_host::plugin::CallLog::disabled(),
        &plugins_dir(),
    )
    .await
    .unwrap();
    let (plugin, tool) = registry.tool("file_write").unwrap();
    assert_eq!(plugin.wit_version(), "0.2.1");
    assert_eq!(plugin.name(), "files");
    assert_eq!(tool.capabilities, vec![capstan_caps::Capability::FsWrite]);
    assert_eq!(
        tool.args_schema["required"],
        serde_json::json!(["path", "content"])
    );
    assert!(
        plugin
            .imports()
            .iter()
            .any(|i| i.starts_with("wasi:filesystem/"))
    );
    assert!(
        !plugin
            .imports()
            .iter()
            .any(|i| i.starts_with("wasi:sockets/"))
    );
}

#[tokio::test]
async fn a_limit_a_cached_component_does_not_fit_refuses_it_and_keeps_the_artifact() {
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = || capstan_host::plugin::ArtifactCache::new(cache_dir.path());
    let file = component("plugins", "files");
    let host = PluginHost::new(Limits::default(), cache()).unwrap();
    assert_eq!(
        host.load(&file).await.unwrap().cache_outcome(),
        CacheOutcome::Compiled
    );
    let artifacts = || walk(cache_dir.path()).len();
    let stored = artifacts();

    // Its memory starts above one MiB: a host limited to that refuses it, naming the limit,
    // and leaves the sound artifact where it is.
    let small = Limits {
        memory_bytes: 1 << 20,
        ..Limits::default()
    };
    let err = PluginHost::new(small, cache())
        .unwrap()
        .load(&file)
        .await
        .unwrap_err();
    assert!(matches!(err, LoadError::OverLimit { .. }), "{err}");
    assert!(err.to_string().contains("limits.tool_memory_mib"), "{err}");
    assert_eq!(artifacts(), stored, "the artifact is kept");

    let again = PluginHost::new(Limits::default(), cache()).unwrap();
    assert_eq!(
        again.load(&file).await.unwrap().cache_outcome(),
        CacheOutcome::Hit,
        "and used when the limit is raised"
    );
}

#[tokio::test]
async fn the_artifact_cache_skips_compilation_and_survives_corruption() {
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = || capstan_host::plugin::ArtifactCache::new(cache_dir.path());
    let file = component("plugins", "files");

    let cold = PluginHost::new(Limits::default(), cache()).unwrap();
    assert_eq!(
        cold.load(&file).await.unwrap().cache_outcome(),
        CacheOutcome::Compiled
    );

    let warm = PluginHost::new(Limits::default(), cache()).unwrap();
    assert_eq!(
        warm.load(&file).await.unwrap().cache_outcome(),
        CacheOutcome::Hit
    );

    // Another component is another key.
    let example = component("examples", "word_count");
    let outcome = warm.load(&example).await.unwrap().cache_outcome();
    assert_eq!(
        outcome,
        CacheOutcome::Compiled,
        "a different component is a different key"
    );

    for entry in std::fs::read_dir(cache_dir.path()).unwrap() {
        std::fs::write(entry.unwrap().path(), b"garbage").unwrap();
    }
    let again = PluginHost::new(Limits::default(), cache()).unwrap();
    let plugin = again.load(&file).await.unwrap();
    assert_eq!(
        plugin.cache_outcome(),
        CacheOutcome::Discarded,
        "a corrupt artifact is discarded unread and rebuilt"
    );
    assert_eq!(plugin.tools().len(), 4);
}

#[tokio::test]
async fn a_warm_load_takes_the_sealed_tool_list_and_never_trusts_a_planted_one() {
    let cache_dir = tempfile::tempdir().unwrap();
    let host = || PluginHost::new(Limits::default(), ArtifactCache::new(cache_dir.path())).unwrap();
    let tool_lists = || -> Vec<std::path::PathBuf> {
        let mut lists: Vec<_> = std::fs::read_dir(cache_dir.path())
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.to_string_lossy().ends_with(".tools.json"))
            .collect();
        lists.sort();
        lists
    };
    let (probe, files) = (
        component("fixtures", "probe"),
        component("plugins", "files"),
    );

    let described = host().load(&probe).await.unwrap();
    assert!(!described.tools_cached());
    assert_eq!(tool_lists().len(), 1);
    let warm = host().load(&probe).await.unwrap();
    assert!(warm.tools_cached(), "a warm load runs no describe()");
    assert_eq!(
        warm.tools(),
        described.tools(),
        "the kept list, checked alike"
    );
    // Described under another memory limit: the plugin may not fit this one, so the list
    // stands for nothing until describe() runs here.
    let smaller = || {
        let limits = Limits {
            memory_bytes: 32 << 20,
            ..Limits::default()
        };
        PluginHost::new(limits, ArtifactCache::new(cache_dir.path())).unwrap()
    };
    assert!(!smaller().load(&probe).await.unwrap().tools_cached());
    assert!(smaller().load(&probe).await.unwrap().tools_cached());
    assert!(!host().load(&probe).await.unwrap().tools_cached());
    assert!(host().load(&probe).await.unwrap().tools_cached());

    // Another component's genuine list under this one's name fails its seal: it is
    // discarded and describe() runs again.
    let probe_list = tool_lists().remove(0);
    host().load(&files).await.unwrap();
    let files_list = tool_lists().into_iter().find(|p| *p != probe_list).unwrap();
    std::fs::copy(&files_list, &probe_list).unwrap();
    let swapped = host().load(&probe).await.unwrap();
    assert!(!swapped.tools_cached(), "a swapped list is not used");
    assert_eq!(swapped.tools(), described.tools());

    // So does an edited one, and one that is not a file.
    let mut bytes = std::fs::read(&probe_list).unwrap();
    let at = bytes.iter().position(|b| *b == b'e').unwrap();
    bytes[at] = b'E';
    std::fs::write(&probe_list, bytes).unwrap();
    assert!(
        !host().load(&probe).await.unwrap().tools_cached(),
        "an edited list"
    );
    std::fs::remove_file(&probe_list).unwrap();
    std::fs::create_dir(&probe_list).unwrap();
    assert!(
        !host().load(&probe).await.unwrap().tools_cached(),
        "a directory"
    );
    std::fs::remove_dir(&probe_list).unwrap();
    assert!(!host().load(&probe).await.unwrap().tools_cached());
    assert!(
        host().load(&probe).await.unwrap().tools_cached(),
        "written again"
    );
}

#[tokio::test]
async fn a_tool_list_that_fails_the_checks_is_never_cached() {
    let cache_dir = tempfile::tempdir().unwrap();
    let host = PluginHost::new(Limits::default(), ArtifactCache::new(cache_dir.path())).unwrap();
    for _ in 0..2 {
        let bad = component("fixtures", "describe_bad_name");
        assert!(host.load(&bad).await.is_err());
    }
    let lists = std::fs::read_dir(cache_dir.path())
        .unwrap()
        .filter(|entry| {
            let name = entry.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".tools.json")
        })
        .count();
    assert_eq!(lists, 0);
}

/// The registry records each call in the log it was given, its arguments redacted by that
/// log's redactor, whatever the host it runs on holds: here a host with no services (its
/// own sink keeps nothing) and no secrets.
#[tokio::test]
async fn calls_are_recorded_in_the_registrys_own_log_redacted_by_its_redactor() {
    use capstan_host::plugin::CallLog;
    use capstan_host::secrets::Redactor;
    use capstan_host::services::{AuditDestination, Services};

    let canary = "canary-7f3a9c1e5b";
    let services = Services::in_memory();
    let redactor = Redactor::new([("CANARY".parse().unwrap(), canary.into())]);
    let host = host();
    assert!(matches!(
        host.audit().destination(),
        AuditDestination::Disabled(_)
    ));
    let log = CallLog::new(services.audit.clone(), redactor);
    let registry = Registry::load_dir(host, log, &plugins_dir()).await.unwrap();
    let ws = crate::support::Workspace::new();
    let path = format!("{canary}.txt");
    let _ = crate::support::call(
        &registry,
        "file_read",
        serde_json::json!({ "path": path }),
        "fs.read",
        &ws.path(),
    )
    .await;
    let rows = services.audit.recent(10).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].tool, "file_read");
    assert!(!rows[0].arguments.contains(canary), "{}", rows[0].arguments);
    assert!(
        rows[0].arguments.contains("[redacted secret CANARY]"),
        "{}",
        rows[0].arguments
    );
}
