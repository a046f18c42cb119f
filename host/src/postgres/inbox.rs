//! The inbox of sessions owned elsewhere: a host forwards what it receives for a session
//! another host owns into a row, and wakes the hosts with a `NOTIFY`; the owner takes the
//! rows under its fence. The notification is only a hint: every host also looks every
//! [`POLL`], so a notification lost with a connection delays a message, never loses it.

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_postgres::{AsyncMessage, NoTls};

use super::prepared::Prepared;
use super::rows::{parsed, readable};
use super::sessions::run_is_live;
use super::{Postgres, now};
use crate::ids::SessionKey;
use crate::services::Operation;
use crate::services::{Answer, Epoch, ForwardId, Forwarded, RunId, ServiceError};

/// The channel of the wake-up hint for forwarded messages.
const CHANNEL: &str = "capstan_inbox";

/// The channel of the wake-up hint for answers.
const ANSWERS: &str = "capstan_answers";

/// How long an answer nobody took is kept (its host went away, or gave up waiting).
const ANSWER_KEPT_SECONDS: f64 = 3600.0;

/// SQL that holds of an inbox row `i` nobody is handling: never taken, or taken by a run
/// that is over.
fn waiting() -> String {
    format!(
        "(i.taken_run IS NULL OR NOT {})",
        run_is_live("i.taken_run")
    )
}

/// What the listener wakes.
#[derive(Default)]
pub(super) struct Hints {
    /// The look at the inbox (one looker per host).
    inbox: Notify,
    /// Every exchange waiting for an answer.
    answers: Notify,
}

/// How often a host looks at the inbox without a hint.
const POLL: Duration = Duration::from_secs(2);

impl Postgres {
    /// Queues `message` for `channel`'s owner, and wakes the hosts.
    pub(super) async fn forward_row(
        &self,
        channel: &str,
        message: &Forwarded,
    ) -> Result<ForwardId, ServiceError> {
        let client = self.client().await?;
        Ok(forward_on(&client, channel, message)
            .await
            .map_err(|err| self.failed(Operation::SessionsForward, err))?)
    }

    /// Leaves `answer` for forwarded message `id`, and wakes the hosts; drops the answers
    /// nobody took.
    pub(super) async fn answer_row(
        &self,
        id: ForwardId,
        answer: &Answer,
    ) -> Result<(), ServiceError> {
        let failed = |err| self.failed(Operation::SessionsAnswer, err);
        let reply = serde_json::to_string(answer).expect("an answer serializes");
        let mut client = self.client().await?;
        // The message is answered: its row goes with the answer's coming, in one step.
        let tx = client.transaction().await.map_err(failed)?;
        tx.execute_cached("DELETE FROM inbox WHERE id = $1", &[&(id.get() as i64)])
            .await
            .map_err(failed)?;
        tx.execute_cached(
            "WITH row AS (INSERT INTO answers (id, reply) VALUES ($1, $2)
                          ON CONFLICT (id) DO NOTHING RETURNING id)
             SELECT pg_notify($3, id::TEXT) FROM row",
            &[&(id.get() as i64), &reply, &ANSWERS],
        )
        .await
        .map_err(failed)?;
        tx.execute_cached(
            "DELETE FROM answers WHERE created_at < now() - make_interval(secs => $1)",
            &[&ANSWER_KEPT_SECONDS],
        )
        .await
        .map_err(failed)?;
        tx.commit().await.map_err(failed)?;
        Ok(())
    }

    /// Takes the answer to forwarded message `id`, if there is one.
    pub(super) async fn take_answer_row(
        &self,
        id: ForwardId,
    ) -> Result<Option<Answer>, ServiceError> {
        let row = self
            .client()
            .await?
            .query_opt_cached(
                "DELETE FROM answers WHERE id = $1 RETURNING reply",
                &[&(id.get() as i64)],
            )
            .await
            .map_err(|err| self.failed(Operation::SessionsTakeAnswer, err))?;
        let Some(row) = row else { return Ok(None) };
        let text: String = row.get(0);
        serde_json::from_str(&text).map(Some).map_err(|err| {
            ServiceError::Invalid(format!(
                "the answer to {id} is not one this host knows ({err}): upgrade this host"
            ))
        })
    }

    /// The channels with rows waiting that `run` owns or may take over.
    pub(super) async fn forwarded_channels(
        &self,
        run: RunId,
    ) -> Result<Vec<SessionKey>, ServiceError> {
        let rows = self
            .client()
            .await?
            .query_cached(
                &format!(
                    "SELECT DISTINCT i.channel FROM inbox i
                     LEFT JOIN sessions s ON s.channel = i.channel
                     WHERE {} AND (s.channel IS NULL OR s.owner_run = $1 OR NOT {})
                     ORDER BY 1",
                    waiting(),
                    run_is_live("s.owner_run"),
                ),
                &[&(run.get() as i64)],
            )
            .await
            .map_err(|err| self.failed(Operation::SessionsForwardedSessions, err))?;
        // A session that cannot be read keeps its messages in the inbox, for a host that
        // can read it; the others are delivered all the same.
        Ok(readable(
            "a session with forwarded messages",
            &rows,
            |row| parsed(row, 0),
        ))
    }

    /// Takes `channel`'s rows, oldest first, under the fence of `run` at `epoch`.
    pub(super) async fn take_rows(
        &self,
        channel: &str,
        run: RunId,
        epoch: Epoch,
    ) -> Result<Vec<(ForwardId, Forwarded)>, ServiceError> {
        let failed = |err| self.failed(Operation::SessionsTakeForwarded, err);
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(failed)?;
        // Marked, not deleted: a user's message goes when it is answered, and is taken
        // again if this run ends first (the host stopped, or lost its lease, before it
        // stored the message). Sent with the fence's check in one round trip: a refusal
        // rolls the marking back.
        let take = format!(
            "UPDATE inbox i SET taken_run = $2 WHERE channel = $1 AND {}
             RETURNING id, body",
            waiting()
        );
        let run_id = run.get() as i64;
        let (_, mut rows) = tokio::try_join!(biased; self.check_fence(&tx, channel, run, epoch), async {
            tx.query_cached(&take, &[&channel, &run_id])
                .await
                .map_err(|err| ServiceError::from(failed(err)))
        })?;
        rows.sort_by_key(|row| row.get::<_, i64>(0));
        let mut taken = Vec::with_capacity(rows.len());
        let mut told = Vec::new();
        for row in rows {
            let body: String = row.get(1);
            let id: i64 = row.get(0);
            match serde_json::from_str(&body) {
                Ok(message) => {
                    // A report has no answer: it goes once taken.
                    if !matches!(message, Forwarded::User { .. }) {
                        told.push(id);
                    }
                    taken.push((ForwardId::new(id as u64), message));
                }
                // A row a newer host wrote in a form this one does not know: kept, with
                // the rows after it, for a host that does.
                Err(err) => {
                    return Err(ServiceError::Invalid(format!(
                        "inbox row {} for {channel} is not a message this host knows ({err}); \
                         nothing was taken: upgrade this host",
                        row.get::<_, i64>(0)
                    )));
                }
            }
        }
        if !told.is_empty() {
            tx.execute_cached("DELETE FROM inbox WHERE id = ANY($1)", &[&told])
                .await
                .map_err(failed)?;
        }
        tx.commit().await.map_err(failed)?;
        Ok(taken)
    }

    /// Returns on a hint that something was forwarded, or after [`POLL`]; starts the
    /// listener on its first call.
    pub(super) async fn inbox_wakeup(&self) {
        self.inbox_wakeup_within(POLL).await
    }

    /// [`Postgres::inbox_wakeup`], looking anyway after `poll`.
    async fn inbox_wakeup_within(&self, poll: Duration) {
        let hints = self.hints();
        let _ = tokio::time::timeout(poll, hints.inbox.notified()).await;
    }

    /// Returns on a hint that an answer was left, or after [`POLL`].
    pub(super) async fn answer_wakeup_within_poll(&self) {
        let hints = self.hints();
        let _ = tokio::time::timeout(POLL, hints.answers.notified()).await;
    }

    /// The hints, and the listener that gives them, started on first use.
    fn hints(&self) -> &Arc<Hints> {
        self.hints.get_or_init(|| {
            let hints = Arc::new(Hints::default());
            tokio::spawn(listen(
                self.config.clone(),
                self.location.clone(),
                Arc::downgrade(&hints),
            ));
            hints
        })
    }
}

impl Hints {
    /// Wakes the look at the inbox and every wait for an answer.
    fn wake_all(&self) {
        self.inbox.notify_one();
        self.answers.notify_waiters();
    }
}

/// Queues `message` for `channel`'s owner on `client` (inside the caller's transaction,
/// if it is one): the row and its hint commit together.
pub(super) async fn forward_on(
    client: &impl deadpool_postgres::GenericClient,
    channel: &str,
    message: &Forwarded,
) -> Result<ForwardId, tokio_postgres::Error> {
    let body = serde_json::to_string(message).expect("a forwarded message serializes");
    let row = client
        .query_one_cached(
            "WITH row AS (INSERT INTO inbox (channel, body, created_at) VALUES ($1, $2, $3)
                          RETURNING id, channel)
             SELECT id, pg_notify($4, channel) FROM row",
            &[&channel, &body, &now(), &CHANNEL],
        )
        .await?;
    Ok(ForwardId::new(row.get::<_, i64>(0) as u64))
}

/// Listens for hints on a connection of its own, made again when lost, until `hint` is
/// dropped with its [`Postgres`].
async fn listen(config: tokio_postgres::Config, location: String, hint: Weak<Hints>) {
    loop {
        match config.connect(NoTls).await {
            Ok((client, mut connection)) => {
                let mut messages =
                    futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
                let listen = format!("LISTEN {CHANNEL}; LISTEN {ANSWERS}");
                // The connection must be driven for the LISTEN to be answered.
                let mut listening = std::pin::pin!(client.batch_execute(&listen));
                let mut listened = false;
                loop {
                    tokio::select! {
                        done = &mut listening, if !listened => {
                            listened = true;
                            if let Err(err) = done {
                                tracing::warn!(database = %location, "cannot listen for forwarded messages: {err}");
                                break;
                            }
                            // What was forwarded before the LISTEN took is found by a look now.
                            match hint.upgrade() {
                                Some(hint) => hint.wake_all(),
                                None => return,
                            }
                        }
                        message = messages.next() => match message {
                            Some(Ok(AsyncMessage::Notification(note))) => match hint.upgrade() {
                                Some(hint) if note.channel() == ANSWERS => hint.answers.notify_waiters(),
                                Some(hint) => hint.inbox.notify_one(),
                                None => return,
                            },
                            Some(Ok(_)) => {}
                            Some(Err(err)) => {
                                tracing::warn!(database = %location, "the inbox listener's connection failed: {err}");
                                break;
                            }
                            None => break,
                        },
                        _ = tokio::time::sleep(POLL) => {
                            if hint.strong_count() == 0 {
                                return;
                            }
                        }
                    }
                }
            }
            Err(err) => {
                tracing::warn!(database = %location, "cannot connect to listen for forwarded messages: {err}");
            }
        }
        // Whatever was forwarded or answered meanwhile is found by the next look.
        match hint.upgrade() {
            Some(hint) => hint.wake_all(),
            None => return,
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_cluster::TestCluster;
    use super::*;
    use crate::services::{Ledger, Sessions};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forward_wakes_the_hosts_that_listen() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let (a, b) = (
            Postgres::connect(&url).await.unwrap(),
            Postgres::connect(&url).await.unwrap(),
        );
        let _runs = (a.begin_run().await.unwrap(), b.begin_run().await.unwrap());
        // Looks so far apart that only a hint ends a wait. The first wait ends once the
        // listener listens; each later one only on a forward.
        let never = Duration::from_secs(24 * 3600);
        a.inbox_wakeup_within(never).await;
        for n in 0..3 {
            let message = Forwarded::User {
                text: n.to_string(),
                key: None,
                traceparent: None,
                label: crate::flow::Label::trusted(),
            };
            let main = crate::ids::testing::key("channel:main");
            let (_, forwarded) =
                tokio::join!(a.inbox_wakeup_within(never), b.forward(&main, &message));
            forwarded.unwrap();
        }
    }
}
