//! The WASI functions that list, read a link, or make or move a name, wrapped so that
//! each workspace path they reach is noted in the call's sandbox ([`Touched`]) before
//! wasmtime-wasi's own runs. (`open-at` notes its paths in
//! [`special_files`](super::special_files), which replaces it.)

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemView as _};
use wasmtime_wasi::p2::bindings::filesystem::types::{ErrorCode, HostDescriptor as _, PathFlags};

use super::sandbox::{FILESYSTEM_TYPES, Sandbox};
use super::touched::Reached;
#[cfg(doc)]
use super::touched::Touched;
use crate::services::FileStamp;

/// Whether descriptor `fd` is a directory, and the stamp of the file it holds if that
/// can be read.
pub(crate) fn stamp_of(
    sandbox: &mut Sandbox,
    fd: &Resource<Descriptor>,
) -> (bool, Option<FileStamp>) {
    use wasmtime_wasi::WasiView as _;
    let (directory, file) = match sandbox.ctx().table.get(fd) {
        Ok(Descriptor::File(file)) => (false, file.file.clone()),
        Ok(Descriptor::Dir(dir)) => (true, dir.dir.clone()),
        Err(_) => return (false, None),
    };
    (
        directory,
        file.metadata().ok().map(|meta| FileStamp::of(&meta)),
    )
}

/// The stamp of `name` beneath directory descriptor `dir`, the name itself (a link is
/// not followed), if it can be read.
fn stamp_at(sandbox: &mut Sandbox, dir: &Resource<Descriptor>, name: &str) -> Option<FileStamp> {
    use cap_std::fs::MetadataExt as _;
    use cap_std::io_lifetimes::AsFilelike as _;
    use wasmtime_wasi::WasiView as _;
    let Ok(Descriptor::Dir(dir)) = sandbox.ctx().table.get(dir) else {
        return None;
    };
    let meta = dir
        .dir
        .as_filelike_view::<cap_std::fs::Dir>()
        .symlink_metadata(name)
        .ok()?;
    let (dev, ino, len) = (meta.dev(), meta.ino(), meta.size());
    Some(FileStamp::new(
        dev,
        ino,
        len,
        meta.ctime(),
        meta.ctime_nsec(),
    ))
}

/// What a wrapped function answers once the call has reached all the paths it may:
/// nothing it reaches goes unnoted.
fn refused<T>() -> wasmtime::Result<(Result<T, ErrorCode>,)> {
    Ok((Err(ErrorCode::Quota),))
}

/// Wraps the WASI functions that list, read a link, or make or move a name, in `linker`
/// (which already holds wasmtime-wasi's), so that each path they reach is noted in the
/// call's sandbox before wasmtime-wasi's own runs. (`open-at` notes its paths in
/// [`special_files`](super::special_files), which replaces it.)
pub(crate) fn note_file_access(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap_async(
        "[method]descriptor.read-directory",
        |mut store: StoreContextMut<'_, Sandbox>, (fd,): (Resource<Descriptor>,)| {
            Box::new(async move {
                let sandbox = store.data_mut();
                if sandbox.file_access().full() {
                    return refused();
                }
                let (_, stamp) = stamp_of(sandbox, &fd);
                sandbox
                    .file_access()
                    .reached(fd.rep(), ".", Reached::Listed(stamp));
                answered(sandbox.filesystem().read_directory(fd).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.readlink-at",
        |mut store: StoreContextMut<'_, Sandbox>, (fd, name): (Resource<Descriptor>, String)| {
            Box::new(async move {
                let sandbox = store.data_mut();
                if sandbox.file_access().full() {
                    return refused();
                }
                let stamp = stamp_at(sandbox, &fd, &name);
                sandbox
                    .file_access()
                    .reached(fd.rep(), &name, Reached::Read(stamp));
                answered(sandbox.filesystem().readlink_at(fd, name).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.rename-at",
        |mut store: StoreContextMut<'_, Sandbox>,
         (fd, old, new_fd, new): (Resource<Descriptor>, String, Resource<Descriptor>, String)| {
            Box::new(async move {
                let sandbox = store.data_mut();
                if sandbox.file_access().full() {
                    return refused();
                }
                // What the moved file held goes with it (and a directory's names): read
                // at the old name (as the file it is now), written at the new.
                let stamp = stamp_at(sandbox, &fd, &old);
                let access = sandbox.file_access();
                access.reached(fd.rep(), &old, Reached::Moved(stamp));
                access.reached(new_fd.rep(), &new, Reached::Written);
                answered(sandbox.filesystem().rename_at(fd, old, new_fd, new).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.link-at",
        |mut store: StoreContextMut<'_, Sandbox>,
         (fd, flags, old, new_fd, new): (
            Resource<Descriptor>,
            PathFlags,
            String,
            Resource<Descriptor>,
            String,
        )| {
            Box::new(async move {
                let sandbox = store.data_mut();
                if sandbox.file_access().full() {
                    return refused();
                }
                let stamp = stamp_at(sandbox, &fd, &old);
                let access = sandbox.file_access();
                access.reached(fd.rep(), &old, Reached::Read(stamp));
                access.reached(new_fd.rep(), &new, Reached::Written);
                answered(
                    sandbox
                        .filesystem()
                        .link_at(fd, flags, old, new_fd, new)
                        .await,
                )
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.symlink-at",
        |mut store: StoreContextMut<'_, Sandbox>,
         (fd, target, name): (Resource<Descriptor>, String, String)| {
            Box::new(async move {
                let sandbox = store.data_mut();
                if sandbox.file_access().full() {
                    return refused();
                }
                sandbox
                    .file_access()
                    .reached(fd.rep(), &name, Reached::Written);
                answered(sandbox.filesystem().symlink_at(fd, target, name).await)
            })
        },
    )?;
    types.func_wrap_async(
        "[method]descriptor.create-directory-at",
        |mut store: StoreContextMut<'_, Sandbox>, (fd, name): (Resource<Descriptor>, String)| {
            Box::new(async move {
                let sandbox = store.data_mut();
                if sandbox.file_access().full() {
                    return refused();
                }
                sandbox
                    .file_access()
                    .reached(fd.rep(), &name, Reached::Written);
                answered(sandbox.filesystem().create_directory_at(fd, name).await)
            })
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// wasmtime-wasi's answer as its own binding gives it: an error code goes back to the
/// guest, anything else traps.
fn answered<T>(
    result: Result<T, wasmtime_wasi::p2::FsError>,
) -> wasmtime::Result<(Result<T, ErrorCode>,)> {
    match result {
        Ok(value) => Ok((Ok(value),)),
        Err(err) => err.downcast().map(|code| (Err(code),)),
    }
}
