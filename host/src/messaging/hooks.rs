//! Events a platform pushes: `POST /hooks/NAME`, for a channel with a `[channels.NAME.hook]`
//! table (Slack's Events API, Discord's interactions).
//!
//! The host checks the platform's signature itself (the signing secret never enters the
//! adapter), has the adapter read the event for its immediate answer (a challenge, an
//! acknowledgement), keeps the event in the channel's [inbox](super::inbox) before it
//! answers, and only then says it arrived: acknowledged means kept. The channel's door
//! takes the inbox's events as it takes a poll's, through the same exchange, so a crash
//! after the answer delivers the event again and never loses it.
//!
//! A channel's hook opens once its door has loaded its adapter, and stays open while the
//! door restarts (events are kept, and taken when it is back); before, the platform is
//! answered 503 and tries again. A repeat of an event kept in the last 5 minutes is
//! answered and not kept twice, and one sender's flood is answered 429 without filling
//! the inbox for everyone.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, Mac};
use sha2::Digest;

use super::inbox::{Inbox, InboxError, MAX_EVENT_BYTES};
use crate::plugin::PluginHost;
use crate::plugin::adapter::{AdapterFailure, LoadedAdapter, PlatformError};
use crate::secrets::Secret;

/// How far a signed request's timestamp may be from the host's clock: an older one is a
/// replay.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);

/// The channels taking pushed events, by name; shared by `capstan serve`'s route and the
/// doors that open them.
#[derive(Default)]
pub struct Hooks {
    channels: RwLock<HashMap<String, Arc<ChannelHook>>>,
}

/// One channel's hook: its inbox, for the life of the process (two inboxes would number
/// two events alike), and the adapter its door last loaded, kept while the door restarts
/// so an event is still kept, and taken once the door is back.
struct ChannelHook {
    inbox: Arc<Inbox>,
    open: RwLock<Option<Arc<OpenHook>>>,
    recent: Mutex<Recent>,
}

/// A channel's hook as its door opened it.
pub(crate) struct OpenHook {
    pub(crate) host: Arc<PluginHost>,
    pub(crate) adapter: Arc<LoadedAdapter>,
    pub(crate) check: SignatureCheck,
}

/// What came lately: the digests of the events kept (a platform's retries, or a replay
/// within the signature's window, are answered without being kept twice), and when each
/// sender's events came (one sender cannot fill the inbox for everyone).
#[derive(Default)]
struct Recent {
    kept: VecDeque<(Instant, [u8; 32])>,
    senders: HashMap<String, VecDeque<Instant>>,
}

/// The most events kept from one sender in a minute: past it the platform is told to
/// wait (429), and everyone else's events are still kept.
pub const EVENTS_PER_SENDER_PER_MINUTE: usize = 60;

/// The most recent events remembered, to know a repeat.
const RECENT_EVENTS: usize = 100_000;

/// How a channel's events are known to come from its platform.
pub(crate) enum SignatureCheck {
    /// Slack's `v0`: HMAC-SHA256 of `v0:TIMESTAMP:BODY` with the signing secret.
    Slack(Secret),
    /// Discord's: Ed25519 over `TIMESTAMP` and the body, with the application's key.
    Discord([u8; 32]),
}

/// The answer to a platform's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The body: the adapter's answer (JSON) or why the request was refused.
    pub body: String,
}

impl HookAnswer {
    fn refused(status: u16, why: impl Into<String>) -> Self {
        HookAnswer {
            status,
            body: serde_json::json!({ "error": why.into() }).to_string(),
        }
    }

    /// The one refusal of a request that is not a channel's platform's: the same for a
    /// bad signature and a name no channel has, so it tells neither.
    fn not_signed() -> Self {
        HookAnswer::refused(
            401,
            format!(
                "the request is not signed as the channel's platform signs its events, or is \
                 more than {} s old",
                MAX_CLOCK_SKEW.as_secs()
            ),
        )
    }
}

impl Hooks {
    /// No channel open yet.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The inbox of `channel`: the one it has, or the one `open` makes.
    pub(crate) fn inbox(
        &self,
        channel: &str,
        open: impl FnOnce() -> Result<Inbox, InboxError>,
    ) -> Result<Arc<Inbox>, InboxError> {
        let mut channels = self.channels.write().unwrap_or_else(|e| e.into_inner());
        if let Some(hook) = channels.get(channel) {
            return Ok(hook.inbox.clone());
        }
        let inbox = Arc::new(open()?);
        channels.insert(
            channel.to_owned(),
            Arc::new(ChannelHook {
                inbox: inbox.clone(),
                open: RwLock::default(),
                recent: Mutex::default(),
            }),
        );
        Ok(inbox)
    }

    /// Opens `channel`'s hook (its inbox made first, by [`Hooks::inbox`]) with what its
    /// door loaded, in place of what an earlier run of it loaded.
    pub(crate) fn open(&self, channel: &str, hook: OpenHook) {
        if let Some(found) = self
            .channels
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(channel)
        {
            *found.open.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(hook));
        }
    }

    /// Takes an event pushed to channel `channel`: its signature checked against
    /// `headers`, read by the adapter, kept in the channel's inbox, answered.
    pub async fn receive(
        &self,
        channel: &str,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> HookAnswer {
        let found = self
            .channels
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(channel)
            .cloned();
        let Some(found) = found else {
            return HookAnswer::not_signed();
        };
        let open = found.open.read().unwrap_or_else(|e| e.into_inner()).clone();
        let Some(hook) = open else {
            return HookAnswer::refused(503, "the channel is starting; try again later");
        };
        if body.len() > MAX_EVENT_BYTES {
            return HookAnswer::refused(413, format!("over the {MAX_EVENT_BYTES} bytes taken"));
        }
        if let Err(why) = hook.check.verify(headers, body, SystemTime::now()) {
            tracing::debug!(channel, "a pushed event was refused: {why}");
            return HookAnswer::not_signed();
        }
        let Ok(text) = std::str::from_utf8(body) else {
            return HookAnswer::refused(400, "the body is not UTF-8");
        };
        let received = match hook.host.adapter_receive(&hook.adapter, text).await {
            Ok(received) => received,
            Err(AdapterFailure::Platform(
                PlatformError::Malformed(m) | PlatformError::Denied(m),
            )) => return HookAnswer::refused(400, m),
            Err(err) => return HookAnswer::refused(503, err.to_string()),
        };
        if !received.messages.is_empty() {
            let senders: Vec<&str> = received
                .messages
                .iter()
                .map(|m| m.sender.id.as_str())
                .collect();
            match found.admit(body, &senders) {
                Admit::Keep => {}
                // Kept before: answered as then, not kept twice.
                Admit::Repeat => {
                    return HookAnswer {
                        status: 200,
                        body: received.answer,
                    };
                }
                Admit::Flood => {
                    return HookAnswer::refused(
                        429,
                        format!(
                            "over {EVENTS_PER_SENDER_PER_MINUTE} events a minute from one \
                             sender; try again later"
                        ),
                    );
                }
            }
            let inbox = found.inbox.clone();
            let event = text.to_owned();
            let failed = match tokio::task::spawn_blocking(move || inbox.push(&event)).await {
                Ok(Ok(_)) => None,
                Ok(Err(err)) => Some(err.to_string()),
                Err(panicked) => Some(panicked.to_string()),
            };
            if let Some(err) = failed {
                found.forget(body);
                tracing::warn!(channel, "a pushed event was not kept: {err}");
                return HookAnswer::refused(503, "the event could not be kept; try again later");
            }
        }
        HookAnswer {
            status: 200,
            body: received.answer,
        }
    }
}

/// Whether an event is kept.
enum Admit {
    Keep,
    Repeat,
    Flood,
}

impl ChannelHook {
    /// Whether the event `body`, from `senders`, is kept: not if it was kept within the
    /// signature's window, nor past a sender's rate. A kept one is remembered.
    fn admit(&self, body: &[u8], senders: &[&str]) -> Admit {
        let now = Instant::now();
        let digest: [u8; 32] = sha2::Sha256::digest(body).into();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        while recent
            .kept
            .front()
            .is_some_and(|(at, _)| now.duration_since(*at) > MAX_CLOCK_SKEW)
            || recent.kept.len() > RECENT_EVENTS
        {
            recent.kept.pop_front();
        }
        if recent.kept.iter().any(|(_, seen)| *seen == digest) {
            return Admit::Repeat;
        }
        let minute = Duration::from_secs(60);
        if recent.senders.len() > RECENT_EVENTS {
            recent.senders.retain(|_, times| {
                times
                    .back()
                    .is_some_and(|t| now.duration_since(*t) < minute)
            });
        }
        for sender in senders {
            let times = recent.senders.entry((*sender).to_owned()).or_default();
            while times
                .front()
                .is_some_and(|t| now.duration_since(*t) >= minute)
            {
                times.pop_front();
            }
            if times.len() >= EVENTS_PER_SENDER_PER_MINUTE {
                return Admit::Flood;
            }
        }
        for sender in senders {
            if let Some(times) = recent.senders.get_mut(*sender) {
                times.push_back(now);
            }
        }
        recent.kept.push_back((now, digest));
        Admit::Keep
    }

    /// Forgets `body` was kept: it was not, after all.
    fn forget(&self, body: &[u8]) {
        let digest: [u8; 32] = sha2::Sha256::digest(body).into();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.kept.retain(|(_, seen)| *seen != digest);
    }
}

impl SignatureCheck {
    /// Whether `body` with `headers` is signed by the platform, at a time near `now`.
    fn verify(
        &self,
        headers: &http::HeaderMap,
        body: &[u8],
        now: SystemTime,
    ) -> Result<(), String> {
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .ok_or_else(|| format!("no `{name}` header"))
        };
        let (timestamp_header, signature_header) = match self {
            SignatureCheck::Slack(_) => ("x-slack-request-timestamp", "x-slack-signature"),
            SignatureCheck::Discord(_) => ("x-signature-timestamp", "x-signature-ed25519"),
        };
        let timestamp = header(timestamp_header)?;
        let seconds: u64 = timestamp
            .parse()
            .map_err(|_| format!("`{timestamp_header}` is not a number of seconds"))?;
        let now = now.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        if now.abs_diff(seconds) > MAX_CLOCK_SKEW.as_secs() {
            return Err(format!(
                "`{timestamp_header}` is more than {} s from the host's clock",
                MAX_CLOCK_SKEW.as_secs()
            ));
        }
        let signature = header(signature_header)?;
        let bad = || "the signature does not check out".to_owned();
        match self {
            SignatureCheck::Slack(secret) => {
                let given = signature
                    .strip_prefix("v0=")
                    .and_then(crate::text::unhex)
                    .ok_or_else(bad)?;
                let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.value().as_bytes())
                    .expect("HMAC takes a key of any length");
                mac.update(format!("v0:{timestamp}:").as_bytes());
                mac.update(body);
                // Constant time: the comparison tells nothing of the expected value.
                mac.verify_slice(&given).map_err(|_| bad())
            }
            SignatureCheck::Discord(key) => {
                let given = crate::text::unhex(signature).ok_or_else(bad)?;
                let mut signed = timestamp.as_bytes().to_vec();
                signed.extend_from_slice(body);
                ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, key)
                    .verify(&signed, &given)
                    .map_err(|_| bad())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, String)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_discord_signature_checks_out_only_for_its_body_and_a_fresh_timestamp() {
        use ring::signature::KeyPair;
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
        let key: [u8; 32] = pair.public_key().as_ref().try_into().unwrap();
        let check = SignatureCheck::Discord(key);
        let now = SystemTime::now();
        let ts = now
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            .to_string();
        let body = br#"{"type":1}"#;
        let sign = |ts: &str, body: &[u8]| {
            let mut m = ts.as_bytes().to_vec();
            m.extend_from_slice(body);
            crate::text::hex(pair.sign(&m).as_ref())
        };
        let good = headers(&[
            ("x-signature-timestamp", ts.clone()),
            ("x-signature-ed25519", sign(&ts, body)),
        ]);
        assert!(check.verify(&good, body, now).is_ok());
        assert!(check.verify(&good, br#"{"type":2}"#, now).is_err());
        let later = now + MAX_CLOCK_SKEW + Duration::from_secs(1);
        assert!(
            check
                .verify(&good, body, later)
                .unwrap_err()
                .contains("clock")
        );
        assert!(check.verify(&headers(&[]), body, now).is_err());
    }
}
