//! One worker per task description across hosts: a row per reserved description, held
//! by its worker until the worker ends or its run is over. Two hosts reserving one
//! description at once meet at the row's primary key: one inserts, the other finds it.

use super::Postgres;
use super::prepared::Prepared;
use super::rows::parsed;
use super::sessions::run_is_live;
use crate::ids::ProcessId;
use crate::services::Operation;
use crate::services::{RunId, ServiceError};

impl Postgres {
    /// [`Ledger::reserve_task`](crate::services::Ledger::reserve_task).
    pub(super) async fn reserve_task_row(
        &self,
        run: RunId,
        key: &str,
        worker: &ProcessId,
    ) -> Result<Option<ProcessId>, ServiceError> {
        let worker = worker.to_string();
        let failed = |err| self.failed(Operation::LedgerReserveTask, err);
        loop {
            let client = self.client().await?;
            // One statement: a holder that ended, or whose run is over, is replaced under
            // the row's lock, so two hosts replacing it cannot both win.
            let sql = format!(
                "INSERT INTO task_reservations (task, worker, run) VALUES ($1, $2, $3)
                 ON CONFLICT (task) DO UPDATE SET worker = $2, run = $3
                     WHERE NOT {}
                        OR EXISTS (SELECT 1 FROM workers w WHERE w.id = task_reservations.worker
                                   AND w.state NOT IN ('running', 'waiting-for-input'))
                 RETURNING worker",
                run_is_live("task_reservations.run")
            );
            let reserved = client
                .query_opt_cached(&sql, &[&key, &worker, &(run.get() as i64)])
                .await
                .map_err(failed)?;
            if reserved.is_some() {
                return Ok(None);
            }
            let holder = client
                .query_opt_cached(
                    "SELECT worker FROM task_reservations WHERE task = $1",
                    &[&key],
                )
                .await
                .map_err(failed)?;
            if let Some(row) = holder {
                return parsed(&row, 0).map(Some);
            }
            // Released between the two statements: reserve again.
        }
    }

    /// [`Ledger::release_task`](crate::services::Ledger::release_task).
    pub(super) async fn release_task_row(
        &self,
        key: &str,
        worker: &ProcessId,
    ) -> Result<(), ServiceError> {
        let worker = worker.to_string();
        self.client()
            .await?
            .execute_cached(
                "DELETE FROM task_reservations WHERE task = $1 AND worker = $2",
                &[&key, &worker],
            )
            .await
            .map_err(|err| self.failed(Operation::LedgerReleaseTask, err))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_cluster::{TestCluster, admin};
    use super::*;
    use crate::services::{Ledger, WorkerState};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_reservations_of_one_task_across_two_hosts_make_one_holder() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let (a, b) = (
            Postgres::connect(&url).await.unwrap(),
            Postgres::connect(&url).await.unwrap(),
        );
        let (run_a, run_b) = (a.begin_run().await.unwrap(), b.begin_run().await.unwrap());
        let tries: Vec<_> = (0..50)
            .map(|n| {
                let (host, run) = if n % 2 == 0 {
                    (a.clone(), run_a.id())
                } else {
                    (b.clone(), run_b.id())
                };
                tokio::spawn(async move {
                    let worker = crate::ids::testing::pid(&format!("worker:{n}"));
                    let held = host.reserve_task(run, "sort the files", &worker).await;
                    (worker, held.unwrap())
                })
            })
            .collect();
        let mut winners = Vec::new();
        let mut named = std::collections::HashSet::new();
        for attempt in tries {
            match attempt.await.unwrap() {
                (worker, None) => winners.push(worker),
                (_, Some(holder)) => {
                    named.insert(holder);
                }
            }
        }
        assert_eq!(winners.len(), 1, "{winners:?}");
        assert!(named.iter().all(|n| *n == winners[0]), "{named:?}");

        // While its worker runs, nobody else gets the description.
        let holder = winners[0].clone();
        let (host, run) = if a
            .reserve_task(
                run_a.id(),
                "sort the files",
                &crate::ids::testing::pid("worker:x"),
            )
            .await
            .unwrap()
            .is_none()
        {
            panic!("a live holder was replaced");
        } else {
            let held_by_a: bool = admin(&url)
                .await
                .query_one(
                    "SELECT run = $1 FROM task_reservations",
                    &[&(run_a.id().get() as i64)],
                )
                .await
                .unwrap()
                .get(0);
            if held_by_a {
                (a.clone(), run_a.id())
            } else {
                (b.clone(), run_b.id())
            }
        };
        let main = crate::ids::testing::pid("channel:main");
        host.worker_started(run, &holder, &main, "sort the files")
            .await
            .unwrap();
        host.set_worker_state(&holder, WorkerState::Done, Some("sorted"))
            .await
            .unwrap();
        // It ended: the description is free, released or not.
        assert_eq!(
            b.reserve_task(
                run_b.id(),
                "sort the files",
                &crate::ids::testing::pid("worker:100")
            )
            .await
            .unwrap(),
            None,
            "an ended holder is replaced"
        );
        b.release_task("sort the files", &crate::ids::testing::pid("worker:100"))
            .await
            .unwrap();
        assert_eq!(
            a.reserve_task(
                run_a.id(),
                "sort the files",
                &crate::ids::testing::pid("worker:101")
            )
            .await
            .unwrap(),
            None,
            "a released description is free"
        );
        // The run of its holder is over: free.
        drop(run_a);
        a.settle().await;
        assert_eq!(
            b.reserve_task(
                run_b.id(),
                "sort the files",
                &crate::ids::testing::pid("worker:102")
            )
            .await
            .unwrap(),
            None
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn admissions_at_once_never_pass_the_worker_limit() {
        let cluster = TestCluster::start();
        let url = cluster.fresh_database().await;
        let host = Postgres::connect(&url).await.unwrap();
        let run = host.begin_run().await.unwrap();
        let admissions: Vec<_> = (0..20)
            .map(|n| {
                let (host, run) = (host.clone(), run.id());
                tokio::spawn(async move {
                    let id = crate::ids::testing::pid(&format!("worker:{n}"));
                    let main = crate::ids::testing::pid("channel:main");
                    host.admit_worker(run, &id, &main, "t", 3).await
                })
            })
            .collect();
        let mut admitted = 0;
        for admission in admissions {
            match admission.await.unwrap() {
                Ok(()) => admitted += 1,
                Err(err) => assert!(
                    err.to_string()
                        .contains("limits.max_workers_per_channel (3)"),
                    "{err}"
                ),
            }
        }
        assert_eq!(admitted, 3);
        // One ends: one more is admitted, to the limit again.
        let working: String = admin(&url)
            .await
            .query_one("SELECT min(id) FROM workers", &[])
            .await
            .unwrap()
            .get(0);
        host.set_worker_state(
            &crate::ids::testing::pid(&working),
            WorkerState::Done,
            Some("done"),
        )
        .await
        .unwrap();
        host.admit_worker(
            run.id(),
            &crate::ids::testing::pid("worker:50"),
            &crate::ids::testing::pid("channel:main"),
            "t",
            3,
        )
        .await
        .unwrap();
        assert!(
            host.admit_worker(
                run.id(),
                &crate::ids::testing::pid("worker:51"),
                &crate::ids::testing::pid("channel:main"),
                "t",
                3
            )
            .await
            .is_err()
        );
        // Another channel counts for itself.
        host.admit_worker(
            run.id(),
            &crate::ids::testing::pid("worker:52"),
            &crate::ids::testing::pid("channel:other"),
            "t",
            3,
        )
        .await
        .unwrap();
    }
}
