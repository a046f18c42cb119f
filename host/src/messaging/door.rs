//! The door itself: each configured channel's adapter polled, its messages sent to their
//! conversations through the exchange, the answers sent back, the adapter restarted with
//! backoff when it fails.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::conversation::{conversation_for, label_of, message_key, text_for};
use super::cursor::Cursor;
use super::hooks::{Hooks, OpenHook, SignatureCheck};
use super::inbox::Inbox;
use super::split::split;
use crate::agent::{ChatStep, ConversationError, End, ReplyPart, Runtime, UserMessage};
use crate::config::{ChannelSpec, HookSignature};
use crate::ids::ProcessId;
use crate::net::mail::{MailError, Mailbox, Recipients};
use crate::plugin::PluginHost;
use crate::plugin::adapter::{
    AdapterFailure, AdapterGrants, AdapterLoadError, Batch, Feature, Inbound, LoadedAdapter,
    Outbound, PlatformError,
};
use crate::policy::ProcessKind;
use crate::services::{AuditRecord, Receipt};
use crate::telemetry::TraceParent;

/// The first wait before an adapter that failed is started again; it doubles up to
/// [`MAX_BACKOFF`] and starts over after a poll that worked.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// The longest wait before an adapter that keeps failing is started again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The longest a platform's rate limit is waited out at once.
const MAX_RATE_WAIT: Duration = Duration::from_secs(600);

/// The least time between two polls that found nothing: an adapter that does not wait
/// for messages is not let spin.
const MIN_EMPTY_POLL: Duration = Duration::from_millis(250);

/// The most messages one poll may bring: an adapter pages past it.
pub const MAX_BATCH: usize = 1000;

/// The longest id (of a message, room, thread or sender) taken: a longer one is refused.
pub const MAX_ID_BYTES: usize = 256;

/// The longest context an adapter keeps with a message for its replies.
pub const MAX_CONTEXT_BYTES: usize = 4096;

/// Times a reply is tried again while the platform says to wait.
const SEND_ATTEMPTS: u32 = 5;

/// The most messages one sender gets taken in a minute; past it their messages are
/// refused (a flood never reaches the model).
pub const SENDER_MESSAGES_PER_MINUTE: usize = 20;

/// The channels `capstan serve` runs, each on a task of its own; dropped, they stop.
pub struct Channels {
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// A channel whose adapter cannot run as configured.
#[derive(Debug, thiserror::Error)]
#[error("[channels.{channel}]: {source}")]
pub struct ChannelError {
    /// The channel's name.
    pub channel: String,
    /// Why it cannot run.
    #[source]
    pub source: ChannelFault,
}

/// What keeps a channel from running.
#[derive(Debug, thiserror::Error)]
pub enum ChannelFault {
    /// Its adapter does not load.
    #[error(transparent)]
    Adapter(#[from] AdapterLoadError),
    /// Its `email` table cannot be used.
    #[error("email: {0}")]
    Mailbox(#[from] MailError),
}

impl Channels {
    /// Loads each channel's adapter as [`Channels::start`] will: a table that cannot run
    /// (no such file, not an adapter, an adapter needing what the table does not grant,
    /// settings it refuses) is an error before anything is served, not a channel that
    /// keeps failing. What may pass by itself (the platform down) shows only at a poll.
    pub async fn check(host: &PluginHost, specs: &[ChannelSpec]) -> Result<(), ChannelError> {
        for spec in specs {
            let fault = |source: ChannelFault| ChannelError {
                channel: spec.name.clone(),
                source,
            };
            mailbox_of(host, spec).map_err(|e| fault(e.into()))?;
            host.load_adapter(&spec.adapter, spec.settings.clone(), grants_of(spec))
                .await
                .map_err(|e| fault(e.into()))?;
        }
        Ok(())
    }

    /// Starts every channel of `specs`: its adapter loaded from `host` and polled (or its
    /// hook opened in `hooks`, for a platform that pushes its events), its messages sent
    /// to `runtime`'s conversations, its cursors kept in `data_dir`. A channel whose
    /// adapter cannot load or fails is tried again with backoff; no channel stops the host.
    pub fn start(
        runtime: Arc<Runtime>,
        host: Arc<PluginHost>,
        specs: Vec<ChannelSpec>,
        data_dir: PathBuf,
        hooks: Arc<Hooks>,
    ) -> Self {
        let stop = CancellationToken::new();
        let tasks = specs
            .into_iter()
            .map(|spec| {
                let door = Door {
                    runtime: runtime.clone(),
                    host: host.clone(),
                    data_dir: data_dir.clone(),
                    rates: Mutex::default(),
                    hooks: hooks.clone(),
                    spec,
                };
                tokio::spawn(door.supervise(stop.clone()))
            })
            .collect();
        Channels { stop, tasks }
    }

    /// How many channels run.
    pub fn len(&self) -> usize {
        self.tasks.len()
    }

    /// Whether none run.
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Stops every channel: a message being answered is left to its exchange, which
    /// ends with the runtime; its cursor is not moved, so it comes again at the next start
    /// (and is answered, not taken twice).
    pub async fn stop(mut self) {
        self.stop.cancel();
        for task in std::mem::take(&mut self.tasks) {
            let _ = task.await;
        }
    }
}

impl Drop for Channels {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// What `spec`'s adapter may use, but its mailbox ([`mailbox_of`]).
pub fn grants_of(spec: &ChannelSpec) -> AdapterGrants {
    AdapterGrants {
        channel: spec.name.clone(),
        net: spec.net.clone(),
        secrets: spec.secrets.clone(),
        mail: None,
    }
}

/// The mailbox of `spec`'s `email` table, if it has one: its letters go only to the
/// channel's senders (`allow` and `admins`).
pub fn mailbox_of(
    host: &PluginHost,
    spec: &ChannelSpec,
) -> Result<Option<Arc<Mailbox>>, MailError> {
    let Some(account) = &spec.email else {
        return Ok(None);
    };
    let password = host
        .network()
        .secrets()
        .get(&account.password)
        .cloned()
        .ok_or_else(|| {
            MailError::Denied(format!(
                "its password secret `{}` has no value in this host",
                account.password
            ))
        })?;
    let recipients = if spec.allow.names() == ["*"] {
        Recipients::Anyone
    } else {
        Recipients::Only(
            spec.allow
                .names()
                .into_iter()
                .chain(spec.admins.names())
                .collect(),
        )
    };
    Mailbox::new(&spec.name, account.clone(), password, recipients).map(Some)
}

/// One channel and what it answers through.
struct Door {
    runtime: Arc<Runtime>,
    host: Arc<PluginHost>,
    data_dir: PathBuf,
    spec: ChannelSpec,
    /// When each sender's recent messages came, for [`SENDER_MESSAGES_PER_MINUTE`].
    rates: Mutex<HashMap<String, Vec<Instant>>>,
    /// Where the channel's hook is opened, for a platform that pushes its events.
    hooks: Arc<Hooks>,
}

/// The most pushed events read into one batch.
const EVENTS_PER_BATCH: usize = 100;

/// Why a channel's adapter stopped for now.
enum Halt {
    /// Something failed: started again after the backoff.
    Failed(String),
    /// A poll worked before it: the backoff starts over.
    FailedAfterWork(String),
}

impl Door {
    /// Runs the channel until `stop`: loaded, polled, started again with backoff.
    async fn supervise(self, stop: CancellationToken) {
        let name = self.spec.name.clone();
        let mut backoff = FIRST_BACKOFF;
        loop {
            let halted = tokio::select! {
                () = stop.cancelled() => return,
                halted = self.run() => halted,
            };
            let why = match halted {
                Halt::Failed(why) => why,
                Halt::FailedAfterWork(why) => {
                    backoff = FIRST_BACKOFF;
                    why
                }
            };
            tracing::warn!(
                channel = %name,
                "messaging channel stopped: {why}; starting it again in {:.1} s",
                backoff.as_secs_f64()
            );
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Loads the adapter and polls it until something fails.
    async fn run(&self) -> Halt {
        let spec = &self.spec;
        let mail = match mailbox_of(&self.host, spec) {
            Ok(mail) => mail,
            Err(err) => return Halt::Failed(format!("[channels.{}] email: {err}", spec.name)),
        };
        let grants = AdapterGrants {
            mail,
            ..grants_of(spec)
        };
        let adapter = match self
            .host
            .load_adapter(&spec.adapter, spec.settings.clone(), grants)
            .await
        {
            Ok(adapter) => Arc::new(adapter),
            Err(err) => return Halt::Failed(format!("[channels.{}]: {err}", spec.name)),
        };
        let cursors = match Cursor::open(&self.data_dir, &spec.name) {
            Ok(cursors) => cursors,
            Err(err) => {
                return Halt::Failed(format!(
                    "cannot keep its cursor in {}: {err}",
                    self.data_dir.join("channels").display()
                ));
            }
        };
        let mut cursor = match cursors.load() {
            Ok(cursor) => cursor,
            Err(err) => return Halt::Failed(format!("{}: {err}", cursors.path().display())),
        };
        let inbox = match &spec.hook {
            None => None,
            Some(signature) => match self.open_hook(&adapter, signature, cursor.as_deref()) {
                Ok(inbox) => Some(inbox),
                Err(why) => return Halt::Failed(why),
            },
        };
        tracing::info!(
            channel = %spec.name,
            platform = %adapter.platform().name,
            "messaging channel started"
        );
        // A long poll ends before the egress or the call's deadline would cut it.
        let limits = self
            .host
            .network()
            .settings()
            .for_tool(&adapter.platform().name);
        let ceiling = limits
            .first_byte_timeout
            .min(limits.request_timeout)
            .min(self.host.limits().deadline)
            .saturating_sub(Duration::from_secs(1));
        let wait_ms = spec
            .poll_wait_ms
            .min(u32::try_from(ceiling.as_millis()).unwrap_or(u32::MAX));
        if wait_ms < spec.poll_wait_ms {
            tracing::warn!(
                channel = %spec.name,
                "polls wait {:.1} s, not channels.{}.poll_wait_secs: the egress's timeouts \
                 ([net] first_byte_timeout_secs, request_timeout_secs) or the call's deadline \
                 (limits.tool_deadline_secs) would cut a longer one",
                f64::from(wait_ms) / 1000.0,
                spec.name
            );
        }
        let mut worked = false;
        let halt = |worked: bool, why: String| {
            if worked {
                Halt::FailedAfterWork(why)
            } else {
                Halt::Failed(why)
            }
        };
        loop {
            let began = Instant::now();
            let polled = match &inbox {
                Some(inbox) => {
                    self.read_inbox(&adapter, inbox, cursor.as_deref(), wait_ms)
                        .await
                }
                None => {
                    self.host
                        .adapter_poll(&adapter, cursor.as_deref(), wait_ms)
                        .await
                }
            };
            let batch = match polled {
                Ok(batch) => batch,
                Err(AdapterFailure::Platform(PlatformError::RateLimited(ms))) => {
                    tokio::time::sleep(Duration::from_millis(ms).min(MAX_RATE_WAIT)).await;
                    continue;
                }
                Err(err) => return halt(worked, format!("poll failed: {err}")),
            };
            let empty = batch.messages.is_empty();
            if batch.messages.len() > MAX_BATCH {
                return halt(
                    worked,
                    format!(
                        "a poll brought {} messages, more than the {MAX_BATCH} a batch may \
                         hold; the adapter must page",
                        batch.messages.len()
                    ),
                );
            }
            if !empty && (batch.cursor.is_none() || batch.cursor == cursor) {
                // Its messages would come again at once, and again: refused before any is
                // taken.
                return halt(
                    worked,
                    "a poll brought messages without moving its cursor past them".into(),
                );
            }
            // Each conversation's messages in order, one after the other (a reply answers
            // the message before the next is taken); conversations side by side.
            let mut by_conversation: HashMap<ProcessId, Vec<Inbound>> = HashMap::new();
            let mut order = Vec::new();
            for message in batch.messages {
                let id = conversation_for(spec, &message, self.kind_of(&message));
                let queue = by_conversation.entry(id.clone()).or_default();
                if queue.is_empty() {
                    order.push(id);
                }
                queue.push(message);
            }
            let by_conversation = order
                .into_iter()
                .filter_map(|id| by_conversation.remove(&id));
            let answered = futures_util::future::join_all(by_conversation.map(async |messages| {
                for message in messages {
                    self.take(&adapter, message).await?;
                }
                Ok::<(), String>(())
            }))
            .await;
            if let Some(why) = answered.into_iter().find_map(Result::err) {
                // The cursor stays: the batch comes again, and what was taken of it is
                // answered again, never taken twice.
                return halt(worked, why);
            }
            if let Some(next) = batch.cursor
                && cursor.as_deref() != Some(next.as_str())
            {
                if let Err(err) = cursors.store(&next) {
                    return halt(worked, format!("{}: {err}", cursors.path().display()));
                }
                // Every message its events brought is stored: they are not needed again.
                if let Some(inbox) = &inbox
                    && let Ok(taken) = next.parse::<u64>()
                    && let Err(err) = inbox.remove_through(taken)
                {
                    tracing::warn!(channel = %spec.name, "taken events not removed: {err}");
                }
                cursor = Some(next);
            }
            // Only a whole batch stored counts as work: a batch that keeps failing backs
            // off, however well its poll went.
            worked = true;
            if empty {
                tokio::time::sleep(MIN_EMPTY_POLL.saturating_sub(began.elapsed())).await;
            }
        }
    }

    /// Opens the channel's hook with `adapter` and the check of the platform's signature;
    /// its inbox, made at the first run (numbered after `cursor`), kept across runs.
    fn open_hook(
        &self,
        adapter: &Arc<LoadedAdapter>,
        signature: &HookSignature,
        cursor: Option<&str>,
    ) -> Result<Arc<Inbox>, String> {
        let spec = &self.spec;
        let taken = match cursor {
            None => 0,
            Some(text) => text.parse::<u64>().map_err(|_| {
                format!(
                    "its cursor `{}` is not the number of a pushed event; remove \
                     {}/channels/{}.cursor to start over",
                    crate::text::echo_name(text, 40),
                    self.data_dir.display(),
                    spec.name
                )
            })?,
        };
        let check = match signature {
            HookSignature::Slack { secret } => SignatureCheck::Slack(
                self.host
                    .network()
                    .secrets()
                    .get(secret)
                    .cloned()
                    .ok_or_else(|| format!("its hook's secret `{secret}` has no value"))?,
            ),
            HookSignature::Discord { public_key } => SignatureCheck::Discord(*public_key),
        };
        let inbox = self
            .hooks
            .inbox(&spec.name, || {
                Inbox::open(&self.data_dir, &spec.name, taken)
            })
            .map_err(|e| e.to_string())?;
        self.hooks.open(
            &spec.name,
            OpenHook {
                host: self.host.clone(),
                adapter: adapter.clone(),
                check,
            },
        );
        Ok(inbox)
    }

    /// The next batch of a push channel: the events its inbox holds after `cursor` (up to
    /// [`EVENTS_PER_BATCH`], waiting up to `wait_ms` for one), read by the adapter. An
    /// event it cannot read is passed over (it was refused when it came, unless the
    /// adapter changed since).
    async fn read_inbox(
        &self,
        adapter: &LoadedAdapter,
        inbox: &Inbox,
        cursor: Option<&str>,
        wait_ms: u32,
    ) -> Result<Batch, AdapterFailure> {
        let failed = |why: String| AdapterFailure::Platform(PlatformError::Failed(why));
        let after = cursor.and_then(|c| c.parse::<u64>().ok()).unwrap_or(0);
        let wait = Duration::from_millis(u64::from(wait_ms));
        let events = inbox
            .after(after, EVENTS_PER_BATCH, wait)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let mut messages = Vec::new();
        let mut last = after;
        for (seq, event) in events {
            match self.host.adapter_receive(adapter, &event).await {
                Ok(received) => messages.extend(received.messages),
                Err(AdapterFailure::Platform(
                    PlatformError::Malformed(why) | PlatformError::Denied(why),
                )) => tracing::warn!(
                    channel = %self.spec.name,
                    "pushed event {seq} passed over: the adapter cannot read it: {why}"
                ),
                Err(err) => return Err(err),
            }
            last = seq;
            if messages.len() >= MAX_BATCH {
                break;
            }
        }
        Ok(Batch {
            messages,
            cursor: if last == after {
                cursor.map(str::to_owned)
            } else {
                Some(last.to_string())
            },
        })
    }

    /// Takes one message in: refused, ignored, or sent to its conversation and answered.
    /// An error only when the message may not be stored: its batch must come again.
    async fn take(&self, adapter: &LoadedAdapter, message: Inbound) -> Result<(), String> {
        let spec = &self.spec;
        let sender = message.sender.id.clone();
        let kind = self.kind_of(&message);
        let admin = kind == ProcessKind::Cortex;
        let conversation = conversation_for(spec, &message, kind);
        let chars = message.text.chars().count();
        let (conversation, message) = (&conversation, &message);
        let oversized = [
            &message.id,
            &message.room,
            &message.sender.id,
            message.thread.as_deref().unwrap_or_default(),
        ]
        .iter()
        .any(|field| field.len() > MAX_ID_BYTES)
            || message
                .context
                .as_ref()
                .is_some_and(|c| c.len() > MAX_CONTEXT_BYTES);
        let note = |step: ChatStep, detail: String| {
            self.runtime
                .note_chat(conversation, &spec.name, step, &sender, chars);
            async move {
                self.audit(conversation, "chat.receive", message, step, &detail, chars)
                    .await
            }
        };
        if !admin && !spec.allow.contains(&sender) {
            note(
                ChatStep::Refused,
                "the sender is not on the channel's `allow` list".into(),
            )
            .await;
            return Ok(());
        }
        if oversized {
            note(
                ChatStep::Refused,
                format!(
                    "an id of it is longer than {MAX_ID_BYTES} bytes, or its context than \
                     {MAX_CONTEXT_BYTES}"
                ),
            )
            .await;
            return Ok(());
        }
        // Chatter not for the bot counts against no one's rate.
        if spec.addressed_only && !message.direct && !message.addressed {
            note(ChatStep::Ignored, "it does not speak to the bot".into()).await;
            return Ok(());
        }
        if !self.admit(&sender) {
            note(
                ChatStep::Refused,
                format!("over {SENDER_MESSAGES_PER_MINUTE} messages a minute from the sender"),
            )
            .await;
            return Ok(());
        }
        note(ChatStep::Taken, String::new()).await;
        if adapter.supports(Feature::Typing) {
            // Only a courtesy: a failure changes nothing.
            let _ = self
                .host
                .adapter_typing(adapter, &message.room, message.thread.as_deref())
                .await;
        }
        let sent = UserMessage {
            text: text_for(spec, message),
            key: Some(message_key(spec, message)),
            trace: TraceParent::none(),
            label: label_of(spec, message),
        };
        let mut exchange = match self.runtime.exchange(conversation, sent).await {
            Ok(exchange) => exchange,
            // The host's limit on open conversations: this message is refused, the
            // channel goes on (halting would refuse every other sender's too).
            Err(ConversationError::TooMany(full)) => {
                note(ChatStep::Refused, full.to_string()).await;
                return Ok(());
            }
            Err(err) => return Err(format!("{conversation} did not take a message: {err}")),
        };
        let mut replies = Vec::new();
        let mut repeated = false;
        let end = loop {
            match exchange.next().await {
                Some(ReplyPart::Reply { text, .. }) => replies.push(text),
                Some(ReplyPart::Repeated { .. }) => repeated = true,
                Some(ReplyPart::End(end)) => break end,
                Some(_) => {}
                None => break End::Lost,
            }
        };
        if !end.is_stored() {
            return Err(format!("{conversation}: {end}"));
        }
        // Taken before (its batch came again): its answer went out then, and is not sent
        // twice.
        if repeated {
            return Ok(());
        }
        for reply in replies {
            self.reply(adapter, conversation, message, &reply).await;
        }
        Ok(())
    }

    /// Sends `reply` to `message`'s room (and thread), cut to what the platform takes,
    /// waiting out its rate limits.
    async fn reply(
        &self,
        adapter: &LoadedAdapter,
        conversation: &ProcessId,
        message: &Inbound,
        reply: &str,
    ) {
        let max = adapter.platform().max_text as usize;
        let mut pieces: std::collections::VecDeque<String> = split(reply, max).into();
        let mut first = true;
        let mut attempts = 0;
        while let Some(piece) = pieces.pop_front() {
            let outbound = Outbound {
                room: message.room.clone(),
                thread: message.thread.clone(),
                reply_to: first.then(|| message.id.clone()),
                text: piece.clone(),
                context: message.context.clone(),
            };
            let chars = piece.chars().count();
            let step = match self.host.adapter_send(adapter, &outbound).await {
                Ok(_) => {
                    first = false;
                    attempts = 0;
                    (ChatStep::Sent, String::new())
                }
                Err(AdapterFailure::Platform(PlatformError::RateLimited(ms)))
                    if attempts + 1 < SEND_ATTEMPTS =>
                {
                    attempts += 1;
                    tokio::time::sleep(Duration::from_millis(ms).min(MAX_RATE_WAIT)).await;
                    pieces.push_front(piece);
                    continue;
                }
                Err(AdapterFailure::Platform(PlatformError::TooLong(limit))) if chars >= 128 => {
                    // The platform counts otherwise than in characters (UTF-16 units):
                    // cut again, to its limit or to half.
                    let max = (limit as usize).min(chars / 2).max(64);
                    for smaller in split(&piece, max).into_iter().rev() {
                        pieces.push_front(smaller);
                    }
                    continue;
                }
                Err(err) => (ChatStep::Failed, err.to_string()),
            };
            self.runtime
                .note_chat(conversation, &self.spec.name, step.0, &message.room, chars);
            self.audit_send(conversation, message, step.0, &step.1, chars)
                .await;
            if step.0 == ChatStep::Failed {
                tracing::warn!(
                    channel = %self.spec.name,
                    "a reply to {} could not be sent: {}",
                    crate::text::one_line(&message.room),
                    crate::text::one_line(&step.1)
                );
                return;
            }
        }
    }

    /// The kind of conversation `message` goes to: the admin's (cortex) for the channel's
    /// `admins` in a direct message, a user channel for everything else (the cortex's
    /// answers never go to a room with others in it).
    fn kind_of(&self, message: &Inbound) -> ProcessKind {
        if message.direct && self.spec.admins.contains(&message.sender.id) {
            ProcessKind::Cortex
        } else {
            ProcessKind::Channel
        }
    }

    /// Whether `sender` may have one more message taken now.
    fn admit(&self, sender: &str) -> bool {
        let now = Instant::now();
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        // Forget senders quiet for a minute, so a flood of names cannot grow the map.
        if rates.len() > 10_000 {
            rates.retain(|_, times| {
                times
                    .last()
                    .is_some_and(|t| now.duration_since(*t) < Duration::from_secs(60))
            });
        }
        let times = rates.entry(sender.to_owned()).or_default();
        times.retain(|t| now.duration_since(*t) < Duration::from_secs(60));
        if times.len() >= SENDER_MESSAGES_PER_MINUTE {
            return false;
        }
        times.push(now);
        true
    }

    /// The audit row of a message that came in.
    async fn audit(
        &self,
        conversation: &ProcessId,
        tool: &str,
        message: &Inbound,
        step: ChatStep,
        detail: &str,
        chars: usize,
    ) {
        let arguments = serde_json::json!({
            "room": message.room,
            "thread": message.thread,
            "message": message.id,
            "sender": message.sender.id,
            "forwarded_from": message.forwarded_from.as_ref().map(|first| &first.id),
            "chars": chars,
            "attachments": message.attachments.len(),
        });
        self.record(conversation, tool, arguments, step, detail)
            .await;
    }

    /// The audit row of a reply that went out, or did not.
    async fn audit_send(
        &self,
        conversation: &ProcessId,
        message: &Inbound,
        step: ChatStep,
        detail: &str,
        chars: usize,
    ) {
        let arguments = serde_json::json!({
            "room": message.room,
            "thread": message.thread,
            "reply_to": message.id,
            "chars": chars,
        });
        self.record(conversation, "chat.send", arguments, step, detail)
            .await;
    }

    async fn record(
        &self,
        conversation: &ProcessId,
        tool: &str,
        arguments: serde_json::Value,
        step: ChatStep,
        detail: &str,
    ) {
        let row = AuditRecord {
            conversation: Some(conversation.session().to_string()),
            process: format!("adapter:{}", self.spec.name),
            tool: tool.to_owned(),
            grants: String::new(),
            arguments: arguments.to_string(),
            outcome: step.as_str().to_owned(),
            detail: detail.to_owned(),
            duration_us: 0,
            receipt: Receipt::default(),
        };
        if let Err(err) = self.runtime.services().audit.record(row).await {
            tracing::warn!(channel = %self.spec.name, "an audit row was not written: {err}");
        }
    }
}
