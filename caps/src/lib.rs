//! The capability vocabulary of Capstan, shared by the host and the plugin SDK.
//!
//! A capability is a named right. A tool declares the capabilities it needs; a caller (a
//! process, or `capstan tool call --grant`) holds grants. A call runs with the declared
//! capabilities that are granted, and is refused if any declared one is not.
//!
//! The text form is the contract: it is what a plugin's `describe()` returns, what a config
//! file lists and what a denial names.
//!
//! | text | right |
//! |---|---|
//! | `fs.read` | read the workspace (a read-only preopen) |
//! | `fs.write` | write the workspace (a read-write preopen) |
//! | `tasks.read` | list and read tasks |
//! | `tasks.write` | create and update any task |
//! | `tasks.write-own` | create tasks, update the caller's own and created tasks |
//! | `memory.read` | recall memories, read working memory |
//! | `memory.write` | save and delete memories, write working memory |
//! | `net:<rule>` | outbound HTTP the rule allows (see [`NetRule`]) |
//! | `secret:<name>` | use one named secret (injected by the host, never read); `secret:*` in a tool's declaration: any the caller grants |
//!
//! ```
//! use capstan_caps::Capability;
//!
//! let cap: Capability = "fs.read".parse().unwrap();
//! assert_eq!(cap, Capability::FsRead);
//! let net: Capability = "net:api.example.com".parse().unwrap();
//! assert_eq!(net.to_string(), "net:api.example.com");
//! assert!("fs.execute".parse::<Capability>().is_err());
//! ```

mod address;
mod effect;
mod net;

use std::fmt;
use std::str::FromStr;

pub use address::{AddressClass, AddressRange, METADATA_V4, METADATA_V6};
pub use effect::{EFFECT_PREFIX, Effect, ParseEffectError};
pub use net::{
    HostRule, METHODS, NetRule, NetTarget, ParseNetRuleError, PortRule, Scheme, SchemeRule,
    TargetHost, canonical_ip,
};

/// One named right a tool can declare and a caller can grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Capability {
    /// Read files in the workspace.
    FsRead,
    /// Create, change and delete files in the workspace.
    FsWrite,
    /// List and read tasks.
    TasksRead,
    /// Create and update any task.
    TasksWrite,
    /// Create tasks, and update the tasks the caller created or is assigned.
    TasksWriteOwn,
    /// Recall memories and read working memory.
    MemoryRead,
    /// Save and delete memories, write working memory.
    MemoryWrite,
    /// Outbound HTTP that the rule allows (`api.example.com`, `*.example.com:8443`).
    Net(NetRule),
    /// Use the named secret; `*` (in a tool's declaration): whichever the caller grants.
    Secret(String),
}

impl Capability {
    /// Every capability without a parameter, in a stable order.
    pub const FIXED: [Capability; 7] = [
        Capability::FsRead,
        Capability::FsWrite,
        Capability::TasksRead,
        Capability::TasksWrite,
        Capability::TasksWriteOwn,
        Capability::MemoryRead,
        Capability::MemoryWrite,
    ];

    /// Whether a call holding `self` can only read: nothing it does with it changes a
    /// file, a task, a memory or anything outside the host.
    ///
    /// ```
    /// use capstan_caps::Capability;
    ///
    /// assert!(Capability::FsRead.only_reads());
    /// assert!(!Capability::FsWrite.only_reads());
    /// ```
    pub fn only_reads(&self) -> bool {
        matches!(
            self,
            Capability::FsRead | Capability::TasksRead | Capability::MemoryRead
        )
    }

    /// Whether a grant of `self` allows a tool that declared `needed`.
    ///
    /// Equal capabilities match; a grant of `tasks.write` allows a tool that only needs
    /// `tasks.write-own`. Network rules match when they overlap: the call may then make
    /// the requests both allow (see [`NetRule::intersect`]). A secret matches its name,
    /// and `secret:*` on either side matches any secret.
    pub fn allows(&self, needed: &Capability) -> bool {
        match (self, needed) {
            (Capability::Net(grant), Capability::Net(need)) => grant.intersect(need).is_some(),
            (Capability::Secret(grant), Capability::Secret(need)) => {
                grant == need || grant == "*" || need == "*"
            }
            (Capability::TasksWrite, Capability::TasksWriteOwn) => true,
            (grant, need) => grant == need,
        }
    }

    /// Whether everything `other` lets a tool do, `self` lets it do too: what tells a
    /// narrowed declaration from a widened one when a plugin is updated. Unlike
    /// [`Capability::allows`], overlapping is not enough: a rule must hold every request
    /// and address the other allows ([`NetRule::contains`]); `secret:*` covers every
    /// secret.
    ///
    /// ```
    /// use capstan_caps::Capability;
    ///
    /// let any: Capability = "net:*.example.com".parse().unwrap();
    /// let some: Capability = "net:*.api.example.com".parse().unwrap();
    /// let one: Capability = "net:api.example.com".parse().unwrap();
    /// assert!(any.covers(&some));
    /// assert!(!some.covers(&any));
    /// // A wildcard reaches public addresses only; an exact name wherever it resolves.
    /// assert!(!any.covers(&one));
    /// assert!(Capability::TasksWrite.covers(&Capability::TasksWriteOwn));
    /// assert!(!Capability::FsRead.covers(&Capability::FsWrite));
    /// ```
    pub fn covers(&self, other: &Capability) -> bool {
        match (self, other) {
            (Capability::Net(wide), Capability::Net(narrow)) => wide.contains(narrow),
            (Capability::Secret(wide), Capability::Secret(narrow)) => wide == narrow || wide == "*",
            (Capability::TasksWrite, Capability::TasksWriteOwn) => true,
            (wide, narrow) => wide == narrow,
        }
    }
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capability::FsRead => f.write_str("fs.read"),
            Capability::FsWrite => f.write_str("fs.write"),
            Capability::TasksRead => f.write_str("tasks.read"),
            Capability::TasksWrite => f.write_str("tasks.write"),
            Capability::TasksWriteOwn => f.write_str("tasks.write-own"),
            Capability::MemoryRead => f.write_str("memory.read"),
            Capability::MemoryWrite => f.write_str("memory.write"),
            Capability::Net(host) => write!(f, "net:{host}"),
            Capability::Secret(name) => write!(f, "secret:{name}"),
        }
    }
}

/// A capability string that is not in the vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseCapabilityError {
    text: String,
    reason: String,
}

impl fmt::Display for ParseCapabilityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown capability `{}`: {}; known capabilities are fs.read, fs.write, tasks.read, \
             tasks.write, tasks.write-own, memory.read, memory.write, net:<rule>, secret:<name>",
            self.text, self.reason
        )
    }
}

impl std::error::Error for ParseCapabilityError {}

impl FromStr for Capability {
    type Err = ParseCapabilityError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| ParseCapabilityError {
            text: text.to_owned(),
            reason,
        };
        if let Some(fixed) = Capability::FIXED.iter().find(|c| c.to_string() == text) {
            return Ok(fixed.clone());
        }
        let (kind, param) = text
            .split_once(':')
            .ok_or_else(|| err("not a known name".into()))?;
        match kind {
            "net" => param
                .parse::<NetRule>()
                .map(Capability::Net)
                .map_err(|e| err(e.to_string())),
            "secret" => {
                let valid = param == "*"
                    || (!param.is_empty()
                        && param.len() <= 64
                        && param
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')));
                if valid {
                    Ok(Capability::Secret(param.to_owned()))
                } else {
                    Err(err(
                        "a secret name is 1 to 64 ASCII letters, digits, '.', '-' or '_' (or * \
                         in a tool's declaration)"
                            .into(),
                    ))
                }
            }
            _ => Err(err("not a known name".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fixed_capability_round_trips_through_text() {
        for cap in Capability::FIXED {
            assert_eq!(cap.to_string().parse::<Capability>().unwrap(), cap);
        }
    }

    #[test]
    fn parameterized_capabilities_parse_and_reject_bad_parameters() {
        assert_eq!(
            "secret:GITHUB_TOKEN".parse::<Capability>().unwrap(),
            Capability::Secret("GITHUB_TOKEN".into())
        );
        assert!("net:".parse::<Capability>().is_err());
        assert!("net:a b".parse::<Capability>().is_err());
        assert!("disk:x".parse::<Capability>().is_err());
        let msg = "fs.exec".parse::<Capability>().unwrap_err().to_string();
        assert!(msg.contains("fs.exec") && msg.contains("fs.read"), "{msg}");
    }

    #[test]
    fn net_patterns_match_subdomains_only() {
        let net = |text: &str| format!("net:{text}").parse::<Capability>().unwrap();
        let grant = net("*.example.com");
        assert!(grant.allows(&net("api.example.com")));
        assert!(!grant.allows(&net("example.com")));
        assert!(!grant.allows(&net("evilexample.com")));
        assert!(!grant.allows(&net("example.com.evil.net")));
        assert!(net("*").allows(&net("x.org")));
    }

    #[test]
    fn tasks_write_covers_write_own_but_not_the_reverse() {
        assert!(Capability::TasksWrite.allows(&Capability::TasksWriteOwn));
        assert!(!Capability::TasksWriteOwn.allows(&Capability::TasksWrite));
        assert!(!Capability::FsRead.allows(&Capability::FsWrite));
    }
}
