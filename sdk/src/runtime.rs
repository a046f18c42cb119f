//! Glue between the exported WIT interface and a [`Toolbox`]; used by
//! [`export_plugin!`](crate::export_plugin).

use crate::bindings::capstan::plugin::types::CallContext;
use crate::bindings::exports::capstan::plugin::tool::{ToolError as WitToolError, ToolSpec};
use crate::{Context, Effect, Toolbox};

/// Answers `describe()`.
pub fn describe(tools: &Toolbox) -> Vec<ToolSpec> {
    tools
        .iter()
        .map(|t| ToolSpec {
            name: t.name.clone(),
            description: t.description.clone(),
            args_schema: (t.schema)(),
            // The effect travels as an entry of the list, so the contract's record is unchanged.
            capabilities: t
                .capabilities
                .iter()
                .map(|c| c.to_string())
                .chain(t.effect.map(Effect::declaration))
                .collect(),
        })
        .collect()
}

/// Answers `call()`.
pub fn call(
    tools: &Toolbox,
    name: String,
    args_json: String,
    context: CallContext,
) -> Result<String, WitToolError> {
    let ctx = Context::from_wit(context);
    tools.call(&name, &args_json, &ctx).map_err(Into::into)
}
