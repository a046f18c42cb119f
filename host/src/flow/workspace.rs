//! [`WorkspaceLabel`]: what a workspace file the host did not see written is taken to be.

use std::fmt;
use std::str::FromStr;

use super::{Label, Origin};

/// The label of a workspace file no process wrote through the host, or changed since
/// (`agent.workspace_label`): `untrusted` (the default: anyone may have put it there) or
/// `trusted` (the operator vouches for what the workspace holds).
///
/// ```
/// use capstan_host::flow::WorkspaceLabel;
///
/// let default = WorkspaceLabel::default();
/// assert_eq!(default.of("inbox/mail.txt").to_string(), "untrusted(file:inbox/mail.txt), public");
/// assert!("trusted".parse::<WorkspaceLabel>().unwrap().of("notes.md").is_trusted());
/// assert!("maybe".parse::<WorkspaceLabel>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WorkspaceLabel {
    /// Untrusted, from the file.
    #[default]
    Untrusted,
    /// Trusted.
    Trusted,
}

impl WorkspaceLabel {
    /// The label of the file at `path` (relative to the workspace), taken by this default.
    pub fn of(self, path: &str) -> Label {
        match self {
            WorkspaceLabel::Untrusted => Label::untrusted(Origin::file(path)),
            WorkspaceLabel::Trusted => Label::trusted(),
        }
    }
}

impl fmt::Display for WorkspaceLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WorkspaceLabel::Untrusted => "untrusted",
            WorkspaceLabel::Trusted => "trusted",
        })
    }
}

/// A workspace label that is neither `untrusted` nor `trusted`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseWorkspaceLabelError(String);

impl fmt::Display for ParseWorkspaceLabelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is not `untrusted` or `trusted`", self.0)
    }
}

impl std::error::Error for ParseWorkspaceLabelError {}

impl FromStr for WorkspaceLabel {
    type Err = ParseWorkspaceLabelError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "untrusted" => Ok(WorkspaceLabel::Untrusted),
            "trusted" => Ok(WorkspaceLabel::Trusted),
            _ => Err(ParseWorkspaceLabelError(text.to_owned())),
        }
    }
}
