//! The decision for one (process kind, tool) pair, and the whole matrix.

use std::collections::BTreeMap;
use std::fmt;

use capstan_caps::Capability;

use super::{ProcessKind, Profile, ReuseRules};

/// A tool as policy sees it: a name and what it needs.
#[derive(Debug, Clone, Copy)]
pub struct ToolNeeds<'a> {
    /// The tool's name.
    pub name: &'a str,
    /// The capabilities it declares.
    pub capabilities: &'a [Capability],
}

/// Whether a process kind is offered a tool, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Offered, and a call runs with the tool's declared capabilities.
    Offered,
    /// The profile does not name the tool.
    NotInProfile,
    /// The profile names the tool but does not grant this capability it declares.
    NotGranted(Capability),
    /// The profile names the tool, but no plugin or host tool provides it.
    NotLoaded,
    /// A host tool that processes of this kind do not run (a worker's `set_status` for a
    /// channel): naming it in the profile offers nothing.
    NotRunByKind,
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Decision::Offered => f.write_str("on"),
            Decision::NotInProfile => f.write_str("not in the profile"),
            Decision::NotGranted(cap) => write!(f, "capability {cap} not granted"),
            Decision::NotLoaded => f.write_str("tool not loaded"),
            Decision::NotRunByKind => f.write_str("a host tool this kind does not run"),
        }
    }
}

/// The profiles of every process kind: the one source of each process's tool list.
#[derive(Debug, Clone)]
pub struct Policy {
    profiles: BTreeMap<ProcessKind, Profile>,
    reuse: ReuseRules,
}

impl Policy {
    /// A policy from one profile per kind.
    ///
    /// # Panics
    ///
    /// If a kind has no profile; config loading guarantees one each.
    pub fn new(profiles: BTreeMap<ProcessKind, Profile>) -> Self {
        for kind in ProcessKind::ALL {
            assert!(profiles.contains_key(&kind), "no profile for {kind}");
        }
        Policy {
            profiles,
            reuse: ReuseRules::default(),
        }
    }

    /// The policy with `reuse` choosing how long plugin instances live.
    pub fn with_reuse(mut self, reuse: ReuseRules) -> Self {
        self.reuse = reuse;
        self
    }

    /// Which plugins' instances each kind of process keeps between its calls.
    pub fn reuse(&self) -> &ReuseRules {
        &self.reuse
    }

    /// The profile of `kind`.
    pub fn profile(&self, kind: ProcessKind) -> &Profile {
        &self.profiles[&kind]
    }

    /// Whether any profile could be offered a tool of the MCP server `server`.
    pub fn names_namespace(&self, server: &str) -> bool {
        self.profiles
            .values()
            .any(|profile| profile.names_namespace(server))
    }

    /// Whether `kind` is offered `tool` (`None`: no such tool is loaded).
    pub fn decide(&self, kind: ProcessKind, name: &str, tool: Option<ToolNeeds<'_>>) -> Decision {
        let profile = self.profile(kind);
        if !profile.names_tool(name) {
            return Decision::NotInProfile;
        }
        let Some(tool) = tool else {
            return Decision::NotLoaded;
        };
        match profile.missing(tool.name, tool.capabilities) {
            Some(cap) => Decision::NotGranted(cap),
            None => Decision::Offered,
        }
    }
}
