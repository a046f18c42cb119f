//! An external server's tools as the host sees them: checked as a plugin's are when listed
//! (names, descriptions, schemas, how many), and their results read back as text.

use std::collections::BTreeMap;

use capstan_caps::Effect;
use rmcp::model::{CallToolResult, InputRequiredResult, Tool};

use crate::plugin::{
    MAX_TOOLS_PER_PLUGIN, ToolError, ToolInfo, check_description, parse_args_schema,
};

/// The longest tool name, namespace included, a model's tool list accepts.
pub(super) const MAX_NAMESPACED_NAME: usize = 64;
/// The most tools one server may offer, as one plugin may.
pub(super) const MAX_TOOLS_PER_SERVER: usize = MAX_TOOLS_PER_PLUGIN;
/// The most pages of a tool list read: a server paginating without end stops here.
pub(super) const MAX_LIST_PAGES: usize = 16;

/// `tool` of `server`, named `SERVER.tool`, with the checks a plugin's tools pass: the
/// name a model accepts, a description of text, a valid JSON Schema of an object. Its
/// effect is the operator's (`effects`, by the tool's own name) if given, else what the
/// server's `readOnlyHint` says. `Err` says why it is left out.
pub(super) fn tool_info(
    server: &str,
    tool: &Tool,
    effects: &BTreeMap<String, Effect>,
) -> Result<ToolInfo, String> {
    let name = format!("{server}.{}", tool.name);
    let shown = crate::text::echo_name(&name, MAX_NAMESPACED_NAME);
    let left_out = |why: String| format!("tool `{shown}` is left out: {why}");
    if name.len() > MAX_NAMESPACED_NAME {
        return Err(left_out(format!(
            "its name is over {MAX_NAMESPACED_NAME} bytes, which models refuse"
        )));
    }
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if tool.name.is_empty() || !tool.name.chars().all(plain) {
        return Err(left_out(
            "a tool name a model accepts has only letters, digits, `_` and `-`".into(),
        ));
    }
    let description = tool.description.as_deref().unwrap_or_default();
    check_description(description).map_err(left_out)?;
    let schema = serde_json::Value::Object((*tool.input_schema).clone()).to_string();
    let args_schema = parse_args_schema(&schema).map_err(left_out)?;
    // The MCP default for a tool without `readOnlyHint` is one that may change the world.
    let read_only = tool
        .annotations
        .as_ref()
        .and_then(|a| a.read_only_hint)
        .unwrap_or(false);
    let hinted = if read_only {
        Effect::Read
    } else {
        Effect::Send
    };
    let effect = effects.get(tool.name.as_ref()).copied().unwrap_or(hinted);
    Ok(ToolInfo {
        name,
        description: description.to_owned(),
        args_schema,
        capabilities: Vec::new(),
        effect: Some(effect),
    })
}

/// A tool's result as the model reads it: its text, or an error with the server's text.
pub(super) fn outcome(result: CallToolResult) -> Result<String, ToolError> {
    let mut text = String::new();
    for block in &result.content {
        if !text.is_empty() {
            text.push('\n');
        }
        match block.as_text() {
            Some(part) => text.push_str(&part.text),
            None => text.push_str(&serde_json::to_string(block).unwrap_or_default()),
        }
    }
    if text.is_empty()
        && let Some(structured) = &result.structured_content
    {
        text = structured.to_string();
    }
    if result.is_error == Some(true) {
        Err(ToolError::Failed(text))
    } else {
        Ok(text)
    }
}

/// The most of a result's input requests an error names, the rest counted.
const MAX_NAMED_ASKS: usize = 5;

/// The error for a call of `server`'s `tool` answered with a result that asks for input
/// (2026-07-28's `input_required`: a form for a person, a model completion, the client's
/// roots): the host answers none, so the call ends, saying what was asked. The server's
/// words are quoted whole, on one line: the registry redacts the error and then caps it,
/// so a secret is never cut where the redactor would miss it.
pub(super) fn asked_for_input(server: &str, tool: &str, asked: &InputRequiredResult) -> ToolError {
    let requests: Vec<_> = asked.input_requests.iter().flatten().collect();
    let mut asks: Vec<String> = requests
        .iter()
        .take(MAX_NAMED_ASKS)
        .map(|(_, request)| {
            let request = serde_json::to_value(request).unwrap_or_default();
            let method = request["method"].as_str().unwrap_or("an unknown request");
            match request["params"]["message"].as_str() {
                Some(message) => format!("{method}: \"{}\"", crate::text::one_line(message)),
                None => method.to_owned(),
            }
        })
        .collect();
    if requests.len() > MAX_NAMED_ASKS {
        asks.push(format!("and {} more", requests.len() - MAX_NAMED_ASKS));
    }
    let asks = if asks.is_empty() {
        "a later round".to_owned()
    } else {
        asks.join("; ")
    };
    ToolError::Failed(format!(
        "MCP tool `{server}.{tool}` asked for input before it answers ({asks}); the host \
         answers no server's request for a person, a model or the client's files, so the \
         call ends here"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str, schema: serde_json::Value) -> Tool {
        let serde_json::Value::Object(schema) = schema else {
            panic!("an object")
        };
        Tool::new(name.to_owned(), description.to_owned(), schema)
    }

    #[test]
    fn a_server_s_tools_pass_a_plugin_s_checks() {
        let object = serde_json::json!({"type": "object"});
        assert_eq!(
            tool_info(
                "notes",
                &tool("search", "Finds notes.", object.clone()),
                &BTreeMap::new()
            )
            .unwrap()
            .name,
            "notes.search"
        );
        for (name, description, schema, why) in [
            ("", "x", object.clone(), "only letters"),
            ("a.b", "x", object.clone(), "only letters"),
            ("s", "bell \u{7}", object.clone(), "control character"),
            ("s", "x", serde_json::json!({"type": "string"}), "must be"),
            ("s", &"x".repeat(5000), object.clone(), "over the limit"),
        ] {
            let err =
                tool_info("notes", &tool(name, description, schema), &BTreeMap::new()).unwrap_err();
            assert!(err.contains("is left out") && err.contains(why), "{err}");
        }
    }

    #[test]
    fn the_operator_s_word_on_a_tool_s_effect_replaces_the_server_s_hint() {
        let object = serde_json::json!({"type": "object"});
        let mut marked = tool("lookup", "Looks up.", object.clone());
        marked.annotations = Some(rmcp::model::ToolAnnotations::new().read_only(true));
        let plain = tool("search", "Finds.", object);
        let none = BTreeMap::new();
        let effect = |tool: &Tool, effects: &BTreeMap<String, Effect>| {
            tool_info("notes", tool, effects).unwrap().effect
        };
        // The server's word: read-only when it says so, else a send.
        assert_eq!(effect(&marked, &none), Some(Effect::Read));
        assert_eq!(effect(&plain, &none), Some(Effect::Send));
        // The operator's, either way, by the tool's own name.
        let operator: BTreeMap<String, Effect> = [
            ("lookup".to_owned(), Effect::Send),
            ("search".to_owned(), Effect::Read),
        ]
        .into();
        assert_eq!(effect(&marked, &operator), Some(Effect::Send));
        assert_eq!(effect(&plain, &operator), Some(Effect::Read));
    }
}
