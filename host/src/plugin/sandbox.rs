//! The per-call sandbox: what one fresh instance can see and hold.
//!
//! A sandbox is built for one call from the call's effective capabilities, or for the
//! calls with the same capabilities of one process that reuses its instance
//! ([`Sandbox::begin_call`] resets what belongs to one call):
//!
//! - no `fs.*` capability: no preopen at all, so the guest sees no files;
//! - `fs.read`: the workspace preopened read-only as `.`; on a local filesystem its file
//!   operations run on the calling thread, and FIFOs, sockets and devices are refused (see
//!   [`special_files`](super::special_files));
//! - `fs.write`: the workspace preopened read-write as `.`;
//! - no environment variables, no arguments, stdin closed;
//! - stdout and stderr captured (at most [`STDERR_CAPTURE_BYTES`]) to explain traps;
//! - sockets: linked (standard runtimes import them) but the WASI context refuses every
//!   address and every name lookup, so a guest's socket never connects;
//! - HTTP: each request goes through the call's egress, which refuses everything unless
//!   the call holds a `net:` rule, and then checks each request against it (see
//!   [`net`](crate::net));
//! - the memory bound of [`Limits`], enforced by [`CallLimiter`].

use std::path::Path;
use std::sync::Arc;

use capstan_caps::Capability;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use super::capture::OutputCapture;
use super::error::ToolError;
use super::limits::{CallLimiter, Limits, MAX_RESOURCES, STDERR_CAPTURE_BYTES};
use super::touched::{CallTrace, FileAccess, ReadLabels};
use crate::flow::Label;
use crate::ids::Caller;
use crate::net::{Egress, NetHost};
use crate::services::Services;

/// The interface whose file functions the host wraps or replaces: the WASI 0.2 release
/// wasmtime-wasi 48 links, which components importing any 0.2.x release resolve to.
pub(super) const FILESYSTEM_TYPES: &str = "wasi:filesystem/types@0.2.12";

/// The store data of one call, or of one process's calls that reuse an instance.
pub struct Sandbox {
    wasi: WasiCtx,
    http: WasiHttpCtx,
    egress: Egress,
    table: ResourceTable,
    pub(crate) limiter: CallLimiter,
    pub(crate) output: OutputCapture,
    pub(crate) scope: CallScope,
    /// File operations run on the calling thread: the call may read but not write
    /// (see [`special_files`](super::special_files)).
    inline_fs: bool,
    /// The workspace directory's device and inode, when the call has it.
    root: Option<(u64, u64)>,
    /// Streams over files the guest was given since the last check, by resource.
    file_streams: Vec<u32>,
    /// The workspace paths the guest reached, for the labels of what it returns.
    files: FileAccess,
}

/// Who is running and with what, for the host imports' checks and log lines.
pub(crate) struct CallScope {
    pub(crate) plugin: Arc<str>,
    /// The `capstan:plugin` version the plugin was built for, e.g. `0.2.0`.
    pub(crate) contract: String,
    pub(crate) tool: String,
    /// The calling process, e.g. `worker:3`: the creator of tasks it makes, and the owner
    /// `tasks.write-own` checks against.
    pub(crate) caller: Caller,
    pub(crate) capabilities: Vec<Capability>,
    /// What the `tasks` and `memory` imports answer from; `None`: they answer "not
    /// available in this host".
    pub(crate) services: Option<Services>,
    /// The secrets behind the `secrets` import (used only for `secret:` capabilities the
    /// call holds) and the redaction of what leaves the call.
    pub(crate) network: Arc<NetHost>,
    pub(crate) log_lines: u32,
    /// What the caller put into the call: what the call writes (tasks, memories)
    /// carries it, with what the call read.
    pub(crate) label: Label,
    /// How what the call read is labelled, when its caller keeps file labels.
    pub(crate) reads: Option<Arc<dyn ReadLabels>>,
    /// The mailbox behind `capstan:channel/mail`: only an email channel's adapter has one.
    pub(crate) mail: Option<Arc<crate::net::mail::Mailbox>>,
}

impl CallScope {
    /// Whether the call runs with any of `caps`.
    pub(crate) fn has_any(&self, caps: &[Capability]) -> bool {
        caps.iter().any(|c| self.capabilities.contains(c))
    }
}

impl Sandbox {
    /// A sandbox for one call of `tool` with `capabilities`, rooted at `workspace` when the
    /// capabilities include file access.
    pub(crate) fn new(
        limits: &Limits,
        scope: CallScope,
        workspace: Option<&Path>,
        egress: Egress,
    ) -> Result<Self, ToolError> {
        let tool = scope.tool.as_str();
        let output = OutputCapture::new(STDERR_CAPTURE_BYTES);
        let perms = fs_perms(&scope.capabilities);
        let inline_fs =
            matches!(perms, Some(FsPerms::ReadOnly)) && workspace.is_some_and(runs_inline);
        let mut root = None;
        let mut wasi = WasiCtx::builder();
        wasi.allow_blocking_current_thread(inline_fs);
        wasi.stdout(output.clone())
            .stderr(output.clone())
            .allow_ip_name_lookup(false)
            .allow_tcp(false)
            .allow_udp(false)
            .socket_addr_check(|_, _| Box::pin(std::future::ready(false)));
        if let Some(perms) = perms {
            let dir = workspace.ok_or_else(|| {
                ToolError::Failed(format!(
                    "tool `{tool}` needs the workspace, but this call has none; pass a workspace \
                     directory (--workspace DIR)"
                ))
            })?;
            // Its identity, to tell the workspace's own handle from any other directory a
            // kept instance might hold (`holds_only_the_workspace`).
            root = std::fs::metadata(dir).ok().map(|m| {
                (
                    std::os::unix::fs::MetadataExt::dev(&m),
                    std::os::unix::fs::MetadataExt::ino(&m),
                )
            });
            wasi.preopened_dir(dir, ".", perms).map_err(|err| {
                let fix = match std::fs::metadata(dir) {
                    Ok(meta) if !meta.is_dir() => {
                        "it is a file, not a directory: pass a directory (--workspace DIR, \
                         agent.workspace)"
                    }
                    Err(_) => "it does not exist: create it, or pass another (--workspace DIR)",
                    Ok(_) => "check its permissions, or pass another (--workspace DIR)",
                };
                ToolError::Failed(format!(
                    "cannot open the workspace {} for tool `{tool}`: {err}; {fix}",
                    dir.display()
                ))
            })?;
        }
        Ok(Sandbox {
            wasi: wasi.build(),
            http: WasiHttpCtx::new(),
            egress,
            table: bounded_table(),
            limiter: CallLimiter::new(limits.memory_bytes),
            output,
            scope,
            inline_fs,
            root,
            file_streams: Vec::new(),
            files: FileAccess::default(),
        })
    }

    /// Notes that the guest holds stream `rep`, made over a file (`plugin/file_streams.rs`).
    pub(crate) fn note_file_stream(&mut self, rep: u32) {
        self.file_streams.push(rep);
    }

    /// Whether the guest holds no file, no stream over a file, and no directory but the
    /// workspace itself. A kept instance holding one would carry it to the next call: a
    /// directory since moved out of the workspace, or a file since deleted from it, would
    /// still be reachable.
    pub(crate) fn holds_only_the_workspace(&mut self) -> bool {
        let root = self.root;
        // A stream's slot may since hold another resource: then the instance is dropped
        // too, which is never wrong.
        let streams = std::mem::take(&mut self.file_streams);
        if streams
            .iter()
            .any(|rep| self.table.get_any_mut(*rep).is_ok())
        {
            return false;
        }
        self.table.iter_mut().all(|entry| {
            match entry.downcast_ref::<wasmtime_wasi::filesystem::Descriptor>() {
                None => true,
                Some(wasmtime_wasi::filesystem::Descriptor::File(_)) => false,
                Some(wasmtime_wasi::filesystem::Descriptor::Dir(dir)) => {
                    let held = dir.dir.metadata().ok().map(|m| {
                        use std::os::unix::fs::MetadataExt as _;
                        (m.dev(), m.ino())
                    });
                    held.is_some() && held == root
                }
            }
        })
    }

    /// The hosts the call's requests have connected to so far.
    pub(crate) fn hosts_reached(&self) -> std::collections::BTreeSet<String> {
        self.egress.reached()
    }

    /// Where the guest's descriptors point, and the paths it reached.
    pub(crate) fn file_access(&mut self) -> &mut FileAccess {
        &mut self.files
    }

    /// Whether the call's file operations run on the calling thread: it may only read.
    pub(crate) fn inline_fs(&self) -> bool {
        self.inline_fs
    }

    /// Readies a reused sandbox for the next call, of `tool` through `egress`, with what
    /// its caller hands it in `trace`: what the last call wrote, logged and was refused is
    /// forgotten, what it read and was given is carried (the instance may still hold it).
    /// The capabilities, caller and preopens stay: an instance is reused only by calls that
    /// would build the same.
    pub(crate) fn begin_call(&mut self, tool: &str, egress: Egress, trace: &CallTrace) {
        self.scope.tool.clear();
        self.scope.tool.push_str(tool);
        let given = std::mem::replace(&mut self.scope.label, trace.label.clone());
        self.files.touched().labels.join(&given);
        self.files.log_into(trace.log.clone());
        self.scope.reads.clone_from(&trace.reads);
        self.scope.log_lines = 0;
        self.egress = egress;
        self.limiter.begin_call();
        self.output.clear();
    }

    /// How many resources (files, streams, pollables) the guest holds now.
    pub(crate) fn resources_held(&mut self) -> usize {
        self.table.iter_mut().count()
    }

    /// What the guest wrote to stdout and stderr, lossily decoded.
    pub(crate) fn captured_output(&self) -> String {
        String::from_utf8_lossy(&self.output.contents()).into_owned()
    }
}

/// Linux filesystems that answer from local storage or memory (`statfs`'s `f_type`).
const LOCAL_FILESYSTEMS: &[(u32, &str)] = &[
    (0xEF53, "ext2/3/4"),
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0x0102_1994, "tmpfs"),
    (0x8584_58F6, "ramfs"),
    (0x794C_7630, "overlayfs"),
    (0xF2F5_2010, "f2fs"),
    (0x2FC1_2FC1, "zfs"),
    (0xCA45_1A4E, "bcachefs"),
];

/// Whether a call that may only read `workspace` runs its file operations inline: only if
/// the workspace lies on a local filesystem (one `statfs`, at each sandbox's creation).
pub(crate) fn runs_inline(workspace: &Path) -> bool {
    rustix::fs::statfs(workspace).is_ok_and(|fs| {
        LOCAL_FILESYSTEMS
            .iter()
            // The word is 32 bits of magic, whatever the width `statfs` gives it.
            .any(|(magic, _)| fs.f_type as u32 == *magic)
    })
}

/// A resource table holding at most [`MAX_RESOURCES`] at once.
fn bounded_table() -> ResourceTable {
    let mut table = ResourceTable::new();
    table.set_max_capacity(MAX_RESOURCES);
    table
}

/// Whether `capabilities` open the workspace in a sandbox.
pub(crate) fn opens_workspace(capabilities: &[Capability]) -> bool {
    fs_perms(capabilities).is_some()
}

/// The preopen a set of capabilities asks for, if any.
fn fs_perms(capabilities: &[Capability]) -> Option<FsPerms> {
    if capabilities.contains(&Capability::FsWrite) {
        Some(FsPerms::ReadWrite)
    } else if capabilities.contains(&Capability::FsRead) {
        Some(FsPerms::ReadOnly)
    } else {
        None
    }
}

impl WasiView for Sandbox {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for Sandbox {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.egress,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_workspace_runs_inline_and_a_pseudo_filesystem_does_not() {
        let dir = tempfile::tempdir().unwrap();
        // The test machines' temporary directories are on ext4 or tmpfs.
        assert!(runs_inline(dir.path()));
        assert!(!runs_inline(Path::new("/proc")));
        assert!(!runs_inline(Path::new("/no/such/workspace")));
    }
}
