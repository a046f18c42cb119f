//! The label of what a plugin call returns, and of the files it wrote, from what the host
//! saw it touch ([`Touched`]): each file read takes the label its writer left, while the
//! file is as that write left it, or the workspace's default; each task or memory an
//! import gave it, the label stored with it; each host a request reached is an untrusted
//! origin; and each file the call wrote is recorded with the writer's label (what the
//! process had read, the handles it passed, what the call read).

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::flow::{Label, Origin, WorkspaceLabel};
use crate::plugin::{ReadLabels, Touched};
use crate::services::{FileLabel, FileLabels, FileStamp};

mod on_disk;
mod writing;

use on_disk::{Names, Stamped};
use writing::Writing;

/// The most file versions [`WorkspaceFiles`] remembers; past it, it starts afresh.
const REMEMBERED: usize = 1 << 16;

/// The most directories a call's listings are looked up by one at a time; a call that
/// listed or moved more is taken to have seen every name in the workspace.
const LISTINGS_LOOKED_UP: usize = 64;

/// What the host knows of one workspace's files: the labels recorded of those written,
/// if it keeps them, the default for the others, and which are being written now.
pub(super) struct WorkspaceFiles {
    workspace: PathBuf,
    recorded: Option<Arc<dyn FileLabels>>,
    default: WorkspaceLabel,
    /// What the store said of each file version asked, and each version this host
    /// recorded: a file read again unchanged costs no query. A version's row changes only
    /// when a call that wrote it records it, and this host's records pass here (an answer
    /// from the store never replaces one); a version another host records while this one
    /// remembers it otherwise is a file both hosts' workspaces share, read mid-write.
    remembered: Mutex<HashMap<FileStamp, Known>>,
    /// The default label of each path asked: the label of a file read again is shared,
    /// not made anew each call.
    defaults: Mutex<HashMap<String, Label>>,
    /// The files this host's calls have open to write.
    writing: Writing,
}

/// What is recorded of one version of a file.
#[derive(Debug, Clone)]
enum Known {
    /// No write of that file (device and inode) is recorded.
    Unwritten,
    /// This version was written with this label.
    Written(Label),
    /// Another version of the file was written with this label, and it changed since
    /// by something the host did not see (its times set, written outside, moved).
    Changed(Label),
}

impl Known {
    /// The label a writer left, whichever version.
    fn writer(&self) -> Option<&Label> {
        match self {
            Known::Written(label) | Known::Changed(label) => Some(label),
            Known::Unwritten => None,
        }
    }
}

impl WorkspaceFiles {
    /// The files of `workspace` whose writes `recorded` keeps, the others taken as
    /// `default`.
    pub(super) fn new(
        workspace: PathBuf,
        recorded: Arc<dyn FileLabels>,
        default: WorkspaceLabel,
    ) -> Self {
        WorkspaceFiles {
            recorded: Some(recorded),
            default,
            ..WorkspaceFiles::unrecorded(workspace)
        }
    }

    /// The files of `workspace`, none recorded: each takes the untrusted default.
    pub(super) fn unrecorded(workspace: PathBuf) -> Self {
        WorkspaceFiles {
            workspace,
            recorded: None,
            default: WorkspaceLabel::default(),
            remembered: Mutex::default(),
            defaults: Mutex::default(),
            writing: Writing::default(),
        }
    }

    /// The label of what a call that touched `touched` read beyond its arguments. A
    /// record that cannot be read, or a file another call is writing now, leaves what was
    /// read untrusted and private to readers it does not name (its writer may have held a
    /// secret), whatever the default.
    pub(super) async fn read_label(&self, touched: &Touched) -> Label {
        let key = self.workspace.to_string_lossy();
        // What the host's imports gave it (tasks, memories), each as its writer left it.
        let mut label = touched.labels.clone();
        for host in &touched.hosts {
            label.join(&Label::untrusted(Origin::Net(host.clone())));
        }
        if touched.overflowed {
            label.join(&Label::untrusted(Origin::file("*")));
        }
        if self.writing.by_others(touched) {
            label.join(&Label::unknown());
        }
        let stamps: Vec<FileStamp> = touched.read.iter().filter_map(|(_, s)| *s).collect();
        let found = self.labels_of(&key, stamps).await;
        for (path, stamp) in &touched.read {
            let known = match (&found, stamp) {
                (Err(()), _) => {
                    label.join(&unreadable(path));
                    continue;
                }
                (Ok(found), Some(stamp)) => found.get(stamp).cloned().unwrap_or(Known::Unwritten),
                (Ok(_), None) => Known::Unwritten,
            };
            match known {
                Known::Written(written) => label.join(&written),
                // What the write left may still be in it.
                Known::Changed(written) => {
                    label.join(&written);
                    label.join(&self.default_of(path));
                }
                Known::Unwritten => label.join(&self.default_of(path)),
            }
        }
        label.join(&self.names_label(&key, touched).await);
        label
    }

    /// The label of the names the call saw in directories it listed, and moved with the
    /// directories it moved: each name's writer's, and the label of whoever made or moved
    /// the directory or one above it.
    async fn names_label(&self, key: &str, touched: &Touched) -> Label {
        let mut label = Label::trusted();
        for (dir, _) in &touched.listed {
            // A name in a listing is its writer's words.
            label.join(&self.default_of(dir));
        }
        let Some(files) = &self.recorded else {
            return label;
        };
        if touched.listed.is_empty() && touched.moved.is_empty() {
            return label;
        }
        let names = self.names_seen(touched).await;
        let above: Vec<FileStamp> = names.iter().flat_map(|n| n.above.clone()).collect();
        match self.labels_of(key, above).await {
            Ok(made) => label.join(&Label::join_all(made.values().filter_map(Known::writer))),
            Err(()) => label.join(&unreadable(".")),
        }
        let beneath: BTreeSet<&str> = names.iter().map(|n| n.beneath.as_str()).collect();
        for dir in beneath {
            match files.beneath(key, dir).await {
                Ok(found) => label.join(&found),
                Err(err) => {
                    tracing::warn!("the labels of the files beneath {dir} cannot be read: {err}");
                    label.join(&unreadable(dir));
                }
            }
        }
        label
    }

    /// Where the names a call listed and moved lie, each directory once.
    async fn names_seen(&self, touched: &Touched) -> BTreeSet<Names> {
        if touched.listed.len() + touched.moved.len() > LISTINGS_LOOKED_UP {
            return BTreeSet::from([Names::anywhere()]);
        }
        let listed: Vec<_> = touched.listed.iter().cloned().collect();
        let moved: Vec<_> = touched.moved.iter().cloned().collect();
        let root = self.workspace.clone();
        let found = tokio::task::spawn_blocking(move || {
            let Ok(real_root) = root.canonicalize() else {
                return BTreeSet::from([Names::anywhere()]);
            };
            let listed = listed.iter().map(|(dir, held)| {
                on_disk::listed(&real_root, dir, *held).unwrap_or_else(Names::anywhere)
            });
            let moved = moved.iter().map(|old| on_disk::moved_from(&real_root, old));
            listed.chain(moved).collect()
        });
        found
            .await
            .unwrap_or_else(|_| BTreeSet::from([Names::anywhere()]))
    }

    /// What is recorded of each of `stamps` in workspace `key`: from memory, else from
    /// the store (remembered after). `Err` when the store cannot say.
    async fn labels_of(
        &self,
        key: &str,
        stamps: Vec<FileStamp>,
    ) -> Result<HashMap<FileStamp, Known>, ()> {
        let mut found = HashMap::new();
        let mut ask = Vec::new();
        {
            let remembered = self.remembered();
            for stamp in stamps {
                match remembered.get(&stamp) {
                    Some(known) => {
                        found.insert(stamp, known.clone());
                    }
                    None => ask.push(stamp),
                }
            }
        }
        let Some(files) = self.recorded.as_ref().filter(|_| !ask.is_empty()) else {
            return Ok(found);
        };
        let rows = files.get(key, ask.clone()).await.map_err(|err| {
            tracing::warn!("the labels of the files a call read cannot be read: {err}");
        })?;
        let mut asked = Vec::with_capacity(ask.len());
        for stamp in ask {
            let row = rows
                .iter()
                .find(|row| (row.stamp.dev, row.stamp.ino) == (stamp.dev, stamp.ino));
            let known = match row {
                Some(row) if row.stamp == stamp => Known::Written(row.label.clone()),
                Some(row) => Known::Changed(row.label.clone()),
                None => Known::Unwritten,
            };
            found.insert(stamp, known.clone());
            asked.push((stamp, known));
        }
        // A record this host made while the store was asked is newer than its answer.
        let mut remembered = self.remembered();
        for (stamp, known) in asked {
            if remembered.len() >= REMEMBERED {
                remembered.clear();
            }
            remembered.entry(stamp).or_insert(known);
        }
        Ok(found)
    }

    /// The workspace's default label of the file at `path`, shared.
    fn default_of(&self, path: &str) -> Label {
        let mut defaults = self.defaults.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(label) = defaults.get(path) {
            return label.clone();
        }
        if defaults.len() >= REMEMBERED {
            defaults.clear();
        }
        let label = self.default.of(path);
        defaults.insert(path.to_owned(), label.clone());
        label
    }

    fn remembered(&self) -> MutexGuard<'_, HashMap<FileStamp, Known>> {
        self.remembered.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records each file a call wrote (as `touched` names them) with `label`, joined with
    /// any label already recorded of that same version (another call that wrote it too),
    /// or of any version when only its name was made or moved. A file that is gone, or
    /// lies outside the workspace through a link, is not recorded. However it ends, the
    /// call's files are no longer open to write in it.
    pub(super) async fn record_written(&self, touched: &Touched, label: &Label) {
        let _done = Done(&self.writing, touched);
        let Some(files) = &self.recorded else {
            return;
        };
        if touched.written.is_empty() {
            return;
        }
        let written: Vec<_> = touched.written.iter().cloned().collect();
        let root = self.workspace.clone();
        let renamed = !touched.moved.is_empty();
        let stamped = tokio::task::spawn_blocking(move || on_disk::stamps(&root, written, renamed));
        // Not looked at: each file opened to write is recorded as a version no read matches.
        let stamped = stamped.await.unwrap_or_else(|_| {
            let opened = touched.written.iter().filter_map(|(path, stamp)| {
                stamp.map(|stamp| Stamped {
                    path: path.clone(),
                    stamp: on_disk::moved(stamp),
                    name_only: false,
                })
            });
            opened.collect()
        });
        let key = self.workspace.to_string_lossy();
        let versions = stamped.iter().map(|row| row.stamp).collect();
        let before = self.labels_of(&key, versions).await.unwrap_or_default();
        let rows: Vec<FileLabel> = stamped
            .into_iter()
            .map(
                |Stamped {
                     path,
                     stamp,
                     name_only,
                 }| {
                    let mut label = label.clone();
                    match before.get(&stamp) {
                        Some(Known::Written(before)) => label.join(before),
                        Some(Known::Changed(before)) if name_only => label.join(before),
                        _ => {}
                    }
                    FileLabel { path, stamp, label }
                },
            )
            .collect();
        // Remembered first: a read of these versions on this host from now on finds them.
        {
            let mut remembered = self.remembered();
            for row in &rows {
                if remembered.len() >= REMEMBERED {
                    remembered.clear();
                }
                remembered.insert(row.stamp, Known::Written(row.label.clone()));
            }
        }
        if let Err(err) = files.record(&key, rows).await {
            tracing::warn!(
                "the labels of the files a call wrote are not recorded, so they take the \
                 workspace's default: {err}"
            );
        }
    }
}

/// Ends a call's writes in [`Writing`] when dropped: once its files are remembered, or
/// however [`WorkspaceFiles::record_written`] ends.
struct Done<'a>(&'a Writing, &'a Touched);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.done(self.1);
    }
}

/// The label of what was read at `path` when its record cannot be read.
fn unreadable(path: &str) -> Label {
    Label::untrusted(Origin::file(path)).joined(&Label::unknown())
}

impl ReadLabels for WorkspaceFiles {
    fn read_label<'a>(
        &'a self,
        touched: &'a Touched,
    ) -> Pin<Box<dyn Future<Output = Label> + Send + 'a>> {
        Box::pin(WorkspaceFiles::read_label(self, touched))
    }

    fn opened_to_write(&self, stamp: FileStamp) {
        self.writing.opened(&stamp);
    }
}
