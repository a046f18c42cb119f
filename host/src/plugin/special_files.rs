//! File operations without a thread hop, and the files that would make them unsafe.
//!
//! A call granted `fs.read` alone runs its WASI file operations on the thread that runs
//! the call, as wasmtime-wasi does with `allow_blocking_current_thread`: opening, reading
//! and listing local regular files and directories take microseconds, while a hand-off to
//! a blocking thread and back costs more than the operation (BENCHMARKS.md, "Where the
//! time goes"). A FIFO, socket or device in the workspace could instead block such an
//! operation with no end, holding an executor thread the deadline cannot free. So for
//! such a call the host replaces three WASI functions:
//!
//! - `descriptor.open-at` opens the path itself, beneath the directory as wasmtime-wasi
//!   would, but with `O_NONBLOCK` (an open never waits for a FIFO's other end), then
//!   checks what it opened: anything but a regular file or a directory is closed and
//!   refused with `unsupported`. The check is on the open descriptor, so no rename
//!   between a check and the open can slip a FIFO past it. (`O_NONBLOCK` changes nothing
//!   for regular files and directories.)
//! - `descriptor.sync` and `sync-data` do nothing: such a call cannot have written, and
//!   flushing what other writers left in a file could take seconds.
//!
//! A call granted `fs.write` may write and sync large files, so its file operations still
//! run on blocking threads, each bounded by the deadline, and it may open special files.
//! So does a call whose workspace is not on a local disk or memory filesystem
//! ([`runs_inline`](super::sandbox::runs_inline)): on FUSE or a network filesystem any
//! operation may wait on a daemon or a server.
//!
//! Limits, measured by attacking them: a refused FIFO is opened and closed at once, so a
//! writer waiting on it sees a reader come and go; a file under a lease answers `io` at
//! once instead of waiting for the lease to break; and a filesystem mounted beneath a
//! local workspace is not detected, so a FUSE mount there could hold the thread (only a
//! local user who can mount in the workspace can do that).

use cap_fs_ext::{FollowSymlinks, OpenOptionsFollowExt as _, OpenOptionsSyncExt as _};
use cap_std::io_lifetimes::AsFilelike as _;
use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::OpenMode;
use wasmtime_wasi::WasiView as _;
use wasmtime_wasi::filesystem::{Descriptor, Dir, File, WasiFilesystemView as _};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorFlags, ErrorCode, HostDescriptor as _, OpenFlags, PathFlags,
};

use super::file_access::stamp_of;
use super::sandbox::{FILESYSTEM_TYPES, Sandbox};
use super::touched::Access;
use crate::services::FileStamp;

type OpenAtParams = (
    Resource<Descriptor>,
    PathFlags,
    String,
    OpenFlags,
    DescriptorFlags,
);

/// Replaces `open-at`, `sync` and `sync-data` in `linker` (which already holds
/// wasmtime-wasi's) with the versions above for calls whose file operations run inline;
/// other calls get wasmtime-wasi's own.
pub(crate) fn replace_inline_fs_functions(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store: StoreContextMut<'_, Sandbox>,
         (fd, path_flags, path, open_flags, flags): OpenAtParams| {
            Box::new(async move {
                let sandbox = store.data_mut();
                // Nothing the guest reaches goes unnoted (`plugin/touched.rs`).
                if sandbox.file_access().full() {
                    return Ok((Err(ErrorCode::Quota),));
                }
                let dir = fd.rep();
                let mut access = Access {
                    writes: flags.contains(DescriptorFlags::WRITE)
                        || open_flags.intersects(OpenFlags::CREATE | OpenFlags::TRUNCATE),
                    reads: flags.contains(DescriptorFlags::READ)
                        || !flags.contains(DescriptorFlags::WRITE),
                    truncates: open_flags.contains(OpenFlags::TRUNCATE),
                    directory: false,
                };
                // The inline open has the file's metadata already: its stamp costs nothing.
                let mut stamped = None;
                let opened = if sandbox.inline_fs() {
                    match open_regular(sandbox, &fd, path_flags, &path, open_flags, flags)? {
                        Ok((descriptor, stamp)) => {
                            stamped = Some((matches!(descriptor, Descriptor::Dir(_)), stamp));
                            Ok(sandbox.ctx().table.push(descriptor)?)
                        }
                        Err(code) => Err(code),
                    }
                } else {
                    let opened = sandbox
                        .filesystem()
                        .open_at(fd, path_flags, path.clone(), open_flags, flags)
                        .await;
                    match opened {
                        Ok(fd) => Ok(fd),
                        // An error code goes back to the guest; anything else traps, as in
                        // wasmtime-wasi's own binding.
                        Err(err) => Err(err.downcast()?),
                    }
                };
                // What the guest got is noted by the file it is, for the label of what
                // the call returns (`plugin/touched.rs`).
                if let Ok(opened) = &opened {
                    let stamp;
                    (access.directory, stamp) = match stamped {
                        Some((directory, stamp)) => (directory, Some(stamp)),
                        None => stamp_of(sandbox, opened),
                    };
                    let writing =
                        sandbox
                            .file_access()
                            .opened(dir, &path, opened.rep(), access, stamp);
                    // Until this call is labelled, another call reading the file reads
                    // what it has not been labelled with.
                    if writing && let (Some(stamp), Some(reads)) = (stamp, &sandbox.scope.reads) {
                        reads.opened_to_write(stamp);
                    }
                }
                Ok((opened,))
            })
        },
    )?;
    for name in ["[method]descriptor.sync", "[method]descriptor.sync-data"] {
        types.func_wrap_async(
            name,
            move |mut store: StoreContextMut<'_, Sandbox>, (fd,): (Resource<Descriptor>,)| {
                Box::new(async move {
                    let sandbox = store.data_mut();
                    if sandbox.inline_fs() {
                        // The descriptor must still be one the guest holds.
                        sandbox.ctx().table.get(&fd)?;
                        return Ok((Ok::<(), ErrorCode>(()),));
                    }
                    let mut fs = sandbox.filesystem();
                    let synced = if name.ends_with("sync-data") {
                        fs.sync_data(fd).await
                    } else {
                        fs.sync(fd).await
                    };
                    match synced {
                        Ok(()) => Ok((Ok(()),)),
                        Err(err) => err.downcast().map(|code| (Err(code),)),
                    }
                })
            },
        )?;
    }
    linker.allow_shadowing(false);
    Ok(())
}

/// `open-at` for a call that may only read: the checks wasmtime-wasi makes for a
/// read-only directory, then an open that cannot wait, kept only if it is a regular file
/// or a directory. The outer error traps (a handle the guest does not hold).
fn open_regular(
    sandbox: &mut Sandbox,
    fd: &Resource<Descriptor>,
    path_flags: PathFlags,
    path: &str,
    open_flags: OpenFlags,
    flags: DescriptorFlags,
) -> wasmtime::Result<Result<(Descriptor, FileStamp), ErrorCode>> {
    let Descriptor::Dir(dir) = sandbox.ctx().table.get(fd)? else {
        return Ok(Err(ErrorCode::NotDirectory));
    };
    if flags.intersects(
        DescriptorFlags::FILE_INTEGRITY_SYNC
            | DescriptorFlags::DATA_INTEGRITY_SYNC
            | DescriptorFlags::REQUESTED_WRITE_SYNC,
    ) {
        return Ok(Err(ErrorCode::Unsupported));
    }
    let directory = open_flags.contains(OpenFlags::DIRECTORY);
    let creates =
        open_flags.intersects(OpenFlags::CREATE | OpenFlags::EXCLUSIVE | OpenFlags::TRUNCATE);
    if directory && creates {
        return Ok(Err(ErrorCode::Invalid));
    }
    // The directory is read-only: nothing may be created, truncated or opened to write.
    if open_flags.intersects(OpenFlags::CREATE | OpenFlags::TRUNCATE)
        || flags.contains(DescriptorFlags::WRITE)
    {
        return Ok(Err(ErrorCode::NotPermitted));
    }
    let perms = dir.perms;
    let opened = (|| {
        let start = dir.dir.as_filelike_view::<cap_std::fs::Dir>();
        let mut options = cap_std::fs::OpenOptions::new();
        options.read(true).nonblock(true).follow(
            if path_flags.contains(PathFlags::SYMLINK_FOLLOW) {
                FollowSymlinks::Yes
            } else {
                FollowSymlinks::No
            },
        );
        let file = start.open_with(path, &options)?.into_std();
        let meta = file.metadata()?;
        Ok::<_, std::io::Error>((file, meta.file_type(), FileStamp::of(&meta)))
    })();
    Ok(match opened {
        Err(err) => Err(ErrorCode::from(err)),
        Ok((file, kind, stamp)) if kind.is_dir() => Ok((
            Descriptor::Dir(Dir::new(file, perms, OpenMode::READ, true)),
            stamp,
        )),
        Ok(_) if directory => Err(ErrorCode::NotDirectory),
        Ok((file, kind, stamp)) if kind.is_file() => Ok((
            Descriptor::File(File::new(file, perms, OpenMode::READ, true)),
            stamp,
        )),
        // A FIFO, socket or device: closed here, never read.
        Ok(_) => Err(ErrorCode::Unsupported),
    })
}
