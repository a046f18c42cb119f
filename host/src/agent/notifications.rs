//! Late-result fold-back: a worker's or branch's report that arrives after its requester
//! ended is kept in working memory and told to the channel in a turn of its own.
//!
//! The entry is `notifications/<kind>/<source>` and a line is added to
//! `notifications/index`, so the report survives even when no channel is left to tell.

use std::fmt;
use std::sync::Mutex;

use super::channel::ChannelInput;
use super::runtime::{ChannelHandle, Runtime};
use crate::ids::ProcessId;
use crate::text::truncate;

/// What a late report is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotificationKind {
    /// A finished worker's outcome, or a branch's conclusion.
    Result,
    /// A worker stopped on request or by its time limit.
    Status,
    /// A worker failed.
    Error,
    /// An interactive worker asks for input.
    InputRequired,
}

impl NotificationKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NotificationKind::Result => "result",
            NotificationKind::Status => "status",
            NotificationKind::Error => "error",
            NotificationKind::InputRequired => "input-required",
        }
    }
}

impl fmt::Display for NotificationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A late report, as its channel is told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Notification {
    /// e.g. `worker:3`.
    pub(crate) source: ProcessId,
    /// Who asked for it and had ended, e.g. `branch:2`.
    pub(crate) requester: ProcessId,
    pub(crate) kind: NotificationKind,
    /// Its working-memory key.
    pub(crate) key: String,
    pub(crate) text: String,
}

impl Notification {
    /// The message the channel's notification turn starts from.
    pub(crate) fn message(&self) -> String {
        format!(
            "[notification: {kind} from {source}, which {requester} asked for before it ended; \
             saved as {key}] {text}\nTell the user what arrived and from where.",
            kind = self.kind,
            source = self.source,
            requester = self.requester,
            key = self.key,
            text = self.text,
        )
    }
}

/// Serializes updates of `notifications/index` (a read, then a write).
#[derive(Debug, Default)]
pub(crate) struct NotificationIndex(Mutex<()>);

/// Sends `source`'s report `text` to conversation `channel` (through `handle`) as a
/// result; if the channel is gone, keeps it as a notification instead (see [`fold_back`]).
pub(crate) fn report(
    rt: &Runtime,
    channel: &ProcessId,
    handle: &ChannelHandle,
    source: &ProcessId,
    kind: NotificationKind,
    text: String,
) {
    let input = ChannelInput::Result {
        source: source.clone(),
        kind,
        text,
    };
    if let Err(ChannelInput::Result { text, .. }) = handle.try_send(input) {
        fold_back(rt, channel, source, channel, kind, &text);
    }
}

/// Keeps `text` from `source` (which `requester` asked for) in working memory and runs a
/// notification turn on `channel`; if the channel is gone, logs a warning and drops the
/// turn (the entry stays). Returns the notification.
pub(crate) fn fold_back(
    rt: &Runtime,
    channel: &ProcessId,
    source: &ProcessId,
    requester: &ProcessId,
    kind: NotificationKind,
    text: &str,
) -> Notification {
    let key = format!("notifications/{kind}/{source}");
    let line = format!("{kind} {source} (for {requester}): {}", truncate(text, 120));
    {
        let _index = rt.notification_index.0.lock().unwrap();
        let saved = rt.store.working_set(&key, text, None).and_then(|()| {
            let mut index = rt
                .store
                .working_get("notifications/index")?
                .unwrap_or_default();
            index.push_str(&line);
            index.push('\n');
            rt.store.working_set("notifications/index", &index, None)
        });
        if let Err(err) = saved {
            tracing::error!(%source, "cannot save a late report in working memory: {err}");
        }
    }
    let note = Notification {
        source: source.clone(),
        requester: requester.clone(),
        kind,
        key,
        text: text.to_owned(),
    };
    let told = rt
        .open_channel(channel)
        .is_some_and(|handle| handle.send(ChannelInput::Notification(note.clone())));
    if !told {
        tracing::warn!(
            %channel,
            %source,
            key = %note.key,
            "a late report arrived for a channel that is gone; kept in working memory, no turn runs"
        );
    }
    note
}
