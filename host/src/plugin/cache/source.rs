//! Plugin files read once per stamp: what a plugin file was found to be (its digest and
//! outline) is kept sealed in the cache under its device and inode, so a file that keeps
//! its [`FileStamp`] is not read or hashed again on the next start.

use std::time::SystemTime;

use wasmtime::Engine;

use super::ArtifactCache;
use super::identity::{FileStamp, inode_of, settled};
use super::seal::{ArtifactId, Kind};
use crate::plugin::inspect::Outline;
use crate::plugin::trust::ComponentDigest;

/// What a plugin file held when it was read: its stamp then, its digest and what it
/// imports and exports, as this version of the host read them.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct KnownSource {
    stamp: FileStamp,
    /// The host version that read the outline: another may read it otherwise.
    read_by: String,
    /// The BLAKE3 digest of its bytes.
    pub digest: ComponentDigest,
    /// Its top-level imports and exports.
    pub outline: Outline,
}

impl ArtifactCache {
    /// What the plugin file whose stamp is `stamp` held when it was last read, if that was
    /// recorded (by this version of the host) and the file has not changed since.
    pub(crate) fn known_source(&self, engine: &Engine, stamp: &FileStamp) -> Option<KnownSource> {
        self.opened()?
            .entry::<KnownSource>(&source_id(engine, stamp), Kind::Source)
            .filter(|known| known.stamp == *stamp && known.read_by == env!("CARGO_PKG_VERSION"))
    }

    /// Records what the plugin file read at `began` held, if the file had the stamp
    /// `before` when opened and still has it (`after`), and had settled before `began`:
    /// otherwise a write could have come between, and it is read again next time.
    pub(crate) fn remember_source(
        &self,
        engine: &Engine,
        began: SystemTime,
        (before, after): (FileStamp, FileStamp),
        digest: ComponentDigest,
        outline: &Outline,
    ) {
        let Some(opened) = self.opened() else {
            return;
        };
        if before != after || !settled(&before, began) {
            return;
        }
        let known = KnownSource {
            stamp: before,
            read_by: env!("CARGO_PKG_VERSION").to_owned(),
            digest,
            outline: outline.clone(),
        };
        opened.store_entry(&source_id(engine, &before), Kind::Source, &known);
    }

    /// Forgets what was recorded of the plugin file with `stamp`, whose bytes turned out
    /// not to be the ones recorded: it is read in full from now on.
    pub(crate) fn forget_source(&self, engine: &Engine, stamp: &FileStamp) {
        if let Some(opened) = self.opened() {
            opened.remove(&source_id(engine, stamp).file_name(Kind::Source));
        }
    }
}

/// What the record of the plugin file with `stamp` is filed under.
fn source_id(engine: &Engine, stamp: &FileStamp) -> ArtifactId {
    ArtifactId::of_source(engine, inode_of(stamp))
}
