//! The tool catalog and router through the real path: a plugin that declares a host tool's
//! name never reaches a model, a door or a call, and its other tools are offered as usual.

use capstan_host::agent::Event;
use capstan_host::app::AgentBuilder;
use capstan_host::config::{Config, ProviderSettings};
use capstan_host::ids::ProcessId;
use capstan_host::mcp::ToolServer;
use capstan_host::policy::ProcessKind;

use crate::support::{Recording, capstan, component, plugins_with, stderr, stdout, test_cache};

/// The channel replies with `reply`; the cortex calls the plugin's own tool, then replies.
const SCRIPT: &str = r#"
[[step]]
process = "channel"
when = "hello"
tool_calls = [{ name = "reply", arguments = { text = "the host's reply" } }]

[[step]]
process = "cortex"
when = "check"
tool_calls = [{ name = "shadow_ok" }]

[[step]]
process = "cortex"
when = "shadow ok"
tool_calls = [{ name = "reply", arguments = { text = "checked" } }]
"#;

#[tokio::test]
async fn a_plugin_tool_named_like_a_host_tool_is_never_offered_served_or_run() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&[(
        "describe_host_name.wasm",
        component("fixtures", "describe_host_name"),
    )]);
    let mut config = Config::defaults(dir.path());
    config.provider = ProviderSettings::Scripted { script: None };
    let provider = Recording::new(SCRIPT);
    let agent = AgentBuilder::new(config)
        .plugins_dir(plugins.path().to_owned())
        .cache(test_cache())
        .provider(provider.clone())
        .build()
        .await
        .expect("the agent starts");
    let (rt, mut events) = (agent.runtime, agent.events);

    // The model is shown the host's `reply` once, with the host's description.
    for kind in [ProcessKind::Channel, ProcessKind::Cortex] {
        let offered = rt.tool_defs(kind);
        let replies: Vec<_> = offered.iter().filter(|t| t.name == "reply").collect();
        assert_eq!(replies.len(), 1, "{kind}: {offered:?}");
        assert!(
            !replies[0].description.contains("better reply"),
            "{replies:?}"
        );
    }
    assert!(
        rt.tool_defs(ProcessKind::Cortex)
            .iter()
            .any(|t| t.name == "shadow_ok"),
        "the plugin's other tool is offered as usual"
    );

    rt.send_user_message("main", "hello").await.unwrap();
    rt.wait_idle("main").await;
    rt.send_admin_message("ops", "check").await.unwrap();
    rt.wait_admin_idle("ops").await;
    let mut seen = Vec::new();
    while let Ok(event) = events.try_recv() {
        seen.push(event);
    }
    assert!(
        seen.contains(&Event::Reply {
            channel: ProcessId::channel("main"),
            text: "the host's reply".into()
        }),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .any(|e| matches!(e, Event::ToolCalled { tool, .. } if tool == "shadow_ok")),
        "{seen:?}"
    );
    let all = format!("{seen:?}{:?}", provider.requests());
    assert!(!all.contains("THE PLUGIN'S REPLY RAN"), "{all}");

    // The MCP door serves the plugin's own tool and neither `reply`; a call of `reply`
    // is refused as a host tool, not run.
    let server = ToolServer::new(rt.router().clone(), ProcessKind::Cortex);
    let served: Vec<String> = server.tools().iter().map(|t| t.name.to_string()).collect();
    assert!(served.contains(&"shadow_ok".to_owned()), "{served:?}");
    assert!(!served.contains(&"reply".to_owned()), "{served:?}");
    let ran = rt
        .router()
        .run(
            ProcessKind::Cortex,
            &crate::support::ids::by("mcp:test"),
            None,
            "reply",
            "{}",
            std::future::pending(),
        )
        .await
        .committed()
        .await;
    let err = ran.unwrap_err();
    assert_eq!(err.kind(), "denied", "{err}");
    // Refused like any call a door is refused: with its audit row.
    let audit = crate::support::stored(&rt).audit_log(50).unwrap();
    assert!(
        audit
            .iter()
            .any(|row| row.tool == "reply" && row.process == "mcp:test" && row.outcome == "denied"),
        "{audit:?}"
    );
    assert!(
        err.message().contains(
            "`reply` is a host tool: it runs only inside an agent's channel or cortex process"
        ),
        "{err}"
    );
}

#[test]
fn the_cli_warns_of_a_plugin_tool_named_like_a_host_tool_and_runs_none() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = plugins_with(&[(
        "describe_host_name.wasm",
        component("fixtures", "describe_host_name"),
    )]);
    let plugins_dir = plugins.path().to_str().unwrap();
    let out = capstan(dir.path(), &["policy", "--plugins-dir", plugins_dir]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("warning: plugin describe_host_name (")
            && stderr(&out).contains(
                "tool `reply` takes the name of a host tool, so it is offered to no process and \
             served by no door; rename the tool"
            ),
        "{}",
        stderr(&out)
    );
    let text = stdout(&out);
    assert_eq!(
        text.lines().filter(|l| l.starts_with("reply ")).count(),
        1,
        "one row, the host's: {text}"
    );
    assert!(text.lines().any(|l| l.starts_with("shadow_ok ")), "{text}");
    // And the lint fails on it, for CI.
    let out = capstan(
        dir.path(),
        &["policy", "--lint", "--plugins-dir", plugins_dir],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("host-name-clash: agent.plugins_dir: plugin describe_host_name ("),
        "{}",
        stdout(&out)
    );

    let workspace = tempfile::tempdir().unwrap();
    let workspace = workspace.path().to_str().unwrap();
    let call = ["tool", "call", "reply", "{}", "--plugins-dir", plugins_dir];
    let as_cortex = ["--as", "cortex", "--workspace", workspace];
    for args in [call.to_vec(), [&call[..], &as_cortex[..]].concat()] {
        let args = &args[..];
        let out = capstan(dir.path(), args);
        let all = format!("{}{}", stdout(&out), stderr(&out));
        assert!(!out.status.success(), "{args:?}: {all}");
        assert!(all.contains("`reply` is a host tool"), "{args:?}: {all}");
        assert!(!all.contains("THE PLUGIN'S REPLY RAN"), "{args:?}: {all}");
    }
}
