//! Host-native tools: they act on the orchestration (replies, delegation, status), so they
//! run in the trusted host rather than in a plugin. Profiles grant them by name like any
//! other tool; they declare no capability.
//!
//! Each tool is defined once, in [`host_tools!`]: its name, its description and its
//! argument type. The schema the model is shown is derived from the argument type
//! (`schemars`), the arguments are parsed into it, and a call is dispatched by matching
//! on [`HostCall`], so the three cannot drift apart.

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::llm::ToolDef;
use crate::plugin::ToolError;

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
    ///
    /// ```
    /// use capstan_host::agent::host_tool;
    ///
    /// let reply = host_tool("reply").unwrap().def();
    /// assert_eq!(reply.parameters["required"], serde_json::json!(["text"]));
    /// ```
    pub fn def(&self) -> ToolDef {
        ToolDef {
            name: self.name.to_owned(),
            description: self.description.to_owned(),
            parameters: (self.schema)(),
        }
    }
}

/// The JSON Schema of `A`, as a model is shown it: without the `$schema` and `title`
/// keys, which only name the Rust type, and with `properties` even when there are none
/// (some OpenAI-compatible servers require it).
fn schema_of<A: JsonSchema>() -> Value {
    let mut schema = schemars::schema_for!(A).to_value();
    if let Some(object) = schema.as_object_mut() {
        object.remove("$schema");
        object.remove("title");
        object
            .entry("properties")
            .or_insert_with(|| Value::Object(Default::default()));
    }
    schema
}

/// The arguments of a host tool, parsed from what the model wrote.
trait HostArgs: DeserializeOwned + JsonSchema {
    /// Parses the arguments of a call of host tool `tool`, or says what is wrong. No
    /// arguments at all (as some models send for a tool without parameters) are `{}`.
    fn parse(tool: &str, arguments: &str) -> Result<Self, ToolError> {
        let arguments = if arguments.trim().is_empty() {
            "{}"
        } else {
            arguments
        };
        serde_json::from_str(arguments)
            .map_err(|err| ToolError::InvalidArgs(format!("{tool}: {err}")))
    }
}

/// Defines every host tool from one list: `Variant(Args) = "name": "description"`.
macro_rules! host_tools {
    ($( $(#[$doc:meta])* $variant:ident($args:ty) = $name:literal: $description:literal; )*) => {
        /// A call of a host tool, with its arguments parsed.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub(crate) enum HostCall {
            $( $(#[$doc])* $variant($args), )*
        }

        /// Every host tool, in the order a model is offered them.
        pub const HOST_TOOLS: &[HostTool] = &[
            $( HostTool { name: $name, description: $description, schema: schema_of::<$args> }, )*
        ];

        impl HostCall {
            /// Parses a call of tool `name`: `None` if it is not a host tool, an error
            /// naming the tool and the field if the arguments do not fit.
            pub(crate) fn parse(name: &str, arguments: &str) -> Option<Result<HostCall, ToolError>> {
                match name {
                    $( $name => Some(<$args as HostArgs>::parse(name, arguments).map(HostCall::$variant)), )*
                    _ => None,
                }
            }
        }
    };
}

host_tools! {
    /// `reply`.
    Reply(ReplyArgs) = "reply": "Sends a message to the user and ends this turn.";
    /// `skip`.
    Skip(SkipArgs) = "skip": "Ends this turn without replying.";
    /// `spawn_worker`.
    SpawnWorker(SpawnArgs) = "spawn_worker":
        "Starts a worker on a task. It works with a fresh prompt, its own tools and the task \
         text only, and reports back when done.";
    /// `branch`.
    Branch(BranchArgs) = "branch":
        "Forks this conversation into a branch that thinks about a question with memory, \
         tasks and read-only files, and returns a conclusion.";
    /// `route`.
    Route(RouteArgs) = "route": "Sends a message to a running worker.";
    /// `cancel`.
    Cancel(CancelArgs) = "cancel": "Stops a running worker.";
    /// `set_status`.
    SetStatus(StatusArgs) = "set_status":
        "Reports this worker's state: progress (keeps working), waiting (asks for input), \
         done or failed (ends the work, with the result).";
}

/// The arguments of `reply`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(crate) struct ReplyArgs {
    /// The message for the user.
    pub(crate) text: String,
}

impl HostArgs for ReplyArgs {}

/// The arguments of `skip`: none.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(crate) struct SkipArgs {}

impl HostArgs for SkipArgs {
    /// Whatever came with it: a model that means to skip is not sent back to fix its
    /// arguments.
    fn parse(_tool: &str, _arguments: &str) -> Result<Self, ToolError> {
        Ok(SkipArgs {})
    }
}

/// The arguments of `spawn_worker`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(crate) struct SpawnArgs {
    /// What to do, self-contained.
    pub(crate) task: String,
    /// Keep it open for follow-up input.
    #[serde(default)]
    pub(crate) interactive: bool,
    /// Assign it to this task on the board, so it may update it.
    #[serde(default)]
    #[schemars(with = "u64")]
    pub(crate) task_number: Option<u64>,
}

impl HostArgs for SpawnArgs {}

/// The arguments of `branch`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(crate) struct BranchArgs {
    /// The question to think about.
    pub(crate) question: String,
}

impl HostArgs for BranchArgs {}

/// The arguments of `route`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(crate) struct RouteArgs {
    /// The worker's id, e.g. `worker:3`.
    pub(crate) worker: String,
    /// The message for it.
    pub(crate) message: String,
}

impl HostArgs for RouteArgs {}

/// The arguments of `cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(crate) struct CancelArgs {
    /// The worker's id, e.g. `worker:3`.
    pub(crate) worker: String,
}

impl HostArgs for CancelArgs {}

/// The arguments of `set_status`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub(crate) struct StatusArgs {
    /// The worker's state.
    pub(crate) state: ReportedState,
    /// The progress note, the question, or the result.
    pub(crate) message: String,
}

impl HostArgs for StatusArgs {}

/// A state a worker reports with `set_status`. Inlined, with no description per case, so
/// that the model is shown a plain `enum` of strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
pub(crate) enum ReportedState {
    // Still working; the message is a progress note.
    Progress,
    // Asks for input; the message is the question.
    Waiting,
    // Finished; the message is the result.
    Done,
    // Could not finish; the message says why.
    Failed,
}

/// The host tool named `name`.
pub fn host_tool(name: &str) -> Option<&'static HostTool> {
    HOST_TOOLS.iter().find(|t| t.name == name)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::plugin::contract::RESERVED_TOOL_NAMES;

    #[test]
    fn every_host_tool_name_is_reserved_from_plugins() {
        for tool in HOST_TOOLS {
            assert!(RESERVED_TOOL_NAMES.contains(&tool.name), "{}", tool.name);
        }
        assert_eq!(RESERVED_TOOL_NAMES.len(), HOST_TOOLS.len());
    }

    #[test]
    fn the_schema_a_model_is_shown_is_the_one_derived_from_the_arguments() {
        let shown = |name: &str| host_tool(name).unwrap().def().parameters;
        assert_eq!(shown("reply"), schema_of::<ReplyArgs>());
        assert_eq!(shown("set_status"), schema_of::<StatusArgs>());
        assert_eq!(
            shown("route"),
            json!({
                "type": "object",
                "properties": {
                    "worker": { "type": "string", "description": "The worker's id, e.g. `worker:3`." },
                    "message": { "type": "string", "description": "The message for it." }
                },
                "required": ["worker", "message"],
                "additionalProperties": false,
                "description": "The arguments of `route`."
            })
        );
        // Plain shapes that every OpenAI-compatible server accepts: an inline enum, an
        // integer (not a nullable one), `properties` even when empty, no `$ref`.
        let status = shown("set_status");
        assert_eq!(
            status["properties"]["state"]["enum"],
            json!(["progress", "waiting", "done", "failed"]),
            "{status:#}"
        );
        let spawn = shown("spawn_worker");
        assert_eq!(spawn["required"], json!(["task"]), "{spawn:#}");
        assert_eq!(
            spawn["properties"]["task_number"]["type"], "integer",
            "{spawn:#}"
        );
        assert_eq!(shown("skip")["properties"], json!({}));
        for tool in HOST_TOOLS {
            let schema = tool.def().parameters.to_string();
            assert!(
                !schema.contains("$ref") && !schema.contains("$defs"),
                "{schema}"
            );
        }
    }

    #[test]
    fn every_host_tool_parses_what_its_schema_allows_and_names_what_it_refuses() {
        for tool in HOST_TOOLS {
            let schema = tool.def().parameters;
            let minimal: serde_json::Map<String, Value> = schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|field| {
                    let value = if field == "state" {
                        json!("done")
                    } else {
                        json!("x")
                    };
                    (field.to_owned(), value)
                })
                .collect();
            let call = HostCall::parse(tool.name, &Value::Object(minimal).to_string());
            assert!(matches!(call, Some(Ok(_))), "{}: {call:?}", tool.name);
        }
        for anything in ["", "null", "{\"reason\":\"done\"}", "{\"trunc"] {
            assert_eq!(
                HostCall::parse("skip", anything),
                Some(Ok(HostCall::Skip(SkipArgs {}))),
                "{anything}"
            );
        }
        assert_eq!(HostCall::parse("file_read", "{}"), None);
        let bad = HostCall::parse("set_status", r#"{"state":"asleep","message":"zz"}"#);
        let Some(Err(err)) = bad else {
            panic!("{bad:?}")
        };
        assert!(
            err.for_model()
                .starts_with("error[invalid-args]: set_status: unknown variant `asleep`"),
            "{err}"
        );
    }
}
