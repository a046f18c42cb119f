//! The label of what a plugin call returns, and of the files it wrote, from what the host
//! saw it touch ([`Touched`]): each file read takes the label its writer left, while the
//! file is as that write left it, or the workspace's default; each task or memory an
//! import gave it, the label stored with it; each host a request reached is an untrusted
//! origin; and each file the call wrote is recorded with the writer's label (what the
//! process had read, the handles it passed, what the call read).

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::flow::{Label, Origin, WorkspaceLabel};
use crate::plugin::{ReadLabels, Touched};
use crate::services::{FileLabel, FileLabels, FileStamp};

/// The most file versions [`WorkspaceFiles`] remembers; past it, it starts afresh.
const REMEMBERED: usize = 1 << 16;

/// What the host knows of one workspace's files: the labels recorded of those written,
/// if it keeps them, and the default for the others.
pub(super) struct WorkspaceFiles {
    workspace: PathBuf,
    recorded: Option<Arc<dyn FileLabels>>,
    default: WorkspaceLabel,
    /// What the store said of each file version asked, and each version this host
    /// recorded: a file read again unchanged costs no query. A version's row changes only
    /// when a call that wrote it records it, and this host's records pass here; a version
    /// another host records while this one remembers it otherwise is a file both hosts'
    /// workspaces share, read mid-write.
    remembered: Mutex<HashMap<FileStamp, Known>>,
    /// The default label of each path asked: the label of a file read again is shared,
    /// not made anew each call.
    defaults: Mutex<HashMap<String, Label>>,
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
        }
    }

    /// The label of what a call that touched `touched` read beyond its arguments. A
    /// record that cannot be read leaves the file untrusted and private to readers it
    /// does not name (its writer may have held a secret), whatever the default.
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
        let unreadable =
            |path: &str| Label::untrusted(Origin::file(path)).joined(&Label::unknown());
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
        if touched.listed.is_empty() {
            return label;
        }
        // Rows are kept by the path each file resolved to: a listing is matched the same
        // way, so `sub/..` or a linked directory lists what lies beneath where it leads.
        let listed: Vec<String> = touched.listed.iter().cloned().collect();
        let count = listed.len();
        let root = self.workspace.clone();
        let found = tokio::task::spawn_blocking(move || {
            let root = root.canonicalize().ok();
            let find = |dir: &String| root.as_deref().and_then(|r| listed_dir(r, dir));
            listed.iter().map(find).collect::<Vec<_>>()
        })
        .await
        .unwrap_or_else(|_| vec![None; count]);
        for (dir, found) in touched.listed.iter().zip(found) {
            // A name in a listing is its writer's words.
            label.join(&self.default_of(dir));
            let Some(files) = &self.recorded else {
                continue;
            };
            // A directory gone since: what lay beneath it could be anywhere now.
            let (beneath, made) = found.unwrap_or_else(|| (".".to_owned(), Vec::new()));
            // Whoever made or moved it, or a directory above it, put every name beneath
            // where it is.
            match self.labels_of(&key, made).await {
                Ok(made) => {
                    for known in made.into_values() {
                        if let Known::Written(by) | Known::Changed(by) = known {
                            label.join(&by);
                        }
                    }
                }
                Err(()) => label.join(&unreadable(dir)),
            }
            match files.beneath(&key, &beneath).await {
                Ok(found) => label.join(&found),
                Err(err) => {
                    tracing::warn!("the labels of the files beneath {dir} cannot be read: {err}");
                    label.join(&unreadable(dir));
                }
            }
        }
        label
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
        self.remember(asked);
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

    fn remember(&self, known: impl IntoIterator<Item = (FileStamp, Known)>) {
        let mut remembered = self.remembered();
        for (stamp, label) in known {
            if remembered.len() >= REMEMBERED {
                remembered.clear();
            }
            remembered.insert(stamp, label);
        }
    }

    /// Records each file a call wrote (as `touched` names them) with `label`, joined with any label already recorded of that same version (another
    /// call that wrote it too). A file that is gone, or lies outside the workspace
    /// through a link, is not recorded.
    pub(super) async fn record_written(&self, touched: &Touched, label: &Label) {
        let Some(files) = &self.recorded else {
            return;
        };
        if touched.written.is_empty() {
            return;
        }
        let paths: Vec<_> = touched.written.iter().cloned().collect();
        let root = self.workspace.clone();
        let stamped = tokio::task::spawn_blocking(move || stamps(&root, paths)).await;
        let Ok(stamped) = stamped else {
            return;
        };
        let key = self.workspace.to_string_lossy();
        let versions = stamped.iter().map(|(_, stamp)| *stamp).collect();
        let before = self.labels_of(&key, versions).await.unwrap_or_default();
        let rows: Vec<FileLabel> = stamped
            .into_iter()
            .map(|(path, stamp)| {
                let mut label = label.clone();
                if let Some(Known::Written(before)) = before.get(&stamp) {
                    label.join(before);
                }
                FileLabel { path, stamp, label }
            })
            .collect();
        // Remembered first: a read of these versions on this host from now on finds them.
        self.remember(
            rows.iter()
                .map(|row| (row.stamp, Known::Written(row.label.clone()))),
        );
        if let Err(err) = files.record(&key, rows).await {
            tracing::warn!(
                "the labels of the files a call wrote are not recorded, so they take the \
                 workspace's default: {err}"
            );
        }
    }
}

impl ReadLabels for WorkspaceFiles {
    fn read_label<'a>(
        &'a self,
        touched: &'a Touched,
    ) -> Pin<Box<dyn Future<Output = Label> + Send + 'a>> {
        Box::pin(WorkspaceFiles::read_label(self, touched))
    }
}

/// The stamp of each of `written` in the workspace at `root` that is there, found beneath
/// it: the name itself, and for a link also the file it leads to (a write through a link
/// writes that file; a link made is read by its name). Each is named by the path it
/// resolves to ([`resolved`]), as a listing is matched. A link leading outside is not
/// followed out.
///
/// A file opened to write that its path no longer leads to (moved, or its directory
/// renamed, before the call ended) is recorded by its device and inode as a version no
/// read will match ([`moved`]): wherever it is read next, it carries its writer's label
/// and the workspace's default.
fn stamps(root: &Path, written: Vec<(String, Option<FileStamp>)>) -> Vec<(String, FileStamp)> {
    use cap_std::fs::MetadataExt as _;
    let Ok(dir) = cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority()) else {
        return Vec::new();
    };
    let Ok(real_root) = root.canonicalize() else {
        return Vec::new();
    };
    let stamp = |meta: &cap_std::fs::Metadata| {
        let (dev, ino, len) = (meta.dev(), meta.ino(), meta.size());
        FileStamp::new(dev, ino, len, meta.ctime(), meta.ctime_nsec())
    };
    let same = |a: &FileStamp, b: &FileStamp| (a.dev, a.ino) == (b.dev, b.ino);
    let mut stamped = Vec::new();
    for (path, opened) in written {
        let own = dir.symlink_metadata(&path).ok();
        let target = own
            .as_ref()
            .filter(|meta| meta.is_symlink())
            .and_then(|_| dir.metadata(&path).ok());
        let (own, target) = (own.as_ref().map(stamp), target.as_ref().map(stamp));
        if let Some(opened) = opened
            && !own.iter().chain(&target).any(|now| same(now, &opened))
        {
            let name = resolved(&real_root, &path, false).unwrap_or(path);
            stamped.push((name, moved(opened)));
            continue;
        }
        if let Some(target) = target
            && let Some(to) = resolved(&real_root, &path, true)
        {
            stamped.push((to, target));
        }
        if let Some(own) = own
            && let Some(name) = resolved(&real_root, &path, false)
        {
            stamped.push((name, own));
        }
    }
    stamped
}

/// Listed directory `dir` as it resolves in the workspace at `real_root` ([`resolved`]),
/// with the stamps of it and of each directory above it in the workspace. `None` when it
/// is not there.
fn listed_dir(real_root: &Path, dir: &str) -> Option<(String, Vec<FileStamp>)> {
    let dir = resolved(real_root, dir, true)?;
    let mut stamps = Vec::new();
    if dir != "." {
        let mut above = real_root.to_owned();
        for part in Path::new(&dir).components() {
            above.push(part);
            stamps.extend(
                std::fs::metadata(&above)
                    .ok()
                    .map(|meta| FileStamp::of(&meta)),
            );
        }
    }
    Some((dir, stamps))
}

/// A stamp of the file `opened` names that matches none of its versions: recorded for a
/// file whose version the host could not see, so any read of it finds the row changed.
fn moved(opened: FileStamp) -> FileStamp {
    FileStamp {
        len: u64::MAX,
        ctime_ns: i64::MIN,
        ..opened
    }
}

/// Workspace path `path` as the filesystem resolves it now, relative to the workspace at
/// `real_root` (itself resolved): no `.`, `..` or links on the way, and none in the last
/// name either when `follow`. `None` when it is not there or leads outside.
fn resolved(real_root: &Path, path: &str, follow: bool) -> Option<String> {
    let path = Path::new(path);
    let (dir, name) = match (follow, path.file_name()) {
        (false, Some(name)) => (path.parent().unwrap_or(Path::new("")), Some(name)),
        _ => (path, None),
    };
    let mut real = real_root.join(dir).canonicalize().ok()?;
    if let Some(name) = name {
        real.push(name);
    }
    let inside = real.strip_prefix(real_root).ok()?.to_str()?;
    Some(if inside.is_empty() {
        ".".to_owned()
    } else {
        inside.to_owned()
    })
}
