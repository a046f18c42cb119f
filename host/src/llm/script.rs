//! The script file the scripted provider plays: a list of steps, each answering one kind
//! of process when the incoming message matches.
//!
//! ```toml
//! [[step]]
//! process = "channel"            # the process kind this step answers
//! when = "open items"            # optional: only if the incoming message contains this
//! reply = "I'll put a worker on it."
//!
//! [[step.tool_calls]]
//! name = "spawn_worker"
//! arguments = { task = "Gather the open items from notes/" }
//!
//! [[step]]
//! process = "worker"
//! tool_calls = [{ name = "file_list", arguments_raw = "{not json" }]  # verbatim, even broken
//! ```

use serde::{Deserialize, Serialize};

use super::ProviderError;

/// A parsed script.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The steps, in the order they are tried.
    #[serde(default, rename = "step")]
    pub steps: Vec<ScriptStep>,
}

/// One scripted model answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptStep {
    /// The process kind it answers: channel, branch, worker, compactor or cortex; or
    /// `question`, a quarantined question about a held result.
    pub process: String,
    /// Answer only when the incoming message (the last one of the request) contains this
    /// text, compared case-insensitively. Unset: any message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// The assistant's text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
    /// The tool calls the assistant makes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ScriptToolCall>,
    /// Wait this long before answering, to make races reproducible.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub delay_ms: u64,
    /// Answer every matching request, instead of only the first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repeat: bool,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A scripted tool call: `arguments` as a table, or `arguments_raw` as the exact text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptToolCall {
    /// The tool's name.
    pub name: String,
    /// The arguments object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<serde_json::Map<String, serde_json::Value>>,
    /// The arguments text, verbatim (wins over `arguments`; may be invalid JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_raw: Option<String>,
}

impl ScriptToolCall {
    /// The arguments text the model "wrote".
    pub fn arguments_text(&self) -> String {
        match (&self.arguments_raw, &self.arguments) {
            (Some(raw), _) => raw.clone(),
            (None, Some(map)) => serde_json::Value::Object(map.clone()).to_string(),
            (None, None) => "{}".to_owned(),
        }
    }
}

impl Script {
    /// Parses script text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ProviderError> {
        let de = toml::Deserializer::parse(text).map_err(|err| {
            ProviderError::Script(format!(
                "{origin}: {}",
                crate::text::toml_error_message(text, &err)
            ))
        })?;
        let script: Script = serde_path_to_error::deserialize(de).map_err(|err| {
            let key = err.path().to_string();
            ProviderError::Script(format!("{origin}: `{key}`: {}", err.into_inner().message()))
        })?;
        for (i, step) in script.steps.iter().enumerate() {
            // `question`: a quarantined question about a held result (`ask_about`).
            const KINDS: [&str; 6] = [
                "channel",
                "branch",
                "worker",
                "compactor",
                "cortex",
                "question",
            ];
            if !KINDS.contains(&step.process.as_str()) {
                return Err(ProviderError::Script(format!(
                    "{origin}: `step[{i}].process`: unknown process kind `{}`; expected one of {}",
                    step.process,
                    KINDS.join(", ")
                )));
            }
        }
        Ok(script)
    }

    /// Reads and parses a script file.
    pub fn load(path: &std::path::Path) -> Result<Self, ProviderError> {
        let text = crate::text::read_text(path)
            .map_err(|err| ProviderError::Script(format!("the script {err}")))?;
        Script::parse(&text, &path.display().to_string())
    }

    /// The script as TOML text.
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a script always serializes")
    }
}
