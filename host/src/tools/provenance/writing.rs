//! [`Writing`]: the files calls have opened to write and are not yet labelled for. Their
//! writers' labels are known only when those calls end, so a read of one meanwhile is of
//! unknown origin and readers.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::plugin::Touched;
use crate::services::FileStamp;

/// A file by its device and inode.
type FileId = (u64, u64);

fn id(stamp: &FileStamp) -> FileId {
    (stamp.dev, stamp.ino)
}

/// How many calls have each file open to write, by its device and inode. Only this host's
/// calls are counted: a file another host's call is writing reads as its default until
/// that call is labelled.
#[derive(Debug, Default)]
pub(super) struct Writing(Mutex<HashMap<FileId, usize>>);

impl Writing {
    fn files(&self) -> MutexGuard<'_, HashMap<FileId, usize>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A call opened `stamp`'s file to write (noted once per call and file version).
    pub(super) fn opened(&self, stamp: &FileStamp) {
        *self.files().entry(id(stamp)).or_default() += 1;
    }

    /// The call that touched `touched` is labelled: the files it opened to write are no
    /// longer its.
    pub(super) fn done(&self, touched: &Touched) {
        let mut files = self.files();
        for stamp in touched
            .written
            .iter()
            .filter_map(|(_, stamp)| stamp.as_ref())
        {
            if let Some(count) = files.get_mut(&id(stamp)) {
                *count -= 1;
                if *count == 0 {
                    files.remove(&id(stamp));
                }
            }
        }
    }

    /// Whether a file the call that touched `touched` read is open to write in another
    /// call, or, when it listed or moved a directory, any file is: its name may be among
    /// those it saw.
    pub(super) fn by_others(&self, touched: &Touched) -> bool {
        let files = self.files();
        if files.is_empty() {
            return false;
        }
        if !touched.listed.is_empty() || !touched.moved.is_empty() {
            let own = touched.written.iter().filter(|(_, s)| s.is_some()).count();
            if files.values().sum::<usize>() > own {
                return true;
            }
        }
        touched
            .read
            .iter()
            .filter_map(|(_, stamp)| stamp.as_ref())
            .any(|read| {
                let own = touched
                    .written
                    .iter()
                    .filter(|(_, stamp)| stamp.as_ref().is_some_and(|s| id(s) == id(read)))
                    .count();
                files.get(&id(read)).is_some_and(|&count| count > own)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(ino: u64, len: u64) -> FileStamp {
        FileStamp::new(1, ino, len, 0, 0)
    }

    #[test]
    fn a_file_another_call_writes_is_open_until_that_call_is_done() {
        let writing = Writing::default();
        let mut writer = Touched::default();
        writer.written.insert(("a".into(), Some(stamp(7, 0))));
        let mut reader = Touched::default();
        reader.read.insert(("a".into(), Some(stamp(7, 3))));
        assert!(!writing.by_others(&reader));
        writing.opened(&stamp(7, 0));
        assert!(writing.by_others(&reader));
        // The writer reading its own file is not another's write.
        let mut own = writer.clone();
        own.read.insert(("a".into(), Some(stamp(7, 3))));
        assert!(!writing.by_others(&own));
        // A listing may show the name of any file being written.
        let mut lister = Touched::default();
        lister.listed.insert((".".into(), None));
        assert!(writing.by_others(&lister));
        let mut own_listing = writer.clone();
        own_listing.listed.insert((".".into(), None));
        assert!(!writing.by_others(&own_listing));
        writing.done(&writer);
        assert!(!writing.by_others(&reader));
        assert!(!writing.by_others(&lister));
        assert!(writing.files().is_empty());
    }
}
