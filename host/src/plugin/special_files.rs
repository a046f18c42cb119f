//! File operations without a thread hop, and the files that would make them unsafe.
//!
//! A call granted `fs.read` alone runs its WASI file operations on the thread that runs
//! the call, as wasmtime-wasi does with `allow_blocking_current_thread`: opening, reading
//! and listing local regular files and directories take microseconds, while a hand-off to
//! a blocking thread and back costs more than the operation (BENCHMARKS.md, "Where the
//! time goes"). A FIFO, socket or device in the workspace could instead block such an
//! operation with no end, holding an executor thread the deadline cannot free. So such a
//! call cannot open one: `open-at` of anything but a regular file, a directory or a
//! symbolic link is refused with `unsupported` before the open is tried.
//!
//! A call granted `fs.write` may write and sync large files, so its operations still run
//! on blocking threads, as every call's did before, and it may open special files, bounded
//! by the deadline like any other wait.
//!
//! What this does not cover: another process swapping a checked file for a FIFO between
//! the check and the open. Only a process with write access to the workspace can do that
//! (no plugin can make a FIFO), and such a process can stop the host by other means.

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::WasiView as _;
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemView as _};
use wasmtime_wasi::p2::bindings::filesystem::types::{
    DescriptorFlags, ErrorCode, HostDescriptor as _, OpenFlags, PathFlags,
};

use super::sandbox::Sandbox;

/// The interface whose `open-at` is checked: the WASI 0.2 release wasmtime-wasi 48 links.
const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

type OpenAtParams = (
    Resource<Descriptor>,
    PathFlags,
    String,
    OpenFlags,
    DescriptorFlags,
);

/// Replaces WASI's `descriptor.open-at` in `linker` (which already holds wasmtime-wasi's)
/// with one that refuses special files to calls whose file operations run inline, then
/// hands every other open to wasmtime-wasi's.
pub(crate) fn check_open_at(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    linker.instance(FILESYSTEM_TYPES)?.func_wrap_async(
        "[method]descriptor.open-at",
        |mut store: StoreContextMut<'_, Sandbox>,
         (fd, path_flags, path, open_flags, flags): OpenAtParams| {
            Box::new(async move {
                let sandbox = store.data_mut();
                let follow = path_flags.contains(PathFlags::SYMLINK_FOLLOW);
                if sandbox.inline_fs() && is_special(sandbox, &fd, &path, follow) {
                    return Ok((Err(ErrorCode::Unsupported),));
                }
                let opened = sandbox
                    .filesystem()
                    .open_at(fd, path_flags, path, open_flags, flags)
                    .await;
                match opened {
                    Ok(fd) => Ok((Ok(fd),)),
                    // An error code goes back to the guest; anything else traps, as in
                    // wasmtime-wasi's own binding.
                    Err(err) => err.downcast().map(|code| (Err(code),)),
                }
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Whether `path` under the directory `fd` names something other than a regular file, a
/// directory or a symbolic link (followed if `follow`). Anything that cannot be checked is
/// left to the open itself, which reports it.
fn is_special(sandbox: &mut Sandbox, fd: &Resource<Descriptor>, path: &str, follow: bool) -> bool {
    let Ok(Descriptor::Dir(dir)) = sandbox.ctx().table.get(fd) else {
        return false;
    };
    let Ok(handle) = dir.dir.try_clone() else {
        return false;
    };
    // The same resolution as the open: beneath the directory, never outside it.
    let dir = cap_std::fs::Dir::from_std_file(handle);
    let metadata = if follow {
        dir.metadata(path)
    } else {
        dir.symlink_metadata(path)
    };
    metadata.is_ok_and(|m| {
        let kind = m.file_type();
        !(kind.is_file() || kind.is_dir() || kind.is_symlink())
    })
}
