//! A push channel's inbox: each event its platform pushed, once its signature checked,
//! kept as a file of its own (`DATA_DIR/channels/NAME.inbox/SEQ.event`) before the platform
//! is answered, and removed once every message it brought is stored. The door reads it as
//! it polls an adapter, its cursor the last sequence number taken.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use cap_std::fs::Dir;
use tokio::sync::Notify;

use super::files::{channels_dir, write_durably};

/// The most events an inbox holds: past it the platform is asked to try again later.
pub const MAX_INBOX_EVENTS: usize = 10_000;

/// The most bytes an inbox holds.
pub const MAX_INBOX_BYTES: u64 = 256 << 20;

/// The largest event kept: a platform's event is a few KiB.
pub const MAX_EVENT_BYTES: usize = 256 << 10;

/// Why an event was not kept.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    /// The inbox holds [`MAX_INBOX_EVENTS`] events or [`MAX_INBOX_BYTES`] not yet taken.
    #[error(
        "the channel's inbox holds {MAX_INBOX_EVENTS} events or {MAX_INBOX_BYTES} bytes not \
         yet taken"
    )]
    Full,
    /// The event is larger than [`MAX_EVENT_BYTES`].
    #[error("an event of {0} bytes is over the {MAX_EVENT_BYTES} kept")]
    TooLarge(usize),
    /// The file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The inbox's directory.
        path: PathBuf,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

/// One channel's inbox: one for the life of the process, so two writers never number
/// two events alike.
pub(crate) struct Inbox {
    dir: Dir,
    path: PathBuf,
    /// The numbering and what is held; locked while an event is written or removed.
    state: Mutex<Held>,
    arrived: Notify,
}

/// What an inbox holds, kept in memory so a push never lists the directory.
struct Held {
    /// The number the next event gets.
    next: u64,
    /// Each event held, by number, with its size.
    events: std::collections::BTreeMap<u64, u64>,
    /// Their bytes together.
    bytes: u64,
}

impl Inbox {
    /// The inbox of `channel` under `data_dir`, made if missing, with what it holds; its
    /// numbering goes on after `taken` (the channel's cursor), so an event pushed after a
    /// restart is never numbered as one already taken.
    pub(crate) fn open(data_dir: &Path, channel: &str, taken: u64) -> Result<Self, InboxError> {
        let (dir, path) =
            channels_dir(data_dir, Some(&format!("{channel}.inbox"))).map_err(|source| {
                InboxError::Io {
                    path: data_dir.join("channels").join(format!("{channel}.inbox")),
                    source,
                }
            })?;
        let mut inbox = Inbox {
            dir,
            path,
            state: Mutex::new(Held {
                next: 0,
                events: Default::default(),
                bytes: 0,
            }),
            arrived: Notify::new(),
        };
        let events = inbox.list()?;
        let held = inbox.state.get_mut().unwrap_or_else(|e| e.into_inner());
        held.next = events.keys().last().copied().unwrap_or(0).max(taken) + 1;
        held.bytes = events.values().sum();
        held.events = events;
        Ok(inbox)
    }

    /// Keeps `event`, durably, before the platform is told it arrived; its number.
    pub(crate) fn push(&self, event: &str) -> Result<u64, InboxError> {
        if event.len() > MAX_EVENT_BYTES {
            return Err(InboxError::TooLarge(event.len()));
        }
        let mut held = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let size = event.len() as u64;
        if held.events.len() >= MAX_INBOX_EVENTS || held.bytes + size > MAX_INBOX_BYTES {
            return Err(InboxError::Full);
        }
        let seq = held.next;
        write_durably(&self.dir, &file_name(seq), event.as_bytes()).map_err(|e| self.io(e))?;
        held.next += 1;
        held.events.insert(seq, size);
        held.bytes += size;
        drop(held);
        self.arrived.notify_waiters();
        Ok(seq)
    }

    /// The events after `seq`, at most `max`, oldest first; waits up to `wait` for one.
    pub(crate) async fn after(
        &self,
        seq: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<(u64, String)>, InboxError> {
        let arrived = self.arrived.notified();
        tokio::pin!(arrived);
        // Registered before the first look, so an event pushed in between wakes it.
        arrived.as_mut().enable();
        let events = self.read_after(seq, max)?;
        if !events.is_empty() || wait.is_zero() {
            return Ok(events);
        }
        let _ = tokio::time::timeout(wait, arrived).await;
        self.read_after(seq, max)
    }

    /// Removes the events up to `seq`: every message they brought is stored.
    pub(crate) fn remove_through(&self, seq: u64) -> Result<(), InboxError> {
        let mut held = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let taken: Vec<(u64, u64)> = held.events.range(..=seq).map(|(k, v)| (*k, *v)).collect();
        for (number, size) in taken {
            match self.dir.remove_file(file_name(number)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(self.io(e)),
            }
            held.events.remove(&number);
            held.bytes -= size;
        }
        Ok(())
    }

    fn read_after(&self, seq: u64, max: usize) -> Result<Vec<(u64, String)>, InboxError> {
        let numbers: Vec<u64> = {
            let held = self.state.lock().unwrap_or_else(|e| e.into_inner());
            held.events
                .range(seq.saturating_add(1)..)
                .map(|(k, _)| *k)
                .take(max)
                .collect()
        };
        numbers
            .into_iter()
            .map(|held| {
                let bytes = self.dir.read(file_name(held)).map_err(|e| self.io(e))?;
                let text = String::from_utf8(bytes).map_err(|_| {
                    self.io(std::io::Error::other(format!(
                        "{} is not UTF-8; it was not written by this host",
                        file_name(held)
                    )))
                })?;
                Ok((held, text))
            })
            .collect()
    }

    /// The events the directory holds, by number, with their sizes: read once, at open.
    fn list(&self) -> Result<std::collections::BTreeMap<u64, u64>, InboxError> {
        let mut held = std::collections::BTreeMap::new();
        for entry in self.dir.entries().map_err(|e| self.io(e))? {
            let entry = entry.map_err(|e| self.io(e))?;
            let name = entry.file_name();
            if let Some(seq) = name
                .to_str()
                .and_then(|n| n.strip_suffix(".event"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                let size = entry.metadata().map_err(|e| self.io(e))?.len();
                held.insert(seq, size);
            }
        }
        Ok(held)
    }

    fn io(&self, source: std::io::Error) -> InboxError {
        InboxError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

/// The file of event `seq`: zero-padded, so names sort as numbers do.
fn file_name(seq: u64) -> String {
    format!("{seq:020}.event")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_are_kept_in_order_read_after_a_number_and_removed_once_taken() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::open(dir.path(), "sl", 0).unwrap();
        assert_eq!(inbox.push("a").unwrap(), 1);
        assert_eq!(inbox.push("b").unwrap(), 2);
        let got = inbox.after(0, 10, Duration::ZERO).await.unwrap();
        assert_eq!(got, [(1, "a".to_owned()), (2, "b".to_owned())]);
        assert_eq!(inbox.after(1, 10, Duration::ZERO).await.unwrap().len(), 1);
        inbox.remove_through(1).unwrap();
        // Opened again (a restart): numbering goes on after what is held.
        let again = Inbox::open(dir.path(), "sl", 1).unwrap();
        assert_eq!(again.push("c").unwrap(), 3);
        assert_eq!(again.after(1, 10, Duration::ZERO).await.unwrap().len(), 2);
        // All taken and removed: numbering goes on after the cursor.
        again.remove_through(3).unwrap();
        let emptied = Inbox::open(dir.path(), "sl", 3).unwrap();
        assert_eq!(emptied.push("d").unwrap(), 4);
        assert!(matches!(
            again.push(&"x".repeat(MAX_EVENT_BYTES + 1)),
            Err(InboxError::TooLarge(_))
        ));
    }

    #[tokio::test]
    async fn a_reader_waiting_is_woken_by_a_push() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = std::sync::Arc::new(Inbox::open(dir.path(), "sl", 0).unwrap());
        let reader = {
            let inbox = inbox.clone();
            tokio::spawn(async move { inbox.after(0, 10, Duration::from_secs(600)).await })
        };
        // Whether the reader is waiting yet or not, the push reaches it.
        inbox.push("late").unwrap();
        let got = reader.await.unwrap().unwrap();
        assert_eq!(got, [(1, "late".to_owned())]);
    }
}
