//! How a branch's or worker's report reaches its conversation: as an input of the channel
//! when the one who asked is still there, folded back into working memory (and told in a
//! turn of its own) when not.

use super::context::Context;
use super::events::Event;
use super::inbox::{ChannelHandle, ChannelInput};
use super::notifications::{Notification, NotificationKind};
use crate::ids::ProcessId;
use crate::text::truncate;

impl Context {
    /// Sends `source`'s report `text` to conversation `channel`, or folds it back (see
    /// [`Context::fold_back`]) when `requester` (the branch that asked; `None`: the
    /// channel did) has ended.
    pub(crate) async fn tell(
        &self,
        channel: &ProcessId,
        handle: &ChannelHandle,
        source: &ProcessId,
        requester: Option<&ProcessId>,
        kind: NotificationKind,
        text: String,
    ) {
        match requester.filter(|branch| !self.supervisor.branch_alive(branch)) {
            Some(requester) => {
                self.fold_back(channel, source, requester, kind, &text)
                    .await;
            }
            None => self.report(channel, handle, source, kind, text).await,
        }
    }

    /// Sends `source`'s report `text` to conversation `channel` (through `handle`) as a
    /// result; if the channel is gone, keeps it as a notification instead (see
    /// [`Context::fold_back`]).
    pub(crate) async fn report(
        &self,
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
            self.fold_back(channel, source, channel, kind, &text).await;
        }
    }

    /// Keeps `text` from `source` (which `requester` asked for) in working memory and runs a
    /// notification turn on `channel`; if the channel is gone, logs a warning and drops the
    /// turn (the entry stays). Reports [`Event::NotificationFolded`] and returns the
    /// notification.
    pub(crate) async fn fold_back(
        &self,
        channel: &ProcessId,
        source: &ProcessId,
        requester: &ProcessId,
        kind: NotificationKind,
        text: &str,
    ) -> Notification {
        let key = format!("notifications/{kind}/{source}");
        let line = format!("{kind} {source} (for {requester}): {}", truncate(text, 120));
        {
            let _index = self.notification_index.0.lock().await;
            let memory = &self.services.memory;
            let saved = async {
                memory.working_set(&key, text, None).await?;
                let mut index = memory
                    .working_get("notifications/index")
                    .await?
                    .unwrap_or_default();
                index.push_str(&line);
                index.push('\n');
                memory
                    .working_set("notifications/index", &index, None)
                    .await
            };
            if let Err(err) = saved.await {
                tracing::error!(%source, "cannot save a late report in working memory: {err}");
            }
        }
        let folded = Event::NotificationFolded {
            channel: channel.clone(),
            source: source.clone(),
            requester: requester.clone(),
            kind,
            key: key.clone(),
        };
        let handle = self.supervisor.channel(channel);
        // The exchanges that follow `source` hear of it, as of its other work.
        match &handle {
            Some(handle) => self.emit_to(&handle.audience.of(source), folded),
            None => self.emit(folded),
        }
        let note = Notification {
            source: source.clone(),
            requester: requester.clone(),
            kind,
            key,
            text: text.to_owned(),
        };
        let told =
            handle.is_some_and(|handle| handle.send(ChannelInput::Notification(note.clone())));
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
}
