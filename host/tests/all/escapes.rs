//! Paths that try to leave the workspace. Each fails and touches nothing outside, through
//! the file tools (which check paths for a clear message) and through the probe's raw tools
//! (which do not, so only the sandbox stands in the way).

use std::os::unix::fs::symlink;

use crate::support::{SECRET, Workspace, call, default_registry};
use serde_json::json;

/// Paths to try, given the sandbox root's absolute path.
fn escapes(root: &str) -> Vec<String> {
    vec![
        "../outside/secret.txt".into(),
        "a/../../outside/secret.txt".into(),
        "./../outside/secret.txt".into(),
        format!("{root}/outside/secret.txt"),
        "/etc/passwd".into(),
        "link-dir/secret.txt".into(),
        "link-file".into(),
        "link-dir/../workspace/x".into(),
        format!("{}x", "a/".repeat(3000)),
        "x".repeat(5000),
        "a\u{0}b".into(),
        "secret.txt\u{0}../outside/secret.txt".into(),
    ]
}

fn workspace_with_links() -> Workspace {
    let ws = Workspace::new();
    symlink(ws.outside(), ws.path().join("link-dir")).unwrap();
    symlink(ws.outside().join("secret.txt"), ws.path().join("link-file")).unwrap();
    ws.put("a/keep.txt", "inside");
    ws
}

#[tokio::test]
async fn reads_that_leave_the_workspace_fail() {
    let registry = default_registry().await;
    let ws = workspace_with_links();
    let root = ws.outside().parent().unwrap().display().to_string();
    for tool in ["file_read", "raw_read"] {
        for path in escapes(&root) {
            let result = call(
                &registry,
                tool,
                json!({ "path": path }),
                "fs.read",
                &ws.path(),
            )
            .await;
            match result {
                Err(err) => assert!(
                    !err.message().contains(SECRET.trim()),
                    "{tool} {path:?}: {err}"
                ),
                Ok(text) => panic!(
                    "{tool} read {:?} outside the workspace: {text:?}",
                    &path[..path.len().min(60)]
                ),
            }
        }
    }
    ws.assert_outside_untouched();
}

#[tokio::test]
async fn writes_that_leave_the_workspace_fail_and_touch_nothing() {
    let registry = default_registry().await;
    let ws = workspace_with_links();
    let root = ws.outside().parent().unwrap().display().to_string();
    let targets: Vec<String> = escapes(&root)
        .into_iter()
        .chain([
            "link-dir/new.txt".into(),
            "../new.txt".into(),
            "../outside/new.txt".into(),
        ])
        .collect();
    for tool in ["file_write", "raw_put"] {
        for path in &targets {
            let args = json!({ "path": path, "content": "pwned" });
            let result = call(&registry, tool, args, "fs.read,fs.write", &ws.path()).await;
            assert!(
                result.is_err(),
                "{tool} wrote {:?}: {result:?}",
                &path[..path.len().min(60)]
            );
        }
    }
    let args = json!({"path": "link-file", "old": "secret", "new": "pwned"});
    assert!(
        call(&registry, "file_edit", args, "fs.read,fs.write", &ws.path())
            .await
            .is_err()
    );
    ws.assert_outside_untouched();
    assert_eq!(ws.read("a/keep.txt"), b"inside");
}

#[tokio::test]
async fn file_tools_explain_why_a_path_is_refused() {
    let registry = default_registry().await;
    let ws = workspace_with_links();
    let cases = [
        ("../outside/secret.txt", "leaves the workspace"),
        ("/etc/passwd", "is absolute"),
        ("a\u{0}b", "NUL byte"),
    ];
    for (path, why) in cases {
        let err = call(
            &registry,
            "file_read",
            json!({ "path": path }),
            "fs.read",
            &ws.path(),
        )
        .await
        .unwrap_err();
        assert!(err.message().contains(why), "{path:?}: {err}");
    }
}

#[tokio::test]
async fn links_that_stay_inside_the_workspace_still_work() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    ws.put("real/data.txt", "inside data");
    symlink("real", ws.path().join("alias")).unwrap();
    let out = call(
        &registry,
        "file_read",
        json!({"path": "alias/data.txt"}),
        "fs.read",
        &ws.path(),
    )
    .await
    .unwrap();
    assert_eq!(out, "inside data");
}
