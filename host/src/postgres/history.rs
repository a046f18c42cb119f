//! Conversation history. Each channel has a head row holding its next sequence number:
//! an append takes its numbers from it under the row's lock, so appends from several
//! hosts to one channel interleave whole, and a replace takes the same lock.

use std::sync::LazyLock;

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use tokio_postgres::error::Severity;

use super::Postgres;
use super::prepared::Prepared;
use super::rows::{parsed, readable};
use super::sessions::{Fence, owner_in, run_is_live};
use crate::ids::SessionKey;
use crate::services::Operation;
use crate::services::{ConversationSummary, History, HistoryEntry, ServiceError};

/// An append in one statement, made and committed in one round trip: it checks the
/// fence, takes the channel's numbers from its head row under the row's lock, and writes
/// the rows; it writes nothing unless the fence holds and the history is as long as the
/// writer knows it to be.
///
/// `$1` channel, `$2` the run (NULL: unfenced), `$3` its epoch, `$4` the length the
/// writer knows (NULL: unchecked), `$5` the messages. Its one row: the session's owner,
/// epoch and whether the run is live (NULL when unfenced or nobody owns it), and the
/// first number written (NULL if nothing was).
///
/// Every writing part reads from `held`: a writing CTE runs whether or not the query
/// reads it. The session's row is held `FOR SHARE` until the commit, so a takeover waits
/// for it, and one committed first is seen.
static APPEND: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH fence AS (
             SELECT owner_run, epoch, {live} AS live FROM sessions
             WHERE channel = $1 AND $2::BIGINT IS NOT NULL FOR SHARE
         ),
         held AS (
             SELECT 1 WHERE $2::BIGINT IS NULL
             UNION ALL
             SELECT 1 FROM fence WHERE owner_run = $2 AND epoch = $3 AND live
         ),
         head AS (
             INSERT INTO history_heads (channel, next)
             SELECT $1, cardinality($5::TEXT[]) FROM held
             WHERE $4::BIGINT IS NULL OR $4 = 0
                OR EXISTS (SELECT 1 FROM history_heads WHERE channel = $1)
             ON CONFLICT (channel) DO UPDATE SET next = history_heads.next + excluded.next
                 WHERE $4::BIGINT IS NULL OR history_heads.next = $4
             RETURNING next - cardinality($5::TEXT[]) AS first
         ),
         written AS (
             INSERT INTO history (channel, seq, message)
             SELECT $1, head.first + n - 1, message
             FROM head, unnest($5::TEXT[]) WITH ORDINALITY AS m(message, n)
         )
         SELECT fence.owner_run, fence.epoch, fence.live, (SELECT first FROM head)
         FROM (SELECT 1) AS one LEFT JOIN fence ON true",
        live = run_is_live("$2")
    )
});

impl Postgres {
    /// Writes `channel`'s history. While this host has a run, the write is fenced: the
    /// run must own the session (claiming it if nobody live does), under the epoch it
    /// claimed; a write refused by the fence forgets the epoch, so the next write claims
    /// again. An append is one statement ([`APPEND`]); a replace, one transaction.
    async fn write_history(
        &self,
        channel: &str,
        write: Write,
        messages: &[String],
    ) -> Result<(), ServiceError> {
        let fence = self.fence(channel, None).await?;
        match write {
            Write::Append => {
                let known = fence.and_then(|_| self.known_length(channel));
                let first = self.append_checked(channel, fence, known, messages).await?;
                if fence.is_some() {
                    self.note_length(channel, first + messages.len() as i64);
                }
                Ok(())
            }
            Write::Replace => self.replace_history(channel, fence, messages).await,
        }
    }

    /// Appends `messages` to `channel` by [`APPEND`], under `fence` (if any) and only if
    /// the history holds `known` messages (if given): the number of the first. A refusal
    /// by the fence forgets the epoch; a write never answered is noted as such.
    pub(super) async fn append_checked(
        &self,
        channel: &str,
        fence: Option<Fence>,
        known: Option<i64>,
        messages: &[String],
    ) -> Result<i64, ServiceError> {
        let failed = |err| self.failed(Operation::HistoryAppend, err);
        let client = self.client().await?;
        let (run, epoch) = fence.map_or((None, None), |f| {
            (Some(f.run.get() as i64), Some(f.epoch.get() as i64))
        });
        // The host's own record of the session, touched only for a write under its own
        // run (`append_fenced` may write under another).
        let own = fence.filter(|f| self.current_run() == Some(f.run));
        // Prepared apart: a failure to prepare sent no write.
        let append = client.prepare_cached(&APPEND).await.map_err(failed)?;
        let row = match client
            .query_one(&append, &[&channel, &run, &epoch, &known, &messages])
            .await
        {
            Ok(row) => row,
            Err(err) => {
                // Only an error the statement answered with rolled it back; without one
                // (the connection went down, or the server failed past its commit) it
                // may have landed.
                let rolled_back = err
                    .as_db_error()
                    .is_some_and(|db| db.parsed_severity() == Some(Severity::Error));
                if let Some(fence) = own
                    && !rolled_back
                {
                    self.note_unanswered(channel, &fence);
                }
                return Err(failed(err).into());
            }
        };
        if let Some(first) = row.get::<_, Option<i64>>(3) {
            return Ok(first);
        }
        if let Some(fence) = fence
            && let Some(refused) = fence.refusal(channel, owner_in(&row))
        {
            if own.is_some() {
                self.forget_epoch(channel, fence.epoch);
            }
            return Err(refused);
        }
        // The fence held: the history is not as long as this host knew it.
        let stored: i64 = client
            .query_opt_cached(
                "SELECT next FROM history_heads WHERE channel = $1",
                &[&channel],
            )
            .await
            .map_err(failed)?
            .map_or(0, |row| row.get(0));
        Err(changed_since_read(
            channel,
            known.unwrap_or_default(),
            stored,
            Write::Append,
        ))
    }

    /// Replaces `channel`'s history with `messages`, in one transaction under `fence`
    /// (if any) and the head row's lock.
    async fn replace_history(
        &self,
        channel: &str,
        fence: Option<Fence>,
        messages: &[String],
    ) -> Result<(), ServiceError> {
        let failed = |err| self.failed(Operation::HistoryReplace, err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        // The fence's check and the history as stored, under its head row's lock, in
        // one round trip, and the write in one more. A refusal rolls all back.
        // The head row is made if there is none, so that it is locked either way: with no
        // row to lock, an append committed while the write ran would keep rows past the
        // new end that the write's DELETE never saw.
        let (_, stored) = tokio::try_join!(biased; self.hold(&tx, channel, fence), async {
            tx.query_one_cached(
                "INSERT INTO history_heads (channel, next) VALUES ($1, 0)
                 ON CONFLICT (channel) DO UPDATE SET next = history_heads.next
                 RETURNING next",
                &[&channel],
            )
            .await
            .map_err(|err| ServiceError::from(failed(err)))
        })?;
        let stored: i64 = stored.get(0);
        // The history must be the one this host last read or wrote. After a write of its
        // own that was never answered (the server restarting as it committed), which may
        // have landed, a replace of this host's whole copy (which holds it) may follow
        // under the same epoch: no other host wrote since.
        if let Some(fence) = fence
            && let Some(known) = self.known_length(channel)
            && known != stored
            && !self.was_unanswered(channel, &fence)
        {
            return Err(changed_since_read(channel, known, stored, Write::Replace));
        }
        let count = messages.len() as i64;
        // One statement: the rows it keeps are written over, the rest deleted, so no row
        // is both deleted and written (which one statement may not do).
        tx.execute_cached(
            "WITH head AS (
                 INSERT INTO history_heads (channel, next) VALUES ($1, $2)
                 ON CONFLICT (channel) DO UPDATE SET next = $2
             ),
             gone AS (DELETE FROM history WHERE channel = $1 AND seq >= $2)
             INSERT INTO history (channel, seq, message)
             SELECT $1, n - 1, message FROM unnest($3::TEXT[]) WITH ORDINALITY AS m(message, n)
             ON CONFLICT (channel, seq) DO UPDATE SET message = excluded.message",
            &[&channel, &count, &messages],
        )
        .await
        .map_err(failed)?;
        if let Err(err) = tx.commit().await {
            if let Some(fence) = fence {
                self.note_unanswered(channel, &fence);
            }
            return Err(failed(err).into());
        }
        if fence.is_some() {
            self.note_length(channel, count);
        }
        Ok(())
    }
}

/// The refusal of a `write` to `channel`, whose history holds `stored` messages where
/// the writer read `known`.
fn changed_since_read(channel: &str, known: i64, stored: i64, write: Write) -> ServiceError {
    ServiceError::Invalid(format!(
        "{channel}'s history changed since this host read it ({known} messages then, \
         {stored} now): the {} is dropped; reload the conversation before writing to it",
        write.what()
    ))
}

#[async_trait]
impl History for Postgres {
    fn location(&self) -> String {
        self.location.clone()
    }

    async fn load(&self, channel: &SessionKey) -> Result<Vec<HistoryEntry>, ServiceError> {
        let channel = channel.as_str();
        let client = self.client().await?;
        let rows = client
            .query_cached(
                "SELECT seq, message FROM history WHERE channel = $1 ORDER BY seq",
                &[&channel],
            )
            .await
            .map_err(|err| self.failed(Operation::HistoryLoad, err))?;
        // One statement, one snapshot: the history is 0..len, as its head row says.
        self.note_length(channel, rows.len() as i64);
        rows.iter()
            .map(|row| {
                let seq = row.get::<_, i64>(0) as u64;
                let message: String = row.get(1);
                serde_json::from_str::<serde::de::IgnoredAny>(&message).map_err(|err| {
                    ServiceError::UnreadableHistory {
                        location: self.location.clone(),
                        channel: channel.to_owned(),
                        seq,
                        reason: format!("not valid JSON: {err}"),
                    }
                })?;
                Ok(HistoryEntry { seq, message })
            })
            .collect()
    }

    async fn append(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.write_history(channel.as_str(), Write::Append, &messages)
            .await
    }

    async fn replace(
        &self,
        channel: &SessionKey,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.write_history(channel.as_str(), Write::Replace, &messages)
            .await
    }

    async fn conversations(&self) -> Result<Vec<ConversationSummary>, ServiceError> {
        let client = self.client().await?;
        let rows = client
            .query_cached(
                "SELECT channel, COUNT(*) FROM history GROUP BY channel ORDER BY channel COLLATE \"C\"",
                &[],
            )
            .await
            .map_err(|err| self.failed(Operation::HistoryConversations, err))?;
        Ok(readable("a conversation", &rows, |row| {
            Ok(ConversationSummary {
                channel: parsed(row, 0)?,
                messages: row.get::<_, i64>(1) as u64,
            })
        }))
    }
}

/// A write of a channel's history.
#[derive(Debug, Clone, Copy)]
enum Write {
    Append,
    Replace,
}

impl Write {
    fn what(self) -> Operation {
        match self {
            Write::Append => Operation::HistoryAppend,
            Write::Replace => Operation::HistoryReplace,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Lease;
    use super::super::test_cluster::TestCluster;
    use super::super::test_wire::WireCount;
    use super::*;
    use crate::services::{AuditRecord, AuditSink, Epoch, Ledger, Receipt, Sessions};

    /// The messages `channel`'s history holds, in order.
    async fn stored(host: &Postgres, channel: &SessionKey) -> Vec<String> {
        let history = host.load(channel).await.unwrap();
        history.into_iter().map(|entry| entry.message).collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fenced_append_and_an_audit_row_are_one_exchange_each_once_prepared() {
        let cluster = TestCluster::start();
        let wire = WireCount::start(cluster.socket(), &cluster.fresh_database().await).await;
        // A lease renewed far outside the test: only the calls below cross the wire.
        let host = Postgres::connect_with(wire.url(), Lease::new(Lease::MAX))
            .await
            .unwrap();
        let run = host.begin_run().await.unwrap();
        let channel = crate::ids::testing::key("channel:main");
        host.load(&channel).await.unwrap();
        let call = || AuditRecord {
            conversation: Some("channel:main".into()),
            process: "channel:main".into(),
            tool: "file_read".into(),
            grants: "fs.read".into(),
            arguments: "{}".into(),
            outcome: "ok".into(),
            detail: String::new(),
            duration_us: 1,
            receipt: Receipt::default(),
        };
        // The first of each claims the session and prepares its statement.
        host.append(&channel, vec!["1".into()]).await.unwrap();
        AuditSink::record(&*host, call()).await.unwrap();

        for n in 2..5 {
            let before = wire.exchanges();
            host.append(&channel, vec![n.to_string(), "\"x\"".into()])
                .await
                .unwrap();
            assert_eq!(wire.exchanges() - before, 1, "append {n}");
            let before = wire.exchanges();
            AuditSink::record(&*host, call()).await.unwrap();
            assert_eq!(wire.exchanges() - before, 1, "audit row {n}");
        }
        assert_eq!(
            stored(&host, &channel).await,
            ["1", "2", "\"x\"", "3", "\"x\"", "4", "\"x\""]
        );

        // A replace: begin, the fence and the head row (pipelined: one round trip), the
        // write, commit. Shorter and longer than what it replaces.
        for rows in [
            vec!["\"a\""],
            vec!["\"b\"", "\"c\"", "\"d\""],
            vec!["\"e\""],
        ] {
            let rows: Vec<String> = rows.into_iter().map(String::from).collect();
            let before = wire.exchanges();
            host.replace(&channel, rows.clone()).await.unwrap();
            assert_eq!(stored(&host, &channel).await, rows);
            if rows.len() > 1 {
                assert_eq!(wire.exchanges() - before, 5 + 1, "a replace and a load");
            }
        }
        // Nothing forwarded: begin, the fence and the marking (pipelined), commit.
        let epoch = Epoch::new(1);
        host.take_forwarded(&channel, run.id(), epoch)
            .await
            .unwrap();
        let before = wire.exchanges();
        assert!(
            host.take_forwarded(&channel, run.id(), epoch)
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(wire.exchanges() - before, 4, "take_forwarded");
        drop(run);
    }
}
