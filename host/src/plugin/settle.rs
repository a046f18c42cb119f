//! Settling a tool name that several plugins declare: never by file-name order.
//!
//! A directory is loaded whole before any tool is offered. A name declared by one plugin
//! is that plugin's. A name declared by several is settled by [`Preferences`] (the config's
//! `[plugins] prefer` table): the preferred plugin provides it and the others' tool of that
//! name is not offered. Without a preference every plugin declaring it is refused, naming
//! the other files and the key that settles it, so a third-party `aaa.wasm` can never
//! shadow the first-party `files.wasm` by sorting first.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use super::error::{LoadError, PREFER_KEY};
use super::loaded::LoadedPlugin;

/// Which plugin provides a tool name that more than one plugin declares: tool name to
/// plugin name (the file name without `.wasm`).
///
/// ```
/// use capstan_host::plugin::Preferences;
///
/// let prefer: Preferences = [("file_read", "files")].into_iter().collect();
/// assert_eq!(prefer.plugin_for("file_read"), Some("files"));
/// assert_eq!(prefer.plugin_for("file_write"), None);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preferences {
    by_tool: BTreeMap<String, String>,
}

impl Preferences {
    /// No preferences: every duplicate tool name is an error.
    pub fn new() -> Self {
        Preferences::default()
    }

    /// The plugin that provides `tool` when several declare it, if the config names one.
    pub fn plugin_for(&self, tool: &str) -> Option<&str> {
        self.by_tool.get(tool).map(String::as_str)
    }

    /// Every `(tool, plugin)` pair, by tool name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.by_tool.iter().map(|(t, p)| (t.as_str(), p.as_str()))
    }
}

impl<T: Into<String>, P: Into<String>> FromIterator<(T, P)> for Preferences {
    fn from_iter<I: IntoIterator<Item = (T, P)>>(pairs: I) -> Self {
        Preferences {
            by_tool: pairs
                .into_iter()
                .map(|(t, p)| (t.into(), p.into()))
                .collect(),
        }
    }
}

/// A tool a plugin declares but does not provide, because the config prefers another
/// plugin for that name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{}: tool `{tool}` is not offered from this plugin: {} provides it (`{PREFER_KEY}.{tool} = \"{winner_name}\"`)",
    plugin.display(),
    winner.display()
)]
pub struct Shadowed {
    /// The tool name.
    pub tool: String,
    /// The plugin whose tool is not offered.
    pub plugin: PathBuf,
    /// The plugin that provides it.
    pub winner: PathBuf,
    /// The winner's plugin name, as the config names it.
    pub winner_name: String,
}

/// What settling a directory's plugins gives: the plugins to offer (each tool name in
/// exactly one), the plugins refused, and the tools not offered.
pub(crate) struct Settled {
    pub(crate) accepted: Vec<LoadedPlugin>,
    pub(crate) refused: Vec<LoadError>,
    pub(crate) shadowed: Vec<Shadowed>,
}

/// Settles every tool name declared by more than one of `plugins`, whatever their order.
pub(crate) fn settle(plugins: Vec<LoadedPlugin>, prefer: &Preferences) -> Settled {
    let mut declarers: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (index, plugin) in plugins.iter().enumerate() {
        for tool in plugin.tools() {
            declarers.entry(&tool.name).or_default().push(index);
        }
    }
    let mut refused: BTreeMap<usize, LoadError> = BTreeMap::new();
    // (plugin index, tool name) pairs not offered, with the winner's index.
    let mut hidden: Vec<(usize, String, usize)> = Vec::new();
    for (tool, indexes) in declarers.iter().filter(|(_, i)| i.len() > 1) {
        let preferred = prefer.plugin_for(tool);
        let winner =
            preferred.and_then(|name| indexes.iter().copied().find(|&i| &*plugins[i].name == name));
        match winner {
            Some(winner) => {
                for &loser in indexes.iter().filter(|&&i| i != winner) {
                    hidden.push((loser, (*tool).to_owned(), winner));
                }
            }
            None => {
                for &index in indexes {
                    refused
                        .entry(index)
                        .or_insert_with(|| LoadError::DuplicateTool {
                            path: plugins[index].path.clone(),
                            tool: (*tool).to_owned(),
                            others: indexes
                                .iter()
                                .filter(|&&i| i != index)
                                .map(|&i| plugins[i].path.clone())
                                .collect(),
                            choices: indexes
                                .iter()
                                .map(|&i| plugins[i].name.to_string())
                                .collect(),
                            preferred: preferred.map(str::to_owned),
                        });
                }
            }
        }
    }
    let mut shadowed = Vec::new();
    let mut drop_tools: BTreeMap<usize, BTreeSet<String>> = BTreeMap::new();
    for (loser, tool, winner) in hidden {
        if refused.contains_key(&loser) {
            continue;
        }
        shadowed.push(Shadowed {
            tool: tool.clone(),
            plugin: plugins[loser].path.clone(),
            winner: plugins[winner].path.clone(),
            winner_name: plugins[winner].name.to_string(),
        });
        drop_tools.entry(loser).or_default().insert(tool);
    }
    let mut accepted = Vec::new();
    for (index, mut plugin) in plugins.into_iter().enumerate() {
        if refused.contains_key(&index) {
            continue;
        }
        if let Some(names) = drop_tools.get(&index) {
            // Pinned as declared: `capstan.lock` names every tool the component offers,
            // offered here or not.
            let _ = plugin.pin();
            plugin.tools.retain(|tool| !names.contains(&tool.name));
        }
        accepted.push(plugin);
    }
    Settled {
        accepted,
        refused: refused.into_values().collect(),
        shadowed,
    }
}
