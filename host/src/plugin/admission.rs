//! Admission: what the host's lock lets in of a loaded plugin or an external source's
//! tools, and the refusals that say what changed and how to accept it. The
//! [`Registry`](super::Registry) admits through here and nowhere else.

use super::error::LoadError;
use super::external::ExternalTools;
use super::loaded::{LoadedPlugin, ToolInfo};
use super::trust::{Change, Pins};

/// `plugin`, if `pins` let it in as it is.
pub(super) fn admit_plugin(pins: &Pins, plugin: LoadedPlugin) -> Result<LoadedPlugin, LoadError> {
    match pins.check_plugin(plugin.name(), plugin.pin()) {
        Ok(()) => Ok(plugin),
        Err(changes) => Err(LoadError::Unpinned {
            path: plugin.path().to_owned(),
            plugin: plugin.name().to_owned(),
            lock: pins.path().to_owned(),
            changes,
        }),
    }
}

/// The tools of `source` (each the source's own name and the tool) that `pins` let in,
/// and a line for each refusal: the whole source, or one tool, with what changed.
pub(super) fn admit_tools(
    pins: &Pins,
    source: &dyn ExternalTools,
    tools: Vec<(String, ToolInfo)>,
) -> (Vec<(String, ToolInfo)>, Vec<String>) {
    let server = source.name();
    let lock = pins.path().display();
    let accept = format!("`capstan plugins accept {server}` offers it");
    if let Err(changes) = pins.check_server(server, &source.identity()) {
        if tools.is_empty() {
            return (tools, Vec::new());
        }
        let why = match changes.iter().next() {
            Some(Change::NoLockFile) => format!(
                "MCP server `{server}`: none of its tools is offered: there is no {lock}, and \
                 the config requires one (plugins.require_lock); `capstan plugins lock` \
                 writes it"
            ),
            Some(Change::NotLocked) => format!(
                "MCP server `{server}` is not in {lock}: none of its {} tools is offered; \
                 {accept}",
                tools.len()
            ),
            _ => format!(
                "MCP server `{server}`: none of its tools is offered: {changes} since {lock} \
                 was written; {accept}"
            ),
        };
        return (Vec::new(), vec![why]);
    }
    let mut refused = Vec::new();
    let admitted = tools
        .into_iter()
        .filter(
            |(remote, info)| match pins.check_tool(server, remote, &info.pin()) {
                Ok(()) => true,
                Err(changes) => {
                    refused.push(format!(
                    "MCP tool `{}` is not offered: {changes} since {lock} was written; {accept}",
                    info.name
                ));
                    false
                }
            },
        )
        .collect();
    (admitted, refused)
}
