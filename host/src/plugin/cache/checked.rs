//! Loading an artifact whose seal passed before, without hashing it again.
//!
//! The artifact is copied (by the kernel, `sendfile`) into an anonymous memory file, the source file's stamp is read again to prove the copy holds
//! the bytes that were checked, and the copy is sealed against every write, growth and
//! shrinkage before wasmtime maps it. Once sealed, nothing can change the code: a write to
//! the cache file while the host runs, or the file cut short, changes the file, not the
//! code the host runs. That copy is most of what a load of an interpreter's artifact costs
//! now (BENCHMARKS.md); wasmtime mapping the cache file itself would save it, and would let
//! a file cut short under a running host stop it with `SIGBUS`.

use std::fs::File;
use std::os::fd::AsRawFd;

use rustix::fs::SealFlags;
use wasmtime::Engine;
use wasmtime::component::Component;

use super::identity::{FileStamp, inode_of, stamp_of};
use super::seal::TAG_BYTES;

/// Why a checked artifact was not loaded from its copy.
pub(super) enum Failed {
    /// It could not be copied or mapped, or changed while it was: the full check decides.
    Unmapped(String),
    /// Sound, but over this host's limits.
    Limit(wasmtime::Error),
}

/// The seals a copy carries before wasmtime maps it.
const SEALS: SealFlags = SealFlags::WRITE
    .union(SealFlags::GROW)
    .union(SealFlags::SHRINK)
    .union(SealFlags::SEAL);

fn unmapped(what: &str, err: &dyn std::fmt::Display) -> Failed {
    Failed::Unmapped(format!("{what}: {err}"))
}

/// The component in the sealed artifact `file`, which has `stamp`, as it had when its
/// seal last passed.
pub(super) fn load(engine: &Engine, file: &File, stamp: FileStamp) -> Result<Component, Failed> {
    let copy = sealed_copy(file, stamp)?;
    // wasmtime maps a file by path; this one names the sealed copy, as its stamp shows
    // (a `/proc` that is not the kernel's would show another file).
    let path = format!("/proc/self/fd/{}", copy.as_raw_fd());
    let named = std::fs::metadata(&path).map_err(|err| unmapped("no /proc here", &err))?;
    let copy_stamp = stamp_of(&copy).map_err(|err| unmapped("cannot read the copy", &err))?;
    if inode_of(&FileStamp::of(&named)) != inode_of(&copy_stamp) {
        return Err(Failed::Unmapped(format!("{path} is not the copy")));
    }
    // SAFETY: the copy holds exactly the bytes of an artifact whose keyed-hash seal passed
    // (see `Opened::load_sealed`): the file had the same device, inode, size and change
    // time when its seal passed as before and after this copy, and had settled before that
    // check, so no write came between. Sealed, the copy can no longer change; wasmtime
    // checks its header and version again.
    match unsafe { Component::deserialize_file(engine, &path) } {
        Ok(component) => Ok(component),
        Err(err) if crate::plugin::failure::is_pool_limit(&err) => Err(Failed::Limit(err)),
        Err(err) => Err(unmapped("wasmtime did not map it", &err)),
    }
}

/// Copies the first `len` bytes of `file` into `copy` in the kernel (`sendfile`, from an
/// explicit offset): the host touches none of the bytes, so a file cut short meanwhile
/// ends the copy early with an error, never a signal.
fn copy_in_kernel(file: &File, len: u64, copy: &File) -> std::io::Result<()> {
    let mut offset = 0;
    while offset < len {
        let rest = usize::try_from(len - offset).unwrap_or(usize::MAX);
        match rustix::fs::sendfile(copy, file, Some(&mut offset), rest) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "cut short while it was copied",
                ));
            }
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(())
}

/// A memory file holding the artifact in `file` without its tag, sealed, if `file` had
/// `stamp` before and after the copy.
fn sealed_copy(file: &File, stamp: FileStamp) -> Result<File, Failed> {
    let len = stamp
        .len
        .checked_sub(TAG_BYTES as u64)
        .ok_or_else(|| Failed::Unmapped("shorter than its seal".into()))?;
    let memory = rustix::fs::memfd_create(
        "capstan-artifact",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )
    .map_err(|err| unmapped("no memory file", &err))?;
    let copy = File::from(memory);
    copy_in_kernel(file, len, &copy).map_err(|err| unmapped("cannot copy it", &err))?;
    let now = stamp_of(file).map_err(|err| unmapped("cannot read it", &err))?;
    if now != stamp {
        return Err(Failed::Unmapped("it changed while it was copied".into()));
    }
    rustix::fs::fcntl_add_seals(&copy, SEALS)
        .map_err(|err| unmapped("cannot seal the copy", &err))?;
    Ok(copy)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// A sealed file of a trivial component's artifact (the tag is not read here).
    fn sealed_file(engine: &Engine) -> (tempfile::TempDir, File) {
        let artifact = Component::new(engine, "(component)")
            .unwrap()
            .serialize()
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.cwasm");
        std::fs::write(&path, [artifact, vec![0; TAG_BYTES]].concat()).unwrap();
        let file = File::open(&path).unwrap();
        (dir, file)
    }

    #[test]
    fn an_artifact_with_its_recorded_stamp_loads_from_a_sealed_copy_no_one_can_write() {
        let engine = Engine::default();
        let (_dir, file) = sealed_file(&engine);
        let stamp = stamp_of(&file).unwrap();
        let mut copy = sealed_copy(&file, stamp).ok().unwrap();
        assert_eq!(copy.metadata().unwrap().len(), stamp.len - TAG_BYTES as u64);
        assert!(rustix::fs::fcntl_get_seals(&copy).unwrap().contains(SEALS));
        assert!(copy.write_all(b"x").is_err(), "sealed against writes");
        assert!(copy.set_len(1).is_err(), "and shrinking");
        assert!(load(&engine, &file, stamp).is_ok());
        // Twice from the same open file: each copy starts from the file's first byte.
        assert!(load(&engine, &file, stamp).is_ok());
    }

    #[test]
    fn a_file_shorter_than_its_stamp_says_ends_the_copy_with_an_error() {
        let engine = Engine::default();
        let (_dir, file) = sealed_file(&engine);
        let len = stamp_of(&file).unwrap().len;
        let copy = tempfile::tempfile().unwrap();
        let err = copy_in_kernel(&file, len + 4096, &copy).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
        assert_eq!(
            copy.metadata().unwrap().len(),
            len,
            "all there was, then the error"
        );
    }

    #[test]
    fn an_artifact_whose_stamp_moved_is_not_loaded_from_its_copy() {
        let engine = Engine::default();
        let (dir, file) = sealed_file(&engine);
        let recorded = stamp_of(&file).unwrap();
        // Written in place after the record, once the clock has moved past its change.
        while stamp_of(&file).unwrap() == recorded {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let bytes = std::fs::read(dir.path().join("a.cwasm")).unwrap();
            std::fs::write(dir.path().join("a.cwasm"), &bytes).unwrap();
        }
        match load(&engine, &file, recorded) {
            Err(Failed::Unmapped(reason)) => assert!(reason.contains("changed"), "{reason}"),
            Err(Failed::Limit(err)) => panic!("{err}"),
            Ok(_) => panic!("a file that changed after its check was mapped"),
        }
    }
}
