//! The host tools: they act on the orchestration (replies, delegation, status), so they
//! run in the trusted host rather than in a plugin. Profiles grant them by name like any
//! other tool; they declare no capability.
//!
//! Each tool is defined once, in the `host_tools!` list below: its name, its description,
//! its argument type and the process kinds that run it. The schema the model is shown is
//! derived from the argument type (`schemars`), the arguments are parsed into it, and a
//! call reaches its process as a typed [`HostCall`], so the four cannot drift apart.
//! Adding a host tool is one line here, its argument type, and its arm in the process
//! that runs it.

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::flow::{AnswerType, Question};
use crate::llm::ToolDef;
use crate::plugin::ToolError;
use crate::policy::ProcessKind;

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

/// Defines every host tool from one list:
/// `Variant(Args) = "name" for [kinds]: "description"`.
macro_rules! host_tools {
    ($( $(#[$doc:meta])* $variant:ident($args:ty) = $name:literal for [$($kind:ident),*]: $description:literal; )*) => {
        /// A host tool.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum HostTool {
            $( $(#[$doc])* $variant, )*
        }

        /// A call of a host tool, with its arguments parsed.
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub enum HostCall {
            $( $(#[$doc])* $variant($args), )*
        }

        impl HostTool {
            /// Every host tool, in the order a model is offered them.
            pub const ALL: &[HostTool] = &[ $( HostTool::$variant, )* ];

            /// The name profiles grant and the model calls.
            pub const fn name(self) -> &'static str {
                match self { $( HostTool::$variant => $name, )* }
            }

            /// What the model is told the tool does.
            pub const fn description(self) -> &'static str {
                match self { $( HostTool::$variant => $description, )* }
            }

            /// Whether a process of `kind` runs this tool.
            pub const fn is_run_by(self, kind: ProcessKind) -> bool {
                match self { $( HostTool::$variant => matches!(kind, $(ProcessKind::$kind)|*), )* }
            }

            fn schema(self) -> Value {
                match self { $( HostTool::$variant => schema_of::<$args>(), )* }
            }
        }

        impl HostCall {
            /// Parses a call of tool `name`: `None` if it is not a host tool, an error
            /// naming the tool and the field if the arguments do not fit.
            pub fn parse(name: &str, arguments: &str) -> Option<Result<HostCall, ToolError>> {
                match name {
                    $( $name => Some(<$args as HostArgs>::parse(name, arguments).map(HostCall::$variant)), )*
                    _ => None,
                }
            }

            /// The tool called.
            pub fn tool(&self) -> HostTool {
                match self { $( HostCall::$variant(_) => HostTool::$variant, )* }
            }
        }
    };
}

host_tools! {
    /// `reply`.
    Reply(ReplyArgs) = "reply" for [Channel, Cortex]:
        "Sends a message to the user and ends this turn.";
    /// `skip`.
    Skip(SkipArgs) = "skip" for [Channel, Cortex]: "Ends this turn without replying.";
    /// `spawn_worker`.
    SpawnWorker(SpawnArgs) = "spawn_worker" for [Channel, Cortex, Branch]:
        "Starts a worker on a task. It works with a fresh prompt, its own tools and the task \
         text only, and reports back when done.";
    /// `branch`.
    Branch(BranchArgs) = "branch" for [Channel, Cortex]:
        "Forks this conversation into a branch that thinks about a question with memory, \
         tasks and read-only files, and returns a conclusion.";
    /// `route`.
    Route(RouteArgs) = "route" for [Channel, Cortex]: "Sends a message to a running worker.";
    /// `cancel`.
    Cancel(CancelArgs) = "cancel" for [Channel, Cortex]: "Stops a running worker.";
    /// `set_status`.
    SetStatus(StatusArgs) = "set_status" for [Worker]:
        "Reports this worker's state: progress (keeps working), waiting (asks for input), \
         done or failed (ends the work, with the result).";
    /// `ask_about`.
    AskAbout(AskArgs) = "ask_about" for [Channel, Cortex, Branch, Worker]:
        "Asks a question about a result the host holds back as a handle ($h1, $h2, ...), \
         answered from its text alone by a model with no tools: a boolean, a number, one of \
         `choices`, or a short text the whole of which matches `pattern`. The answer carries \
         the handle's labels.";
}

impl HostTool {
    /// The host tool named `name`.
    ///
    /// ```
    /// use capstan_host::tools::HostTool;
    ///
    /// assert_eq!(HostTool::named("reply"), Some(HostTool::Reply));
    /// assert_eq!(HostTool::named("file_read"), None);
    /// ```
    pub fn named(name: &str) -> Option<HostTool> {
        HostTool::ALL
            .iter()
            .copied()
            .find(|tool| tool.name() == name)
    }

    /// The tool as offered to a model, its schema derived from its argument type.
    ///
    /// ```
    /// use capstan_host::tools::HostTool;
    ///
    /// let reply = HostTool::Reply.def();
    /// assert_eq!(reply.parameters["required"], serde_json::json!(["text"]));
    /// ```
    pub fn def(self) -> ToolDef {
        ToolDef {
            name: self.name().to_owned(),
            description: self.description().to_owned(),
            parameters: self.schema(),
        }
    }

    /// The host tools a process of `kind` runs, in the order a model is offered them.
    ///
    /// ```
    /// use capstan_host::policy::ProcessKind;
    /// use capstan_host::tools::HostTool;
    ///
    /// let worker: Vec<_> = HostTool::run_by(ProcessKind::Worker).collect();
    /// assert_eq!(worker, [HostTool::SetStatus, HostTool::AskAbout]);
    /// assert_eq!(HostTool::run_by(ProcessKind::Compactor).count(), 0);
    /// ```
    pub fn run_by(kind: ProcessKind) -> impl Iterator<Item = HostTool> {
        HostTool::ALL
            .iter()
            .copied()
            .filter(move |tool| tool.is_run_by(kind))
    }
}

impl HostTool {
    /// The names of the kinds that run this tool, in [`ProcessKind::ALL`]'s order.
    ///
    /// ```
    /// use capstan_host::tools::HostTool;
    ///
    /// assert_eq!(HostTool::SetStatus.kinds_running(), ["worker"]);
    /// ```
    pub fn kinds_running(self) -> Vec<&'static str> {
        ProcessKind::ALL
            .into_iter()
            .filter(|kind| self.is_run_by(*kind))
            .map(ProcessKind::as_str)
            .collect()
    }
}

impl std::fmt::Display for HostTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The arguments of `reply`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplyArgs {
    /// The message for the user.
    pub text: String,
}

impl HostArgs for ReplyArgs {}

/// The arguments of `skip`: none.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SkipArgs {}

impl HostArgs for SkipArgs {
    /// Whatever came with it: a model that means to skip is not sent back to fix its
    /// arguments.
    fn parse(_tool: &str, _arguments: &str) -> Result<Self, ToolError> {
        Ok(SkipArgs {})
    }
}

/// The arguments of `spawn_worker`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SpawnArgs {
    /// What to do, self-contained.
    pub task: String,
    /// Keep it open for follow-up input.
    #[serde(default)]
    pub interactive: bool,
    /// Assign it to this task on the board, so it may update it.
    #[serde(default)]
    #[schemars(with = "u64")]
    pub task_number: Option<u64>,
}

impl HostArgs for SpawnArgs {}

/// The arguments of `branch`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchArgs {
    /// The question to think about.
    pub question: String,
}

impl HostArgs for BranchArgs {}

/// The arguments of `route`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RouteArgs {
    /// The worker's id, e.g. `worker:3`.
    pub worker: String,
    /// The message for it.
    pub message: String,
}

impl HostArgs for RouteArgs {}

/// The arguments of `cancel`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CancelArgs {
    /// The worker's id, e.g. `worker:3`.
    pub worker: String,
}

impl HostArgs for CancelArgs {}

/// The arguments of `set_status`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusArgs {
    /// The worker's state.
    pub state: ReportedState,
    /// The progress note, the question, or the result.
    pub message: String,
}

impl HostArgs for StatusArgs {}

/// The arguments of `ask_about`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AskArgs {
    /// The handle asked about, e.g. `$h3`.
    pub handle: String,
    /// The question, about the handle's text alone.
    pub question: String,
    /// The type of the answer.
    pub answer: AnswerKind,
    /// For `choice`: the answers it may be, 1 to 32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    /// For `text`: a regular expression the whole answer must match (at most 200
    /// characters), e.g. `[A-Z]{2}[0-9]{2}[A-Z0-9]{10,30}`.
    #[serde(default)]
    pub pattern: Option<String>,
}

impl HostArgs for AskArgs {}

impl AskArgs {
    /// The question asked, with its answer's type checked, or what is wrong with it.
    pub fn question(&self) -> Result<Question, ToolError> {
        let invalid = |msg: String| ToolError::InvalidArgs(format!("ask_about: {msg}"));
        let answer = match (self.answer, &self.pattern) {
            (AnswerKind::Boolean, _) => AnswerType::Boolean,
            (AnswerKind::Number, _) => AnswerType::Number,
            (AnswerKind::Choice, _) => AnswerType::choice(self.choices.clone()).map_err(invalid)?,
            (AnswerKind::Text, Some(pattern)) => AnswerType::text(pattern).map_err(invalid)?,
            (AnswerKind::Text, None) => {
                return Err(invalid(
                    "a `text` answer needs a `pattern` the whole answer must match".into(),
                ));
            }
        };
        Ok(Question {
            text: self.question.clone(),
            answer,
        })
    }
}

/// The type of answer `ask_about` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
// Documented in comments, for the plain enum of strings (as `ReportedState`).
#[allow(missing_docs)]
pub enum AnswerKind {
    // true or false.
    Boolean,
    // A number.
    Number,
    // One of `choices`.
    Choice,
    // A short text matching `pattern`.
    Text,
}

/// A state a worker reports with `set_status`. Inlined, with no description per case, so
/// that the model is shown a plain `enum` of strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
#[schemars(inline)]
// The cases are documented in comments: a doc comment would give each a description in
// the schema, and the model a `oneOf` instead of the plain enum.
#[allow(missing_docs)]
pub enum ReportedState {
    // Still working; the message is a progress note.
    Progress,
    // Asks for input; the message is the question.
    Waiting,
    // Finished; the message is the result.
    Done,
    // Could not finish; the message says why.
    Failed,
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn each_kind_runs_the_host_tools_its_process_answers() {
        use ProcessKind::*;
        let names = |kind| {
            HostTool::run_by(kind)
                .map(HostTool::name)
                .collect::<Vec<_>>()
        };
        let conversation = [
            "reply",
            "skip",
            "spawn_worker",
            "branch",
            "route",
            "cancel",
            "ask_about",
        ];
        assert_eq!(names(Channel), conversation);
        assert_eq!(names(Cortex), conversation);
        assert_eq!(names(Branch), ["spawn_worker", "ask_about"]);
        assert_eq!(names(Worker), ["set_status", "ask_about"]);
        assert!(names(Compactor).is_empty());
        for tool in HostTool::ALL {
            assert_eq!(HostTool::named(tool.name()), Some(*tool));
        }
    }

    #[test]
    fn the_schema_a_model_is_shown_is_the_one_derived_from_the_arguments() {
        let shown = |name: &str| HostTool::named(name).unwrap().def().parameters;
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
        for tool in HostTool::ALL {
            let schema = tool.def().parameters.to_string();
            assert!(
                !schema.contains("$ref") && !schema.contains("$defs"),
                "{schema}"
            );
        }
    }

    #[test]
    fn every_host_tool_parses_what_its_schema_allows_and_names_what_it_refuses() {
        for tool in HostTool::ALL {
            let schema = tool.def().parameters;
            let minimal: serde_json::Map<String, Value> = schema["required"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(|field| {
                    let value = match field {
                        "state" => json!("done"),
                        "answer" => json!("boolean"),
                        _ => json!("x"),
                    };
                    (field.to_owned(), value)
                })
                .collect();
            let call = HostCall::parse(tool.name(), &Value::Object(minimal).to_string());
            assert!(matches!(call, Some(Ok(_))), "{}: {call:?}", tool.name());
        }
        for anything in ["", "null", "{\"reason\":\"done\"}", "{\"trunc"] {
            assert_eq!(
                HostCall::parse("skip", anything),
                Some(Ok(HostCall::Skip(SkipArgs {}))),
                "{anything}"
            );
        }
        assert_eq!(HostCall::parse("file_read", "{}"), None);
        // What the schema shows (`additionalProperties: false`) is what parsing holds to.
        let extra = HostCall::parse("reply", r#"{"text":"hi","tone":"loud"}"#);
        let Some(Err(err)) = extra else {
            panic!("{extra:?}")
        };
        assert!(err.for_model().contains("unknown field `tone`"), "{err}");
        let Some(Ok(HostCall::AskAbout(ask))) = HostCall::parse(
            "ask_about",
            r#"{"handle":"$h1","question":"q","answer":"text"}"#,
        ) else {
            panic!("a text question parses; its pattern is checked when asked")
        };
        let err = ask.question().unwrap_err().for_model();
        assert!(err.contains("needs a `pattern`"), "{err}");
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
