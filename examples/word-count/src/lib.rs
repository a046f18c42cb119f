//! `word_count`: counts the lines, words and bytes of a file in the workspace.

use capstan_sdk::{Capability, Context, Json, Tool, ToolError, Toolbox};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Arguments of `word_count`. Doc comments become descriptions in the schema.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// A file, relative to the workspace root.
    path: String,
}

#[derive(Serialize)]
struct Counts {
    lines: usize,
    words: usize,
    bytes: usize,
}

fn word_count(args: Args, _ctx: &Context) -> Result<Json<Counts>, ToolError> {
    let text = std::fs::read_to_string(&args.path)?;
    Ok(Json(Counts {
        lines: text.lines().count(),
        words: text.split_whitespace().count(),
        bytes: text.len(),
    }))
}

fn tools() -> Toolbox {
    Toolbox::new().tool(
        Tool::new(
            "word_count",
            "Counts the lines, words and bytes of a workspace file.",
            word_count,
        )
        .needs(Capability::FsRead),
    )
}

capstan_sdk::export_plugin!(tools);
