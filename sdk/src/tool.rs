//! Tools and the toolbox a plugin exports.

use capstan_caps::{Capability, Effect};
use schemars::JsonSchema;
use serde::de::DeserializeOwned;

use crate::{Context, IntoOutput, ToolError};

type Handler = Box<dyn Fn(&str, &Context) -> Result<String, ToolError>>;

/// One tool: a name, a description for the model, the capabilities it needs, and a handler
/// that takes typed arguments.
///
/// The arguments type gives both the JSON Schema the host shows the model (derived with
/// [`schemars`]) and the parser for each call (with [`serde`]): the two cannot drift apart.
/// Arguments that do not parse become [`ToolError::InvalidArgs`] naming the field.
pub struct Tool {
    pub(crate) name: String,
    pub(crate) description: String,
    pub(crate) capabilities: Vec<Capability>,
    pub(crate) effect: Option<Effect>,
    pub(crate) schema: fn() -> String,
    pub(crate) handler: Handler,
}

impl Tool {
    /// A tool named `name` whose calls go to `handler`.
    ///
    /// `name` must be lowercase letters, digits and `_`, unique across the plugins a host
    /// loads (the host refuses a plugin that breaks this, naming both files).
    pub fn new<A, O, F>(name: &str, description: &str, handler: F) -> Self
    where
        A: DeserializeOwned + JsonSchema,
        O: IntoOutput,
        F: Fn(A, &Context) -> Result<O, ToolError> + 'static,
    {
        let tool_name = name.to_owned();
        Tool {
            name: name.to_owned(),
            description: description.to_owned(),
            capabilities: Vec::new(),
            effect: None,
            schema: schema_of::<A>,
            handler: Box::new(move |args_json, ctx| {
                let args = parse_args::<A>(&tool_name, args_json)?;
                handler(args, ctx)?.into_output()
            }),
        }
    }

    /// Declares that the tool needs `capability`. Without it, the call's sandbox lacks the
    /// matching resource (no preopen without `fs.read`, for instance), and a caller that does
    /// not grant it is refused before the tool runs.
    pub fn needs(mut self, capability: Capability) -> Self {
        if !self.capabilities.contains(&capability) {
            self.capabilities.push(capability);
        }
        self
    }

    /// Declares what a call of the tool does: [`Effect::Send`] for a tool that reaches a
    /// person or a program outside the host (a message, a payment, a post), so the host's
    /// data-flow rules park it for approval when the process calling it has read untrusted
    /// data. The host takes the higher of this and what the capabilities imply (`fs.write`
    /// writes locally; a `net:` rule for a method other than GET or HEAD sends), so a
    /// declaration can only raise the effect.
    ///
    /// ```
    /// use capstan_sdk::{Effect, Tool};
    ///
    /// let tool = Tool::new("notify", "Sends a message.", |_: serde_json::Value, _| Ok("sent"))
    ///     .effect(Effect::Send);
    /// # let _ = tool;
    /// ```
    pub fn effect(mut self, effect: Effect) -> Self {
        self.effect = Some(effect);
        self
    }
}

fn schema_of<A: JsonSchema>() -> String {
    serde_json::to_string(&schemars::schema_for!(A)).expect("a JSON Schema always serializes")
}

/// Parses a call's arguments, naming the field that failed.
fn parse_args<A: DeserializeOwned>(tool: &str, args_json: &str) -> Result<A, ToolError> {
    let mut de = serde_json::Deserializer::from_str(args_json);
    let parsed: Result<A, _> = serde_path_to_error::deserialize(&mut de);
    let args = parsed.map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let at = if path == "." {
            String::new()
        } else {
            format!(" at `{path}`")
        };
        ToolError::InvalidArgs(format!("{tool}: arguments{at}: {inner}"))
    })?;
    de.end()
        .map_err(|err| ToolError::InvalidArgs(format!("{tool}: arguments: {err}")))?;
    Ok(args)
}

/// The tools a plugin exports, in order.
///
/// ```
/// use capstan_sdk::{Context, Toolbox, Tool, ToolError};
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// #[derive(Deserialize, JsonSchema)]
/// struct Args { text: String }
///
/// fn shout(args: Args, _: &Context) -> Result<String, ToolError> {
///     Ok(args.text.to_uppercase())
/// }
///
/// let tools = Toolbox::new().tool(Tool::new("shout", "Upper-cases text.", shout));
/// assert_eq!(tools.names().collect::<Vec<_>>(), ["shout"]);
/// ```
#[derive(Default)]
pub struct Toolbox {
    tools: Vec<Tool>,
}

impl Toolbox {
    /// An empty toolbox.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `tool`.
    pub fn tool(mut self, tool: Tool) -> Self {
        self.tools.push(tool);
        self
    }

    /// The tools' names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|t| t.name.as_str())
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter()
    }

    /// Runs tool `name`; used by [`export_plugin!`](crate::export_plugin) and handy in
    /// native unit tests of a plugin's handlers.
    pub fn call(&self, name: &str, args_json: &str, ctx: &Context) -> Result<String, ToolError> {
        let tool = self.tools.iter().find(|t| t.name == name).ok_or_else(|| {
            let known: Vec<_> = self.names().collect();
            ToolError::NotFound(format!(
                "this plugin has no tool `{name}`; it has {}",
                known.join(", ")
            ))
        })?;
        let _running = crate::context::enter(ctx);
        (tool.handler)(args_json, ctx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Args {
        path: String,
        #[serde(default)]
        limit: Option<u64>,
    }

    #[test]
    fn bad_arguments_name_the_field() {
        let err = parse_args::<Args>("file_read", r#"{"path": "a", "limit": "ten"}"#)
            .err()
            .unwrap();
        let ToolError::InvalidArgs(msg) = err else {
            panic!("{err:?}")
        };
        assert!(
            msg.contains("`limit`") && msg.contains("file_read"),
            "{msg}"
        );

        let err = parse_args::<Args>("file_read", r#"{"limit": 1}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("missing field `path`"), "{err}");

        let err = parse_args::<Args>("file_read", r#"{"path": "a", "mode": 1}"#)
            .err()
            .unwrap();
        assert!(err.to_string().contains("unknown field `mode`"), "{err}");

        let err = parse_args::<Args>("file_read", r#"{"path": "#)
            .err()
            .unwrap();
        assert!(matches!(err, ToolError::InvalidArgs(_)), "{err:?}");
    }

    #[test]
    fn the_schema_describes_the_arguments() {
        let schema: serde_json::Value = serde_json::from_str(&schema_of::<Args>()).unwrap();
        assert_eq!(schema["required"], serde_json::json!(["path"]));
        assert!(schema["properties"]["limit"].is_object(), "{schema}");
    }
}
