//! What pinning and signatures cost: a warm start of the start benchmark's plugins (10
//! with `scripts/bench-start`, else 7), each signed and all locked, against the same
//! plugins unsigned and unlocked; and verifying a 40 MB component's signature cold.
//!
//! `env -u RUST_BACKTRACE cargo bench -p capstan-host --bench pinned` (after
//! `bash scripts/setup`; `CAPSTAN_START_PLUGINS=target/start-plugins` for 10 plugins).
//!
//! - `load/unsigned_unlocked` and `load/signed_locked`: `Registry::load_dir` of the plugins
//!   directory in process, its artifact cache warm (artifacts, tool lists and, for the
//!   second, verified signatures): each plugin read, digested, mapped and, for the second,
//!   its signature file read and matched against the cached verification, and its tools
//!   compared with the lock.
//! - `process/...`: the release `capstan tool call echo` with each config, to its result.
//! - `verify_40mb/digest` and `verify_40mb/check`: BLAKE3 of a 40 MB component in memory,
//!   and the whole cold check (read the file, digest it, read and verify its signature).

// A benchmark reports to its runner, not through a door of the host.
#![allow(clippy::disallowed_macros, clippy::disallowed_methods)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use capstan_host::plugin::trust::{
    ComponentDigest, Pins, SignatureFile, Signer, Signers, Trust, signature_path,
};
use capstan_host::plugin::{ArtifactCache, CallLog, Limits, PluginHost, Registry};
use capstan_host::services::HostKey;
use criterion::Criterion;

#[path = "support/starting.rs"]
mod starting;

use starting::{percentiles, start_components};

/// The size of the big component, in bytes.
const BIG: usize = 40_000_000;

/// `bytes` with a custom section of `payload` bytes appended: the same component, bigger.
fn padded(bytes: &[u8], payload: usize) -> Vec<u8> {
    let name = b"capstan-bench";
    let size = 1 + name.len() + payload;
    let mut out = bytes.to_vec();
    out.push(0);
    let mut rest = size;
    loop {
        let byte = (rest & 0x7f) as u8;
        rest >>= 7;
        if rest == 0 {
            out.push(byte);
            break;
        }
        out.push(byte | 0x80);
    }
    out.push(name.len() as u8);
    out.extend_from_slice(name);
    out.resize(out.len() + payload, b'x');
    out
}

fn sign(key: &HostKey, file: &Path) {
    let digest = ComponentDigest::of(&std::fs::read(file).unwrap());
    std::fs::write(
        signature_path(file),
        SignatureFile::sign(key, digest).to_json(),
    )
    .unwrap();
}

/// Runs `capstan tool call echo` with the config in `dir`, to success.
fn tool_call(base: &Path, dir: &str) {
    let out = Command::new(env!("CARGO_BIN_EXE_capstan"))
        .args(["tool", "call", "echo", r#"{"text":"hi"}"#, "--config"])
        .arg(base.join(dir).join("capstan.toml"))
        .current_dir(base.join(dir))
        .env_clear()
        .env("HOME", base)
        .env("CAPSTAN_CACHE_DIR", base.join("cache"))
        .env("CAPSTAN_STATE_DIR", base.join("state"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("hi"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path();
    let plugins = base.join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let files = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/plugins/files.wasm");
    let components = start_components(&files);
    for component in &components {
        std::fs::copy(component, plugins.join(component.file_name().unwrap())).unwrap();
    }
    let (_, key) = HostKey::generate().unwrap();
    let public = key.public_hex();
    for component in &components {
        sign(&key, &plugins.join(component.file_name().unwrap()));
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    let cache = base.join("cache");
    let plain = Arc::new(PluginHost::new(Limits::default(), ArtifactCache::new(&cache)).unwrap());
    let load = |host: &Arc<PluginHost>| {
        let registry = rt
            .block_on(Registry::load_dir(
                host.clone(),
                CallLog::disabled(),
                &plugins,
            ))
            .unwrap();
        assert_eq!(
            registry.plugins().len(),
            components.len(),
            "{:?}",
            registry.refused()
        );
        registry
    };
    let lock = load(&plain).lock();

    // The two deployments the process rows start: the same plugins, one config requiring
    // signatures with the lock beside it.
    for (name, toml) in [
        ("plain", String::new()),
        (
            "signed",
            format!(
                "[plugins]\nrequire_signatures = true\n\n[plugins.signers.bench]\n\
                 public = \"{public}\"\nplugins = [\"*\"]\n"
            ),
        ),
    ] {
        let dir = base.join(name);
        std::fs::create_dir(&dir).unwrap();
        let toml = format!(
            "[agent]\nplugins_dir = {:?}\n{toml}",
            plugins.display().to_string()
        );
        std::fs::write(dir.join("capstan.toml"), toml).unwrap();
    }
    let lock_file = base.join("signed/capstan.lock");
    lock.write(&lock_file).unwrap();
    let trust = Trust {
        signers: Signers::required(vec![Signer::new("bench", &public, ["*"]).unwrap()]),
        pins: Some(Pins::new(lock, &lock_file, false)),
    };
    let pinned = Arc::new(
        PluginHost::new(Limits::default(), ArtifactCache::new(&cache))
            .unwrap()
            .with_trust(trust),
    );
    // Warm: every artifact, tool list and verified signature is in the cache.
    load(&pinned);
    tool_call(base, "plain");
    tool_call(base, "signed");
    println!("{} plugins", components.len());

    // The big one: the probe, padded to 40 MB, signed.
    let big_dir = base.join("big");
    std::fs::create_dir(&big_dir).unwrap();
    let probe = std::fs::read(
        components
            .iter()
            .find(|c| c.ends_with("probe.wasm"))
            .unwrap(),
    )
    .unwrap();
    let big: PathBuf = big_dir.join("big.wasm");
    let bytes = padded(&probe, BIG - probe.len() - 32);
    std::fs::write(&big, &bytes).unwrap();
    sign(&key, &big);
    let signers = Signers::required(vec![Signer::new("bench", &public, ["*"]).unwrap()]);
    let check = || {
        let bytes = std::fs::read(&big).unwrap();
        let digest = ComponentDigest::of(&bytes);
        signers.check_file(&big, "big", digest, |_| false).unwrap();
    };
    check();

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("load");
    group.bench_function("unsigned_unlocked", |b| b.iter(|| load(&plain)));
    group.bench_function("signed_locked", |b| b.iter(|| load(&pinned)));
    group.finish();
    let mut group = c.benchmark_group("verify_40mb");
    group.sample_size(20);
    group.bench_function("digest", |b| b.iter(|| ComponentDigest::of(&bytes)));
    group.bench_function("check", |b| b.iter(check));
    group.finish();
    c.final_summary();

    let title = format!("warm load in process, {} plugins", components.len());
    percentiles(
        &title,
        &[
            ("signed and locked", &|| drop(load(&pinned))),
            ("unsigned, unlocked", &|| drop(load(&plain))),
        ],
    );
    let title = format!("whole process, {} plugins", components.len());
    percentiles(
        &title,
        &[
            ("signed and locked", &|| tool_call(base, "signed")),
            ("unsigned, unlocked", &|| tool_call(base, "plain")),
        ],
    );
}
