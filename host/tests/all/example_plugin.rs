//! The example third-party plugin, built only against the SDK, loads and runs like any other.

use std::sync::Arc;

use crate::support::{Workspace, call, component, expect_error, test_cache};
use capstan_host::plugin::{Limits, PluginHost, Registry};
use serde_json::json;

#[tokio::test]
async fn the_word_count_example_counts_under_fs_read() {
    let host = Arc::new(PluginHost::new(Limits::default(), test_cache()).unwrap());
    let mut registry = Registry::new(host, capstan_host::plugin::CallLog::disabled());
    registry
        .add_file(&component("examples", "word_count"))
        .await
        .unwrap();
    let ws = Workspace::new();
    ws.put("poem.txt", "so much depends\nupon a red wheel barrow\n");
    let out = call(
        &registry,
        "word_count",
        json!({"path": "poem.txt"}),
        "fs.read",
        &ws.path(),
    )
    .await
    .unwrap();
    assert_eq!(out, r#"{"lines":2,"words":8,"bytes":40}"#);
    let msg = expect_error(
        call(
            &registry,
            "word_count",
            json!({"path": "poem.txt"}),
            "",
            &ws.path(),
        )
        .await,
        "denied",
    );
    assert!(msg.contains("`fs.read`"), "{msg}");
}
