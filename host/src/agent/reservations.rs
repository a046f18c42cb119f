//! The duplicate-worker guard: at most one live worker per task description.
//!
//! Spawning reserves the normalized description; the check and the insert happen under
//! one lock, so two spawns racing on the same task cannot both win. The [`Reservation`]
//! lives inside the worker's future and releases the description when dropped: on every
//! terminal path (done, failed, cancelled, a panic unwinding, the task aborted).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::ids::ProcessId;

/// The live reservations: normalized task description -> worker id.
#[derive(Debug, Default)]
pub(crate) struct TaskReservations {
    active: Mutex<HashMap<String, ProcessId>>,
}

/// One held reservation; dropping it releases the description.
#[derive(Debug)]
pub(crate) struct Reservation {
    key: String,
    worker: ProcessId,
    owner: Arc<TaskReservations>,
}

impl TaskReservations {
    /// Reserves `task` for `worker`, or returns the worker that already holds it.
    pub(crate) fn reserve(
        self: &Arc<Self>,
        task: &str,
        worker: &ProcessId,
    ) -> Result<Reservation, ProcessId> {
        let key = task_key(task);
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = active.get(&key) {
            return Err(existing.clone());
        }
        active.insert(key.clone(), worker.clone());
        Ok(Reservation {
            key,
            worker: worker.clone(),
            owner: self.clone(),
        })
    }

    /// The worker holding `task`, if a live one does.
    pub(crate) fn holder(&self, task: &str) -> Option<ProcessId> {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        active.get(&task_key(task)).cloned()
    }

    /// How many descriptions are reserved.
    pub(crate) fn len(&self) -> usize {
        self.active.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Reservation {
    /// The normalized description it holds.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut active = self.owner.active.lock().unwrap_or_else(|p| p.into_inner());
        if active.get(&self.key) == Some(&self.worker) {
            active.remove(&self.key);
        }
    }
}

/// Lowercase, single spaces, no surrounding whitespace or trailing punctuation: the same
/// task asked twice with different spacing or a final period is one task.
pub(crate) fn task_key(task: &str) -> String {
    let words: Vec<String> = task.split_whitespace().map(str::to_lowercase).collect();
    words
        .join(" ")
        .trim_end_matches(['.', '!', '?', ';', ':', ','])
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(n: u64) -> ProcessId {
        ProcessId::numbered(crate::policy::ProcessKind::Worker, n)
    }

    #[test]
    fn the_same_task_is_reserved_once_until_released() {
        let reservations = Arc::new(TaskReservations::default());
        let first = reservations
            .reserve("Gather the  open items.", &w(1))
            .unwrap();
        assert_eq!(
            reservations
                .reserve("gather the open items", &w(2))
                .unwrap_err(),
            w(1)
        );
        assert!(
            reservations
                .reserve("gather the closed items", &w(3))
                .is_ok()
        );
        drop(first);
        assert_eq!(reservations.len(), 0, "both released");
        assert!(reservations.reserve("Gather the open items", &w(4)).is_ok());
    }
}
