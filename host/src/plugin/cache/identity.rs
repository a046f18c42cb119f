//! Checked once per file identity: what lets a file be checked once rather than on every
//! load.
//!
//! A write to a file through `write()` moves its change time, which no process can set
//! back, and a file replaced by a rename is another inode. So a file whose [`FileStamp`]
//! (device, inode, size, change time) is the one recorded when its bytes were checked still
//! holds those bytes, with one gap: a write in the same tick of the file system's clock as
//! the change before it leaves the change time as it was. A check is therefore recorded
//! only when the file had last changed at least [`SETTLED`] before the check began: any
//! later write then moves it.
//!
//! What this vouches for is the file as written through the kernel of this machine:
//! writes through a shared writable mapping (whose change time may move only once per
//! writeback), file systems whose server keeps the times (network and FUSE mounts), and
//! bits a disk flips without a write are caught on the first check only: a code byte
//! changed that way in an artifact goes unnoticed (wasmtime checks an artifact's header,
//! version and engine settings, not its code), and a changed plugin file is noticed by
//! its digest only when it must be compiled.

use std::time::{Duration, SystemTime};

pub(crate) use crate::services::FileStamp;

/// How long a file must have gone unchanged, before its check began, for the check to
/// be recorded. Above the coarsest timestamp granularity of file systems a host might
/// keep plugins on (FAT's two seconds; ext4 with small inodes, one).
pub(crate) const SETTLED: Duration = Duration::from_secs(2);

/// The stamp of the open `file`, read now.
pub(crate) fn stamp_of(file: &std::fs::File) -> std::io::Result<FileStamp> {
    Ok(FileStamp::of(&file.metadata()?))
}

/// The device and inode of `stamp`: what a record of the file is filed under.
pub(crate) fn inode_of(stamp: &FileStamp) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&stamp.dev.to_le_bytes());
    key[8..].copy_from_slice(&stamp.ino.to_le_bytes());
    key
}

/// Whether the file of `stamp` last changed at least [`SETTLED`] before `began` (when its
/// check began, taken before the stamp was read), so the check may be recorded. A change
/// time in the future (a clock set back) never is.
pub(crate) fn settled(stamp: &FileStamp, began: SystemTime) -> bool {
    let Ok(nanos) = u64::try_from(stamp.ctime_ns) else {
        return false;
    };
    let changed = SystemTime::UNIX_EPOCH + Duration::from_nanos(nanos);
    began
        .duration_since(changed)
        .is_ok_and(|age| age >= SETTLED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changed_at(stamp: &FileStamp) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_nanos(stamp.ctime_ns as u64)
    }

    #[test]
    fn a_check_is_recorded_only_once_the_file_has_settled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"one").unwrap();
        let stamp = stamp_of(&std::fs::File::open(&path).unwrap()).unwrap();
        let changed = changed_at(&stamp);
        assert!(!settled(&stamp, changed));
        assert!(!settled(
            &stamp,
            changed + SETTLED - Duration::from_millis(1)
        ));
        assert!(settled(&stamp, changed + SETTLED));
        assert!(
            !settled(&stamp, changed - Duration::from_secs(60)),
            "changed in the future"
        );
    }

    #[test]
    fn a_write_in_place_after_the_file_settled_changes_its_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"one").unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let before = stamp_of(&file).unwrap();
        // The same size and contents, written again through the same inode once the first
        // write has settled: the change time moves, whatever the clock's tick.
        while !settled(&before, SystemTime::now()) {
            std::thread::sleep(Duration::from_millis(50));
        }
        std::fs::write(&path, b"one").unwrap();
        let after = stamp_of(&file).unwrap();
        assert_eq!(inode_of(&before), inode_of(&after));
        assert_ne!(before, after);
    }
}
