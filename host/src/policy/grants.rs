//! The capabilities a caller holds, and the decision for one call.

use std::collections::BTreeSet;
use std::fmt;
use std::str::FromStr;

use capstan_caps::{Capability, ParseCapabilityError};

/// The capabilities a caller holds.
///
/// ```
/// use capstan_caps::Capability;
/// use capstan_host::policy::Grants;
///
/// let grants: Grants = "fs.read,memory.read".parse().unwrap();
/// let effective = grants.effective("file_read", &[Capability::FsRead]).unwrap();
/// assert_eq!(effective, vec![Capability::FsRead]);
///
/// let denial = grants.effective("file_write", &[Capability::FsWrite]).unwrap_err();
/// assert_eq!(denial.missing, Capability::FsWrite);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Grants {
    caps: BTreeSet<Capability>,
}

impl Grants {
    /// No grants: only tools that declare no capability may run.
    pub fn none() -> Self {
        Self::default()
    }

    /// Grants exactly `caps`.
    pub fn new(caps: impl IntoIterator<Item = Capability>) -> Self {
        Grants {
            caps: caps.into_iter().collect(),
        }
    }

    /// The granted capabilities, sorted.
    pub fn iter(&self) -> impl Iterator<Item = &Capability> {
        self.caps.iter()
    }

    /// Whether some grant allows `needed`.
    pub fn allows(&self, needed: &Capability) -> bool {
        self.caps.iter().any(|grant| grant.allows(needed))
    }

    /// The capabilities a call of `tool`, which declares `declared`, runs with: all of
    /// `declared`, if every one is granted. Otherwise the first one missing.
    ///
    /// One capability is scoped by the caller rather than the tool: a tool declaring
    /// `tasks.write-own` writes tasks on the caller's behalf, so a caller granted
    /// `tasks.write` runs it with `tasks.write` (any task), and a caller granted only
    /// `tasks.write-own` runs it scoped to its own and created tasks.
    pub fn effective(
        &self,
        tool: &str,
        declared: &[Capability],
    ) -> Result<Vec<Capability>, Denial> {
        if let Some(missing) = declared.iter().find(|cap| !self.allows(cap)) {
            return Err(Denial {
                tool: tool.to_owned(),
                missing: missing.clone(),
                granted: self.clone(),
            });
        }
        Ok(declared
            .iter()
            .map(|cap| match cap {
                Capability::TasksWriteOwn if self.caps.contains(&Capability::TasksWrite) => {
                    Capability::TasksWrite
                }
                other => other.clone(),
            })
            .collect())
    }
}

impl fmt::Display for Grants {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.caps.is_empty() {
            return f.write_str("(none)");
        }
        let mut first = true;
        for cap in &self.caps {
            if !first {
                f.write_str(",")?;
            }
            first = false;
            write!(f, "{cap}")?;
        }
        Ok(())
    }
}

/// Parses a comma-separated list such as `fs.read,tasks.write-own`; blanks are ignored.
impl FromStr for Grants {
    type Err = ParseCapabilityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let caps = text
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
            .map(str::parse)
            .collect::<Result<BTreeSet<_>, _>>()?;
        Ok(Grants { caps })
    }
}

/// A call refused because the tool declares a capability the caller does not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// The tool that was called.
    pub tool: String,
    /// The first declared capability no grant allows.
    pub missing: Capability,
    /// What the caller holds.
    pub granted: Grants,
}

impl fmt::Display for Denial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tool `{}` needs capability `{}`, which this caller does not grant (granted: {}); \
             a grant of `{}` would allow it",
            self.tool, self.missing, self.granted, self.missing
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn effective_is_the_declared_set_when_all_are_granted() {
        let grants: Grants = "fs.read, fs.write ,tasks.write".parse().unwrap();
        let caps = grants.effective("t", &[Capability::FsRead]).unwrap();
        assert_eq!(caps, vec![Capability::FsRead]);
        assert_eq!(grants.effective("t", &[]).unwrap(), vec![]);
    }

    #[test]
    fn task_writes_are_scoped_by_the_callers_grant() {
        let full: Grants = "tasks.write".parse().unwrap();
        let own: Grants = "tasks.write-own".parse().unwrap();
        let declared = [Capability::TasksWriteOwn];
        assert_eq!(
            full.effective("t", &declared).unwrap(),
            vec![Capability::TasksWrite]
        );
        assert_eq!(
            own.effective("t", &declared).unwrap(),
            vec![Capability::TasksWriteOwn]
        );
        assert!(own.effective("t", &[Capability::TasksWrite]).is_err());
    }

    #[test]
    fn a_denial_names_tool_capability_and_grants() {
        let grants: Grants = "fs.read".parse().unwrap();
        let denial = grants
            .effective("file_edit", &[Capability::FsRead, Capability::FsWrite])
            .unwrap_err();
        let text = denial.to_string();
        assert!(text.contains("file_edit"), "{text}");
        assert!(text.contains("`fs.write`"), "{text}");
        assert!(text.contains("granted: fs.read"), "{text}");
    }

    #[test]
    fn grants_parse_and_print() {
        assert_eq!(Grants::none().to_string(), "(none)");
        assert_eq!("".parse::<Grants>().unwrap(), Grants::none());
        assert_eq!(
            "memory.read,fs.read".parse::<Grants>().unwrap().to_string(),
            "fs.read,memory.read"
        );
        assert!("fs.read,fs.root".parse::<Grants>().is_err());
    }
}
