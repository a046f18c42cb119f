//! Property tests: 10,000 generated tool inputs through a real registry (the first-party
//! plugins and the probe, built), and 10,000 generated `describe()` outputs through the
//! checks the load path runs. No input panics the host, each outcome is ok or one of the
//! four error kinds, and no error message carries a raw newline or escape character.

use std::path::Path;
use std::sync::Arc;

use capstan_host::plugin::{
    ArtifactCache, CallRequest, Limits, LoadError, PluginHost, RawToolSpec, Registry, ToolError,
    check_describe_output,
};
use capstan_host::policy::Grants;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::support::{component, plugins_dir, test_cache_dir};

/// Tools worth calling: quick ones that parse their arguments, fail, exit, touch the
/// workspace or need what the call lacks; and names that are not tools.
const TOOLS: &[&str] = &[
    "echo",
    "panic",
    "exit",
    "raw_list",
    "raw_read",
    "file_read",
    "file_list",
    "file_write",
    "task_list",
    "task_create",
    "memory_recall",
    "memory_save",
    "nope",
    "",
];

const KEYS: &[&str] = &[
    "text", "path", "code", "content", "status", "limit", "query", "title", "old", "new",
];

/// Argument texts that sit on the edges of JSON: bad escapes, huge numbers, deep nesting.
fn edge_text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(r#"{"text": "\ud800"}"#.to_owned()),
        Just(r#"{"text": "\x41"}"#.to_owned()),
        Just(r#"{"text": "\u12"}"#.to_owned()),
        Just("{\"text\": \"\u{0}\u{1b}[2J\r\n\"}".to_owned()),
        Just(r#"{"code": 1e999999}"#.to_owned()),
        Just(r#"{"code": 123456789012345678901234567890}"#.to_owned()),
        Just(r#"{"code": -9223372036854775809}"#.to_owned()),
        Just(r#"{"path": "../../../../etc/passwd"}"#.to_owned()),
        Just(r#"{"path": "/dev/zero"}"#.to_owned()),
        (1usize..5000).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n))),
        (1usize..500).prop_map(|n| format!("{}1{}", r#"{"text":"#.repeat(n), "}".repeat(n))),
        (0usize..200_000).prop_map(|n| format!(r#"{{"text": "{}"}}"#, "a".repeat(n))),
    ]
}

fn json_value() -> impl Strategy<Value = serde_json::Value> {
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        any::<String>().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|pairs| {
                Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

fn args_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => json_value().prop_map(|v| v.to_string()),
        3 => prop::collection::vec((prop::sample::select(KEYS), json_value()), 0..4)
            .prop_map(|pairs| {
                let object: serde_json::Map<String, serde_json::Value> =
                    pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                serde_json::Value::Object(object).to_string()
            }),
        2 => any::<String>(),
        2 => edge_text(),
    ]
}

fn tool_name() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(TOOLS).prop_map(str::to_owned),
        1 => any::<String>(),
        1 => (0usize..10_000).prop_map(|n| format!("{}\n\u{1b}[31m", "x".repeat(n))),
    ]
}

fn assert_clean(text: &str) {
    assert!(!text.is_empty(), "an empty message");
    assert!(
        !text.contains('\n') && !text.contains('\r') && !text.contains('\u{1b}'),
        "a message with raw control characters: {text:?}"
    );
}

#[test]
fn ten_thousand_generated_tool_inputs_never_panic_the_host() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let registry = runtime.block_on(async {
        let host =
            PluginHost::new(Limits::default(), ArtifactCache::new(test_cache_dir())).unwrap();
        let mut registry = Registry::load_dir(
            Arc::new(host),
            capstan_host::plugin::CallLog::disabled(),
            &plugins_dir(),
        )
        .await
        .unwrap();
        registry
            .add_file(&component("fixtures", "probe"))
            .await
            .expect("the probe loads");
        registry
    });
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.md"), "- one\n- two\n").unwrap();
    let grants: Grants = "fs.read".parse().unwrap();

    let mut runner = TestRunner::new(Config {
        cases: 10_000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&(tool_name(), args_text()), |(tool, args)| {
            let result = runtime.block_on(registry.call(CallRequest {
                tool: &tool,
                args_json: &args,
                grants: &grants,
                workspace: Some(ws.path()),
                caller: &crate::support::ids::by("fuzz"),
                instances: None,
            }));
            match &result {
                Ok(_) => {}
                Err(
                    ToolError::InvalidArgs(m)
                    | ToolError::Denied(m)
                    | ToolError::NotFound(m)
                    | ToolError::Failed(m),
                ) => assert_clean(m),
            }
            Ok(())
        })
        .unwrap();
}

fn raw_spec() -> impl Strategy<Value = RawToolSpec> {
    let name = prop_oneof![
        4 => "[a-z][a-z0-9_]{0,20}",
        1 => any::<String>(),
        1 => (60usize..70).prop_map(|n| "a".repeat(n)),
        1 => Just("file_read\n\u{1b}[31mFORGED".to_owned()),
    ];
    let description = prop_oneof![
        4 => "[ -~]{0,80}",
        1 => any::<String>(),
        1 => (4000usize..4200).prop_map(|n| "d".repeat(n)),
    ];
    let schema = prop_oneof![
        3 => json_value().prop_map(|v| v.to_string()),
        2 => Just(r#"{"type": "object", "properties": {"p": {"type": "string"}}}"#.to_owned()),
        1 => any::<String>(),
        1 => (30_000usize..34_000).prop_map(|n| format!(r#"{{"description": "{}"}}"#, "s".repeat(n))),
        1 => (1usize..60).prop_map(|n| {
            format!("{}{{}}{}", r#"{"properties": {"p": "#.repeat(n), "}}".repeat(n))
        }),
    ];
    let capabilities = prop::collection::vec(
        prop_oneof![
            4 => prop::sample::select(&["fs.read", "fs.write", "tasks.read", "memory.write"][..])
                .prop_map(str::to_owned),
            1 => any::<String>(),
        ],
        0..3,
    );
    (name, description, schema, capabilities).prop_map(
        |(name, description, args_schema, capabilities)| RawToolSpec {
            name,
            description,
            args_schema,
            capabilities,
        },
    )
}

#[test]
fn ten_thousand_generated_describe_outputs_are_checked_without_a_panic() {
    let specs = prop_oneof![
        9 => prop::collection::vec(raw_spec(), 0..6),
        1 => prop::collection::vec(raw_spec(), 60..70),
    ];
    let mut runner = TestRunner::new(Config {
        cases: 10_000,
        failure_persistence: None,
        ..Config::default()
    });
    let path = Path::new("fuzz.wasm");
    runner
        .run(&specs, |specs| {
            let count = specs.len();
            match check_describe_output(path, specs) {
                Ok(tools) => {
                    prop_assert_eq!(tools.len(), count);
                    prop_assert!(count <= 64);
                    for tool in &tools {
                        prop_assert!(tool.args_schema.is_object());
                        prop_assert!(tool.description.len() <= 4096);
                        prop_assert!(tool.name.len() <= 64 && !tool.name.is_empty());
                    }
                }
                Err(err @ (LoadError::TooManyTools { .. } | LoadError::BadToolSpec { .. })) => {
                    let text = err.to_string();
                    prop_assert!(text.starts_with("fuzz.wasm: "), "{}", text);
                    assert_clean(&text);
                }
                Err(other) => prop_assert!(false, "unexpected refusal: {other}"),
            }
            Ok(())
        })
        .unwrap();
}
