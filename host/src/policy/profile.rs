//! A profile: the tools one process kind is offered and the capabilities it is granted.

use capstan_caps::Capability;

use super::Grants;

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
        Ok(Profile { tools, grants })
    }

    /// Whether a tool name matches one of the profile's names or globs.
    pub fn names_tool(&self, tool: &str) -> bool {
        self.tools.iter().any(|t| t.pattern.matches(tool))
    }

    /// The tool names and globs, as written.
    pub fn tool_patterns(&self) -> impl Iterator<Item = &str> {
        self.tools.iter().map(|t| t.text.as_str())
    }

    /// The capabilities the profile grants.
    pub fn grants(&self) -> &Grants {
        &self.grants
    }

    /// The first of `needs` this profile does not grant, if any.
    pub fn missing(&self, needs: &[Capability]) -> Option<Capability> {
        needs.iter().find(|cap| !self.grants.allows(cap)).cloned()
    }
}
