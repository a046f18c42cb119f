//! Outbound HTTP under policy, end to end: the probe fixture makes real `wasi:http`
//! requests to a loopback server started by each test, through the host's egress.

use std::sync::Arc;
use std::time::Duration;

use capstan_host::net::{NetHost, NetLimits, NetSettings};
use capstan_host::plugin::{CallRequest, Limits, PluginHost, Registry, ToolError};
use capstan_host::policy::Grants;
use capstan_host::secrets::{HeaderTemplate, SecretSource, SecretSpec, Secrets};
use capstan_host::services::{RequestDecision, RequestEntry, Services};
use serde_json::{Value, json};

use crate::support::http_server::TestServer;
use crate::support::{registry_on, test_cache};

/// The value of the test secret; it must never come back.
const KEY: &str = "sk-test-0123456789abcdef";

struct Net {
    registry: Registry,
    services: Services,
    _secret_dir: tempfile::TempDir,
}

/// A host with `limits`, the secret `API_KEY` (sent as a bearer token to `bound_to`), and
/// in-memory services keeping the audit log.
async fn net(limits: NetLimits, bound_to: &str) -> Net {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("api_key");
    std::fs::write(&file, format!("{KEY}\n")).unwrap();
    let spec = SecretSpec {
        name: "API_KEY".parse().unwrap(),
        source: SecretSource::File(file),
        hosts: vec![bound_to.parse().unwrap()],
        header: Some(HeaderTemplate::parse("Authorization: Bearer {API_KEY}", "API_KEY").unwrap()),
        path_prefix: None,
    };
    let secrets = Secrets::load(&[spec]).unwrap();
    let services = Services::in_memory();
    let settings = NetSettings {
        limits,
        per_tool: Default::default(),
    };
    let host = PluginHost::new(Limits::default(), test_cache())
        .unwrap()
        .with_services(services.clone())
        .with_network(NetHost::new(settings, secrets));
    Net {
        registry: registry_on(host).await,
        services,
        _secret_dir: dir,
    }
}

impl Net {
    async fn call(&self, tool: &str, args: Value, grants: &str) -> Result<String, ToolError> {
        let grants: Grants = grants.parse().unwrap();
        self.registry
            .call(CallRequest {
                tool,
                args_json: &args.to_string(),
                grants: &grants,
                workspace: None,
                caller: &crate::support::ids::by("worker:1"),
                instances: None,
            })
            .await
    }

    async fn requests(&self) -> Vec<RequestEntry> {
        self.services.audit.recent_requests(100).await.unwrap()
    }
}

fn fast() -> NetLimits {
    NetLimits::default()
}

fn refused(result: Result<String, ToolError>) -> String {
    match result {
        Err(err) => err.message().to_owned(),
        Ok(out) => panic!("expected a refusal, got {out}"),
    }
}

#[tokio::test]
async fn a_granted_request_reaches_the_server_and_is_audited() {
    let server = TestServer::start().await;
    let net = net(fast(), "api.example.com").await;
    let out = net
        .call(
            "net_get",
            json!({"url": server.url("/ok")}),
            &server.grant(),
        )
        .await
        .unwrap();
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["status"], 200);
    assert_eq!(out["body"], "hello from the test server");
    assert_eq!(server.seen().len(), 1);
    let rows = net.requests().await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0].request;
    assert_eq!(row.decision, RequestDecision::Allowed);
    assert_eq!(
        (row.method.as_str(), row.host.as_str(), row.port),
        ("GET", "127.0.0.1", server.addr.port())
    );
    assert_eq!(row.status, Some(200));
    assert_eq!(row.bytes_received, 26);
    assert_eq!(row.grant, format!("http://{}", server.addr));
    assert_eq!(row.process, "worker:1");
    assert_eq!(row.tool, "net_get");
}

/// A tool that does not declare `net` runs with `wasi:http` linked as traps, even in a
/// process granted the host: the first HTTP call (building the request's headers) stops
/// it, naming the missing grant, and the same plugin's declared tool still reaches the
/// server.
#[tokio::test]
async fn a_tool_without_a_net_grant_is_not_linked_to_wasi_http() {
    let server = TestServer::start().await;
    let net = net(fast(), "api.example.com").await;
    let args = json!({"url": server.url("/ok")});
    let text = refused(
        net.call("net_get_undeclared", args.clone(), &server.grant())
            .await,
    );
    assert!(text.contains("tool `net_get_undeclared`"), "{text}");
    assert!(text.contains("`wasi:http/types@0.2."), "{text}");
    assert!(
        text.contains("is not linked for this call: the tool holds no network grant"),
        "{text}"
    );
    assert!(text.contains("declares `net:HOST` in describe()"), "{text}");
    assert!(server.seen().is_empty());
    assert!(
        net.requests().await.is_empty(),
        "nothing reached the egress"
    );

    net.call("net_get", args, &server.grant()).await.unwrap();
    assert_eq!(server.seen().len(), 1);
}

#[tokio::test]
async fn a_host_not_granted_is_refused_before_anything_is_sent() {
    let server = TestServer::start().await;
    let net = net(fast(), "api.example.com").await;
    let text = refused(
        net.call(
            "net_get",
            json!({"url": server.url("/ok")}),
            "net:api.example.com",
        )
        .await,
    );
    assert!(text.contains("capstan refused this request"), "{text}");
    assert!(
        text.contains("which the grant does not name (granted net: api.example.com)"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "only a grant naming the host or address exactly (net:http://{}) or its range \
             (net:http://{{loopback}}:{}) in --grant",
            server.addr,
            server.addr.port()
        )),
        "{text}"
    );
    assert!(server.seen().is_empty());
    let rows = net.requests().await;
    assert_eq!(rows[0].request.decision, RequestDecision::Refused);
    assert!(
        rows[0]
            .request
            .detail
            .contains("which the grant does not name")
    );
}

#[tokio::test]
async fn loopback_and_private_addresses_need_a_grant_naming_them() {
    let server = TestServer::start().await;
    let net = net(fast(), "api.example.com").await;
    let port = server.addr.port();
    // A wildcard reaches neither a loopback literal, in any spelling, nor a name resolving
    // to loopback.
    for url in [
        format!("http://127.0.0.1:{port}/ok"),
        format!("http://2130706433:{port}/ok"),
        format!("http://0x7f.1:{port}/ok"),
        format!("http://[::ffff:127.0.0.1]:{port}/ok"),
        format!("http://localhost:{port}/ok"),
        format!("http://LOCALHOST.:{port}/ok"),
    ] {
        let text = refused(
            net.call("net_get", json!({"url": url}), "net:*://*:*")
                .await,
        );
        assert!(text.contains("a loopback address"), "{url}: {text}");
        assert!(
            text.contains("only a grant naming the host or address exactly"),
            "{url}: {text}"
        );
    }
    assert!(server.seen().is_empty());
    // Naming the host exactly reaches it.
    let grant = format!("net:http://localhost:{port}");
    let out = net
        .call(
            "net_get",
            json!({"url": format!("http://localhost:{port}/ok")}),
            &grant,
        )
        .await
        .unwrap();
    assert!(out.contains("hello from the test server"), "{out}");
}

#[tokio::test]
async fn the_host_never_follows_a_redirect_and_a_guest_that_does_is_checked_again() {
    let server = TestServer::start().await;
    let net = net(fast(), "api.example.com").await;
    let to = "http://169.254.169.254/latest/meta-data/";
    let url = server.url(&format!("/redirect?to={to}"));
    let out = net
        .call("net_get", json!({"url": url}), &server.grant())
        .await
        .unwrap();
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["status"], 302, "the redirect comes back as is: {out}");
    let text = refused(
        net.call(
            "net_get",
            json!({"url": url, "follow_redirects": true}),
            &format!("{},net:*://*:*", server.grant()),
        )
        .await,
    );
    assert!(
        text.contains("169.254.169.254 is a cloud metadata address"),
        "{text}"
    );
    let seen = server.seen();
    assert_eq!(
        seen.len(),
        2,
        "only the two requests to the server went out"
    );
    assert!(
        seen.iter()
            .all(|s| s.method == "GET" && s.path == "/redirect"),
        "{seen:?}"
    );
}

#[tokio::test]
async fn bodies_over_their_caps_are_stopped_in_both_directions() {
    let server = TestServer::start().await;
    let limits = NetLimits {
        max_request_body_bytes: 1024,
        max_response_body_bytes: 2048,
        ..fast()
    };
    let net = net(limits, "api.example.com").await;
    let text = refused(
        net.call(
            "net_post",
            json!({"url": server.url("/echo-body"), "body": "0123456789abcdef", "repeat": 100}),
            &server.grant(),
        )
        .await,
    );
    assert!(text.contains("over the 1 KiB limit"), "{text}");
    assert!(text.contains("[net] max_request_body_kib"), "{text}");
    let seen = server.seen();
    assert!(seen.iter().all(|s| s.body_len <= 1024), "{seen:?}");

    let text = refused(
        net.call(
            "net_get",
            json!({"url": server.url("/big?bytes=5000")}),
            &server.grant(),
        )
        .await,
    );
    assert!(text.contains("over the 2 KiB limit"), "{text}");
    assert!(text.contains("[net] max_response_body_kib"), "{text}");
    let ok = net
        .call(
            "net_get",
            json!({"url": server.url("/big?bytes=2000")}),
            &server.grant(),
        )
        .await
        .unwrap();
    assert!(ok.contains(&"x".repeat(2000)));
    let rows = net.requests().await;
    assert_eq!(
        rows[1].request.decision,
        RequestDecision::Failed,
        "{rows:?}"
    );
}

#[tokio::test]
async fn a_slow_server_hits_each_timeout() {
    // Each case's other timeouts are long, so only the one under test can fire, however
    // slow the machine.
    let long = Duration::from_secs(10);
    let server = TestServer::start().await;
    let first_byte = net(
        NetLimits {
            connect_timeout: long,
            first_byte_timeout: Duration::from_millis(300),
            request_timeout: long,
            ..fast()
        },
        "api.example.com",
    )
    .await;
    let text = refused(
        first_byte
            .call(
                "net_get",
                json!({"url": server.url("/hang")}),
                &server.grant(),
            )
            .await,
    );
    assert!(
        text.contains("no response from 127.0.0.1 within 0.3 s ([net] first_byte_timeout_secs)"),
        "{text}"
    );

    let total = net(
        NetLimits {
            connect_timeout: long,
            first_byte_timeout: long,
            request_timeout: Duration::from_millis(500),
            ..fast()
        },
        "api.example.com",
    )
    .await;
    let text = refused(
        total
            .call(
                "net_get",
                json!({"url": server.url("/stall")}),
                &server.grant(),
            )
            .await,
    );
    assert!(text.contains("[net] request_timeout_secs"), "{text}");

    // A listener that accepts but never speaks TLS: the connection never comes up.
    let connect = net(
        NetLimits {
            connect_timeout: Duration::from_millis(300),
            first_byte_timeout: long,
            request_timeout: long,
            ..fast()
        },
        "api.example.com",
    )
    .await;
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = silent.local_addr().unwrap();
    let _hold = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = silent.accept().await {
            open.push(stream);
        }
    });
    let text = refused(
        connect
            .call(
                "net_get",
                json!({"url": format!("https://{addr}/")}),
                &format!("net:https://{addr}"),
            )
            .await,
    );
    assert!(
        text.contains("no connection to 127.0.0.1 within 0.3 s ([net] connect_timeout_secs)"),
        "{text}"
    );
}

#[tokio::test]
async fn requests_in_flight_beyond_the_limit_are_refused() {
    let server = TestServer::start().await;
    let limits = NetLimits {
        max_concurrent_requests: 2,
        ..fast()
    };
    let net = net(limits, "api.example.com").await;
    let grant = server.grant();
    let call = net.call(
        "net_parallel",
        json!({"url": server.url("/hold"), "count": 3}),
        &grant,
    );
    let release = async {
        // Both admitted requests wait in the server before any answers.
        server.held(2).await;
        server.release();
    };
    let (out, ()) = tokio::join!(call, release);
    let out = out.unwrap();
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["status 200", "status 200"], "{out}");
    assert!(
        lines[2].contains("this call already has 2 requests in flight"),
        "{out}"
    );
    assert!(lines[2].contains("[net] max_concurrent_requests"), "{out}");
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn the_rate_limit_is_per_process_and_tool() {
    let server = TestServer::start().await;
    let limits = NetLimits {
        requests_per_minute: 2,
        ..fast()
    };
    let net = net(limits, "api.example.com").await;
    let grant = server.grant();
    let get = || net.call("net_get", json!({"url": server.url("/ok")}), &grant);
    get().await.unwrap();
    get().await.unwrap();
    let text = refused(get().await);
    assert!(
        text.contains("worker:1 has made its 2 requests per minute with tool `net_get`"),
        "{text}"
    );
    assert!(text.contains("raise [net] requests_per_minute"), "{text}");
    assert_eq!(server.seen().len(), 2);
}

#[tokio::test]
async fn a_secret_is_injected_at_the_egress_and_never_seen_by_the_guest() {
    let server = TestServer::start().await;
    let bound = format!("http://{}", server.addr);
    let net = net(fast(), &bound).await;
    let grants = format!("{},secret:API_KEY", server.grant());
    let args = json!({"method": "GET", "url": server.url("/echo-headers")});
    let out = net
        .call("http_request", args.clone(), &grants)
        .await
        .unwrap();
    // The server saw the key...
    let seen = server.seen();
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    // ...and echoed it, but the guest read it redacted, so the output never holds it.
    assert!(!out.contains(KEY), "{out}");
    assert!(out.contains("Bearer [redacted secret API_KEY]"), "{out}");
    let calls = net.services.audit.recent(10).await.unwrap();
    let rows = net.requests().await;
    let audit = format!("{calls:?}{rows:?}");
    assert!(!audit.contains(KEY), "{audit}");

    // Without the grant, nothing is injected.
    net.call("http_request", args, &server.grant())
        .await
        .unwrap();
    assert_eq!(server.seen()[1].header("authorization"), None);

    // `web_fetch` carries it too, as the README says of both first-party tools.
    let page = net
        .call(
            "web_fetch",
            json!({"url": server.url("/echo-headers")}),
            &grants,
        )
        .await
        .unwrap();
    assert_eq!(
        server.seen()[2].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert!(!page.contains(KEY), "{page}");
}

#[tokio::test]
async fn a_secret_goes_only_to_the_hosts_it_is_bound_to() {
    let bound = TestServer::start().await;
    let other = TestServer::start().await;
    let net = net(fast(), &format!("http://{}", bound.addr)).await;
    let grants = format!("{},{},secret:API_KEY", bound.grant(), other.grant());
    let args = json!({"method": "GET", "url": other.url("/echo-headers")});
    net.call("http_request", args, &grants).await.unwrap();
    assert_eq!(other.seen()[0].header("authorization"), None);
}

#[tokio::test]
async fn a_secret_in_a_tools_output_is_redacted() {
    let server = TestServer::start().await;
    let net = net(fast(), &format!("http://{}", server.addr)).await;
    // The probe's `echo` returns what it is given; an error path that quotes a body or
    // header holding the key is redacted the same way as output.
    let out = net
        .call("echo", json!({"text": format!("the key is {KEY}")}), "")
        .await
        .unwrap();
    assert_eq!(out, "the key is [redacted secret API_KEY]");
}

#[tokio::test]
async fn the_hmac_oracle_signs_without_handing_out_the_key() {
    use hmac::{Hmac, Mac};
    let net = net(fast(), "api.example.com").await;
    let out = net
        .call(
            "secret_hmac",
            json!({"name": "API_KEY", "data": "payload"}),
            "secret:API_KEY",
        )
        .await
        .unwrap();
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(KEY.as_bytes()).unwrap();
    mac.update(b"payload");
    let want: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(out.trim(), want);
    let exists = net
        .call(
            "secret_exists",
            json!({"name": "API_KEY"}),
            "secret:API_KEY",
        )
        .await
        .unwrap();
    assert_eq!(exists.trim(), "true");
    let hidden = net
        .call("secret_exists", json!({"name": "API_KEY"}), "")
        .await
        .unwrap();
    assert_eq!(
        hidden.trim(),
        "false",
        "an ungranted secret does not exist for the guest"
    );
    let text = match net
        .call("secret_hmac", json!({"name": "API_KEY", "data": "x"}), "")
        .await
    {
        Ok(out) => out,
        Err(err) => err.message().to_owned(),
    };
    assert!(text.contains("not granted"), "{text}");
    assert!(
        text.contains("grant secret:API_KEY in its profile's `secrets`") && !text.contains("  "),
        "the refusal names the fix in one sentence: {text}"
    );
}

#[tokio::test]
async fn a_guest_socket_never_connects() {
    let net = net(fast(), "api.example.com").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    for tool in ["socket_connect", "udp_send"] {
        let out = match net
            .call(tool, json!({"addr": addr.to_string()}), "net:*://*:*")
            .await
        {
            Ok(out) => out,
            Err(err) => err.message().to_owned(),
        };
        assert!(!out.contains("connected"), "{tool}: {out}");
        assert!(
            out.contains("denied") || out.contains("not-permitted") || out.contains("access"),
            "{tool}: {out}"
        );
    }
    // Had the guest connected, the connection would be waiting to be accepted now.
    let pending = tokio::time::timeout(Duration::from_millis(0), listener.accept()).await;
    assert!(pending.is_err(), "a guest socket reached the listener");
}

#[tokio::test]
async fn a_component_importing_sockets_and_http_like_a_python_runtime_loads_and_runs() {
    let host = Arc::new(PluginHost::new(Limits::default(), test_cache()).unwrap());
    let mut registry = Registry::new(host, capstan_host::plugin::CallLog::disabled());
    registry
        .add_file(&crate::support::component("fixtures", "python_style"))
        .await
        .expect("a component importing wasi:sockets and wasi:http loads");
    let plugin = &registry.plugins()[0];
    assert!(
        plugin
            .imports()
            .iter()
            .any(|i| i.starts_with("wasi:sockets/tcp")),
        "{:?}",
        plugin.imports()
    );
    assert!(
        plugin
            .imports()
            .iter()
            .any(|i| i.starts_with("wasi:http/outgoing-handler"))
    );
    let out = registry
        .call(CallRequest {
            tool: "hello",
            args_json: "{}",
            grants: &Grants::none(),
            workspace: None,
            caller: &crate::support::ids::by("cli"),
            instances: None,
        })
        .await
        .unwrap();
    assert_eq!(out, "hello");
}

/// The README's five lines, through the `capstan` binary: `policy` shows the grant,
/// `--why` explains an allowed and a refused request, and `tool call --as worker` sends
/// the key to the server while its output shows it redacted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_lines_of_config_give_a_worker_one_host_and_one_key() {
    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    let host = format!("http://{}", server.addr);
    std::fs::write(
        dir.path().join("capstan.toml"),
        format!(
            "[secrets.API_KEY]\nenv = \"CAPSTAN_TEST_API_KEY\"\nhosts = [\"{host}\"]\n\
             header = \"Authorization: Bearer {{API_KEY}}\"\n\
             [profiles.worker]\nnet = [\"{host}\"]\nsecrets = [\"API_KEY\"]\n"
        ),
    )
    .unwrap();
    let run = |args: Vec<String>| {
        let dir = dir.path().to_owned();
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            crate::support::capstan_command(&dir, &args)
                .env("CAPSTAN_TEST_API_KEY", KEY)
                .output()
                .unwrap()
        })
    };
    let args = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();

    let out = run(args(&["policy"])).await.unwrap();
    let text = crate::support::stdout(&out);
    assert!(out.status.success(), "{}", crate::support::stderr(&out));
    let port = server.addr.port();
    let expanded = format!("\"{host}\" (any method, http, 127.0.0.1, port {port})");
    assert!(
        text.contains(&format!("worker:    net: {expanded}; secrets: API_KEY")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "http_request      reaches {expanded}; secrets API_KEY"
        )),
        "{text}"
    );
    assert!(text.contains("branch:    no network"), "{text}");
    assert!(!text.contains(KEY));

    let url = server.url("/echo-headers");
    let out = run(args(&["policy", "--why", "worker", "http_request", &url]))
        .await
        .unwrap();
    let text = crate::support::stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("secrets injected: API_KEY (in authorization)"),
        "{text}"
    );
    assert!(
        text.contains("address: 127.0.0.1 (a loopback address)"),
        "{text}"
    );
    // Both halves, for the request and then for its address.
    assert!(
        text.contains("\nthe declaration: allows it, by \"*://{internal}:*\""),
        "{text}"
    );
    assert!(
        text.contains("  the declaration: allows it, by \"*://{internal}:*\""),
        "{text}"
    );
    assert!(
        text.contains(&format!("  the grant:       allows it, by {expanded}")),
        "{text}"
    );

    let out = run(args(&[
        "policy",
        "--why",
        "worker",
        "http_request",
        "https://evil.example/",
    ]))
    .await
    .unwrap();
    let text = crate::support::stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("add \"evil.example\" to `net` in [profiles.worker]"),
        "{text}"
    );
    assert!(
        text.contains("the grant:       does not allow it"),
        "{text}"
    );
    let out = run(args(&["policy", "--why", "branch", "http_request", &url]))
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(crate::support::stdout(&out).contains("not offered to branch"));

    let call = format!(r#"{{"method":"GET","url":"{url}"}}"#);
    let workspace = tempfile::tempdir().unwrap();
    let ws = workspace.path().to_str().unwrap();
    let out = run(args(&[
        "tool",
        "call",
        "http_request",
        &call,
        "--as",
        "worker",
        "--workspace",
        ws,
    ]))
    .await
    .unwrap();
    let text = crate::support::stdout(&out);
    assert!(
        out.status.success(),
        "{text}{}",
        crate::support::stderr(&out)
    );
    assert!(text.contains("[redacted secret API_KEY]"), "{text}");
    assert!(!text.contains(KEY) && !crate::support::stderr(&out).contains(KEY));
    assert_eq!(
        server.seen()[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
}

#[tokio::test]
async fn web_fetch_returns_text_and_refuses_binary_and_redirects_by_name() {
    let server = TestServer::start().await;
    let net = net(fast(), "api.example.com").await;
    let grant = server.grant();
    let fetch = |path: &str| net.call("web_fetch", json!({"url": server.url(path)}), &grant);
    let text = fetch("/ok").await.unwrap();
    assert!(text.contains("hello from the test server"), "{text}");
    let json = fetch("/json").await.unwrap();
    assert!(json.contains(r#"{"answer":42}"#), "{json}");
    let binary = refused(fetch("/binary").await);
    assert!(binary.contains("image/png"), "{binary}");
    let redirect = refused(fetch("/redirect?to=https://elsewhere.example/page").await);
    assert!(
        redirect.contains("https://elsewhere.example/page"),
        "{redirect}"
    );
    assert!(redirect.contains("302"), "{redirect}");
}

#[tokio::test]
async fn a_secret_in_an_error_message_is_redacted() {
    let server = TestServer::start().await;
    let net = net(fast(), &format!("http://{}", server.addr)).await;
    // The server redirects to a host named after the key; the probe follows, and the
    // host's refusal names that host: the error the model would read holds the key.
    let to = format!("http://{KEY}.invalid/");
    let text = refused(
        net.call(
            "net_get",
            json!({"url": server.url(&format!("/redirect?to={to}")), "follow_redirects": true}),
            &server.grant(),
        )
        .await,
    );
    assert!(text.contains("[redacted secret API_KEY].invalid"), "{text}");
    assert!(!text.contains(KEY), "{text}");
    let rows = net.requests().await;
    assert!(!format!("{rows:?}").contains(KEY), "{rows:?}");
}

/// Through an agent run: a worker granted the server and the key calls `http_request`; the
/// server sees the key, and neither the model's context nor anything stored (history,
/// audit, the whole database) ever holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_request_carries_the_key_and_the_model_and_the_store_never_see_it() {
    use capstan_host::agent::Event;
    use capstan_host::config::Config;

    let server = TestServer::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("api_key"), KEY).unwrap();
    let host = format!("http://{}", server.addr);
    let config = Config::parse(
        &format!(
            "[secrets.API_KEY]\nfile = \"api_key\"\nhosts = [\"{host}\"]\n\
             header = \"Authorization: Bearer {{API_KEY}}\"\n\
             [profiles.worker]\nnet = [\"{host}\"]\nsecrets = [\"API_KEY\"]\n"
        ),
        &dir.path().join("capstan.toml"),
    )
    .unwrap();
    let url = server.url("/echo-headers");
    let script = format!(
        r#"
[[step]]
process = "channel"
when = "fetch it"
tool_calls = [{{ name = "spawn_worker", arguments = {{ task = "Fetch the headers." }} }}]

[[step]]
process = "worker"
when = "fetch the headers"
tool_calls = [{{ name = "http_request", arguments = {{ method = "GET", url = "{url}" }} }}]

[[step]]
process = "worker"
tool_calls = [{{ name = "set_status", arguments = {{ state = "done", message = "fetched" }} }}]

[[step]]
process = "channel"
repeat = true
tool_calls = [{{ name = "skip" }}]
"#
    );
    let recording = crate::support::Recording::new(&script);
    let (rt, mut events) = crate::support::agent_runtime(config, recording.clone(), false).await;
    rt.send_user_message("main", "fetch it").await.unwrap();
    while let Some(event) = events.recv().await {
        if matches!(event, Event::WorkerEnded { .. }) {
            break;
        }
    }
    rt.wait_idle("main").await;

    assert_eq!(
        server.seen()[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    let context = format!("{:?}", recording.requests());
    assert!(
        context.contains("[redacted secret API_KEY]"),
        "the worker read the echo"
    );
    assert!(!context.contains(KEY), "the model's context holds the key");
    let services = rt.services();
    let rows = services.audit.recent_requests(10).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].request.process, "worker:1");
    rt.shutdown();
    for entry in std::fs::read_dir(&rt.config().agent.data_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            let bytes = std::fs::read(&path).unwrap();
            let found = bytes.windows(KEY.len()).any(|w| w == KEY.as_bytes());
            assert!(!found, "{} holds the key", path.display());
        }
    }
}
