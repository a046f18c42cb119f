//! Pinned and signed tools: `capstan.lock` written, an update refused with what it
//! changes until accepted, signatures verified (and their verification cached), through
//! the real `capstan` binary and the plugin host. The tamper suite: a flipped byte, a
//! swapped component with the same name, a signature by an untrusted key, a lock naming
//! a missing file. MCP servers that change are tried in `tests/interop/test_pinning.py`; here, a
//! thousand reconnects of one that does not.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use capstan_host::config::Config;
use capstan_host::mcp::{Servers, ToolServer, add_servers};
use capstan_host::plugin::trust::{Lock, Pins, Signer, Signers, Trust};
use capstan_host::plugin::{ArtifactCache, CallLog, Limits, LoadError, PluginHost, Registry};
use capstan_host::policy::ProcessKind;

use crate::support::{Recording, agent_runtime, capstan, component, plugins_dir, stderr, stdout};

/// A directory with `capstan.toml` (its plugins in `plugins/`, a copy of the first-party
/// ones, plus `toml`) and the first-party plugins.
fn deployment(toml: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    for name in ["files", "tasks", "memory", "web"] {
        std::fs::copy(
            plugins_dir().join(format!("{name}.wasm")),
            plugins.join(format!("{name}.wasm")),
        )
        .unwrap();
    }
    std::fs::write(
        dir.path().join("capstan.toml"),
        // Only this directory: what the lock pins is exactly what it holds.
        format!("[agent]\nplugins_dir = \"plugins\"\nfirst_party_plugins = false\n{toml}"),
    )
    .unwrap();
    dir
}

/// `bytes` with a custom section appended: another component that does the same.
fn rebuilt(bytes: &[u8], note: &[u8]) -> Vec<u8> {
    let name = b"capstan-test";
    let mut body = vec![name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(note);
    assert!(body.len() < 128, "one LEB128 byte of length");
    let mut out = bytes.to_vec();
    out.push(0);
    out.push(body.len() as u8);
    out.extend_from_slice(&body);
    out
}

fn ok(out: &std::process::Output) -> String {
    assert!(out.status.success(), "{}{}", stdout(out), stderr(out));
    stdout(out)
}

/// Tools `capstan plugins list` offers in `dir`.
fn listed(dir: &Path) -> (String, String) {
    let out = capstan(dir, &["plugins", "list"]);
    (ok(&out), stderr(&out))
}

#[test]
fn a_swapped_component_is_not_offered_until_accepted_and_the_refusal_says_what_widened() {
    let dir = deployment("");
    let out = ok(&capstan(dir.path(), &["plugins", "lock"]));
    assert!(out.contains("4 plugins"), "{out}");
    let lock = Lock::read(&dir.path().join("capstan.lock"))
        .unwrap()
        .unwrap();
    assert_eq!(lock.plugins.len(), 4);
    assert!(lock.plugins["web"].tools.contains_key("web_fetch"));

    // Unchanged: every tool offered, no warning.
    let (tools, warnings) = listed(dir.path());
    assert!(
        tools.contains("web_fetch") && tools.contains("file_read"),
        "{tools}"
    );
    assert!(!warnings.contains("not offered"), "{warnings}");

    // A component with the same name and other tools.
    let web = dir.path().join("plugins/web.wasm");
    std::fs::copy(component("fixtures", "probe"), &web).unwrap();
    let (tools, warnings) = listed(dir.path());
    assert!(
        !tools.contains("web_fetch") && !tools.contains("net_post"),
        "{tools}"
    );
    assert!(
        tools.contains("file_read"),
        "the other plugins still load: {tools}"
    );
    assert!(
        warnings.contains("plugin `web` is not offered: it changed since")
            && warnings.contains("capstan.lock was written: component changed")
            && warnings.contains("tools added (")
            && warnings.contains("), wider")
            && warnings.contains("tools removed (`http_request`, `web_fetch`)")
            && warnings.contains("`capstan plugins accept web` accepts it"),
        "{warnings}"
    );
    // `policy` sees the same: the catalog never offers it.
    let policy = capstan(dir.path(), &["policy"]);
    assert!(!stdout(&policy).contains("net_post"), "{}", stdout(&policy));

    let accepted = ok(&capstan(dir.path(), &["plugins", "accept", "web"]));
    assert!(
        accepted.contains("net_post") && accepted.contains("WIDER"),
        "{accepted}"
    );
    assert!(
        accepted.contains("web_fetch") && accepted.contains("narrower"),
        "{accepted}"
    );
    let (tools, warnings) = listed(dir.path());
    assert!(tools.contains("net_post"), "{tools}");
    assert!(!warnings.contains("not offered"), "{warnings}");
}

#[test]
fn a_rebuild_waits_for_acceptance_unless_the_config_accepts_what_only_narrows() {
    let dir = deployment("");
    ok(&capstan(dir.path(), &["plugins", "lock"]));
    let files = dir.path().join("plugins/files.wasm");
    let bytes = std::fs::read(&files).unwrap();
    std::fs::write(&files, rebuilt(&bytes, b"v2")).unwrap();
    let (tools, warnings) = listed(dir.path());
    assert!(!tools.contains("file_read"), "{tools}");
    assert!(
        warnings.contains("plugin `files` is not offered: it changed since")
            && warnings.contains("component changed ("),
        "{warnings}"
    );
    // The operator's word: what adds nothing may come in unasked.
    let narrowing = ["--set", "plugins.accept_narrowing=true"];
    let out = capstan(dir.path(), &[&["plugins", "list"][..], &narrowing].concat());
    assert!(ok(&out).contains("file_read"), "{}", stderr(&out));
    // A widening never does: another component under the name of one locked.
    std::fs::copy(
        component("fixtures", "probe"),
        dir.path().join("plugins/web.wasm"),
    )
    .unwrap();
    let out = capstan(dir.path(), &[&["plugins", "list"][..], &narrowing].concat());
    assert!(!ok(&out).contains("net_post"), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("plugin `web` is not offered"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_lock_naming_a_missing_file_says_so_and_accept_drops_it() {
    let dir = deployment("");
    ok(&capstan(dir.path(), &["plugins", "lock"]));
    std::fs::remove_file(dir.path().join("plugins/memory.wasm")).unwrap();
    let (tools, warnings) = listed(dir.path());
    assert!(
        !tools.contains("memory_save") && tools.contains("file_read"),
        "{tools}"
    );
    assert!(
        warnings.contains("plugin `memory` is pinned in")
            && warnings.contains("but its file is missing")
            && warnings.contains("`capstan plugins accept memory` drops it"),
        "{warnings}"
    );
    let out = ok(&capstan(dir.path(), &["plugins", "accept", "memory"]));
    assert!(out.contains("dropped from"), "{out}");
    let (_, warnings) = listed(dir.path());
    assert!(!warnings.contains("memory"), "{warnings}");
    let lock = Lock::read(&dir.path().join("capstan.lock"))
        .unwrap()
        .unwrap();
    assert!(!lock.plugins.contains_key("memory"));

    // A new plugin the lock does not name is not offered either.
    std::fs::copy(
        plugins_dir().join("memory.wasm"),
        dir.path().join("plugins/memory.wasm"),
    )
    .unwrap();
    let (tools, warnings) = listed(dir.path());
    assert!(!tools.contains("memory_save"), "{tools}");
    assert!(
        warnings.contains("plugin `memory` is not offered: it is not in"),
        "{warnings}"
    );
    let out = capstan(dir.path(), &["plugins", "accept", "nothing"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no plugin or MCP server is named `nothing`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_config_that_requires_a_lock_offers_nothing_without_one() {
    let dir = deployment("[plugins]\nrequire_lock = true\n");
    let (tools, warnings) = listed(dir.path());
    assert!(!tools.contains("file_read"), "{tools}");
    assert!(
        warnings.contains("plugin `files` is not offered: there is no ")
            && warnings
                .contains("capstan.lock, and the config requires one (plugins.require_lock)")
            && warnings.contains("`capstan plugins lock` writes it"),
        "{warnings}"
    );
    ok(&capstan(dir.path(), &["plugins", "lock"]));
    let (tools, warnings) = listed(dir.path());
    assert!(tools.contains("file_read"), "{tools}");
    assert!(!warnings.contains("not offered"), "{warnings}");
}

#[test]
fn a_damaged_lock_stops_the_start_naming_its_line() {
    let dir = deployment("");
    std::fs::write(
        dir.path().join("capstan.lock"),
        "version = 1\n\n[plugins.files]\ndigest = \"blake3:00\"\ncontract = \"0.2.1\"\n",
    )
    .unwrap();
    let out = capstan(dir.path(), &["plugins", "list"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("capstan.lock: not valid TOML at line 4") && err.contains("plugins lock"),
        "{err}"
    );
    // `plugins lock` writes it anew.
    ok(&capstan(dir.path(), &["plugins", "lock"]));
    let (tools, _) = listed(dir.path());
    assert!(tools.contains("file_read"), "{tools}");
}

#[test]
fn diff_shows_a_readable_table_and_exits_1_when_an_update_widens() {
    let dir = deployment("");
    let web = plugins_dir().join("web.wasm");
    let probe = component("fixtures", "probe");
    let args = |old: &Path, new: &Path| {
        vec![
            "plugins".to_owned(),
            "diff".to_owned(),
            old.display().to_string(),
            new.display().to_string(),
        ]
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        capstan(dir.path(), &args)
    };
    let wider = run(args(&web, &probe));
    assert_eq!(wider.status.code(), Some(1), "{}", stderr(&wider));
    let table = stdout(&wider);
    let header = table.lines().find(|l| l.starts_with("TOOL")).expect(&table);
    assert!(
        header.contains("CHANGE") && header.contains("DETAIL") && header.contains("DIRECTION"),
        "{table}"
    );
    let row = |tool: &str| {
        table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(tool))
            .unwrap_or_else(|| panic!("no row for {tool}: {table}"))
            .to_owned()
    };
    assert!(row("net_post").contains("tool added") && row("net_post").ends_with("WIDER"));
    assert!(row("web_fetch").contains("tool removed") && row("web_fetch").ends_with("narrower"));
    let narrower = run(args(&probe, &web));
    assert_eq!(narrower.status.code(), Some(1), "tools are added both ways");
    let same = run(args(&web, &web));
    assert_eq!(same.status.code(), Some(0));
    assert!(stdout(&same).contains("(no changes)"), "{}", stdout(&same));
    // A rebuild with the same tools: what `accept_narrowing` lets in.
    let rebuild = dir.path().join("web-rebuilt.wasm");
    std::fs::write(&rebuild, rebuilt(&std::fs::read(&web).unwrap(), b"v2")).unwrap();
    let same_tools = run(args(&web, &rebuild));
    assert_eq!(same_tools.status.code(), Some(0), "{}", stdout(&same_tools));
    assert!(
        stdout(&same_tools).contains("rebuilt"),
        "{}",
        stdout(&same_tools)
    );
    // A file that is no component: 2, not the 1 of an update that needs accepting.
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"not wasm").unwrap();
    let broken = run(args(&web, &junk));
    assert_eq!(broken.status.code(), Some(2), "{}", stderr(&broken));
    assert!(
        stderr(&broken).contains("not a WebAssembly file"),
        "{}",
        stderr(&broken)
    );
}

/// A host that requires signatures by `keys`, caching in `cache`.
fn signed_host(keys: Vec<Signer>, cache: &Path, pins: Option<Pins>) -> PluginHost {
    PluginHost::new(Limits::default(), ArtifactCache::new(cache))
        .unwrap()
        .with_trust(Trust {
            signers: Signers::required(keys),
            pins,
        })
}

async fn load_dir(host: PluginHost, dir: &Path) -> Registry {
    Registry::load_dir(Arc::new(host), CallLog::disabled(), dir)
        .await
        .unwrap()
}

fn refusal(registry: &Registry, plugin: &str) -> String {
    registry
        .refused()
        .iter()
        .find(|err| err.path().file_stem().is_some_and(|s| s == plugin))
        .map(LoadError::to_string)
        .unwrap_or_else(|| panic!("{plugin} is not refused: {:?}", registry.refused()))
}

/// `capstan plugins keygen` into `dir`: the key file and its public half.
fn keygen(dir: &Path, name: &str) -> (PathBuf, String) {
    let key = dir.join(name);
    let out = ok(&capstan(dir, &["plugins", "keygen", key.to_str().unwrap()]));
    let public = out
        .lines()
        .find(|l| l.len() == 64 && l.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no public key printed: {out}"))
        .to_owned();
    (key, public)
}

fn sign(dir: &Path, file: &Path, key: &Path) {
    ok(&capstan(
        dir,
        &[
            "plugins",
            "sign",
            file.to_str().unwrap(),
            "--key",
            key.to_str().unwrap(),
        ],
    ));
}

#[tokio::test]
async fn only_components_signed_by_a_key_trusted_for_them_load_and_each_refusal_names_file_and_key()
{
    let dir = deployment("");
    let plugins = dir.path().join("plugins");
    let cache = tempfile::tempdir().unwrap();
    let (release, release_public) = keygen(dir.path(), "release.key");
    let (vendor, vendor_public) = keygen(dir.path(), "vendor.key");
    for name in ["files", "tasks", "memory"] {
        sign(dir.path(), &plugins.join(format!("{name}.wasm")), &release);
    }
    // `web` is signed by a key trusted only for another plugin.
    sign(dir.path(), &plugins.join("web.wasm"), &vendor);
    let keys = vec![
        Signer::new(
            "release",
            &release_public,
            ["files", "tasks", "memory", "web"],
        )
        .unwrap(),
        Signer::new("vendor", &vendor_public, ["weather"]).unwrap(),
    ];
    let registry = load_dir(signed_host(keys.clone(), cache.path(), None), &plugins).await;
    let names: Vec<&str> = registry.plugins().iter().map(|p| p.name()).collect();
    assert_eq!(names, ["files", "memory", "tasks"]);
    assert_eq!(registry.plugins()[0].signer(), Some("release"));
    let web = refusal(&registry, "web");
    assert!(
        web.contains("web.wasm.sig is by key")
            && web.contains(&vendor_public)
            && web.contains("no [plugins.signers.NAME] entry trusts for plugin `web`")
            && web.contains("[plugins.signers.vendor], which may sign only"),
        "{web}"
    );

    // Unsigned: refused, naming where the signature was looked for and how to make one.
    std::fs::remove_file(plugins.join("web.wasm.sig")).unwrap();
    let registry = load_dir(signed_host(keys.clone(), cache.path(), None), &plugins).await;
    let web = refusal(&registry, "web");
    assert!(
        web.contains("it is not signed (no ") && web.contains("capstan plugins sign"),
        "{web}"
    );

    // A flipped byte after signing (in a custom section: still a valid component).
    let files = plugins.join("files.wasm");
    let signed = rebuilt(&std::fs::read(&files).unwrap(), b"AAAA");
    std::fs::write(&files, &signed).unwrap();
    sign(dir.path(), &files, &release);
    assert!(
        load_dir(signed_host(keys.clone(), cache.path(), None), &plugins)
            .await
            .tool("file_read")
            .is_some()
    );
    let mut flipped = signed.clone();
    *flipped.last_mut().unwrap() ^= 1;
    std::fs::write(&files, &flipped).unwrap();
    let registry = load_dir(signed_host(keys.clone(), cache.path(), None), &plugins).await;
    let err = refusal(&registry, "files");
    assert!(
        err.contains("signs another component")
            && err.contains("the file changed after it was signed"),
        "{err}"
    );
    assert!(registry.tool("file_read").is_none());

    // `plugins verify` says the same from the command line.
    let verify = |file: &Path| {
        capstan(
            dir.path(),
            &[
                "plugins",
                "verify",
                file.to_str().unwrap(),
                "--trust",
                &release_public,
            ],
        )
    };
    let out = verify(&files);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("signs another component"),
        "{}",
        stderr(&out)
    );
    let out = verify(&plugins.join("tasks.wasm"));
    assert!(ok(&out).contains("signed by `--trust`"), "{}", stdout(&out));
}

#[tokio::test]
async fn a_verified_signature_is_cached_sealed_and_a_changed_signature_file_is_checked_again() {
    let dir = deployment("");
    let plugins = dir.path().join("plugins");
    let cache = tempfile::tempdir().unwrap();
    let (release, public) = keygen(dir.path(), "release.key");
    let files = plugins.join("files.wasm");
    sign(dir.path(), &files, &release);
    for name in ["tasks", "memory", "web"] {
        std::fs::remove_file(plugins.join(format!("{name}.wasm"))).unwrap();
    }
    let keys = vec![Signer::new("release", &public, ["*"]).unwrap()];
    let registry = load_dir(signed_host(keys.clone(), cache.path(), None), &plugins).await;
    assert!(
        registry.tool("file_read").is_some(),
        "{:?}",
        registry.refused()
    );
    let kept: Vec<_> = std::fs::read_dir(cache.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".signature.json"))
        .collect();
    assert_eq!(kept.len(), 1, "one verification kept beside the artifact");

    // A signature file replaced by one that does not verify: the cache vouches only for
    // the file it saw, so this one is checked, and refused.
    let sig = plugins.join("files.wasm.sig");
    let mut forged: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&sig).unwrap()).unwrap();
    forged["signature"] = "00".repeat(64).into();
    std::fs::write(&sig, serde_json::to_vec(&forged).unwrap()).unwrap();
    let registry = load_dir(signed_host(keys.clone(), cache.path(), None), &plugins).await;
    let err = refusal(&registry, "files");
    assert!(
        err.contains("does not verify for key") && err.contains(&public),
        "{err}"
    );

    // The key no longer trusted: refused though the cache saw it verify.
    sign(dir.path(), &files, &release);
    let (_, other) = keygen(dir.path(), "other.key");
    let others = vec![Signer::new("other", &other, ["*"]).unwrap()];
    let registry = load_dir(signed_host(others, cache.path(), None), &plugins).await;
    assert!(refusal(&registry, "files").contains("which no [plugins.signers.NAME] entry trusts"));
}

#[tokio::test]
async fn a_signed_and_locked_plugin_loads_and_a_locked_but_unsigned_one_does_not() {
    let dir = deployment("");
    let plugins = dir.path().join("plugins");
    let cache = tempfile::tempdir().unwrap();
    ok(&capstan(dir.path(), &["plugins", "lock"]));
    let lock_path = dir.path().join("capstan.lock");
    let lock = Lock::read(&lock_path).unwrap().unwrap();
    let (release, public) = keygen(dir.path(), "release.key");
    for name in ["files", "tasks", "memory"] {
        sign(dir.path(), &plugins.join(format!("{name}.wasm")), &release);
    }
    let keys = vec![Signer::new("release", &public, ["*"]).unwrap()];
    let pins = Pins::new(lock, &lock_path, false);
    let registry = load_dir(signed_host(keys, cache.path(), Some(pins)), &plugins).await;
    assert_eq!(registry.plugins().len(), 3, "{:?}", registry.refused());
    assert!(refusal(&registry, "web").contains("it is not signed"));
}

/// A registry on `host` with the tools of the MCP servers `config` names.
async fn with_servers(config: &Config, host: &Arc<PluginHost>) -> Registry {
    let mut registry = Registry::new(host.clone(), CallLog::disabled());
    add_servers(config, &mut registry, Servers::Named).await;
    registry
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_reconnects_of_an_unchanged_server_raise_no_false_alarm() {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::{
        StreamableHttpServerConfig, StreamableHttpService,
    };

    // The server: the worker's tools behind Capstan's own MCP door, over streamable
    // HTTP on loopback.
    let dir = tempfile::tempdir().unwrap();
    let (rt, _events) =
        agent_runtime(Config::defaults(dir.path()), Recording::new(""), false).await;
    let server = ToolServer::new(rt.router().clone(), ProcessKind::Worker);
    let service = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        StreamableHttpServerConfig::default(),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route_service("/mcp", service);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The client: a config naming it, locked on the first connection.
    let toml = format!(
        "[mcp.door]\nurl = \"http://127.0.0.1:{port}/mcp\"\n\n\
         [profiles.worker]\ntools = [\"door.*\"]\ncapabilities = []\n"
    );
    let path = dir.path().join("client.toml");
    let config = Config::parse(&toml, &path).unwrap();
    let host = |pins| {
        let host = PluginHost::new(Limits::default(), ArtifactCache::disabled()).unwrap();
        let signers = Signers::default();
        Arc::new(host.with_trust(Trust { signers, pins }))
    };
    let first = with_servers(&config, &host(None)).await;
    assert!(
        first.external_problems().is_empty(),
        "{:?}",
        first.external_problems()
    );
    let lock = first.lock();
    let tools = lock.mcp["door"].tools.len();
    assert!(
        tools >= 3,
        "the worker's tools: {:?}",
        lock.mcp["door"].tools.keys()
    );

    let pinned = host(Some(Pins::new(
        lock.clone(),
        dir.path().join("capstan.lock"),
        false,
    )));
    for reconnect in 0..1000 {
        let registry = with_servers(&config, &pinned).await;
        assert!(
            registry.external_problems().is_empty(),
            "reconnect {reconnect}: {:?}",
            registry.external_problems()
        );
        assert_eq!(
            registry.external_tools().count(),
            tools,
            "reconnect {reconnect}"
        );
    }

    // And the check is live: a lock whose pin of one tool differs holds that tool back.
    let mut changed = lock;
    let pin = changed
        .mcp
        .get_mut("door")
        .unwrap()
        .tools
        .values_mut()
        .next()
        .unwrap();
    pin.description = capstan_host::plugin::trust::TextDigest::of_text("another description");
    let held = host(Some(Pins::new(
        changed,
        dir.path().join("capstan.lock"),
        false,
    )));
    let registry = with_servers(&config, &held).await;
    assert_eq!(registry.external_tools().count(), tools - 1);
    assert_eq!(
        registry.external_problems().len(),
        1,
        "{:?}",
        registry.external_problems()
    );
    assert!(registry.external_problems()[0].contains("description changed"));
}
