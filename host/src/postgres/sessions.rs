//! Session ownership across hosts: a session (a channel) is owned by one live run at a
//! time. A run takes a session that nobody owns, or whose owner's lease is over by the
//! database's clock; every takeover bumps the session's epoch. Writes a session's
//! processes make carry the epoch they were made under and land only while it is current
//! and its run's lease is live ([`Postgres::append_fenced`]), so a host that lost a
//! session, paused past its lease, say, lands nothing after another took over.

use std::collections::HashMap;

use async_trait::async_trait;
use deadpool_postgres::Transaction;
use tokio_postgres::Row;

use super::Postgres;
use super::prepared::Prepared;
use crate::ids::SessionKey;
use crate::services::Operation;
use crate::services::{Answer, Claim, Epoch, ForwardId, Forwarded, RunId, ServiceError, Sessions};

/// SQL that holds when run `id` (an SQL expression) is live: not ended, and its lease
/// not over by the database's clock when the statement began. The one place the rule is
/// written; a run that is not live owns nothing and writes nothing.
pub(super) fn run_is_live(id: &str) -> String {
    format!(
        "EXISTS (SELECT 1 FROM runs live WHERE live.id = {id} AND live.ended_at IS NULL \
         AND live.expires_at > statement_timestamp())"
    )
}

impl Postgres {
    /// The claim of session `channel` for `run`, in the database ([`Sessions::claim`]).
    async fn claim_row(&self, channel: &str, run: RunId) -> Result<Claim, ServiceError> {
        let failed = |err| self.failed(Operation::SessionsClaim, err);
        let client = self.client().await?;
        let run_id = run.get() as i64;
        // One statement: the owner's liveness is judged under the row's lock, so two
        // hosts taking over one session cannot both bump it.
        let sql = format!(
            "INSERT INTO sessions (channel, owner_run, epoch)
             SELECT $1, $2, 1 WHERE {}
             ON CONFLICT (channel) DO UPDATE SET owner_run = $2, epoch = sessions.epoch + 1
                 WHERE sessions.owner_run <> $2 AND NOT {}
             RETURNING epoch",
            run_is_live("$2"),
            run_is_live("sessions.owner_run"),
        );
        if let Some(row) = client
            .query_opt_cached(&sql, &[&channel, &run_id])
            .await
            .map_err(failed)?
        {
            let epoch = row.get::<_, i64>(0) as u64;
            // Past the first epoch, the row was another run's, whose lease had ended.
            if epoch > 1 {
                crate::telemetry::metrics().lease_taken_over();
            }
            return Ok(Claim::Owned(Epoch::new(epoch)));
        }
        let row = client
            .query_opt_cached(
                &format!(
                    "SELECT owner_run, epoch, {} FROM sessions WHERE channel = $1",
                    run_is_live("$2")
                ),
                &[&channel, &run_id],
            )
            .await
            .map_err(failed)?;
        match row {
            Some(row) if !row.get::<_, bool>(2) => Err(run_over(run)),
            Some(row) if row.get::<_, i64>(0) == run_id => {
                Ok(Claim::Owned(Epoch::new(row.get::<_, i64>(1) as u64)))
            }
            Some(row) => Ok(Claim::OwnedElsewhere(RunId::new(
                row.get::<_, i64>(0) as u64
            ))),
            // Nothing owns it and the insert did not happen: this run is over.
            None => Err(run_over(run)),
        }
    }

    /// Appends `messages` to `channel`'s history if `run` still owns it under `epoch` and
    /// its lease is live; otherwise refuses with [`ServiceError::Invalid`] naming the
    /// current owner and epoch, and appends nothing.
    ///
    /// ```no_run
    /// use capstan_host::ids::ProcessId;
    /// use capstan_host::postgres::Postgres;
    /// use capstan_host::services::{Claim, Ledger, Sessions};
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let host = Postgres::connect("postgres://capstan@db:5432/capstan").await.unwrap();
    /// let run = host.begin_run().await.unwrap();
    /// let main = ProcessId::channel("main").session();
    /// if let Claim::Owned(epoch) = host.claim(&main, run.id()).await.unwrap() {
    ///     host.append_fenced("channel:main", run.id(), epoch, vec!["\"hi\"".into()])
    ///         .await
    ///         .unwrap();
    /// }
    /// # });
    /// ```
    pub async fn append_fenced(
        &self,
        channel: &str,
        run: RunId,
        epoch: Epoch,
        messages: Vec<String>,
    ) -> Result<(), ServiceError> {
        self.append_checked(channel, Some(Fence { run, epoch }), None, &messages)
            .await
            .map(drop)
    }

    /// Refuses unless `run` owns `channel` under `epoch` and its lease is live. Inside
    /// `tx`, with the session's row held `FOR SHARE`: a takeover (an update of the row)
    /// waits for the transaction, and the transaction sees any takeover committed first.
    pub(super) async fn check_fence(
        &self,
        tx: &Transaction<'_>,
        channel: &str,
        run: RunId,
        epoch: Epoch,
    ) -> Result<(), ServiceError> {
        let current = tx
            .query_opt_cached(
                &format!(
                    "SELECT owner_run, epoch, {} FROM sessions
                     WHERE channel = $1 FOR SHARE",
                    run_is_live("$2")
                ),
                &[&channel, &(run.get() as i64)],
            )
            .await
            .map_err(|err| self.failed(Operation::SessionsFence, err))?;
        let owner = current.as_ref().and_then(owner_in);
        match (Fence { run, epoch }).refusal(channel, owner) {
            Some(refused) => Err(refused),
            None => Ok(()),
        }
    }

    /// The fence of a write to `channel` by this host: its current run and the epoch it
    /// owns the session under (claiming it if nobody live does); `None` while the host
    /// has no run (tools and commands outside an agent), or for a write under `run` that
    /// is not the host's current one.
    pub(super) async fn fence(
        &self,
        channel: &str,
        run: Option<RunId>,
    ) -> Result<Option<Fence>, ServiceError> {
        let Some(current) = self.current_run() else {
            return Ok(None);
        };
        if run.is_some_and(|run| run != current) {
            return Ok(None);
        }
        let epoch = self.epoch_for(channel, current).await?;
        Ok(Some(Fence {
            run: current,
            epoch,
        }))
    }

    /// Checks `fence` (if any) for `channel` inside `tx`; a refusal forgets the epoch, so
    /// the host's next write claims again.
    pub(super) async fn hold(
        &self,
        tx: &Transaction<'_>,
        channel: &str,
        fence: Option<Fence>,
    ) -> Result<(), ServiceError> {
        let Some(Fence { run, epoch }) = fence else {
            return Ok(());
        };
        let held = self.check_fence(tx, channel, run, epoch).await;
        if held.is_err() {
            self.forget_epoch(channel, epoch);
        }
        held
    }

    /// The run this host writes sessions under: its newest live [`Run`](crate::services::Run).
    pub(super) fn current_run(&self) -> Option<RunId> {
        self.owner.lock().unwrap().run
    }

    /// The run this host's writes of tasks and audit rows are fenced by, as the SQL
    /// parameter of [`live_run`]: none while the host has no run (commands outside an
    /// agent).
    pub(super) fn writer_run(&self) -> Option<i64> {
        self.current_run().map(|run| run.get() as i64)
    }

    /// The refusal of `what`, written by this host after its run was over.
    pub(super) fn dropped(&self, what: &str) -> ServiceError {
        let run = self
            .current_run()
            .map_or_else(|| "this host's run".to_owned(), |run| run.to_string());
        ServiceError::Invalid(format!(
            "{run} is over (ended, or its lease expired): {what} is dropped; another host may \
             answer its conversations now"
        ))
    }

    /// [`Sessions::claim`] of session `session`.
    async fn claim_session(&self, session: &str, run: RunId) -> Result<Claim, ServiceError> {
        let claim = self.claim_row(session, run).await?;
        if let Claim::Owned(epoch) = claim {
            // The epoch this host's writes to the session are fenced with.
            let mut owner = self.owner.lock().unwrap();
            if owner.run == Some(run) {
                owner.epochs.insert(session.to_owned(), epoch);
            }
        }
        Ok(claim)
    }

    /// The epoch `run` owns `channel` under: the one it claimed before, or a new claim.
    pub(super) async fn epoch_for(&self, channel: &str, run: RunId) -> Result<Epoch, ServiceError> {
        if let Some(epoch) = self.owner.lock().unwrap().epochs.get(channel) {
            return Ok(*epoch);
        }
        match self.claim_session(channel, run).await? {
            Claim::Owned(epoch) => Ok(epoch),
            Claim::OwnedElsewhere(other) => Err(ServiceError::Invalid(format!(
                "{channel} is owned by {other}, a run of another host: this host ({run}) may not \
                 write to it until that run ends or its lease expires"
            ))),
        }
    }

    /// Notes that `channel`'s history holds `length` messages, as this host knows it.
    pub(super) fn note_length(&self, channel: &str, length: i64) {
        let mut owner = self.owner.lock().unwrap();
        owner.unanswered.remove(channel);
        if owner.run.is_some() {
            owner.lengths.insert(channel.to_owned(), length);
        }
    }

    /// How many messages this host knows `channel`'s history to hold, if it read it.
    pub(super) fn known_length(&self, channel: &str) -> Option<i64> {
        self.owner.lock().unwrap().lengths.get(channel).copied()
    }

    /// Forgets that this host owns `channel` under `epoch`, if it thought so: its next
    /// write claims again.
    pub(super) fn forget_epoch(&self, channel: &str, epoch: Epoch) {
        let mut owner = self.owner.lock().unwrap();
        if owner.epochs.get(channel) == Some(&epoch) {
            owner.epochs.remove(channel);
            owner.unanswered.remove(channel);
        }
    }

    /// Notes that a write to `channel` under `fence`'s epoch was never answered: it may
    /// have landed.
    pub(super) fn note_unanswered(&self, channel: &str, fence: &Fence) {
        let epoch = fence.epoch;
        let mut owner = self.owner.lock().unwrap();
        if owner.epochs.get(channel) == Some(&epoch) {
            owner.unanswered.insert(channel.to_owned(), epoch);
        }
    }

    /// Whether a write to `channel` under `fence`'s epoch was never answered.
    pub(super) fn was_unanswered(&self, channel: &str, fence: &Fence) -> bool {
        self.owner.lock().unwrap().unanswered.get(channel) == Some(&fence.epoch)
    }
}

#[async_trait]
impl Sessions for Postgres {
    async fn claim(&self, session: &SessionKey, run: RunId) -> Result<Claim, ServiceError> {
        self.claim_session(session.as_str(), run).await
    }

    async fn forward(
        &self,
        session: &SessionKey,
        message: &Forwarded,
    ) -> Result<ForwardId, ServiceError> {
        self.forward_row(session.as_str(), message).await
    }

    async fn forwarded_sessions(&self, run: RunId) -> Result<Vec<SessionKey>, ServiceError> {
        self.forwarded_channels(run).await
    }

    async fn take_forwarded(
        &self,
        session: &SessionKey,
        run: RunId,
        epoch: Epoch,
    ) -> Result<Vec<(ForwardId, Forwarded)>, ServiceError> {
        self.take_rows(session.as_str(), run, epoch).await
    }

    async fn forwarded_wakeup(&self) {
        self.inbox_wakeup().await
    }

    async fn answer(&self, id: ForwardId, answer: &Answer) -> Result<(), ServiceError> {
        self.answer_row(id, answer).await
    }

    async fn take_answer(&self, id: ForwardId) -> Result<Option<Answer>, ServiceError> {
        self.take_answer_row(id).await
    }

    async fn answer_wakeup(&self) {
        self.answer_wakeup_within_poll().await
    }
}

/// SQL that holds when parameter `$param` (a run id, or NULL) is NULL or a live run: a
/// write under it lands only while this host's run is live by the database's clock, in
/// the statement that makes it. Another host takes a session over only once the run's
/// lease is over, so this fences every write of the run's sessions.
pub(super) fn live_run(param: usize) -> String {
    format!(
        "(${param}::BIGINT IS NULL OR {})",
        run_is_live(&format!("${param}"))
    )
}

/// The session's owner as a fence's statement reads it in its first three columns: its
/// run, its epoch, and whether the writing run is live; `None` when nobody owns it (no
/// row, or a row of NULLs).
pub(super) fn owner_in(row: &Row) -> Option<(RunId, Epoch, bool)> {
    let owner = row.get::<_, Option<i64>>(0)?;
    Some((
        RunId::new(owner as u64),
        Epoch::new(row.get::<_, i64>(1) as u64),
        row.get::<_, bool>(2),
    ))
}

/// What a fenced write carries: the run and the epoch it owns the session under.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fence {
    pub(super) run: RunId,
    pub(super) epoch: Epoch,
}

impl Fence {
    /// Why a write to `channel` under this fence is refused, given the session's `owner`
    /// as the database holds it (its run, epoch, and whether this fence's run is live);
    /// `None` if it may write.
    pub(super) fn refusal(
        self,
        channel: &str,
        owner: Option<(RunId, Epoch, bool)>,
    ) -> Option<ServiceError> {
        let Fence { run, epoch } = self;
        let why = match owner {
            None => "the session has no owner".to_owned(),
            Some((owner, now, _)) if owner != run || now != epoch => {
                format!("{owner} owns it under {now}")
            }
            Some((_, _, false)) => "this run's lease is over".to_owned(),
            Some(_) => return None,
        };
        Some(ServiceError::Invalid(format!(
            "{run} may not write to {channel} under {epoch}: {why}; the write is dropped"
        )))
    }
}

/// The run this host writes sessions under, and the sessions it claimed.
#[derive(Debug, Default)]
pub(super) struct Owner {
    pub(super) run: Option<RunId>,
    /// Whether that run's [`Run`](crate::services::Run) is still held: once dropped, the
    /// run still fences this host's writes, but nothing waits for it.
    pub(super) held: bool,
    pub(super) epochs: HashMap<String, Epoch>,
    /// How many messages each channel's history held when this host last read or wrote
    /// it: a write to a history that changed since is refused, so a host never writes
    /// from (or over) a copy another host's writes made stale.
    pub(super) lengths: HashMap<String, i64>,
    /// Channels whose last write under this epoch was never answered (the connection
    /// went down as it committed): it may have landed, so the length noted is not known
    /// to be right, and only a replace of this host's whole copy may follow, under the
    /// same epoch.
    pub(super) unanswered: HashMap<String, Epoch>,
}

fn run_over(run: RunId) -> ServiceError {
    ServiceError::Invalid(format!(
        "{run} is over (ended, or its lease expired): it cannot own a session"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::test_cluster::{TestCluster, admin};
    use super::*;
    use crate::services::{History, Ledger, Run, WorkerState};

    fn user(text: &str) -> Forwarded {
        Forwarded::User {
            text: text.into(),
            key: None,
            traceparent: None,
            label: crate::flow::Label::trusted(),
        }
    }

    /// Two hosts on one fresh database, each with a live run.
    async fn two_hosts(cluster: &TestCluster) -> (String, [(Arc<Postgres>, Run); 2]) {
        let url = cluster.fresh_database().await;
        let mut hosts = Vec::new();
        for _ in 0..2 {
            let host = Postgres::connect(&url).await.unwrap();
            let run = host.begin_run().await.unwrap();
            hosts.push((host, run));
        }
        let [a, b] = <[_; 2]>::try_from(hosts).ok().unwrap();
        (url, [a, b])
    }

    async fn expire(url: &str, run: RunId) {
        admin(url)
            .await
            .execute(
                "UPDATE runs SET expires_at = now() - interval '1 second' WHERE id = $1",
                &[&(run.get() as i64)],
            )
            .await
            .unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_has_one_live_owner_and_a_takeover_fences_the_old_one() {
        let cluster = TestCluster::start();
        let (url, [(a, run_a), (b, run_b)]) = two_hosts(&cluster).await;
        let one = Epoch::new(1);
        assert_eq!(
            a.claim(&crate::ids::testing::key("channel:main"), run_a.id())
                .await
                .unwrap(),
            Claim::Owned(one)
        );
        assert_eq!(
            a.claim(&crate::ids::testing::key("channel:main"), run_a.id())
                .await
                .unwrap(),
            Claim::Owned(one)
        );
        assert_eq!(
            b.claim(&crate::ids::testing::key("channel:main"), run_b.id())
                .await
                .unwrap(),
            Claim::OwnedElsewhere(run_a.id())
        );
        a.append_fenced("channel:main", run_a.id(), one, vec!["1".into()])
            .await
            .unwrap();

        // A is paused past its lease; B takes over.
        expire(&url, run_a.id()).await;
        let two = Epoch::new(2);
        assert_eq!(
            b.claim(&crate::ids::testing::key("channel:main"), run_b.id())
                .await
                .unwrap(),
            Claim::Owned(two)
        );
        // A resumes: its late append lands nowhere, and it says why.
        let late = a
            .append_fenced("channel:main", run_a.id(), one, vec!["2".into()])
            .await
            .unwrap_err()
            .to_string();
        assert!(
            late.contains(&run_b.id().to_string()) && late.contains("epoch 2"),
            "{late}"
        );
        let stale = a
            .claim(&crate::ids::testing::key("channel:main"), run_a.id())
            .await
            .unwrap_err();
        assert!(stale.to_string().contains("is over"), "{stale}");
        b.append_fenced("channel:main", run_b.id(), two, vec!["3".into()])
            .await
            .unwrap();
        let history: Arc<dyn History> = b.clone();
        let kept: Vec<u32> = history
            .load_as(&crate::ids::testing::key("channel:main"))
            .await
            .unwrap();
        assert_eq!(kept, [1, 3], "the fenced-out append left nothing");
        // The new owner's own stale epoch is refused too.
        let wrong = b
            .append_fenced("channel:main", run_b.id(), one, vec!["4".into()])
            .await;
        assert!(wrong.is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn claims_at_once_from_two_hosts_make_one_owner_and_one_takeover() {
        let cluster = TestCluster::start();
        let (url, [(a, run_a), (b, run_b)]) = two_hosts(&cluster).await;
        let claims: Vec<_> = (0..50)
            .map(|n| {
                let (host, run) = if n % 2 == 0 {
                    (a.clone(), run_a.id())
                } else {
                    (b.clone(), run_b.id())
                };
                tokio::spawn(async move {
                    (
                        run,
                        host.claim(&crate::ids::testing::key("channel:x"), run)
                            .await
                            .unwrap(),
                    )
                })
            })
            .collect();
        let mut owners = std::collections::HashSet::new();
        for claim in claims {
            let (run, claim) = claim.await.unwrap();
            match claim {
                Claim::Owned(epoch) => {
                    assert_eq!(epoch, Epoch::new(1));
                    owners.insert(run);
                }
                Claim::OwnedElsewhere(owner) => {
                    assert_ne!(owner, run);
                    owners.insert(owner);
                }
            }
        }
        assert_eq!(owners.len(), 1, "one owner: {owners:?}");
        let owner = *owners.iter().next().unwrap();
        // Its lease runs out; both try to take over at once: one does, once.
        expire(&url, owner).await;
        let third = a.begin_run().await.unwrap();
        let fourth = b.begin_run().await.unwrap();
        let x = crate::ids::testing::key("channel:x");
        let (x, y) = tokio::join!(a.claim(&x, third.id()), b.claim(&x, fourth.id()));
        let mut outcomes = [x.unwrap(), y.unwrap()];
        outcomes.sort_by_key(|c| matches!(c, Claim::OwnedElsewhere(_)));
        assert_eq!(outcomes[0], Claim::Owned(Epoch::new(2)), "{outcomes:?}");
        assert!(
            matches!(outcomes[1], Claim::OwnedElsewhere(_)),
            "{outcomes:?}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hosts_history_writes_claim_the_session_and_are_fenced_after_a_takeover() {
        let cluster = TestCluster::start();
        let (url, [(a, run_a), (b, run_b)]) = two_hosts(&cluster).await;
        let append = |host: &Arc<Postgres>, n: u32| {
            let host: Arc<dyn History> = host.clone();
            async move {
                host.append(
                    &crate::ids::testing::key("channel:main"),
                    vec![n.to_string()],
                )
                .await
            }
        };
        append(&a, 1).await.unwrap();
        let refused = append(&b, 2).await.unwrap_err().to_string();
        assert!(
            refused.contains(&run_a.id().to_string()) && refused.contains("another host"),
            "{refused}"
        );
        // A is paused past its lease: B's next write takes the session over.
        expire(&url, run_a.id()).await;
        append(&b, 3).await.unwrap();
        let late = append(&a, 4).await.unwrap_err().to_string();
        assert!(
            late.contains("epoch 2") && late.contains("dropped"),
            "{late}"
        );
        let again = append(&a, 5).await.unwrap_err().to_string();
        assert!(again.contains("is over"), "{again}");
        let replaced = {
            let a: Arc<dyn History> = a.clone();
            a.replace(&crate::ids::testing::key("channel:main"), vec!["9".into()])
                .await
        };
        assert!(replaced.is_err(), "a replace is fenced too");
        let history: Arc<dyn History> = b.clone();
        let kept: Vec<u32> = history
            .load_as(&crate::ids::testing::key("channel:main"))
            .await
            .unwrap();
        assert_eq!(kept, [1, 3]);
        drop((run_a, run_b));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn worker_records_are_fenced_by_their_conversations_owner() {
        let cluster = TestCluster::start();
        let (url, [(a, run_a), (b, run_b)]) = two_hosts(&cluster).await;
        a.worker_started(
            run_a.id(),
            &crate::ids::testing::pid("worker:1"),
            &crate::ids::testing::pid("channel:main"),
            "t",
        )
        .await
        .unwrap();
        let elsewhere = b
            .worker_started(
                run_b.id(),
                &crate::ids::testing::pid("worker:2"),
                &crate::ids::testing::pid("channel:main"),
                "t",
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(elsewhere.contains("another host"), "{elsewhere}");
        assert_eq!(
            b.worker(&crate::ids::testing::pid("worker:2"))
                .await
                .unwrap(),
            None
        );

        // A is paused past its lease; B marks its worker interrupted.
        expire(&url, run_a.id()).await;
        let marked = b.mark_interrupted_workers().await.unwrap();
        assert_eq!(marked.len(), 1);
        // A resumes with its worker's result: it lands nothing, and says why.
        let late = a
            .set_worker_state(
                &crate::ids::testing::pid("worker:1"),
                WorkerState::Done,
                Some("late result"),
            )
            .await
            .unwrap_err()
            .to_string();
        assert!(late.contains("dropped"), "{late}");
        let record = b
            .worker(&crate::ids::testing::pid("worker:1"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.state, WorkerState::Interrupted);
        assert_ne!(record.outcome.as_deref(), Some("late result"));
        // B takes the conversation over with its next worker.
        b.worker_started(
            run_b.id(),
            &crate::ids::testing::pid("worker:3"),
            &crate::ids::testing::pid("channel:main"),
            "t",
        )
        .await
        .unwrap();
        assert_eq!(
            b.claim(&crate::ids::testing::key("channel:main"), run_b.id())
                .await
                .unwrap(),
            Claim::Owned(Epoch::new(2))
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_host_never_writes_over_history_it_did_not_see() {
        let cluster = TestCluster::start();
        let (url, [(a, run_a), (b, run_b)]) = two_hosts(&cluster).await;
        let (ha, hb): (Arc<dyn History>, Arc<dyn History>) = (a.clone(), b.clone());
        // Both hosts open the conversation; A answers first.
        assert!(
            ha.load(&crate::ids::testing::key("channel:main"))
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            hb.load(&crate::ids::testing::key("channel:main"))
                .await
                .unwrap()
                .is_empty()
        );
        ha.append(&crate::ids::testing::key("channel:main"), vec!["1".into()])
            .await
            .unwrap();
        assert!(
            hb.append(&crate::ids::testing::key("channel:main"), vec!["2".into()])
                .await
                .is_err()
        );
        // A goes away; B, which never saw A's message, tries to rewrite from its copy.
        expire(&url, run_a.id()).await;
        let stale = hb
            .replace(&crate::ids::testing::key("channel:main"), vec!["2".into()])
            .await
            .unwrap_err()
            .to_string();
        assert!(stale.contains("changed since this host read it"), "{stale}");
        let kept: Vec<u32> = hb
            .load_as(&crate::ids::testing::key("channel:main"))
            .await
            .unwrap();
        assert_eq!(kept, [1], "A's message survives");
        // Having read it, B writes on.
        hb.append(&crate::ids::testing::key("channel:main"), vec!["3".into()])
            .await
            .unwrap();
        let kept: Vec<u32> = hb
            .load_as(&crate::ids::testing::key("channel:main"))
            .await
            .unwrap();
        assert_eq!(kept, [1, 3]);
        drop((run_a, run_b));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn forwarded_messages_are_taken_once_in_order_by_the_owner_only() {
        let cluster = TestCluster::start();
        let (url, [(a, run_a), (b, run_b)]) = two_hosts(&cluster).await;
        let Claim::Owned(epoch) = a
            .claim(&crate::ids::testing::key("channel:main"), run_a.id())
            .await
            .unwrap()
        else {
            panic!("nobody owned it");
        };
        let forwards: Vec<_> = (0..20)
            .map(|n| {
                let b = b.clone();
                async move {
                    b.forward(
                        &crate::ids::testing::key("channel:main"),
                        &user(&n.to_string()),
                    )
                    .await
                }
            })
            .collect();
        let mut numbers = Vec::new();
        for forward in forwards {
            numbers.push(forward.await.unwrap());
        }
        b.forward(
            &crate::ids::testing::key("channel:other"),
            &user("elsewhere"),
        )
        .await
        .unwrap();
        // B sees the unowned session only; A sees both.
        assert_eq!(
            b.forwarded_sessions(run_b.id()).await.unwrap(),
            [crate::ids::testing::key("channel:other")]
        );
        assert_eq!(
            a.forwarded_sessions(run_a.id()).await.unwrap(),
            [
                crate::ids::testing::key("channel:main"),
                crate::ids::testing::key("channel:other")
            ]
        );
        let refused = b
            .take_forwarded(&crate::ids::testing::key("channel:main"), run_b.id(), epoch)
            .await
            .unwrap_err();
        assert!(refused.to_string().contains("dropped"), "{refused}");
        let taken = a
            .take_forwarded(&crate::ids::testing::key("channel:main"), run_a.id(), epoch)
            .await
            .unwrap();
        let expected: Vec<_> = numbers
            .into_iter()
            .zip((0..20).map(|n| user(&n.to_string())))
            .collect();
        assert_eq!(taken, expected, "all of them, in the order forwarded");
        assert!(
            a.take_forwarded(&crate::ids::testing::key("channel:main"), run_a.id(), epoch)
                .await
                .unwrap()
                .is_empty(),
            "taken once"
        );

        // A answers five of them; its lease runs out before it answers the rest.
        for (number, _) in &taken[..5] {
            a.answer(*number, &Answer::default()).await.unwrap();
        }
        // With one more message waiting, B may take the session over, and with it every
        // message A took and never answered (A stopped before storing them); A's stale
        // epoch takes nothing.
        b.forward(&crate::ids::testing::key("channel:main"), &user("late"))
            .await
            .unwrap();
        expire(&url, run_a.id()).await;
        assert_eq!(
            b.forwarded_sessions(run_b.id()).await.unwrap(),
            [
                crate::ids::testing::key("channel:main"),
                crate::ids::testing::key("channel:other")
            ]
        );
        assert!(
            a.take_forwarded(&crate::ids::testing::key("channel:main"), run_a.id(), epoch)
                .await
                .is_err()
        );
        let Claim::Owned(taken_over) = b
            .claim(&crate::ids::testing::key("channel:main"), run_b.id())
            .await
            .unwrap()
        else {
            panic!("the expired owner kept it");
        };
        let late: Vec<Forwarded> = b
            .take_forwarded(
                &crate::ids::testing::key("channel:main"),
                run_b.id(),
                taken_over,
            )
            .await
            .unwrap()
            .into_iter()
            .map(|(_, message)| message)
            .collect();
        let mut expected: Vec<_> = (5..20).map(|n| user(&n.to_string())).collect();
        expected.push(user("late"));
        assert_eq!(late, expected);
        // The owner's answer reaches the host that forwarded, once.
        let answer = Answer {
            reply: "done".into(),
            error: Some("the disk is full".into()),
            outcome: crate::services::AnswerOutcome::NotStored,
        };
        b.answer(ForwardId::new(7), &answer).await.unwrap();
        assert_eq!(
            a.take_answer(ForwardId::new(7)).await.unwrap(),
            Some(answer)
        );
        assert_eq!(a.take_answer(ForwardId::new(7)).await.unwrap(), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_forwarded_row_this_host_cannot_read_is_left_for_one_that_can() {
        let cluster = TestCluster::start();
        let (url, [(a, run_a), _]) = two_hosts(&cluster).await;
        let Claim::Owned(epoch) = a
            .claim(&crate::ids::testing::key("channel:main"), run_a.id())
            .await
            .unwrap()
        else {
            panic!("nobody owned it");
        };
        admin(&url)
            .await
            .execute(
                "INSERT INTO inbox (channel, body, created_at)
                 VALUES ('channel:main', '{\"type\":\"hologram\"}', 0)",
                &[],
            )
            .await
            .unwrap();
        let err = a
            .take_forwarded(&crate::ids::testing::key("channel:main"), run_a.id(), epoch)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("upgrade this host"), "{err}");
        let left: i64 = admin(&url)
            .await
            .query_one("SELECT count(*) FROM inbox", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(left, 1, "nothing was taken");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn task_and_audit_writes_of_a_run_that_is_over_land_nothing() {
        use crate::services::{AuditRecord, AuditSink, NewTask, TaskBoard, TaskPatch};
        let cluster = TestCluster::start();
        let (url, [(a, run_a), (b, _run_b)]) = two_hosts(&cluster).await;
        let task = a
            .create(
                &crate::ids::testing::by("worker:1"),
                NewTask::titled("kept"),
            )
            .await
            .unwrap();
        let call = || AuditRecord {
            process: "worker:1".into(),
            tool: "file_read".into(),
            grants: String::new(),
            arguments: "{}".into(),
            outcome: "ok".into(),
            detail: String::new(),
            duration_us: 1,
            conversation: None,
            receipt: crate::services::Receipt::default(),
        };
        a.record(call()).await.unwrap();

        // A is paused past its lease: whatever it writes now is refused, and says so.
        expire(&url, run_a.id()).await;
        let refused = [
            a.create(
                &crate::ids::testing::by("worker:1"),
                NewTask::titled("late"),
            )
            .await
            .map(drop),
            a.update(
                task.number,
                TaskPatch {
                    title: Some("late".into()),
                    ..TaskPatch::default()
                },
            )
            .await
            .map(drop),
            a.record(call()).await,
        ];
        for write in refused {
            let err = write.unwrap_err().to_string();
            assert!(
                err.contains(&run_a.id().to_string()) && err.contains("dropped"),
                "{err}"
            );
        }
        let db = admin(&url).await;
        let titles: Vec<String> = db
            .query("SELECT title FROM tasks ORDER BY number", &[])
            .await
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect();
        assert_eq!(titles, ["kept"]);
        let audited: i64 = db
            .query_one("SELECT count(*) FROM audit", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(audited, 1);
        // A live host, and a command with no run, write as before.
        b.record(call()).await.unwrap();
        let command = Postgres::connect(&url).await.unwrap();
        command
            .create(
                &crate::ids::testing::by("cli"),
                NewTask::titled("from a command"),
            )
            .await
            .unwrap();
    }
}
