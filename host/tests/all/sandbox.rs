//! File tools under each grant: what fs.read and fs.write allow, through the real plugins.

use crate::support::{Workspace, call, default_registry, expect_error};
use serde_json::json;

#[tokio::test]
async fn fs_read_grant_reads_a_file() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    ws.put("notes/todo.md", "- ship it\n- test it\n");
    let out = call(
        &registry,
        "file_read",
        json!({"path": "notes/todo.md"}),
        "fs.read",
        &ws.path(),
    )
    .await
    .unwrap();
    assert_eq!(out, "- ship it\n- test it\n");
}

#[tokio::test]
async fn file_write_under_fs_read_is_denied_and_leaves_the_file_byte_identical() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    ws.put("keep.txt", "original\u{0}bytes\n");
    let before = ws.read("keep.txt");
    let args = json!({"path": "keep.txt", "content": "overwritten"});
    let msg = expect_error(
        call(&registry, "file_write", args, "fs.read", &ws.path()).await,
        "denied",
    );
    assert!(
        msg.contains("file_write") && msg.contains("`fs.write`"),
        "{msg}"
    );
    assert!(msg.contains("granted: fs.read"), "{msg}");
    assert_eq!(ws.read("keep.txt"), before);
}

#[tokio::test]
async fn without_any_grant_file_tools_are_denied_naming_the_capability() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    ws.put("a.txt", "a");
    let msg = expect_error(
        call(
            &registry,
            "file_read",
            json!({"path": "a.txt"}),
            "",
            &ws.path(),
        )
        .await,
        "denied",
    );
    assert!(
        msg.contains("`fs.read`") && msg.contains("granted: (none)"),
        "{msg}"
    );
}

#[tokio::test]
async fn fs_read_and_fs_write_grants_write_and_edit() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    let grants = "fs.read,fs.write";
    let out = call(
        &registry,
        "file_write",
        json!({"path": "out/report.md", "content": "status: draft\n"}),
        grants,
        &ws.path(),
    )
    .await
    .unwrap();
    assert!(out.contains("wrote 14 bytes"), "{out}");
    assert_eq!(ws.read("out/report.md"), b"status: draft\n");

    let out = call(
        &registry,
        "file_edit",
        json!({"path": "out/report.md", "old": "draft", "new": "final"}),
        grants,
        &ws.path(),
    )
    .await
    .unwrap();
    assert!(out.contains("replaced 1 occurrence"), "{out}");
    assert_eq!(ws.read("out/report.md"), b"status: final\n");
}

#[tokio::test]
async fn file_edit_fails_clearly_when_the_string_is_absent_or_ambiguous() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    ws.put("a.txt", "one two one\n");
    let grants = "fs.read,fs.write";
    let msg = expect_error(
        call(
            &registry,
            "file_edit",
            json!({"path": "a.txt", "old": "three", "new": "x"}),
            grants,
            &ws.path(),
        )
        .await,
        "not-found",
    );
    assert!(msg.contains("does not occur in `a.txt`"), "{msg}");
    let msg = expect_error(
        call(
            &registry,
            "file_edit",
            json!({"path": "a.txt", "old": "one", "new": "x"}),
            grants,
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(msg.contains("occurs 2 times"), "{msg}");
    assert_eq!(
        ws.read("a.txt"),
        b"one two one\n",
        "a failed edit changes nothing"
    );

    call(
        &registry,
        "file_edit",
        json!({"path": "a.txt", "old": "one", "new": "1", "replace_all": true}),
        grants,
        &ws.path(),
    )
    .await
    .unwrap();
    assert_eq!(ws.read("a.txt"), b"1 two 1\n");
}

#[tokio::test]
async fn file_read_pages_big_files_with_a_truncation_marker() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    let text: String = (1..=5000).map(|n| format!("line {n}\n")).collect();
    ws.put("big.txt", &text);

    let first = call(
        &registry,
        "file_read",
        json!({"path": "big.txt"}),
        "fs.read",
        &ws.path(),
    )
    .await
    .unwrap();
    assert!(first.starts_with("line 1\n"));
    assert!(
        first.ends_with("[truncated by the line limit: showing lines 1-2000 of 5000; call file_read with offset=2001 to continue]"),
        "{}",
        &first[first.len() - 200..]
    );

    let page = call(
        &registry,
        "file_read",
        json!({"path": "big.txt", "offset": 4999, "limit": 10}),
        "fs.read",
        &ws.path(),
    )
    .await
    .unwrap();
    assert_eq!(page, "line 4999\nline 5000\n");

    // One huge line is cut by the byte cap, not passed on whole.
    ws.put("wide.txt", &format!("{}\nsecond\n", "w".repeat(200_000)));
    let wide = call(
        &registry,
        "file_read",
        json!({"path": "wide.txt"}),
        "fs.read",
        &ws.path(),
    )
    .await
    .unwrap();
    assert!(wide.len() < 70 * 1024, "{} bytes", wide.len());
    assert!(wide.contains("64 KiB output cap"), "{wide}");
    // It is paged: each page names the next, and the pages are the line, whole.
    let pages_of = |path: &'static str| {
        let registry = &registry;
        let ws = &ws;
        async move {
            let mut pages = Vec::new();
            loop {
                let next = pages.len() + 1;
                let page = call(
                    registry,
                    "file_read",
                    json!({"path": path, "offset": 1, "limit": 1, "line_page": next}),
                    "fs.read",
                    &ws.path(),
                )
                .await
                .unwrap();
                let marker = format!("call file_read with offset=1 and line_page={} ", next + 1);
                match page.rfind("\n[truncated by the 64 KiB output cap: line 1 of 2 is ") {
                    Some(at) => {
                        assert!(page.contains(&marker), "{}", &page[at..]);
                        pages.push(page[..at].to_owned());
                    }
                    None => {
                        let rest = "[truncated by the line limit: showing lines 1-1 of 2; \
                                    call file_read with offset=2 to continue]";
                        assert!(page.ends_with(rest), "{page}");
                        pages.push(page[..page.len() - rest.len()].to_owned());
                        return pages;
                    }
                }
                assert!(pages.len() < 100, "paging does not end");
            }
        }
    };
    let pages = pages_of("wide.txt").await;
    assert_eq!(pages.concat(), format!("{}\n", "w".repeat(200_000)));
    assert_eq!(pages.len(), 4);
    // A line of tokens is cut between them, never inside one.
    let tokens: String = (0..12_000).map(|n| format!("tok-{n:012} ")).collect();
    ws.put("tokens.txt", &format!("{tokens}\nsecond\n"));
    let pages = pages_of("tokens.txt").await;
    assert_eq!(pages.concat(), format!("{tokens}\n"));
    for page in &pages[..pages.len() - 1] {
        assert!(
            page.ends_with(' '),
            "a page ends inside a token: {}",
            &page[page.len() - 30..]
        );
    }
    // Bytes that are not UTF-8 show as three, and are counted so against the cap.
    let mut binary = vec![0xffu8; 40_000];
    binary.push(b'\n');
    binary.extend_from_slice(&[0xfe; 30_000]);
    binary.push(b'\n');
    std::fs::write(ws.path().join("binary.txt"), &binary).unwrap();
    for args in [
        json!({"path": "binary.txt"}),
        json!({"path": "binary.txt", "offset": 2}),
    ] {
        let shown = call(&registry, "file_read", args, "fs.read", &ws.path())
            .await
            .unwrap();
        assert!(shown.len() <= 64 * 1024 + 300, "{} bytes", shown.len());
        assert!(shown.contains("is not UTF-8 text: shown up to the 64 KiB output cap"));
    }
    // The next page starts after the line shown in part, not at it again.
    let shown = call(
        &registry,
        "file_read",
        json!({"path": "binary.txt"}),
        "fs.read",
        &ws.path(),
    )
    .await
    .unwrap();
    assert!(
        shown.ends_with("call file_read with offset=2 to continue]"),
        "{}",
        &shown[shown.len() - 200..]
    );
    let msg = expect_error(
        call(
            &registry,
            "file_read",
            json!({"path": "wide.txt", "line_page": 9}),
            "fs.read",
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(msg.contains("line 1 has 4 pages"), "{msg}");
    let msg = expect_error(
        call(
            &registry,
            "file_read",
            json!({"path": "big.txt", "line_page": 2}),
            "fs.read",
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(
        msg.contains("for a line longer than the 64 KiB output cap"),
        "{msg}"
    );

    let msg = expect_error(
        call(
            &registry,
            "file_read",
            json!({"path": "big.txt", "offset": 9000}),
            "fs.read",
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(msg.contains("has 5000 lines"), "{msg}");
}

#[tokio::test]
async fn file_list_shows_directories_then_files_with_sizes() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    ws.put("b.txt", "12345");
    ws.put("a/inner.txt", "x");
    let out = call(&registry, "file_list", json!({}), "fs.read", &ws.path())
        .await
        .unwrap();
    assert_eq!(out, "a/\nb.txt (5 bytes)");
    let msg = expect_error(
        call(
            &registry,
            "file_list",
            json!({"path": "missing"}),
            "fs.read",
            &ws.path(),
        )
        .await,
        "not-found",
    );
    assert!(msg.contains("`missing`"), "{msg}");
}

#[tokio::test]
async fn a_tool_without_fs_capabilities_sees_no_files() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    ws.put("visible-to-no-one.txt", "x");
    // raw_list declares nothing; even with every fs grant, its sandbox has no preopen.
    let result = call(
        &registry,
        "raw_list",
        json!({}),
        "fs.read,fs.write",
        &ws.path(),
    )
    .await;
    let err = result.expect_err("listing `.` without a preopen must fail");
    assert!(!err.message().contains("visible-to-no-one"), "{err}");
}

#[tokio::test]
async fn the_sandbox_refuses_a_write_through_a_read_only_grant() {
    // raw_write declares only fs.read and then writes with std::fs, no checks of its own:
    // the read-only preopen is what refuses it.
    let registry = default_registry().await;
    let ws = Workspace::new();
    ws.put("keep.txt", "original");
    for path in ["keep.txt", "new.txt", "sub/new.txt"] {
        let result = call(
            &registry,
            "raw_write",
            json!({"path": path, "content": "changed"}),
            "fs.read,fs.write",
            &ws.path(),
        )
        .await;
        assert!(result.is_err(), "{path}: {result:?}");
    }
    assert_eq!(ws.read("keep.txt"), b"original");
    assert!(!ws.path().join("new.txt").exists());
    assert!(!ws.path().join("sub").exists());
}
