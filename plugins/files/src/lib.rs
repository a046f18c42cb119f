//! Capstan's file tools: `file_read`, `file_list`, `file_write` and `file_edit`.
//!
//! Paths are relative to the workspace, which the host preopens read-only (`fs.read`) or
//! read-write (`fs.write`). The tools check paths themselves only to give clear messages;
//! the sandbox is what keeps them inside the workspace.

use capstan_sdk::{Capability, Tool, Toolbox};

mod edit;
mod limits;
mod list;
mod path;
mod read;
mod write;

fn tools() -> Toolbox {
    Toolbox::new()
        .tool(
            Tool::new(
                "file_read",
                "Reads a text file in the workspace. Long files come in pages: pass `offset` \
                 (first line, 1-based) and `limit` (lines) to read further; a line longer \
                 than the output cap comes in pages of its own (`line_page`), as the marker \
                 at the end of each page says.",
                read::file_read,
            )
            .needs(Capability::FsRead),
        )
        .tool(
            Tool::new(
                "file_list",
                "Lists a directory in the workspace (default: its root), directories first \
                 with a trailing `/`, files with their size in bytes.",
                list::file_list,
            )
            .needs(Capability::FsRead),
        )
        .tool(
            Tool::new(
                "file_write",
                "Writes a file in the workspace, replacing it if it exists and creating \
                 parent directories.",
                write::file_write,
            )
            .needs(Capability::FsWrite),
        )
        .tool(
            Tool::new(
                "file_edit",
                "Replaces an exact string in a workspace file. `old` must occur exactly once \
                 unless `replace_all` is true.",
                edit::file_edit,
            )
            .needs(Capability::FsRead)
            .needs(Capability::FsWrite),
        )
}

capstan_sdk::export_plugin!(tools);
