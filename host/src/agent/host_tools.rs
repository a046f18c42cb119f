//! Host-native tools: they act on the orchestration (replies, delegation, status), so they
//! run in the trusted host rather than in a plugin. Profiles grant them by name like any
//! other tool; they declare no capability.

use serde_json::{Value, json};

use crate::llm::ToolDef;

/// A host tool's name, description and argument schema.
#[derive(Debug, Clone, Copy)]
pub struct HostTool {
    /// The name profiles grant.
    pub name: &'static str,
    /// For the model.
    pub description: &'static str,
    schema: fn() -> Value,
}

impl HostTool {
    /// The tool as offered to a model.
    pub fn def(&self) -> ToolDef {
        ToolDef {
            name: self.name.to_owned(),
            description: self.description.to_owned(),
            parameters: (self.schema)(),
        }
    }
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required, "additionalProperties": false })
}

/// Every host tool.
pub const HOST_TOOLS: &[HostTool] = &[
    HostTool {
        name: "reply",
        description: "Sends a message to the user and ends this turn.",
        schema: || object(json!({ "text": { "type": "string" } }), &["text"]),
    },
    HostTool {
        name: "skip",
        description: "Ends this turn without replying.",
        schema: || object(json!({}), &[]),
    },
    HostTool {
        name: "spawn_worker",
        description: "Starts a worker on a task. It works with a fresh prompt, its own tools \
                      and the task text only, and reports back when done.",
        schema: || {
            object(
                json!({
                    "task": { "type": "string", "description": "What to do, self-contained." },
                    "interactive": { "type": "boolean", "description": "Keep it open for follow-up input." },
                    "task_number": { "type": "integer", "description": "Assign it to this task on the board, so it may update it." }
                }),
                &["task"],
            )
        },
    },
    HostTool {
        name: "branch",
        description: "Forks this conversation into a branch that thinks about a question with \
                      memory, tasks and read-only files, and returns a conclusion.",
        schema: || object(json!({ "question": { "type": "string" } }), &["question"]),
    },
    HostTool {
        name: "route",
        description: "Sends a message to a running worker.",
        schema: || {
            object(
                json!({ "worker": { "type": "string" }, "message": { "type": "string" } }),
                &["worker", "message"],
            )
        },
    },
    HostTool {
        name: "cancel",
        description: "Stops a running worker.",
        schema: || object(json!({ "worker": { "type": "string" } }), &["worker"]),
    },
    HostTool {
        name: "set_status",
        description: "Reports this worker's state: progress (keeps working), waiting (asks \
                      for input), done or failed (ends the work, with the result).",
        schema: || {
            object(
                json!({
                    "state": { "type": "string", "enum": ["progress", "waiting", "done", "failed"] },
                    "message": { "type": "string" }
                }),
                &["state", "message"],
            )
        },
    },
];

/// The host tool named `name`.
pub fn host_tool(name: &str) -> Option<&'static HostTool> {
    HOST_TOOLS.iter().find(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::contract::RESERVED_TOOL_NAMES;

    #[test]
    fn every_host_tool_name_is_reserved_from_plugins() {
        for tool in HOST_TOOLS {
            assert!(RESERVED_TOOL_NAMES.contains(&tool.name), "{}", tool.name);
        }
        assert_eq!(RESERVED_TOOL_NAMES.len(), HOST_TOOLS.len());
    }
}
