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
    // It is paged by bytes: each page names where the next starts, and the pages are the
    // line, whole, then the next line.
    let marker = "call file_read with offset=1 and byte_offset=";
    let (mut read, mut pages, mut byte_offset) = (String::new(), 0, 0u64);
    loop {
        let page = call(
            &registry,
            "file_read",
            json!({"path": "wide.txt", "offset": 1, "limit": 1, "byte_offset": byte_offset}),
            "fs.read",
            &ws.path(),
        )
        .await
        .unwrap();
        pages += 1;
        match page.rfind(marker) {
            Some(at) => {
                assert!(
                    page.contains("line 1 of 2 is 200001 bytes; showing its bytes"),
                    "{}",
                    &page[page.len() - 200..]
                );
                let next: u64 = page[at + marker.len()..]
                    .trim_end_matches(" to continue]")
                    .parse()
                    .unwrap();
                assert!(next > byte_offset, "{page}");
                read.push_str(page[..page.rfind("\n[truncated").unwrap()].as_ref());
                byte_offset = next;
            }
            None => {
                let rest = "[truncated by the line limit: showing lines 1-1 of 2; call \
                            file_read with offset=2 to continue]";
                assert!(page.ends_with(rest), "{page}");
                read.push_str(&page[..page.len() - rest.len()]);
                break;
            }
        }
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(read, format!("{}\n", "w".repeat(200_000)));
    assert_eq!(pages, 4);
    let msg = expect_error(
        call(
            &registry,
            "file_read",
            json!({"path": "wide.txt", "byte_offset": 300_000}),
            "fs.read",
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(
        msg.contains("past the end of line 1, which is 200001 bytes"),
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
