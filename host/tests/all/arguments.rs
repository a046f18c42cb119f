//! Arguments that are not JSON, not an object, or do not match the schema: `invalid-args`
//! naming the field, and no file touched.

use crate::support::{Workspace, call, default_registry, expect_error};
use capstan_host::plugin::CallRequest;
use capstan_host::policy::Grants;
use serde_json::json;

async fn raw_call(args_json: &str) -> Result<String, capstan_host::plugin::ToolError> {
    let registry = default_registry().await;
    let ws = Workspace::new();
    let grants: Grants = "fs.read".parse().unwrap();
    registry
        .call(CallRequest {
            tool: "file_read",
            args_json,
            grants: &grants,
            workspace: Some(&ws.path()),
            caller: &crate::support::ids::by("test"),
            instances: None,
        })
        .await
}

#[tokio::test]
async fn invalid_json_is_invalid_args() {
    for bad in [
        r#"{"path": "a.txt""#,
        "",
        "{path: 1}",
        r#"{"path": "a"} trailing"#,
    ] {
        let msg = expect_error(raw_call(bad).await, "invalid-args");
        assert!(msg.contains("not valid JSON"), "{bad:?}: {msg}");
    }
}

#[tokio::test]
async fn arguments_must_be_an_object() {
    for bad in ["[]", "\"a.txt\"", "null", "42"] {
        let msg = expect_error(raw_call(bad).await, "invalid-args");
        assert!(msg.contains("JSON object"), "{bad:?}: {msg}");
    }
}

#[tokio::test]
async fn schema_violations_name_the_field() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    ws.put("a.txt", "a");
    let cases = [
        (json!({"path": "a.txt", "offset": "ten"}), "`offset`"),
        (json!({"path": 7}), "`path`"),
        (json!({}), "missing field `path`"),
        (
            json!({"path": "a.txt", "lines": 3}),
            "unknown field `lines`",
        ),
        (json!({"path": "a.txt", "limit": -1}), "`limit`"),
    ];
    for (args, field) in cases {
        let msg = expect_error(
            call(&registry, "file_read", args.clone(), "fs.read", &ws.path()).await,
            "invalid-args",
        );
        assert!(msg.contains(field), "{args}: {msg}");
        assert!(msg.contains("file_read"), "names the tool: {msg}");
    }
    let msg = expect_error(
        call(
            &registry,
            "file_write",
            json!({"path": "b.txt", "content": ["x"]}),
            "fs.write",
            &ws.path(),
        )
        .await,
        "invalid-args",
    );
    assert!(msg.contains("`content`"), "{msg}");
    assert!(!ws.path().join("b.txt").exists());
}

#[tokio::test]
async fn an_unknown_tool_is_not_found_and_lists_the_loaded_ones() {
    let registry = default_registry().await;
    let ws = Workspace::new();
    let msg = expect_error(
        call(&registry, "file_delete", json!({}), "fs.write", &ws.path()).await,
        "not-found",
    );
    assert!(
        msg.contains("file_delete") && msg.contains("file_read"),
        "{msg}"
    );
}
