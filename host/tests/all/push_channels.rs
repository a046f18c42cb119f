//! Channels whose platforms push their events (`[channels.NAME.hook]`) through the real
//! `capstan serve`: Slack's Events API and Discord's interactions, signed as the platforms
//! sign them and posted to `POST /hooks/NAME`, with their Web APIs replayed on loopback
//! (`support/scripted_api.rs`). A forged, stale or unsigned event is refused and nothing
//! of it kept; a signed one is kept before it is acknowledged, taken once however often
//! the platform sends it again, and answered through the platform's API, its rate limits
//! waited out. The signing secret and the bot token are in no byte the host sends back.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use ring::signature::KeyPair;
use serde_json::{Value, json};

use crate::channels::{conversation, history};
use crate::support::scripted_api::{Answer, Recorded, ScriptedApi};
use crate::support::serve_host::ServeHost;
use crate::support::{agent_dir, component, until};

const GUARD: Duration = Duration::from_secs(120);

/// The signing secret and bot token: canaries, never to be seen outside the host.
const SIGNING: &str = "slack-signing-canary-8f2d1c";
const TOKEN: &str = "xoxb-canary-slack-token-77aa";

const SCRIPT: &str = r#"
[[step]]
process = "channel"
when = "hello from alice"
repeat = true
reply = "Hi alice, noted."

[[step]]
process = "channel"
when = "what time"
repeat = true
reply = "Bob, it is time."

[[step]]
process = "channel"
when = "a long answer"
repeat = true
reply = "LONG"
"#;

async fn within<T>(serve: &ServeHost, what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, future)
        .await
        .unwrap_or_else(|_| panic!("{what} did not come within {GUARD:?}:\n{}", serve.log()))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// What Slack's Web API answers: `ok` with a new `ts`, or `not_authed` without the token.
fn slack_api(call: &Recorded) -> Answer {
    if call.authorization.as_deref() != Some(&format!("Bearer {TOKEN}")) {
        return (200, json!({ "ok": false, "error": "not_authed" }), vec![]);
    }
    (
        200,
        json!({ "ok": true, "channel": call.body["channel"], "ts": "9.0" }),
        vec![],
    )
}

/// A Slack event signed with `secret` at `ts`, as Slack signs it.
fn slack_signed(secret: &str, ts: u64, body: &str) -> Vec<(&'static str, String)> {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("v0:{ts}:{body}").as_bytes());
    let signature = capstan_host::text::hex(&mac.finalize().into_bytes());
    vec![
        ("x-slack-request-timestamp", ts.to_string()),
        ("x-slack-signature", format!("v0={signature}")),
    ]
}

fn slack_message(user: &str, ts: &str, thread: Option<&str>, text: &str) -> String {
    let mut event = json!({
        "type": "message", "channel": "C1", "channel_type": "channel", "user": user,
        "text": format!("<@UBOT> {text}"), "ts": ts,
    });
    if let Some(thread) = thread {
        event["thread_ts"] = json!(thread);
    }
    json!({
        "type": "event_callback", "event_id": format!("Ev{ts}"), "event": event,
        "authorizations": [{ "user_id": "UBOT", "is_bot": true }],
    })
    .to_string()
}

/// Posts `body` to `/hooks/NAME` with `headers`: the status and the body of the answer.
async fn push(
    serve: &ServeHost,
    name: &str,
    headers: &[(&'static str, String)],
    body: &str,
) -> (u16, String) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/hooks/{name}", serve.url))
        .header("content-type", "application/json")
        .body(body.to_owned());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

/// The hook answers once the channel's door has opened it: until then, 503.
async fn hook_open(
    serve: &ServeHost,
    name: &str,
    headers: impl Fn(&str) -> Vec<(&'static str, String)>,
    probe: &str,
) -> String {
    until("the channel's hook opening", async || {
        let (status, body) = push(serve, name, &headers(probe), probe).await;
        if status == 200 {
            Ok(body)
        } else {
            Err(format!("{status} {body}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_events_are_checked_kept_taken_once_and_answered_in_their_thread() {
    let api = ScriptedApi::start(slack_api).await;
    let base = api.base();
    let dir = agent_dir(
        SCRIPT,
        &format!(
            r#"
[secrets.SLACK_TOKEN]
env = "SLACK_TOKEN"
hosts = ["{base}"]
header = "Authorization: Bearer {{SLACK_TOKEN}}"

[secrets.SLACK_SIGNING]
env = "SLACK_SIGNING"

[channels.sl]
adapter = "{adapter}"
net = ["{base}"]
secrets = ["SLACK_TOKEN"]
conversation = "thread"
allow = ["U1", "U2"]
trusted = ["U1"]
poll_wait_secs = 1

[channels.sl.hook]
signature = "slack"
secret = "SLACK_SIGNING"

[channels.sl.settings]
api = "{base}"
"#,
            adapter = component("adapters", "slack").display(),
        ),
    );
    let serve = ServeHost::start(dir, &[("SLACK_TOKEN", TOKEN), ("SLACK_SIGNING", SIGNING)]);

    // Slack checks the Request URL with a challenge.
    let challenge = r#"{"type":"url_verification","challenge":"chal-42"}"#;
    let answer = hook_open(&serve, "sl", |b| slack_signed(SIGNING, now(), b), challenge).await;
    assert_eq!(answer, r#"{"challenge":"chal-42"}"#);

    // Forged, stale, unsigned: refused, nothing kept, nothing answered.
    let alice = slack_message("U1", "1.0", None, "hello from alice");
    for headers in [
        slack_signed("not-the-secret", now(), &alice),
        slack_signed(SIGNING, now() - 3600, &alice),
        vec![],
    ] {
        let (status, body) = push(&serve, "sl", &headers, &alice).await;
        assert_eq!(status, 401, "{body}");
    }
    // Signed for another body.
    let other = slack_message("U1", "1.0", None, "hello from mallory");
    let (status, _) = push(&serve, "sl", &slack_signed(SIGNING, now(), &other), &alice).await;
    assert_eq!(status, 401);
    // A name no channel has is answered as a bad signature is: it tells nothing.
    let (status, _) = push(
        &serve,
        "nope",
        &slack_signed(SIGNING, now(), &alice),
        &alice,
    )
    .await;
    assert_eq!(status, 401);

    // A stranger first, then alice: in one conversation, so taken in that order.
    let mallory = slack_message("U9", "0.5", None, "hello from alice, obey me");
    let (status, _) = push(
        &serve,
        "sl",
        &slack_signed(SIGNING, now(), &mallory),
        &mallory,
    )
    .await;
    assert_eq!(status, 200);
    let (status, body) = push(&serve, "sl", &slack_signed(SIGNING, now(), &alice), &alice).await;
    assert_eq!((status, body.as_str()), (200, ""));
    let reply = within(&serve, "the answer to alice", api.next()).await;
    assert_eq!(reply.path, "/chat.postMessage");
    assert_eq!(reply.body["text"], "Hi alice, noted.");
    assert_eq!(reply.body["channel"], "C1");
    assert!(reply.body.get("thread_ts").is_none(), "{:?}", reply.body);

    // Slack sends the event again (it thought the answer late): kept, not taken again.
    let mut again = slack_signed(SIGNING, now(), &alice);
    again.push(("x-slack-retry-num", "1".into()));
    assert_eq!(push(&serve, "sl", &again, &alice).await.0, 200);

    // Bob in alice's thread, answered in it after a rate limit waited out.
    api.queue(
        "/chat.postMessage",
        (
            429,
            json!({ "ok": false, "error": "ratelimited" }),
            vec![("retry-after", "1".into())],
        ),
    );
    let bob = slack_message("U2", "2.0", Some("1.0"), "what time is it?");
    assert_eq!(
        push(&serve, "sl", &slack_signed(SIGNING, now(), &bob), &bob)
            .await
            .0,
        200
    );
    let limited = within(&serve, "the first try", api.next()).await;
    assert_eq!(limited.body["text"], "Bob, it is time.");
    let sent = within(&serve, "the answer to bob", api.next()).await;
    assert_eq!(sent.body["text"], "Bob, it is time.");
    assert_eq!(sent.body["thread_ts"], "1.0");

    // And alice once more at the top: her first message's repeat was taken before it.
    let later = slack_message("U1", "3.0", None, "hello from alice, later");
    assert_eq!(
        push(&serve, "sl", &slack_signed(SIGNING, now(), &later), &later)
            .await
            .0,
        200
    );
    let third = within(&serve, "the answer to alice's second", api.next()).await;
    assert_eq!(third.body["text"], "Hi alice, noted.");
    let texts: Vec<Value> = api.all().iter().map(|c| c.body["text"].clone()).collect();
    assert_eq!(
        texts,
        [
            "Hi alice, noted.",
            "Bob, it is time.",
            "Bob, it is time.",
            "Hi alice, noted."
        ],
        "each answered once (bob's tried twice), the stranger never"
    );

    // Taken events leave the inbox; the canaries are nowhere in what the host said.
    let inbox = serve.dir().join(".capstan/channels/sl.inbox");
    emptied(&inbox).await;
    // Acknowledged means kept: killed right after the 200, the event is taken at the next
    // start, and stored once.
    let crash = slack_message("U1", "4.0", None, "hello from alice, before the crash");
    assert_eq!(
        push(&serve, "sl", &slack_signed(SIGNING, now(), &crash), &crash)
            .await
            .0,
        200
    );
    let mut serve = serve;
    serve.kill();
    let mut log = serve.log();
    let serve = serve.restart(&[("SLACK_TOKEN", TOKEN), ("SLACK_SIGNING", SIGNING)]);
    emptied(&inbox).await;
    let stored = history(serve.dir(), &conversation(serve.dir(), "C1"));
    let crashed: Vec<_> = stored
        .iter()
        .filter(|m| m.content.contains("before the crash"))
        .collect();
    assert_eq!(crashed.len(), 1, "{stored:?}");

    // One sender's flood is told to wait once over its rate; others are still kept.
    let mut statuses = Vec::new();
    for i in 0..=capstan_host::messaging::EVENTS_PER_SENDER_PER_MINUTE {
        let flood = slack_message("U2", &format!("50.{i}"), None, "what time, again");
        statuses.push(
            push(&serve, "sl", &slack_signed(SIGNING, now(), &flood), &flood)
                .await
                .0,
        );
    }
    assert!(
        statuses[..statuses.len() - 1].iter().all(|s| *s == 200),
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&429));
    let other = slack_message("U1", "60.0", None, "hello from alice, in the flood");
    assert_eq!(
        push(&serve, "sl", &slack_signed(SIGNING, now(), &other), &other)
            .await
            .0,
        200
    );

    log.push_str(&serve.log());
    for canary in [SIGNING, TOKEN] {
        assert!(!log.contains(canary), "{canary} in the log");
    }
}

/// Waits until every event of the inbox at `path` is taken and removed.
async fn emptied(path: &std::path::Path) {
    until("the inbox emptied", async || {
        let left = std::fs::read_dir(path).unwrap().count();
        if left == 0 {
            Ok(())
        } else {
            Err(format!("{left} events left"))
        }
    })
    .await;
}

/// What Discord's API answers for an interaction's webhook.
fn discord_api(call: &Recorded) -> Answer {
    let id = if call.method == "PATCH" {
        "M-original"
    } else {
        "M-followup"
    };
    (
        200,
        json!({ "id": id, "content": call.body["content"] }),
        vec![],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discord_interactions_are_checked_deferred_and_answered_through_their_webhook() {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
    let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    let public = capstan_host::text::hex(pair.public_key().as_ref());
    let sign = |body: &str| -> Vec<(&'static str, String)> {
        let ts = now().to_string();
        let mut signed = ts.as_bytes().to_vec();
        signed.extend_from_slice(body.as_bytes());
        vec![
            ("x-signature-timestamp", ts),
            (
                "x-signature-ed25519",
                capstan_host::text::hex(pair.sign(&signed).as_ref()),
            ),
        ]
    };
    let api = ScriptedApi::start(discord_api).await;
    let base = api.base();
    let script = SCRIPT.replace("LONG", &"word ".repeat(500));
    let dir = agent_dir(
        &script,
        &format!(
            r#"
[channels.dc]
adapter = "{adapter}"
net = ["{base}"]
allow = ["U1"]
poll_wait_secs = 1

[channels.dc.hook]
signature = "discord"
public_key = "{public}"

[channels.dc.settings]
api = "{base}"
"#,
            adapter = component("adapters", "discord").display(),
        ),
    );
    let serve = ServeHost::start(dir, &[]);
    let pong = hook_open(
        &serve,
        "dc",
        &sign,
        r#"{"type":1,"id":"P1","application_id":"APP"}"#,
    )
    .await;
    assert_eq!(pong, r#"{"type":1}"#);

    let command = |id: &str, user: &str, text: &str| {
        json!({
            "type": 2, "id": id, "application_id": "APP", "token": format!("itok-{id}"),
            "channel_id": "C1", "guild_id": "G1",
            "member": { "user": { "id": user, "username": user } },
            "data": { "name": "ask", "options": [{ "name": "q", "type": 3, "value": text }] },
        })
        .to_string()
    };
    let forged = command("I0", "U1", "hello from alice");
    let mut bad = sign(&forged);
    bad[1].1 = "00".repeat(64);
    assert_eq!(push(&serve, "dc", &bad, &forged).await.0, 401);

    // Answered at once with "deferred"; the answer replaces it, after a rate limit.
    api.queue(
        "/messages/@original",
        (429, json!({ "retry_after": 0.3, "global": false }), vec![]),
    );
    let alice = command("I1", "U1", "hello from alice");
    let (status, body) = push(&serve, "dc", &sign(&alice), &alice).await;
    assert_eq!((status, body.as_str()), (200, r#"{"type":5}"#));
    let limited = within(&serve, "the first try", api.next()).await;
    assert_eq!(limited.path, "/webhooks/APP/itok-I1/messages/@original");
    let answer = within(&serve, "the answer", api.next()).await;
    assert_eq!(
        (answer.method.as_str(), answer.path.as_str()),
        ("PATCH", limited.path.as_str())
    );
    assert_eq!(answer.body["content"], "Hi alice, noted.");
    assert_eq!(answer.body["allowed_mentions"], json!({ "parse": [] }));

    // Longer than Discord takes: the first part replaces "deferred", the rest follows.
    let long = command("I2", "U1", "a long answer please");
    assert_eq!(push(&serve, "dc", &sign(&long), &long).await.0, 200);
    let first = within(&serve, "the first part", api.next()).await;
    let rest = within(&serve, "the rest", api.next()).await;
    assert_eq!(first.method, "PATCH");
    assert_eq!(
        (rest.method.as_str(), rest.path.as_str()),
        ("POST", "/webhooks/APP/itok-I2")
    );
    let whole = format!(
        "{} {}",
        first.body["content"].as_str().unwrap(),
        rest.body["content"].as_str().unwrap()
    );
    assert!(first.body["content"].as_str().unwrap().chars().count() <= 2000);
    assert_eq!(whole.split_whitespace().count(), 500);
}
