//! What a call touched beyond its arguments, as the host saw it: the workspace files it
//! opened, listed and wrote, and the hosts its requests reached ([`Touched`]). The host
//! labels the call's result and the files it wrote from these facts
//! ([`crate::tools::ToolRouter`]), never from what the tool says.
//!
//! Files are noted as the guest reaches them through WASI
//! ([`file_access`](super::file_access)): an
//! `open-at` (read, or write when it may change the file: opened to write, created or
//! truncated; a write that does not truncate also reads what the file keeps), a `read-directory`, a `readlink-at` (a read of the link), and the calls
//! that make or move a name (`rename-at` reads and moves the old name and writes the new;
//! `link-at` reads the old and writes the new; `symlink-at` and `create-directory-at`
//! write the new). Each descriptor's path is
//! kept so a path opened beneath it is known in full; a descriptor the host did not see
//! opened is the workspace itself (the only preopen). A read's [`FileStamp`] is taken
//! from the descriptor just opened, so it names the file the guest got, whatever its
//! path resolved through.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use super::error::ToolError;
use crate::flow::Label;
use crate::ids::SessionKey;
use crate::services::{FILE_LABELS_MAX, FileStamp, Receipt};
use crate::telemetry::DenialReason;

/// What one call touched beyond its arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Touched {
    /// Workspace files opened to read, by path relative to the workspace, each with the
    /// stamp of what was opened (`None`: it could not be read), once per file a path
    /// named. A kept instance's reads add up over its calls: what it read once it may
    /// still hold.
    pub read: BTreeSet<(String, Option<FileStamp>)>,
    /// Workspace directories listed, by path (`.` is the workspace), each with the stamp
    /// of the directory the guest held when it listed it: a path that leads elsewhere by
    /// the time the call is labelled did not name what was listed.
    pub listed: BTreeSet<(String, Option<FileStamp>)>,
    /// Workspace paths this call may have written, each with the stamp of the file it
    /// opened to write there, when it opened one (a name made or moved has none): a file
    /// moved away before the call ends is still known by its device and inode.
    pub written: BTreeSet<(String, Option<FileStamp>)>,
    /// The hosts the call's requests reached (connected to).
    pub hosts: BTreeSet<String>,
    /// The join of the labels of what the host's imports gave it (tasks, memories). A
    /// kept instance's add up over its calls, as its reads do.
    pub labels: Label,
    /// Whether it touched more than [`FILE_LABELS_MAX`] paths: those past it are not named.
    pub overflowed: bool,
    /// The workspace paths it moved names away from (`rename-at`), as they were: what lay
    /// beneath a moved directory moved with it, and a file it opened to write that its
    /// path no longer leads to when it ends may have moved too.
    pub moved: BTreeSet<String>,
}

impl Touched {
    /// Whether it names nothing.
    pub fn is_empty(&self) -> bool {
        self.read.is_empty()
            && self.listed.is_empty()
            && self.written.is_empty()
            && self.hosts.is_empty()
            && self.labels.is_clear()
            && !self.overflowed
    }

    fn room(&mut self) -> bool {
        let full = self.paths() >= FILE_LABELS_MAX;
        self.overflowed |= full;
        !full
    }

    /// How many paths it names.
    fn paths(&self) -> usize {
        self.read.len() + self.listed.len() + self.written.len() + self.moved.len()
    }

    fn note_read(&mut self, path: String, stamp: Option<FileStamp>) {
        let read = (path, stamp);
        if !self.read.contains(&read) && self.room() {
            self.read.insert(read);
        }
    }

    fn note_listed(&mut self, path: String, stamp: Option<FileStamp>) {
        let listed = (path, stamp);
        if !self.listed.contains(&listed) && self.room() {
            self.listed.insert(listed);
        }
    }

    /// Notes `path` written; whether it was not noted before.
    fn note_written(&mut self, path: String, stamp: Option<FileStamp>) -> bool {
        let written = (path, stamp);
        !self.written.contains(&written) && self.room() && self.written.insert(written)
    }
}

/// A call that has ended: what it gave back, what it touched, and what it used as far as
/// the runtime measured it (the registry adds the wall time and the bytes).
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) result: Result<String, ToolError>,
    pub(crate) touched: Touched,
    pub(crate) receipt: Receipt,
    /// What denied it, when the host did before the tool ran; a `denied` answer without
    /// it is the tool's own.
    pub(crate) denied_by: Option<DenialReason>,
}

impl Ran {
    /// A call that ended with `result` having run no instance: it touched nothing.
    pub(crate) fn without_instance(result: Result<String, ToolError>) -> Self {
        Ran {
            result,
            touched: Touched::default(),
            receipt: Receipt::default(),
            denied_by: None,
        }
    }

    /// A call the host refused with `err` before it ran, for `reason` when it is a denial.
    pub(crate) fn refused(err: ToolError, reason: Option<DenialReason>) -> Self {
        Ran {
            denied_by: reason,
            ..Ran::without_instance(Err(err))
        }
    }
}

/// Where a call's [`Touched`] is noted: shared by the sandbox, which notes, and the host
/// running the call, which reads it after the call, however the call ended (a call that
/// traps, is cancelled or is dropped may have written files too).
pub(crate) type TouchLog = Arc<Mutex<Touched>>;

/// How the host labels what a call read beyond its arguments, from what it touched: each
/// file by the label its writer left (see [`crate::tools::ToolRouter`]). The plugin runtime
/// asks it when a call writes a task or a memory, so what goes in carries each file's own
/// label, a secret's included.
pub(crate) trait ReadLabels: Send + Sync {
    /// The label of what a call that touched `touched` read.
    fn read_label<'a>(
        &'a self,
        touched: &'a Touched,
    ) -> Pin<Box<dyn Future<Output = Label> + Send + 'a>>;

    /// A call opened the file `stamp` names to write: until that call is labelled, what
    /// another reads of it is of unknown origin.
    fn opened_to_write(&self, stamp: FileStamp);
}

/// What a caller hands a plugin call beside its arguments, and gets back however the call
/// ends: the label of what it put in (what the call writes to tasks and memories carries
/// it), how what the call reads is labelled, and the log of what the call touched.
#[derive(Default)]
pub(crate) struct CallTrace {
    pub(crate) label: Label,
    /// `None`: the caller keeps no labels of files (a client's call), and a call that read
    /// any is taken to hold the workspace's untrusted, private data.
    pub(crate) reads: Option<Arc<dyn ReadLabels>>,
    pub(crate) log: TouchLog,
    /// The conversation whose work the call is, for its audit row.
    pub(crate) conversation: Option<SessionKey>,
}

impl fmt::Debug for CallTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallTrace")
            .field("label", &self.label)
            .field("reads", &self.reads.is_some())
            .field("log", &self.log)
            .field("conversation", &self.conversation)
            .finish()
    }
}

impl CallTrace {
    /// A trace for a call its caller put `label` into, whose reads `reads` labels.
    pub(crate) fn new(label: Label, reads: Arc<dyn ReadLabels>) -> Self {
        CallTrace {
            label,
            reads: Some(reads),
            log: TouchLog::default(),
            conversation: None,
        }
    }

    /// This trace, for a call that is part of `conversation`'s work.
    pub(crate) fn in_conversation(mut self, conversation: Option<SessionKey>) -> Self {
        self.conversation = conversation;
        self
    }

    /// What the call has touched so far.
    pub(crate) fn touched(&self) -> Touched {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// The files a sandbox's guest reached, and where each of its descriptors points.
#[derive(Debug, Default)]
pub(crate) struct FileAccess {
    /// Descriptor resource -> its path relative to the workspace. A slot reused by
    /// another descriptor is overwritten when that one is opened.
    paths: HashMap<u32, String>,
    log: TouchLog,
}

impl FileAccess {
    /// The workspace path of `name` opened beneath descriptor `dir`.
    fn path(&self, dir: u32, name: &str) -> String {
        let base = self.paths.get(&dir).map_or("", String::as_str);
        joined(base, name)
    }

    /// Notes that `name` beneath descriptor `dir` was reached `how`.
    pub(crate) fn reached(&mut self, dir: u32, name: &str, how: Reached) {
        let path = self.path(dir, name);
        let mut touched = self.touched();
        match how {
            Reached::Read(stamp) => touched.note_read(path, stamp),
            Reached::Listed(stamp) => touched.note_listed(path, stamp),
            Reached::Moved(stamp) => {
                if !touched.moved.contains(&path) && touched.room() {
                    touched.moved.insert(path.clone());
                }
                touched.note_read(path, stamp);
            }
            Reached::Written => {
                touched.note_written(path, None);
            }
        }
    }

    /// Whether it has noted all the paths one call may reach ([`FILE_LABELS_MAX`]): the
    /// guest is then refused any more (`quota`), so nothing it reaches goes unnoted.
    pub(crate) fn full(&self) -> bool {
        let touched = self.touched();
        touched.paths() >= FILE_LABELS_MAX
    }

    /// What has been noted.
    pub(crate) fn touched(&self) -> MutexGuard<'_, Touched> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Notes the next call's access in `log`: what the instance read before is carried
    /// into it (it may still hold it), what the last call wrote and reached is not (it
    /// was labelled then).
    pub(crate) fn log_into(&mut self, log: TouchLog) {
        {
            let before = self.touched();
            let mut next = log.lock().unwrap_or_else(|e| e.into_inner());
            next.read.clone_from(&before.read);
            next.listed.clone_from(&before.listed);
            next.labels.join(&before.labels);
            next.overflowed |= before.overflowed;
        }
        self.log = log;
    }

    /// Notes that `name` beneath descriptor `dir` was opened as descriptor `opened` with
    /// `access`, and the stamp of what it read. Whether it newly noted a file opened to
    /// write.
    pub(crate) fn opened(
        &mut self,
        dir: u32,
        name: &str,
        opened: u32,
        access: Access,
        stamp: Option<FileStamp>,
    ) -> bool {
        let path = self.path(dir, name);
        let mut newly_written = false;
        // Opening a directory reads nothing yet: listing it does.
        if !access.directory {
            let mut touched = self.touched();
            if access.writes {
                newly_written = touched.note_written(path.clone(), stamp);
            }
            // A write that does not truncate keeps what the file held: it goes into what
            // the call writes as a read would (an empty file holds nothing).
            let kept = access.writes && !access.truncates && stamp.is_none_or(|s| s.len > 0);
            if access.reads || kept {
                touched.note_read(path.clone(), stamp);
            }
        }
        self.paths.insert(opened, path);
        newly_written
    }
}

/// How a call reached a path other than by opening it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Reached {
    /// Read (a link, a name moved or linked away), with the stamp of what it named.
    Read(Option<FileStamp>),
    /// Listed (a directory), with the stamp of the directory listed.
    Listed(Option<FileStamp>),
    /// Moved away from (the old name of a rename), with the stamp of what it named.
    Moved(Option<FileStamp>),
    /// Written (a name made, moved or linked to).
    Written,
}

/// How a descriptor was opened.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Access {
    /// It may read the file (or list the directory) it names.
    pub(crate) reads: bool,
    /// It may change the file: opened to write, created or truncated.
    pub(crate) writes: bool,
    /// It emptied the file first.
    pub(crate) truncates: bool,
    /// It is a directory.
    pub(crate) directory: bool,
}

/// `base/name`, without `.` and empty parts (`..` is kept: only the filesystem knows
/// what it leads to). The workspace itself is `.`.
fn joined(base: &str, name: &str) -> String {
    let parts: Vec<&str> = base
        .split('/')
        .chain(name.split('/'))
        .filter(|part| !part.is_empty() && *part != ".")
        .collect();
    if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_joined_beneath_their_directory_without_dots() {
        assert_eq!(joined("", "."), ".");
        assert_eq!(joined("", "./notes//a.md"), "notes/a.md");
        assert_eq!(joined("notes", "../b.md"), "notes/../b.md");
        assert_eq!(joined(".", "a"), "a");
    }

    #[test]
    fn a_path_opened_to_two_files_names_both_and_room_runs_out() {
        let stamp = |ino| {
            Some(FileStamp {
                dev: 1,
                ino,
                len: 0,
                ctime_ns: 0,
            })
        };
        let mut touched = Touched::default();
        touched.note_read("a".into(), stamp(1));
        touched.note_read("a".into(), stamp(1));
        assert_eq!(touched.read.len(), 1);
        touched.note_read("a".into(), stamp(2));
        assert_eq!(touched.read.len(), 2);
        for n in 0..FILE_LABELS_MAX {
            touched.note_written(format!("w{n}"), None);
        }
        assert!(touched.overflowed);
        assert!(touched.written.len() < FILE_LABELS_MAX);
    }

    #[test]
    fn a_sandbox_that_noted_all_it_may_is_full() {
        let mut access = FileAccess::default();
        for n in 0..FILE_LABELS_MAX - 1 {
            access.reached(0, &format!("f{n}"), Reached::Written);
        }
        assert!(!access.full());
        access.reached(0, "last", Reached::Listed(None));
        assert!(access.full());
    }
}
