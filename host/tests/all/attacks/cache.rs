//! The precompiled-artifact cache runs only code this host compiled: a damaged, truncated,
//! swapped, planted or symlinked artifact is discarded unread and replaced, reported once;
//! a cache directory someone else owns or may write is refused with the fix. A file checked
//! once and recorded by its identity is trusted only while it keeps that identity: a write
//! in place, a rename over it or a record of another file sends it back to the full check.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use capstan_host::plugin::{ArtifactCache, CacheError, Limits, PluginHost};

use crate::support::{capstan, capstan_command, component, stderr, stdout};

/// A fresh cache directory, owner-only like the one the host creates.
fn cache_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

/// `capstan plugins inspect` of a first-party plugin on `cache`.
fn inspect(cache: &Path, plugin: &str) -> std::process::Output {
    inspect_file(cache, &component("plugins", plugin))
}

/// `capstan plugins inspect` of the component `file` on `cache`, with the cache's debug
/// lines on standard error.
fn inspect_file(cache: &Path, file: &Path) -> std::process::Output {
    let out = capstan_command(
        cache,
        &[
            "plugins",
            "inspect",
            file.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
    )
    .env("CAPSTAN_LOG", "warn,capstan_host::plugin=debug")
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    out
}

/// What the debug line of a load that skipped the artifact's hash says.
const NOT_HASHED: &str = "loaded without hashing it again";
/// What the debug line of a load that skipped reading the plugin file says.
const NOT_READ: &str = "its digest and outline taken from the cache";

/// Waits until `path` last changed over two seconds ago: what the host asks of a file before
/// it records the file's identity.
fn wait_until_settled(path: &Path) {
    use std::os::unix::fs::MetadataExt;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};
    loop {
        let metadata = std::fs::metadata(path).unwrap();
        let changed =
            UNIX_EPOCH + Duration::new(metadata.ctime() as u64, metadata.ctime_nsec() as u32);
        let age = SystemTime::now()
            .duration_since(changed)
            .unwrap_or_default();
        if age > Duration::from_millis(2100) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The files of `kind` (`checked.json`, `source.json`) in `cache`.
fn records(cache: &Path, kind: &str) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.to_str().unwrap().ends_with(kind))
        .collect();
    files.sort();
    files
}

/// Compiles `plugin` into `cache`, waits for its artifact to settle and loads it until the
/// load skips the hash: its artifact's path and its record's.
fn checked_artifact(cache: &Path, plugin: &str) -> (PathBuf, PathBuf) {
    let artifact = compiled_artifact(cache, plugin);
    wait_until_settled(&artifact);
    let before = records(cache, ".checked.json");
    let out = inspect(cache, plugin);
    assert_eq!(outcome(&out), "hit");
    assert!(!stderr(&out).contains(NOT_HASHED), "first checked in full");
    let after = records(cache, ".checked.json");
    let new: Vec<_> = after.iter().filter(|p| !before.contains(p)).collect();
    assert_eq!(new.len(), 1, "{after:?}");
    let out = inspect(cache, plugin);
    assert_eq!(outcome(&out), "hit");
    assert!(stderr(&out).contains(NOT_HASHED), "{}", stderr(&out));
    (artifact, new[0].clone())
}

/// How `inspect` says the component was obtained: `hit`, `compiled`, `discarded`.
fn outcome(out: &std::process::Output) -> String {
    let text = stdout(out);
    text.lines()
        .find_map(|line| line.strip_prefix("compile: "))
        .unwrap_or_else(|| panic!("no compile line: {text}"))
        .trim()
        .to_owned()
}

/// The artifact files in `cache`.
fn artifacts(cache: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(cache)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "cwasm"))
        .collect();
    files.sort();
    files
}

/// Compiles `plugin` into `cache` and returns its artifact's path.
fn compiled_artifact(cache: &Path, plugin: &str) -> PathBuf {
    let before = artifacts(cache);
    assert_eq!(outcome(&inspect(cache, plugin)), "compiled");
    let after = artifacts(cache);
    let new: Vec<_> = after.iter().filter(|p| !before.contains(p)).collect();
    assert_eq!(new.len(), 1, "{after:?}");
    new[0].clone()
}

/// A file_read through the binary on `cache`, with every first-party plugin loaded.
fn call_file_read(cache: &Path) -> std::process::Output {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    capstan(
        ws.path(),
        &[
            "tool",
            "call",
            "file_read",
            r#"{"path":"a.txt"}"#,
            "--grant",
            "fs.read",
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
    )
}

/// After `artifact` was tampered with: the next load discards it unread, with one warning
/// naming it and no ANSI codes; the load after that is a clean hit; and a call works.
fn assert_discarded_once_then_clean(cache: &Path, plugin: &str, artifact: &Path) {
    let out = inspect(cache, plugin);
    assert_eq!(outcome(&out), "discarded", "{}", stderr(&out));
    let err = stderr(&out);
    let name = artifact.display().to_string();
    assert_eq!(
        err.matches(&name).count(),
        1,
        "one warning naming it: {err}"
    );
    assert!(err.contains("not loaded"), "{err}");
    assert!(!err.contains('\x1b'), "no ANSI codes into a pipe: {err:?}");
    assert!(
        std::fs::symlink_metadata(artifact).unwrap().is_file(),
        "replaced by a regular file"
    );

    let out = inspect(cache, plugin);
    assert_eq!(outcome(&out), "hit");
    assert!(!stderr(&out).contains(&name), "{}", stderr(&out));

    let out = call_file_read(cache);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "alpha\n");
    assert!(!stderr(&out).contains("discarded"), "{}", stderr(&out));
}

#[test]
fn a_bit_flipped_artifact_is_discarded_and_replaced() {
    let cache = cache_dir();
    let artifact = compiled_artifact(cache.path(), "files");
    let mut bytes = std::fs::read(&artifact).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&artifact, bytes).unwrap();
    assert_discarded_once_then_clean(cache.path(), "files", &artifact);
}

#[test]
fn a_truncated_artifact_is_discarded_and_replaced() {
    let cache = cache_dir();
    let artifact = compiled_artifact(cache.path(), "files");
    let bytes = std::fs::read(&artifact).unwrap();
    std::fs::write(&artifact, &bytes[..bytes.len() - 1]).unwrap();
    assert_discarded_once_then_clean(cache.path(), "files", &artifact);
    let artifact_again = std::fs::read(&artifact).unwrap();
    std::fs::write(&artifact, &artifact_again[..100]).unwrap();
    assert_discarded_once_then_clean(cache.path(), "files", &artifact);
}

#[test]
fn a_swapped_artifact_of_another_plugin_is_discarded_and_replaced() {
    let cache = cache_dir();
    let files = compiled_artifact(cache.path(), "files");
    let tasks = compiled_artifact(cache.path(), "tasks");
    // A genuine, sealed artifact of this host, but of another component.
    std::fs::copy(&tasks, &files).unwrap();
    assert_discarded_once_then_clean(cache.path(), "files", &files);
    assert_eq!(outcome(&inspect(cache.path(), "tasks")), "hit");
}

#[test]
fn a_planted_artifact_without_this_hosts_seal_is_discarded() {
    let cache = cache_dir();
    let files = compiled_artifact(cache.path(), "files");
    // What anyone with wasmtime can produce: a valid artifact for this very engine (the
    // binary's default limits), of another component, unsealed or with a forged seal.
    let host = PluginHost::new(Limits::default(), ArtifactCache::disabled()).unwrap();
    let tasks = std::fs::read(component("plugins", "tasks")).unwrap();
    let planted = wasmtime::component::Component::new(host.engine(), &tasks)
        .unwrap()
        .serialize()
        .unwrap();
    std::fs::write(&files, &planted).unwrap();
    assert_discarded_once_then_clean(cache.path(), "files", &files);

    let mut forged = planted;
    forged.extend_from_slice(&[0x5a; 32]);
    std::fs::write(&files, &forged).unwrap();
    assert_discarded_once_then_clean(cache.path(), "files", &files);
}

#[test]
fn a_symlink_at_an_artifacts_name_is_never_followed_out() {
    let cache = cache_dir();
    let artifact = compiled_artifact(cache.path(), "files");
    let outside = tempfile::tempdir().unwrap();
    // A genuine sealed artifact outside the cache, and a plain file: neither is loaded
    // through the link, and neither is written.
    let genuine = outside.path().join("genuine.cwasm");
    std::fs::copy(&artifact, &genuine).unwrap();
    let genuine_bytes = std::fs::read(&genuine).unwrap();
    let victim = outside.path().join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    for target in [&genuine, &victim] {
        std::fs::remove_file(&artifact).unwrap();
        std::os::unix::fs::symlink(target, &artifact).unwrap();
        assert_discarded_once_then_clean(cache.path(), "files", &artifact);
    }
    assert_eq!(std::fs::read(&genuine).unwrap(), genuine_bytes);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 2);
}

#[test]
fn symlinks_at_temporary_names_lead_nowhere() {
    let cache = cache_dir();
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    // The names the host used to write through (`.tmp-<pid>-ThreadId<n>`) and others like
    // them: temporary names are random now and created exclusively.
    let planted: Vec<PathBuf> = (0..64)
        .map(|n| cache.path().join(format!(".tmp-{n}-ThreadId{}", n % 8)))
        .chain([cache.path().join(".tmp-key"), cache.path().join(".tmp-")])
        .collect();
    for link in &planted {
        std::os::unix::fs::symlink(&victim, link).unwrap();
    }
    compiled_artifact(cache.path(), "files");
    let out = call_file_read(cache.path());
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    for link in &planted {
        assert!(std::fs::symlink_metadata(link).unwrap().is_symlink());
    }
    for artifact in artifacts(cache.path()) {
        assert!(std::fs::symlink_metadata(&artifact).unwrap().is_file());
    }
}

/// Each of `cache`'s refusals through the binary names the path, what is wrong and the
/// fix; `--no-cache` then works, and so does the directory once it is fixed.
fn assert_refused_then_fixed(cache: &Path, expected: &[&str], fix: impl FnOnce()) {
    let out = call_file_read(cache);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains(&cache.display().to_string()), "{err}");
    for part in expected.iter().chain(&["--cache-dir", "--no-cache"]) {
        assert!(err.contains(part), "{part}: {err}");
    }
    assert!(artifacts(cache).is_empty(), "nothing written or loaded");
    assert!(matches!(
        ArtifactCache::open(cache),
        Err(CacheError::Shared { .. } | CacheError::NotOwned { .. })
    ));

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
            "--cache-dir",
            cache.to_str().unwrap(),
            "--no-cache",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out), "alpha\n");

    fix();
    let out = call_file_read(cache);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!artifacts(cache).is_empty());
}

#[test]
fn a_group_or_world_writable_cache_dir_is_refused() {
    for mode in [0o777, 0o770, 0o702] {
        let cache = cache_dir();
        std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        let path = cache.path().to_owned();
        assert_refused_then_fixed(
            cache.path(),
            &[
                &format!("mode {mode:03o}"),
                &format!("chmod 700 {}", path.display()),
            ],
            || std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o700)).unwrap(),
        );
    }
}

#[test]
fn a_cache_dir_owned_by_someone_else_is_refused() {
    let cache = cache_dir();
    // The tests run as root, so the directory can be given away (uid 65534: nobody).
    std::os::unix::fs::chown(cache.path(), Some(65534), None)
        .expect("chown needs root; these tests run as root");
    let path = cache.path().to_owned();
    let user = current_uid();
    assert_refused_then_fixed(
        cache.path(),
        &["owned by uid 65534", &format!("chown {user}")],
        || std::os::unix::fs::chown(&path, Some(user), None).unwrap(),
    );
}

/// The uid of this process, from the owner of a file it creates.
fn current_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    let file = tempfile::NamedTempFile::new().unwrap();
    file.as_file().metadata().unwrap().uid()
}

#[test]
fn a_new_cache_dir_is_created_owner_only_with_an_owner_only_key() {
    let parent = tempfile::tempdir().unwrap();
    let cache = parent.path().join("new/cache");
    assert_eq!(compiled_artifact_at(parent.path(), &cache), 1);
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cache), 0o700);
    for entry in std::fs::read_dir(&cache).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
}

fn compiled_artifact_at(cwd: &Path, cache: &Path) -> usize {
    let file = component("plugins", "files");
    let out = capstan(
        cwd,
        &[
            "plugins",
            "inspect",
            file.to_str().unwrap(),
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(outcome(&out), "compiled");
    artifacts(cache).len()
}

/// Writes `bytes` at `offset` of `path` through its own inode, then sets its modification
/// time back, so its size and times but the change time are as they were.
fn write_in_place(path: &Path, offset: usize, bytes: &[u8]) {
    let modified = std::fs::metadata(path).unwrap().modified().unwrap();
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, bytes, offset as u64).unwrap();
    file.set_modified(modified).unwrap();
}

#[test]
fn a_checked_artifact_written_in_place_is_checked_in_full_and_discarded() {
    let cache = cache_dir();
    let (artifact, _) = checked_artifact(cache.path(), "files");
    // One byte flipped through the same inode, its size and modification time kept: only
    // the change time tells.
    let before = std::fs::metadata(&artifact).unwrap();
    let middle = before.len() as usize / 2;
    let byte = std::fs::read(&artifact).unwrap()[middle];
    write_in_place(&artifact, middle, &[byte ^ 0x01]);
    let after = std::fs::metadata(&artifact).unwrap();
    assert_eq!(after.len(), before.len());
    assert_eq!(after.modified().unwrap(), before.modified().unwrap());
    assert_discarded_once_then_clean(cache.path(), "files", &artifact);
}

#[test]
fn a_sealed_artifact_renamed_over_a_checked_one_is_checked_in_full_and_discarded() {
    let cache = cache_dir();
    let (files, _) = checked_artifact(cache.path(), "files");
    let (tasks, _) = checked_artifact(cache.path(), "tasks");
    // A genuine artifact of this host, whose own record is good, moved over another's:
    // another inode, so the record of `files` does not vouch for it.
    std::fs::rename(&tasks, &files).unwrap();
    assert_discarded_once_then_clean(cache.path(), "files", &files);
}

#[test]
fn a_record_of_another_artifact_vouches_for_nothing() {
    let cache = cache_dir();
    let (_, files_record) = checked_artifact(cache.path(), "files");
    let (_, tasks_record) = checked_artifact(cache.path(), "tasks");
    std::fs::copy(&tasks_record, &files_record).unwrap();
    // The record fails its seal and is discarded; the artifact is checked in full again.
    let out = inspect(cache.path(), "files");
    assert_eq!(outcome(&out), "hit");
    let err = stderr(&out);
    assert!(!err.contains(NOT_HASHED), "{err}");
    assert_eq!(
        err.matches(&files_record.display().to_string()).count(),
        1,
        "one warning naming the record: {err}"
    );
    assert!(err.contains("not loaded"), "{err}");
}

/// A copy of the first-party `files` plugin in a directory of its own, settled, loaded
/// until its digest and outline are taken from the cache: the directory and the file.
fn recorded_plugin(cache: &Path) -> (tempfile::TempDir, PathBuf) {
    let plugins = tempfile::tempdir().unwrap();
    let file = plugins.path().join("mine.wasm");
    std::fs::copy(component("plugins", "files"), &file).unwrap();
    wait_until_settled(&file);
    let out = inspect_file(cache, &file);
    assert_eq!(outcome(&out), "compiled");
    assert!(!stderr(&out).contains(NOT_READ));
    assert_eq!(records(cache, ".source.json").len(), 1);
    let out = inspect_file(cache, &file);
    assert_eq!(outcome(&out), "hit");
    assert!(stderr(&out).contains(NOT_READ), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("Reads a text file"),
        "{}",
        stdout(&out)
    );
    (plugins, file)
}

#[test]
fn a_plugin_file_written_in_place_is_read_again() {
    let cache = cache_dir();
    let (_plugins, file) = recorded_plugin(cache.path());
    let inode =
        |path: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap());
    let before = inode(&file);

    // The same size, one word of a description changed, the modification time kept:
    // read, and loaded, as what it now is.
    let bytes = std::fs::read(&file).unwrap();
    let at = bytes
        .windows(17)
        .position(|w| w == b"Reads a text file")
        .unwrap();
    write_in_place(&file, at, b"Reads a TEXT file");
    let out = inspect_file(cache.path(), &file);
    assert_eq!(outcome(&out), "compiled", "{}", stderr(&out));
    assert!(!stderr(&out).contains(NOT_READ), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("Reads a TEXT file"),
        "{}",
        stdout(&out)
    );

    // Another component written through the same inode: read as what it is.
    std::fs::write(&file, std::fs::read(component("plugins", "tasks")).unwrap()).unwrap();
    assert_eq!(inode(&file), before);
    let out = inspect_file(cache.path(), &file);
    assert_eq!(outcome(&out), "compiled");
    assert!(!stderr(&out).contains(NOT_READ), "{}", stderr(&out));
    assert!(!stdout(&out).contains("file_read"), "{}", stdout(&out));
    assert!(stdout(&out).contains("  task_"), "{}", stdout(&out));
}

#[test]
fn a_recorded_plugin_whose_artifact_is_gone_is_read_and_compiled_again() {
    let cache = cache_dir();
    let (_plugins, file) = recorded_plugin(cache.path());
    for artifact in artifacts(cache.path()) {
        std::fs::remove_file(artifact).unwrap();
    }
    let out = inspect_file(cache.path(), &file);
    assert_eq!(outcome(&out), "compiled", "{}", stderr(&out));
    assert!(stderr(&out).contains(NOT_READ), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("Reads a text file"),
        "{}",
        stdout(&out)
    );
    assert_eq!(outcome(&inspect_file(cache.path(), &file)), "hit");
}
