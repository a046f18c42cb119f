//! The label of what a plugin call returns, and of the files it wrote, from what the host
//! saw it touch ([`Touched`]): each file read takes the label its writer left, while the
//! file is as that write left it, or the workspace's default; each task or memory an
//! import gave it, the label stored with it; each host a request reached is an untrusted
//! origin; and each file the call wrote is recorded with the writer's label (what the
//! process had read, the handles it passed, what the call read).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::flow::{Label, Origin, WorkspaceLabel};
use crate::plugin::Touched;
use crate::services::{FileLabel, FileLabels, FileStamp};

/// The most file versions [`WorkspaceFiles`] remembers; past it, it starts afresh.
const REMEMBERED: usize = 1 << 16;

/// What the host knows of the workspace's files: the labels recorded of those written,
/// if it keeps them, and the default for the others.
#[derive(Default)]
pub(super) struct WorkspaceFiles {
    recorded: Option<Arc<dyn FileLabels>>,
    default: WorkspaceLabel,
    /// What the store said of each file version asked (`None`: no write of it recorded),
    /// and each version this host recorded: a file read again unchanged costs no query.
    /// A version's row changes only when a call that wrote it records it, and this host's
    /// records pass here; a version another host records while this one remembers it
    /// unwritten is a file both hosts' workspaces share, read mid-write.
    remembered: Mutex<HashMap<FileStamp, Option<Label>>>,
}

impl WorkspaceFiles {
    /// The files whose writes `recorded` keeps, the others taken as `default`.
    pub(super) fn new(recorded: Arc<dyn FileLabels>, default: WorkspaceLabel) -> Self {
        WorkspaceFiles {
            recorded: Some(recorded),
            default,
            remembered: Mutex::default(),
        }
    }

    /// The label of what a call that touched `touched` in `workspace` read beyond its
    /// arguments. A record that cannot be read leaves the file untrusted, whatever the
    /// default.
    pub(super) async fn read_label(&self, workspace: &Path, touched: &Touched) -> Label {
        let key = workspace.to_string_lossy();
        // What the host's imports gave it (tasks, memories), each as its writer left it.
        let mut label = touched.labels.clone();
        for host in &touched.hosts {
            label.join(&Label::untrusted(Origin::Net(host.clone())));
        }
        if touched.overflowed {
            label.join(&Label::untrusted(Origin::file("*")));
        }
        let unreadable = |path: &str| Label::untrusted(Origin::file(path));
        let stamps: Vec<FileStamp> = touched.read.values().flatten().copied().collect();
        let found = self.labels_of(&key, stamps).await;
        for (path, stamp) in &touched.read {
            match found
                .as_ref()
                .map(|found| stamp.and_then(|s| found.get(&s).cloned().flatten()))
            {
                Ok(Some(recorded)) => label.join(&recorded),
                Ok(None) => label.join(&self.default.of(path)),
                Err(()) => label.join(&unreadable(path)),
            }
        }
        for dir in &touched.listed {
            // A name in a listing is its writer's words.
            label.join(&self.default.of(dir));
            if let Some(files) = &self.recorded {
                match files.beneath(&key, dir).await {
                    Ok(beneath) => label.join(&beneath),
                    Err(err) => {
                        tracing::warn!(
                            "the labels of the files beneath {dir} cannot be read: {err}"
                        );
                        label.join(&unreadable(dir));
                    }
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
    ) -> Result<HashMap<FileStamp, Option<Label>>, ()> {
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
        for stamp in ask {
            found.insert(stamp, None);
        }
        for row in rows {
            found.insert(row.stamp, Some(row.label));
        }
        self.remember(found.iter().map(|(stamp, label)| (*stamp, label.clone())));
        Ok(found)
    }

    fn remembered(&self) -> MutexGuard<'_, HashMap<FileStamp, Option<Label>>> {
        self.remembered.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn remember(&self, known: impl IntoIterator<Item = (FileStamp, Option<Label>)>) {
        let mut remembered = self.remembered();
        for (stamp, label) in known {
            if remembered.len() >= REMEMBERED {
                remembered.clear();
            }
            remembered.insert(stamp, label);
        }
    }

    /// Records each file a call wrote in `workspace` (as `touched` names them) with
    /// `label`, joined with any label already recorded of that same version (another
    /// call that wrote it too). A file that is gone, or lies outside the workspace
    /// through a link, is not recorded.
    pub(super) async fn record_written(&self, workspace: &Path, touched: &Touched, label: &Label) {
        let Some(files) = &self.recorded else {
            return;
        };
        if touched.written.is_empty() {
            return;
        }
        let paths: Vec<String> = touched.written.iter().cloned().collect();
        let root = workspace.to_owned();
        let stamped = tokio::task::spawn_blocking(move || stamps(&root, paths)).await;
        let Ok(stamped) = stamped else {
            return;
        };
        let key = workspace.to_string_lossy();
        let versions = stamped.iter().map(|(_, stamp)| *stamp).collect();
        let before = self.labels_of(&key, versions).await.unwrap_or_default();
        let rows: Vec<FileLabel> = stamped
            .into_iter()
            .map(|(path, stamp)| {
                let mut label = label.clone();
                if let Some(Some(before)) = before.get(&stamp) {
                    label.join(before);
                }
                FileLabel { path, stamp, label }
            })
            .collect();
        // Remembered first: a read of these versions on this host from now on finds them.
        self.remember(rows.iter().map(|row| (row.stamp, Some(row.label.clone()))));
        if let Err(err) = files.record(&key, rows).await {
            tracing::warn!(
                "the labels of the files a call wrote are not recorded, so they take the \
                 workspace's default: {err}"
            );
        }
    }
}

/// The stamp of each of `paths` in the workspace at `root` that is there, found beneath
/// it (a link leading outside is not followed out).
fn stamps(root: &Path, paths: Vec<String>) -> Vec<(String, FileStamp)> {
    let Ok(dir) = cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority()) else {
        return Vec::new();
    };
    paths
        .into_iter()
        .filter_map(|path| {
            use cap_std::fs::MetadataExt as _;
            let meta = dir.metadata(&path).ok()?;
            let (dev, ino, len) = (meta.dev(), meta.ino(), meta.size());
            let stamp = FileStamp::new(dev, ino, len, meta.ctime(), meta.ctime_nsec());
            Some((path, stamp))
        })
        .collect()
}
