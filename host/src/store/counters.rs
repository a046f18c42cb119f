//! Persisted counters: numbers that stay unique across runs and processes sharing a
//! database, for process ids such as `worker:N`.

use rusqlite::Transaction;

use super::{Store, StoreError};
use crate::ids::ProcessKind;

impl Store {
    /// The next number of `kind` (a worker, a branch): 1 the first time, then one
    /// more than the last number any run or process drew, so no two draws ever share a
    /// number.
    ///
    /// ```
    /// use capstan_host::ids::ProcessKind::{Branch, Worker};
    /// use capstan_host::store::Store;
    ///
    /// let dir = tempfile::tempdir().unwrap();
    /// let store = Store::open(dir.path()).unwrap();
    /// assert_eq!(store.next_process_number(Worker).unwrap(), 1);
    /// assert_eq!(store.next_process_number(Worker).unwrap(), 2);
    /// assert_eq!(store.next_process_number(Branch).unwrap(), 1);
    /// drop(store);
    /// let reopened = Store::open(dir.path()).unwrap();
    /// assert_eq!(reopened.next_process_number(Worker).unwrap(), 3);
    /// ```
    pub fn next_process_number(&self, kind: ProcessKind) -> Result<u64, StoreError> {
        self.write(|tx| next_number_in(tx, kind))
    }
}

/// Draws the next number of `kind` inside `tx`.
fn next_number_in(tx: &Transaction<'_>, kind: ProcessKind) -> Result<u64, StoreError> {
    let number: i64 = tx
        .prepare_cached(
            "INSERT INTO counters (kind, last) VALUES (?1, 1)
             ON CONFLICT(kind) DO UPDATE SET last = last + 1
             RETURNING last",
        )?
        .query_row([kind.as_str()], |row| row.get(0))?;
    Ok(number as u64)
}

#[cfg(test)]
mod tests {
    use crate::ids::ProcessKind::{Branch, Worker};
    use crate::store::tests::temp_store as store;

    #[test]
    fn numbers_start_at_one_and_count_per_kind() {
        let (_dir, store) = store();
        let draws: Vec<u64> = [Worker, Worker, Branch, Worker]
            .into_iter()
            .map(|kind| store.next_process_number(kind).unwrap())
            .collect();
        assert_eq!(draws, [1, 2, 1, 3]);
    }
}
