//! The spill file (`store.spill_file`): conversations' histories the store refused, kept
//! on disk besides memory, so that a stop or a crash during an outage loses none of them.
//!
//! A history is spilled whole, as it would be stored (redacted), before any exchange is
//! told it is not yet stored, and dropped from the file once the store takes it. At the
//! next start each spilled conversation is opened: under that host's claim on it, a
//! spilled history that extends what the store holds is written to the store; one that
//! does not (another host answered the conversation meanwhile, or compacted it) is moved
//! to a file of its own beside the spill and reported, never dropped.
//!
//! The file is replaced whole through a temporary file and a rename, so a crash leaves the
//! old or the new one, never half of one; it is written only while the store refuses. What
//! is in memory changes only once the file says it too, so a spill that cannot be written
//! is never reported as kept. One process at a time uses a spill file: it holds a lock on
//! `NAME.lock` beside it for its life, and a second is refused at its start.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use cap_std::ambient_authority;
use cap_std::fs::Dir;
use serde::{Deserialize, Serialize};

use crate::ids::ProcessId;
use crate::services::RunId;

/// The file's format version.
const VERSION: u32 = 1;

/// Why the spill file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    /// It could not be read or written.
    #[error(
        "{}: cannot use the spill file: {source}; fix its directory's permissions or space, \
         or set store.spill_file elsewhere", path.display()
    )]
    Io {
        /// The spill file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Another process uses it.
    #[error(
        "{}: another capstan process uses this spill file; give each host its own \
         store.spill_file", path.display()
    )]
    InUse {
        /// The spill file.
        path: PathBuf,
    },
    /// It is not a spill file this host can read.
    #[error(
        "{}: is not a capstan spill file ({reason}); it was left untouched: move it aside \
         (the histories in it were not stored) or set store.spill_file elsewhere",
        path.display()
    )]
    Unreadable {
        /// The spill file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// What the file holds.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Contents {
    version: u32,
    conversations: BTreeMap<ProcessId, Spilled>,
}

/// One conversation's spilled history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Spilled {
    /// The run that spilled it: until its lease ends, it may still hold the conversation.
    pub(crate) run: RunId,
    /// The whole history, message by message as stored (JSON text).
    pub(crate) rows: Vec<String>,
}

/// The spill file and the histories it holds.
#[derive(Debug)]
pub(crate) struct Spill {
    path: PathBuf,
    dir: Dir,
    name: String,
    /// What the file holds: read on async threads, so it is locked only to be read or
    /// swapped, never across the disk work.
    held: Mutex<BTreeMap<ProcessId, Spilled>>,
    /// Taken by each change for its whole course (read, write the file, swap), so changes
    /// go one at a time.
    writing: Mutex<()>,
    /// The lock that keeps other processes off the file, held for this one's life.
    _lock: File,
}

/// The lock file beside a spill file named `name`.
fn lock_name(name: &str) -> String {
    format!("{name}.lock")
}

impl Spill {
    /// Opens the spill file at `path`, reading the histories an earlier run left in it.
    /// A missing file is an empty spill; its directory must exist.
    pub(crate) fn open(path: &Path) -> Result<Spill, SpillError> {
        let io = |source| SpillError::Io {
            path: path.to_owned(),
            source,
        };
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| SpillError::Unreadable {
                path: path.to_owned(),
                reason: "the path names no file".into(),
            })?
            .to_owned();
        let dir = Dir::open_ambient_dir(parent, ambient_authority()).map_err(io)?;
        let lock = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(parent.join(lock_name(&name)))
            .map_err(io)?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(SpillError::InUse {
                    path: path.to_owned(),
                });
            }
            Err(std::fs::TryLockError::Error(err)) => return Err(io(err)),
        }
        let unreadable = |reason: String| SpillError::Unreadable {
            path: path.to_owned(),
            reason,
        };
        let held = match std::fs::symlink_metadata(path) {
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Contents::default(),
            Err(err) => return Err(io(err)),
            Ok(meta) if !meta.is_file() => {
                return Err(unreadable(
                    "not a regular file (a symbolic link or a directory is never followed)".into(),
                ));
            }
            // What it holds is written to the store: only this user may have put it there.
            Ok(meta) if meta.uid() != rustix::process::geteuid().as_raw() => {
                return Err(unreadable(format!(
                    "owned by user {}, not by the user capstan runs as",
                    meta.uid()
                )));
            }
            Ok(meta) if meta.mode() & 0o022 != 0 => {
                return Err(unreadable(format!(
                    "others may write it (mode {:o}); it must be the owner's alone (0600)",
                    meta.mode() & 0o777
                )));
            }
            Ok(_) => {
                let text = dir.read_to_string(&name).map_err(io)?;
                let contents: Contents =
                    serde_json::from_str(&text).map_err(|err| unreadable(err.to_string()))?;
                if contents.version != VERSION {
                    return Err(unreadable(format!(
                        "version {} where this capstan reads {VERSION}",
                        contents.version
                    )));
                }
                contents
            }
        };
        Ok(Spill {
            path: path.to_owned(),
            dir,
            name,
            held: Mutex::new(held.conversations),
            writing: Mutex::new(()),
            _lock: lock,
        })
    }

    /// Where it is.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<ProcessId, Spilled>> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The conversations it holds a history of.
    pub(crate) fn conversations(&self) -> Vec<ProcessId> {
        self.lock().keys().cloned().collect()
    }

    /// The history it holds of `conversation`.
    pub(crate) fn history(&self, conversation: &ProcessId) -> Option<Spilled> {
        self.lock().get(conversation).cloned()
    }

    /// Whether the file holds a history of `conversation` (it cannot be stored now).
    pub(crate) fn holds(&self, conversation: &ProcessId) -> bool {
        self.lock().contains_key(conversation)
    }

    /// Changes what the file holds with `change` (which says whether it changed anything):
    /// the file is written first, and what is in memory follows only once it is.
    fn change(
        &self,
        change: impl FnOnce(&mut BTreeMap<ProcessId, Spilled>) -> bool,
    ) -> Result<(), SpillError> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = self.lock().clone();
        if !change(&mut next) {
            return Ok(());
        }
        self.write(&next)?;
        *self.lock() = next;
        Ok(())
    }

    /// Keeps `rows`, `conversation`'s whole history, in the file, as spilled by `run`.
    /// Blocks on the disk: call it off the async threads.
    pub(crate) fn keep(
        &self,
        conversation: &ProcessId,
        run: RunId,
        rows: Vec<String>,
    ) -> Result<(), SpillError> {
        let spilled = Spilled { run, rows };
        self.change(|held| {
            if held.get(conversation) == Some(&spilled) {
                return false;
            }
            held.insert(conversation.clone(), spilled);
            true
        })
    }

    /// Drops `conversation`'s history from the file: the store holds it. Blocks on the
    /// disk when the file holds it: call it off the async threads.
    pub(crate) fn release(&self, conversation: &ProcessId) -> Result<(), SpillError> {
        self.change(|held| held.remove(conversation).is_some())
    }

    /// Moves `conversation`'s history out of the file into a file of its own beside it,
    /// which is returned: it cannot be written to the store, and is kept for the operator.
    pub(crate) fn set_aside(&self, conversation: &ProcessId) -> Result<PathBuf, SpillError> {
        let Some(spilled) = self.history(conversation) else {
            return Ok(self.path.clone());
        };
        let name = format!(
            "{}.{}.{}.unstored",
            self.name,
            conversation.to_string().replace(['/', ':'], "_"),
            self.random_suffix()?
        );
        // Written there before it leaves the spill file: a crash between keeps both.
        self.replace(&name, &BTreeMap::from([(conversation.clone(), spilled)]))?;
        self.release(conversation)?;
        Ok(self.path.with_file_name(name))
    }

    /// Whether `spilled` begins with `stored`, message by message (compared as JSON, so a
    /// store that reformats what it keeps compares equal).
    pub(crate) fn extends(spilled: &[String], stored: &[String]) -> bool {
        let same = |a: &String, b: &String| {
            a == b
                || matches!(
                    (
                        serde_json::from_str::<serde_json::Value>(a),
                        serde_json::from_str::<serde_json::Value>(b),
                    ),
                    (Ok(a), Ok(b)) if a == b
                )
        };
        spilled.len() >= stored.len() && stored.iter().zip(spilled).all(|(a, b)| same(a, b))
    }

    /// Writes `conversations` as the file, or removes the file when there are none.
    fn write(&self, conversations: &BTreeMap<ProcessId, Spilled>) -> Result<(), SpillError> {
        if conversations.is_empty() {
            return match self.dir.remove_file(&self.name) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(self.io(err)),
                // The removal itself reaches the disk with the directory.
                _ => self.sync_dir().map_err(|err| self.io(err)),
            };
        }
        self.replace(&self.name, conversations)
    }

    /// Replaces file `name` in the spill's directory with `conversations`, through a
    /// temporary file with a random name, made exclusively (a planted name is never
    /// followed), and a rename.
    fn replace(
        &self,
        name: &str,
        conversations: &BTreeMap<ProcessId, Spilled>,
    ) -> Result<(), SpillError> {
        let tmp = format!(".{name}.tmp-{}", self.random_suffix()?);
        let text = serde_json::to_vec(&Contents {
            version: VERSION,
            conversations: conversations.clone(),
        })
        .expect("a spill serializes");
        // Only the owner may read it: it holds conversations.
        let mut options = cap_std::fs::OpenOptions::new();
        options.write(true).create_new(true);
        cap_std::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let written = (|| {
            let mut file = self.dir.open_with(&tmp, &options)?;
            file.write_all(&text)?;
            file.sync_all()?;
            self.dir.rename(&tmp, &self.dir, name)?;
            // The rename itself reaches the disk with the directory.
            self.sync_dir()
        })();
        if written.is_err() {
            let _ = self.dir.remove_file(&tmp);
        }
        written.map_err(|err| self.io(err))
    }

    /// Sixteen random hex digits, for names no one can plant in advance.
    fn random_suffix(&self) -> Result<String, SpillError> {
        let mut random = [0u8; 8];
        getrandom::fill(&mut random).map_err(|err| self.io(std::io::Error::other(err)))?;
        Ok(random.iter().map(|b| format!("{b:02x}")).collect())
    }

    fn sync_dir(&self) -> std::io::Result<()> {
        self.dir.open(".")?.sync_all()
    }

    fn io(&self, source: std::io::Error) -> SpillError {
        SpillError::Io {
            path: self.path.clone(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(texts: &[&str]) -> Vec<String> {
        texts
            .iter()
            .map(|t| format!("{{\"content\":\"{t}\"}}"))
            .collect()
    }

    #[test]
    fn a_kept_history_is_read_back_by_the_next_open_and_a_released_one_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spill.json");
        let main = ProcessId::channel("main");
        let spill = Spill::open(&path).unwrap();
        spill.keep(&main, RunId::new(7), rows(&["a", "b"])).unwrap();
        drop(spill);
        let again = Spill::open(&path).unwrap();
        let spilled = again.history(&main).unwrap();
        assert_eq!(
            (spilled.run, spilled.rows),
            (RunId::new(7), rows(&["a", "b"]))
        );
        again.release(&main).unwrap();
        assert!(!path.exists(), "an empty spill leaves no file");
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, ["spill.json.lock"], "no temporary file left");
    }

    #[test]
    fn a_history_that_cannot_be_stored_is_set_aside_in_a_file_of_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spill.json");
        let main = ProcessId::channel("main");
        let spill = Spill::open(&path).unwrap();
        spill.keep(&main, RunId::new(7), rows(&["a"])).unwrap();
        let aside = spill.set_aside(&main).unwrap();
        assert!(!path.exists());
        let kept = Spill::open(&aside).unwrap();
        assert_eq!(kept.history(&main).unwrap().rows, rows(&["a"]));
    }

    #[test]
    fn a_spill_extends_a_stored_history_only_if_it_begins_with_it() {
        let stored = rows(&["a", "b"]);
        assert!(Spill::extends(&rows(&["a", "b", "c"]), &stored));
        assert!(Spill::extends(&rows(&["a", "b"]), &stored));
        assert!(!Spill::extends(&rows(&["a", "x", "c"]), &stored));
        assert!(!Spill::extends(&rows(&["a"]), &stored));
        // Reformatted by the store, still the same message.
        let spaced = vec!["{ \"content\": \"a\" }".to_owned()];
        assert!(Spill::extends(&rows(&["a"]), &spaced));
    }

    #[test]
    fn a_second_process_on_one_spill_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spill.json");
        let _first = Spill::open(&path).unwrap();
        let err = Spill::open(&path).unwrap_err().to_string();
        assert!(err.contains("another capstan process"), "{err}");
    }

    #[test]
    fn a_damaged_or_planted_spill_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("spill.json");
        std::fs::write(&path, "not json").unwrap();
        let err = Spill::open(&path).unwrap_err().to_string();
        assert!(
            err.contains("spill.json") && err.contains("move it aside"),
            "{err}"
        );
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", &path).unwrap();
        let err = Spill::open(&path).unwrap_err().to_string();
        assert!(err.contains("symbolic link"), "{err}");
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, r#"{"version":1,"conversations":{}}"#).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666))
            .unwrap();
        let err = Spill::open(&path).unwrap_err().to_string();
        assert!(err.contains("others may write it"), "{err}");
    }
}
