//! Capstan's memory tools: `memory_save`, `memory_recall` and `memory_delete`.

use capstan_sdk::host::{MemoryItem, NewMemory, memory};
use capstan_sdk::{Capability, Context, Json, Tool, ToolError, Toolbox};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A memory as the tools return it.
#[derive(Serialize)]
struct MemoryView {
    id: String,
    kind: String,
    content: String,
    importance: f32,
}

impl From<MemoryItem> for MemoryView {
    fn from(m: MemoryItem) -> Self {
        MemoryView {
            id: m.id,
            kind: m.kind,
            content: m.content,
            importance: m.importance,
        }
    }
}

/// Arguments of `memory_save`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SaveArgs {
    /// What to remember, as one self-contained statement.
    content: String,
    /// fact (default), decision, preference or observation.
    #[serde(default)]
    kind: Option<String>,
    /// 0.0 to 1.0 (default 0.5): how much it matters later.
    #[serde(default)]
    importance: Option<f32>,
}

fn memory_save(args: SaveArgs, _: &Context) -> Result<Json<MemoryView>, ToolError> {
    let saved = memory::save(&NewMemory {
        kind: args.kind.unwrap_or_else(|| "fact".into()),
        content: args.content,
        importance: args.importance,
    })?;
    Ok(Json(saved.into()))
}

/// Arguments of `memory_recall`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct RecallArgs {
    /// Words to search for.
    query: String,
    /// At most this many (default 5).
    #[serde(default)]
    limit: Option<u32>,
}

fn memory_recall(args: RecallArgs, _: &Context) -> Result<Json<Vec<MemoryView>>, ToolError> {
    let found = memory::recall(&args.query, args.limit.unwrap_or(5))?;
    Ok(Json(found.into_iter().map(Into::into).collect()))
}

/// Arguments of `memory_delete`.
#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct DeleteArgs {
    /// The memory's id, from memory_recall.
    id: String,
}

fn memory_delete(args: DeleteArgs, _: &Context) -> Result<String, ToolError> {
    memory::delete(&args.id)?;
    Ok(format!("deleted memory {}", args.id))
}

fn tools() -> Toolbox {
    Toolbox::new()
        .tool(
            Tool::new(
                "memory_save",
                "Saves a memory for later recall.",
                memory_save,
            )
            .needs(Capability::MemoryWrite),
        )
        .tool(
            Tool::new(
                "memory_recall",
                "Finds saved memories about a query, best first.",
                memory_recall,
            )
            .needs(Capability::MemoryRead),
        )
        .tool(
            Tool::new("memory_delete", "Deletes a saved memory.", memory_delete)
                .needs(Capability::MemoryWrite),
        )
}

capstan_sdk::export_plugin!(tools);
