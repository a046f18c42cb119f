//! What the attack tests share: the built binary and components, and commands to run it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("host/ sits in the repository")
        .to_owned()
}

/// A built component under `target/<group>/<name>.wasm`, checked to exist.
pub fn component(group: &str, name: &str) -> PathBuf {
    let path = repo_root()
        .join("target")
        .join(group)
        .join(format!("{name}.wasm"));
    assert!(
        path.is_file(),
        "{} is missing: build the plugins with `bash scripts/setup`",
        path.display()
    );
    path
}

/// The first-party plugins directory.
pub fn plugins_dir() -> PathBuf {
    component("plugins", "files")
        .parent()
        .expect("in a directory")
        .to_owned()
}

/// The artifact cache the tests share, so each component compiles once per run.
pub fn test_cache_dir() -> PathBuf {
    repo_root().join("target/test-component-cache")
}

/// `capstan ARGS` in `dir`, with the tests' artifact cache, the first-party plugins and no
/// backtraces.
pub fn capstan_command(dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_capstan"));
    command
        .args(args)
        .current_dir(dir)
        .env("CAPSTAN_CACHE_DIR", test_cache_dir())
        .env("CAPSTAN_PLUGINS_DIR", plugins_dir())
        .env_remove("RUST_BACKTRACE")
        .env_remove("CAPSTAN_LOG")
        .stdin(Stdio::null());
    command
}

/// Runs `capstan ARGS` in `dir` to its end.
pub fn capstan(dir: &Path, args: &[&str]) -> Output {
    capstan_command(dir, args)
        .output()
        .expect("running capstan")
}

/// Its standard output, lossily decoded.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Its standard error, lossily decoded.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}
