//! The tools of the `{{name}}` plugin.

use std::collections::HashMap;

use capstan_sdk::{Capability, Context, Json, Tool, ToolError, Toolbox};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Doc comments become descriptions in the schema the model reads.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// A file, relative to the workspace root.
    path: String,
    /// How many of the most frequent words to list.
    #[serde(default = "default_top")]
    top: usize,
}

fn default_top() -> usize {
    5
}

#[derive(Serialize)]
struct Stats {
    lines: usize,
    words: usize,
    top: Vec<(String, usize)>,
}

fn count_words(args: Args, _ctx: &Context) -> Result<Json<Stats>, ToolError> {
    // Plain std::fs: the sandbox holds the workspace only when the call is granted fs.read.
    let text = std::fs::read_to_string(&args.path)?;
    let mut counts: HashMap<String, usize> = HashMap::new();
    for word in text.split_whitespace() {
        *counts.entry(word.to_lowercase()).or_default() += 1;
    }
    let mut top: Vec<(String, usize)> = counts.into_iter().collect();
    top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let words = top.iter().map(|(_, n)| n).sum();
    top.truncate(args.top);
    Ok(Json(Stats {
        lines: text.lines().count(),
        words,
        top,
    }))
}

fn toolbox() -> Toolbox {
    Toolbox::new().tool(
        Tool::new(
            "{{tool}}",
            "Counts the lines and words of a workspace file and lists its most frequent words.",
            count_words,
        )
        .needs(Capability::FsRead),
    )
}

capstan_sdk::export_plugin!(toolbox);
