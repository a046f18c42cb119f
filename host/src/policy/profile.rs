//! A profile: the tools one process kind is offered and the capabilities it is granted.

use std::borrow::Cow;
use std::collections::BTreeMap;

use capstan_caps::Capability;

use super::{Grants, ToolGrants};
use crate::flow::{FlowRules, Holding};

/// The tools a process kind may be offered (names or globs such as `file_*`) and the
/// capabilities it holds.
///
/// ```
/// use capstan_host::policy::Profile;
///
/// let worker = Profile::new(["file_*", "task_create"], "fs.read,tasks.write-own".parse().unwrap()).unwrap();
/// assert!(worker.names_tool("file_write"));
/// assert!(!worker.names_tool("memory_recall"));
/// ```
#[derive(Debug, Clone)]
pub struct Profile {
    tools: Vec<ToolPattern>,
    grants: Grants,
    /// `[profiles.KIND.tool.NAME]`: narrower network and secret grants for one tool.
    per_tool: BTreeMap<String, ToolGrants>,
    /// `[profiles.KIND.flow]`: what data may drive its calls.
    flow: FlowRules,
    /// `[profiles.KIND.handles]`: which tool results are held back as handles.
    holding: Holding,
}

#[derive(Debug, Clone)]
struct ToolPattern {
    text: String,
    pattern: glob::Pattern,
}

impl Profile {
    /// A profile offering the tools matching `tools` with `grants`. Fails on a bad glob,
    /// naming it and showing the valid syntax.
    pub fn new<S: AsRef<str>>(
        tools: impl IntoIterator<Item = S>,
        grants: Grants,
    ) -> Result<Self, String> {
        let tools = tools
            .into_iter()
            .map(|text| {
                let text = text.as_ref();
                glob::Pattern::new(text)
                    .map(|pattern| ToolPattern {
                        text: text.to_owned(),
                        pattern,
                    })
                    .map_err(|err| {
                        format!(
                            "bad tool pattern `{text}`: {err}; a pattern is a tool name or a \
                             glob: `*` matches any characters, `?` one character, `[abc]` \
                             one of a set and `[!abc]` any other (e.g. \"file_*\", \
                             \"task_[cl]*\")"
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Profile {
            tools,
            grants,
            per_tool: BTreeMap::new(),
            flow: FlowRules::default(),
            holding: Holding::default(),
        })
    }

    /// Narrows the network and secret grants of tool `name` to `grants`, within the
    /// profile's own.
    pub fn with_tool_grants(mut self, name: impl Into<String>, grants: ToolGrants) -> Self {
        self.per_tool.insert(name.into(), grants);
        self
    }

    /// Sets what data may drive its calls.
    pub fn with_flow(mut self, flow: FlowRules) -> Self {
        self.flow = flow;
        self
    }

    /// Holds back the tool results `holding` says as handles.
    pub fn with_holding(mut self, holding: Holding) -> Self {
        self.holding = holding;
        self
    }

    /// Which tool results it holds back as handles (`[profiles.KIND.handles]`).
    pub fn holding(&self) -> &Holding {
        &self.holding
    }

    /// What data may drive its calls (`[profiles.KIND.flow]`).
    pub fn flow(&self) -> &FlowRules {
        &self.flow
    }

    /// The narrower grants of each tool that has some.
    pub fn tool_grants(&self) -> &BTreeMap<String, ToolGrants> {
        &self.per_tool
    }

    /// What a call of tool `name` holds: the profile's grants, narrowed by the tool's own
    /// if it has some.
    pub fn grants_for(&self, name: &str) -> Cow<'_, Grants> {
        match self.per_tool.get(name) {
            Some(narrow) => Cow::Owned(self.grants.narrowed(narrow)),
            None => Cow::Borrowed(&self.grants),
        }
    }

    /// Whether a tool name matches one of the profile's names or globs. A tool of an MCP
    /// server (`NAME.tool`) is matched only by a pattern that has a `.` too (`NAME.*`,
    /// `*.search`): `*` alone, as the cortex's, never grants a server nobody named.
    pub fn names_tool(&self, tool: &str) -> bool {
        let namespaced = tool.contains('.');
        self.tools
            .iter()
            .any(|t| (!namespaced || t.text.contains('.')) && t.pattern.matches(tool))
    }

    /// Whether some pattern of the profile could name a tool of the MCP server `server`
    /// (`server.*`, `*.search`, `n*.x`): the part of a dotted pattern before its first
    /// `.` matches the server's name. A pattern that is not a glob counts as naming it.
    pub fn names_namespace(&self, server: &str) -> bool {
        self.tools.iter().any(|t| {
            t.text.split_once('.').is_some_and(|(prefix, _)| {
                glob::Pattern::new(prefix).map_or(true, |p| p.matches(server))
            })
        })
    }

    /// The tool names and globs, as written.
    pub fn tool_patterns(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|t| t.text.as_str())
    }

    /// The capabilities the profile grants.
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// The first capability tool `name`, which declares `needs`, is not granted, if any.
    pub fn missing(&self, name: &str, needs: &[Capability]) -> Option<Capability> {
        self.grants_for(name)
            .effective(name, needs)
            .err()
            .map(|denial| denial.missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_s_tools_are_named_only_by_patterns_with_a_dot() {
        let everything = Profile::new(["*"], Grants::none()).unwrap();
        assert!(everything.names_tool("file_read"));
        assert!(!everything.names_tool("notes.search"));
        let notes = Profile::new(["notes.*", "file_read"], Grants::none()).unwrap();
        assert!(notes.names_tool("notes.search"));
        assert!(!notes.names_tool("other.search"));
        let exact = Profile::new(["notes.search"], Grants::none()).unwrap();
        assert!(exact.names_tool("notes.search") && !exact.names_tool("notes.write"));
        assert!(
            Profile::new(["*.*"], Grants::none())
                .unwrap()
                .names_tool("a.b")
        );
    }

    #[test]
    fn a_server_is_reachable_only_by_a_dotted_pattern_whose_prefix_matches_it() {
        let names = |patterns: &[&str], server: &str| {
            Profile::new(patterns.iter().copied(), Grants::none())
                .unwrap()
                .names_namespace(server)
        };
        assert!(names(&["notes.*"], "notes"));
        assert!(names(&["*.search"], "notes"));
        assert!(names(&["n*.x"], "notes"));
        assert!(!names(&["*", "file_read", "n*"], "notes"));
        assert!(!names(&["other.*"], "notes"));
    }
}
