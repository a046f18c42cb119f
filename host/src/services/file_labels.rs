//! [`FileLabels`]: the label of each workspace file a process wrote, as the host saw it
//! written, so a later read of it carries what went into it.
//!
//! A row is the label of the file (device and inode) as its last seen write left it: the
//! same length and change time ([`FileStamp`]). A file never written through the host
//! takes the workspace's default label ([`WorkspaceLabel`](crate::flow::WorkspaceLabel));
//! one changed since by anything the host did not see takes both.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::ServiceError;
use crate::flow::{Label, Origin};

/// The most rows one call records or looks up; a call that touches more files is
/// labelled as touching unknown ones.
pub const FILE_LABELS_MAX: usize = 4096;

/// What identifies one version of a file: which file it is and what its last write left.
///
/// ```
/// use capstan_host::services::FileStamp;
///
/// let stamp = FileStamp { dev: 1, ino: 2, len: 3, ctime_ns: 4 };
/// assert_eq!(stamp, FileStamp { dev: 1, ino: 2, len: 3, ctime_ns: 4 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct FileStamp {
    /// The device it lies on.
    pub dev: u64,
    /// Its inode: the same file under any of its names.
    pub ino: u64,
    /// Its length in bytes.
    pub len: u64,
    /// When its inode last changed (written, renamed, its times or mode set), in
    /// nanoseconds since the Unix epoch: no process can set it back.
    pub ctime_ns: i64,
}

impl FileStamp {
    /// The stamp of the file `meta` describes.
    pub fn of(meta: &impl std::os::unix::fs::MetadataExt) -> FileStamp {
        FileStamp::new(
            meta.dev(),
            meta.ino(),
            meta.size(),
            meta.ctime(),
            meta.ctime_nsec(),
        )
    }

    /// The stamp of file `ino` on `dev`, `len` bytes long, changed at `ctime` seconds and
    /// `ctime_nsec` nanoseconds since the Unix epoch.
    pub fn new(dev: u64, ino: u64, len: u64, ctime: i64, ctime_nsec: i64) -> FileStamp {
        FileStamp {
            dev,
            ino,
            len,
            ctime_ns: ctime
                .saturating_mul(1_000_000_000)
                .saturating_add(ctime_nsec),
        }
    }
}

/// A file's label as the host recorded it after a write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileLabel {
    /// The path it was written at, relative to the workspace.
    pub path: String,
    /// The file as the write left it.
    pub stamp: FileStamp,
    /// The writer's label: what the writing process had read, and what its call read.
    pub label: Label,
}

/// The labels of the files processes wrote, per workspace (the workspace directory's
/// path as the host names it).
///
/// ```
/// use capstan_host::flow::{Label, Origin};
/// use capstan_host::services::{FileLabel, FileStamp, Services};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let services = Services::in_memory();
/// let stamp = FileStamp { dev: 1, ino: 7, len: 12, ctime_ns: 5 };
/// let page = Label::untrusted(Origin::Net("example.com".into()));
/// let row = FileLabel { path: "notes.md".into(), stamp, label: page.clone() };
/// services.files.record("/work", vec![row]).await.unwrap();
/// let found = services.files.get("/work", vec![stamp]).await.unwrap();
/// assert_eq!(found[0].label, page);
/// // Changed since: the row comes back with the stamp the write left.
/// let now = FileStamp { ctime_ns: 6, ..stamp };
/// assert_eq!(services.files.get("/work", vec![now]).await.unwrap()[0].stamp, stamp);
/// # });
/// ```
#[async_trait]
pub trait FileLabels: Send + Sync {
    /// Records `rows` (at most [`FILE_LABELS_MAX`]) in `workspace`, each replacing what
    /// was recorded of the same file (device and inode).
    async fn record(&self, workspace: &str, rows: Vec<FileLabel>) -> Result<(), ServiceError>;

    /// The rows recorded in `workspace` of the files (device and inode) `stamps` name
    /// (at most [`FILE_LABELS_MAX`] asked), in no order, each with the stamp its write
    /// left: a file changed since has another stamp now.
    async fn get(
        &self,
        workspace: &str,
        stamps: Vec<FileStamp>,
    ) -> Result<Vec<FileLabel>, ServiceError>;

    /// The join of the labels recorded in `workspace` of files written beneath `dir` (a
    /// path relative to the workspace, `""` for the workspace itself): what the names in
    /// a listing of it may carry.
    async fn beneath(&self, workspace: &str, dir: &str) -> Result<Label, ServiceError>;
}

/// Whether `path` (as written) lies beneath `dir`, both relative to the workspace.
pub(crate) fn lies_beneath(path: &str, dir: &str) -> bool {
    let dir = dir.trim_matches('/');
    dir.is_empty() || dir == "." || path.strip_prefix(dir).is_some_and(|r| r.starts_with('/'))
}

/// A stored label of the file at `path`, read back. One that does not parse could have
/// said anything: the file is as untrusted as one never seen written.
pub(crate) fn stored_file_label(text: &str, path: &str) -> Label {
    serde_json::from_str(text).unwrap_or_else(|err| {
        tracing::warn!("the stored label of {path} cannot be read ({err}): taken as untrusted");
        Label::untrusted(Origin::file(path))
    })
}
