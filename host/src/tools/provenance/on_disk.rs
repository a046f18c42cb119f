//! What the filesystem says of the paths a call touched once it ends: the stamp of each
//! file it wrote, and where each directory it listed or moved leads. Paths are named as
//! they resolve in the workspace (no `.`, `..` or links on the way), so a file is recorded,
//! and a listing matched, the same way whichever spelling reached it. Each function here
//! blocks: it runs on a blocking thread.

use std::path::Path;

use cap_std::fs::MetadataExt as _;

use crate::services::FileStamp;

/// A file a call wrote, as it is now.
#[derive(Debug)]
pub(super) struct Stamped {
    /// Its path in the workspace, resolved when it can be.
    pub(super) path: String,
    pub(super) stamp: FileStamp,
    /// Only its name was made or moved (a rename, link or directory made): whoever
    /// labelled it before still chose what it holds, so their label is kept with the new.
    pub(super) name_only: bool,
}

/// A directory whose names a call saw or moved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Names {
    /// Where its names' rows lie: the directory's resolved path.
    pub(super) beneath: String,
    /// The stamp of it and of each directory above it: whoever made or moved one of them
    /// put each name beneath where it is.
    pub(super) above: Vec<FileStamp>,
}

impl Names {
    /// Names that could be anywhere in the workspace.
    pub(super) fn anywhere() -> Names {
        Names {
            beneath: ".".to_owned(),
            above: Vec::new(),
        }
    }
}

/// The stamp of each of `written` (a path, and the stamp of the file the call opened to
/// write there if it opened one) in the workspace at `root` that is there: the name
/// itself, and for a link also the file it leads to (a write through a link writes that
/// file; a link made is read by its name). A link leading outside is not followed out.
///
/// A file opened to write that its path no longer leads to is recorded by its device and
/// inode as a version no read will match ([`moved`]) when the call `renamed` something (it
/// may have moved it, or its directory): wherever it is read next, it carries its
/// writer's label joined with the workspace's default. Otherwise it was removed, and
/// nothing is recorded of it.
pub(super) fn stamps(
    root: &Path,
    written: Vec<(String, Option<FileStamp>)>,
    renamed: bool,
) -> Vec<Stamped> {
    let Ok(dir) = cap_std::fs::Dir::open_ambient_dir(root, cap_std::ambient_authority()) else {
        return Vec::new();
    };
    let real_root = root.canonicalize().ok();
    let named = |path: &str, follow: bool| {
        real_root
            .as_deref()
            .and_then(|real| resolved(real, path, follow))
            .unwrap_or_else(|| lexical(path))
    };
    let stamp = |meta: &cap_std::fs::Metadata| {
        let (dev, ino, len) = (meta.dev(), meta.ino(), meta.size());
        FileStamp::new(dev, ino, len, meta.ctime(), meta.ctime_nsec())
    };
    let same = |a: &FileStamp, b: &FileStamp| (a.dev, a.ino) == (b.dev, b.ino);
    let mut stamped = Vec::new();
    let mut gone = Vec::new();
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
            if renamed {
                gone.push((named(&path, false), opened));
            }
            continue;
        }
        if let Some(target) = target {
            let path = named(&path, true);
            stamped.push(Stamped {
                path,
                stamp: target,
                name_only: false,
            });
        }
        if let Some(own) = own {
            stamped.push(Stamped {
                path: named(&path, false),
                stamp: own,
                name_only: opened.is_none(),
            });
        }
    }
    // A file found where the call left it is recorded as it is, not as moved.
    for (path, opened) in gone {
        if !stamped.iter().any(|row| same(&row.stamp, &opened)) {
            stamped.push(Stamped {
                path,
                stamp: moved(opened),
                name_only: false,
            });
        }
    }
    stamped
}

/// A stamp of the file `opened` names that matches none of its versions: recorded for a
/// file whose version the host could not see, so any read of it finds the row changed.
pub(super) fn moved(opened: FileStamp) -> FileStamp {
    FileStamp {
        len: u64::MAX,
        ctime_ns: i64::MIN,
        ..opened
    }
}

/// The names directory `dir` showed when it was listed through a descriptor of the
/// directory `held` names. `None` when its path no longer leads to that directory: what
/// was listed could be anywhere now.
pub(super) fn listed(real_root: &Path, dir: &str, held: Option<FileStamp>) -> Option<Names> {
    let beneath = resolved(real_root, dir, true)?;
    let now = FileStamp::of(&std::fs::metadata(real_root.join(&beneath)).ok()?);
    if held.is_some_and(|held| (held.dev, held.ino) != (now.dev, now.ino)) {
        return None;
    }
    Some(Names {
        above: above(real_root, &beneath),
        beneath,
    })
}

/// The names that lay beneath `old` before the call moved it away: its rows are still
/// kept under its old path, its parent resolved when it is still there (else they could
/// be anywhere).
pub(super) fn moved_from(real_root: &Path, old: &str) -> Names {
    let Some(beneath) = resolved(real_root, old, false) else {
        return Names::anywhere();
    };
    let parent = Path::new(&beneath)
        .parent()
        .and_then(Path::to_str)
        .unwrap_or_default();
    Names {
        above: above(real_root, parent),
        beneath,
    }
}

/// The stamps of resolved workspace directory `dir` and of each directory above it in
/// the workspace at `real_root`.
fn above(real_root: &Path, dir: &str) -> Vec<FileStamp> {
    let mut stamps = Vec::new();
    let mut path = real_root.to_owned();
    for part in Path::new(dir).components() {
        let std::path::Component::Normal(part) = part else {
            continue;
        };
        path.push(part);
        if let Ok(meta) = std::fs::metadata(&path) {
            stamps.push(FileStamp::of(&meta));
        }
    }
    stamps
}

/// Workspace path `path` with `.` and `..` taken by their names alone: for a path the
/// filesystem no longer resolves. A `..` above the workspace stays at it.
fn lexical(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            name => parts.push(name),
        }
    }
    if parts.is_empty() {
        ".".to_owned()
    } else {
        parts.join("/")
    }
}

/// Workspace path `path` as the filesystem resolves it now, relative to the workspace at
/// `real_root` (itself resolved): no `.`, `..` or links on the way, and none in the last
/// name either when `follow`. `None` when it is not there or leads outside.
pub(super) fn resolved(real_root: &Path, path: &str, follow: bool) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_inside_the_workspace_or_not_at_all() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("sub/deep")).unwrap();
        std::os::unix::fs::symlink("sub", root.join("alias")).unwrap();
        std::os::unix::fs::symlink("..", root.join("up")).unwrap();
        let at = |path: &str, follow: bool| resolved(&root, path, follow);
        assert_eq!(at("", true).as_deref(), Some("."));
        assert_eq!(at(".", true).as_deref(), Some("."));
        assert_eq!(at("sub/..", true).as_deref(), Some("."));
        assert_eq!(at("alias/deep", true).as_deref(), Some("sub/deep"));
        // The last name itself is kept when not followed: a link made is its own name.
        assert_eq!(at("alias", false).as_deref(), Some("alias"));
        assert_eq!(at("alias", true).as_deref(), Some("sub"));
        // Outside, through `..` or a link: not a workspace path.
        assert_eq!(at("..", true), None);
        assert_eq!(at("up/x", false), None);
        assert_eq!(at("missing/x", false), None);
        // What no longer resolves is named by its parts alone.
        assert_eq!(lexical("d/../secret/./x"), "secret/x");
        assert_eq!(lexical("../.."), ".");
        // A name moved from a directory gone since could have lain anywhere.
        assert_eq!(moved_from(&root, "gone/../sub/x"), Names::anywhere());
        assert_eq!(moved_from(&root, "alias/x").beneath, "sub/x");
    }

    #[test]
    fn a_listing_whose_path_now_leads_elsewhere_names_nothing_known() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("notes")).unwrap();
        let held = FileStamp::of(&std::fs::metadata(root.join("notes")).unwrap());
        let names = listed(&root, "notes", Some(held)).unwrap();
        assert_eq!(names.beneath, "notes");
        assert_eq!(names.above, [held]);
        std::fs::rename(root.join("notes"), root.join("old")).unwrap();
        std::fs::create_dir_all(root.join("notes")).unwrap();
        assert_eq!(listed(&root, "notes", Some(held)), None);
    }

    #[test]
    fn a_file_removed_in_its_call_is_not_recorded_and_one_moved_is() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("kept"), "x").unwrap();
        let kept = FileStamp::of(&std::fs::metadata(root.join("kept")).unwrap());
        let gone = FileStamp::new(kept.dev, kept.ino + 1_000_000, 0, 0, 0);
        let written = vec![
            ("kept".to_owned(), Some(kept)),
            ("was-here".to_owned(), Some(gone)),
        ];
        let rows = stamps(root, written.clone(), false);
        assert_eq!(rows.len(), 1, "{rows:?}");
        assert_eq!(rows[0].stamp, kept);
        let rows = stamps(root, written, true);
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[1].stamp, moved(gone));
        assert_eq!(rows[1].path, "was-here");
    }
}
