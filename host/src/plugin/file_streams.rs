//! Streams over files, noted as the guest opens them, so that an instance still holding
//! one is not kept for the next call.
//!
//! A stream made from a file descriptor (`read-via-stream`, `write-via-stream`,
//! `append-via-stream`) holds the file open after the guest drops the descriptor, and a
//! stream's type does not say what it reads from. A kept instance holding one would reach
//! the file at its next call, even after the file was deleted from the workspace or the
//! workspace's grant changed meaning. So the host wraps those three functions to note each
//! stream they make ([`Sandbox::note_file_stream`]); an instance holding any of them after
//! a call is dropped ([`Sandbox::holds_only_the_workspace`]).

use wasmtime::StoreContextMut;
use wasmtime::component::{Linker, Resource};
use wasmtime_wasi::filesystem::{Descriptor, WasiFilesystemView as _};
use wasmtime_wasi::p2::FsError;
use wasmtime_wasi::p2::bindings::filesystem::types::{ErrorCode, HostDescriptor as _};

use super::sandbox::{FILESYSTEM_TYPES, Sandbox};

/// Wraps the three functions that make a stream over a file, in `linker` (which already
/// holds wasmtime-wasi's), so that each stream they make is noted in the call's sandbox.
pub(crate) fn note_file_streams(linker: &mut Linker<Sandbox>) -> wasmtime::Result<()> {
    linker.allow_shadowing(true);
    let mut types = linker.instance(FILESYSTEM_TYPES)?;
    types.func_wrap(
        "[method]descriptor.read-via-stream",
        |mut store: StoreContextMut<'_, Sandbox>, (fd, offset): (Resource<Descriptor>, u64)| {
            let sandbox = store.data_mut();
            let made = sandbox.filesystem().read_via_stream(fd, offset);
            noted(sandbox, made)
        },
    )?;
    types.func_wrap(
        "[method]descriptor.write-via-stream",
        |mut store: StoreContextMut<'_, Sandbox>, (fd, offset): (Resource<Descriptor>, u64)| {
            let sandbox = store.data_mut();
            let made = sandbox.filesystem().write_via_stream(fd, offset);
            noted(sandbox, made)
        },
    )?;
    types.func_wrap(
        "[method]descriptor.append-via-stream",
        |mut store: StoreContextMut<'_, Sandbox>, (fd,): (Resource<Descriptor>,)| {
            let sandbox = store.data_mut();
            let made = sandbox.filesystem().append_via_stream(fd);
            noted(sandbox, made)
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Notes the stream `made`, if one was; an error code goes back to the guest and
/// anything else traps, as in wasmtime-wasi's own binding.
fn noted<S: 'static>(
    sandbox: &mut Sandbox,
    made: Result<Resource<S>, FsError>,
) -> wasmtime::Result<(Result<Resource<S>, ErrorCode>,)> {
    match made {
        Ok(stream) => {
            sandbox.note_file_stream(stream.rep());
            Ok((Ok(stream),))
        }
        Err(err) => err.downcast().map(|code| (Err(code),)),
    }
}
