//! Parked calls and a person's approvals of them.
//!
//! A call the flow rules send for approval is parked: stored as a pending [`Approval`]
//! that names the process, the tool, the canonical arguments, their [`ArgsDigest`] and the
//! labels that required it. A person approves it (a lease: a time to live and a number of
//! uses) or denies it. A lease covers only calls by that process, of that tool, with
//! arguments of that digest; each call that runs on it takes one use, in the write that
//! checks the lease, so a call approved once runs once whichever host asks.

use std::fmt;
use std::str::FromStr;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::ServiceError;
use crate::flow::{ArgsDigest, Carried, CarriedList};
use crate::ids::ProcessId;

/// The parked calls and their approvals, shared by every host on one store.
///
/// ```
/// use capstan_host::flow::ArgsDigest;
/// use capstan_host::ids::{ProcessId, ProcessKind};
/// use capstan_host::services::{ApprovalState, Lease, NewApproval, Services, Verdict};
///
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// let services = Services::in_memory();
/// let worker = ProcessId::numbered(ProcessKind::Worker, 1);
/// let args = r#"{"to":"me@example.com"}"#;
/// let parked = services.approvals.park(NewApproval::of(&worker, "send_mail", args, "untrusted_send", "untrusted(mcp:web)")).await.unwrap();
/// assert_eq!(parked.state, ApprovalState::Pending);
///
/// services.approvals.decide(parked.id, Verdict::Approve(Lease::once()), "operator").await.unwrap();
/// let digest = ArgsDigest::of(args);
/// assert!(services.approvals.take(&worker, "send_mail", digest).await.unwrap().is_some());
/// // One use: the same call again needs a new approval.
/// assert!(services.approvals.take(&worker, "send_mail", digest).await.unwrap().is_none());
/// # });
/// ```
#[async_trait]
pub trait Approvals: Send + Sync {
    /// Parks `call`: a new pending approval, or the pending one already asking for the
    /// same process, tool and digest.
    async fn park(&self, call: NewApproval) -> Result<Approval, ServiceError>;

    /// Approval `id`, or [`ServiceError::NotFound`].
    async fn get(&self, id: ApprovalId) -> Result<Approval, ServiceError>;

    /// At most `limit` (clamped to 1..=1000) approvals, newest first; only the pending ones
    /// if `pending_only`.
    async fn list(&self, pending_only: bool, limit: u32) -> Result<Vec<Approval>, ServiceError>;

    /// Decides pending approval `id` as `verdict`, recording who decided (`by`). Refuses
    /// one already decided or withdrawn ([`ServiceError::Invalid`]), checked in the write
    /// that decides it, so two people deciding at once cannot both succeed.
    async fn decide(
        &self,
        id: ApprovalId,
        verdict: Verdict,
        by: &str,
    ) -> Result<Approval, ServiceError>;

    /// Takes one use of a live lease covering a call by `process` of `tool` with
    /// arguments of `digest`: the approval it was taken from, or `None` if no lease
    /// covers the call (none approved, expired, used up, or for other arguments).
    async fn take(
        &self,
        process: &ProcessId,
        tool: &str,
        digest: ArgsDigest,
    ) -> Result<Option<Approval>, ServiceError>;

    /// Withdraws pending approval `id` (the call stopped waiting): whether it was pending.
    async fn withdraw(&self, id: ApprovalId) -> Result<bool, ServiceError>;

    /// The values a person endorsed for `process` (each bound to its digest): those of
    /// every approval of its calls decided [`Verdict::Endorse`] whose lease has not
    /// expired.
    async fn endorsed(&self, process: &ProcessId) -> Result<Vec<Endorsement>, ServiceError>;

    /// Records that a call of `tool` by `process` used `endorsement`'s value as trusted
    /// (an audit row; the backends keep nothing for it).
    async fn vouched(
        &self,
        _process: &ProcessId,
        _tool: &str,
        _endorsement: &Endorsement,
    ) -> Result<(), ServiceError> {
        Ok(())
    }
}

/// A value a person vouched for, and the approval that says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Endorsement {
    /// The endorsing approval.
    pub approval: ApprovalId,
    /// The handle and its value's digest.
    pub value: Carried,
}

/// The number of an approval: increasing, never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ApprovalId(u64);

impl ApprovalId {
    /// The approval numbered `n`.
    pub fn new(n: u64) -> Self {
        ApprovalId(n)
    }

    /// Its number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for ApprovalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

impl FromStr for ApprovalId {
    type Err = ServiceError;

    /// `7` or `#7`.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let digits = text.strip_prefix('#').unwrap_or(text);
        digits.parse().map(ApprovalId).map_err(|_| {
            ServiceError::Invalid(format!(
                "`{}` is not an approval number: expected e.g. `7` or `#7` (see `capstan approvals`)",
                crate::text::truncate(text, 40)
            ))
        })
    }
}

/// Where an approval stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalState {
    /// Waiting for a person.
    Pending,
    /// Approved: a lease while it has uses left and has not expired.
    Approved,
    /// Denied: the call was refused.
    Denied,
    /// The call stopped waiting (its process ended or its wait ran out) before anyone
    /// decided.
    Withdrawn,
}

impl ApprovalState {
    /// The name stored and shown: `pending`, `approved`, `denied`, `withdrawn`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Withdrawn => "withdrawn",
        }
    }
}

impl fmt::Display for ApprovalState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ApprovalState {
    type Err = ServiceError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        [
            ApprovalState::Pending,
            ApprovalState::Approved,
            ApprovalState::Denied,
            ApprovalState::Withdrawn,
        ]
        .into_iter()
        .find(|state| state.as_str() == text)
        .ok_or_else(|| ServiceError::Invalid(format!("`{text}` is not an approval state")))
    }
}

/// A call to park.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApproval {
    /// The process that made the call.
    pub process: ProcessId,
    /// The tool.
    pub tool: String,
    /// The arguments as a person is [shown](crate::flow::shown) them: canonical, with
    /// deceptive characters escaped (the caller removes configured secrets' values).
    pub arguments: String,
    /// The digest of the canonical arguments: what a lease is bound to.
    pub digest: ArgsDigest,
    /// Why it needs a person: the flow decision, explained.
    pub reason: String,
    /// The labels that required it.
    pub label: String,
    /// The handles whose values the host put into the arguments: what endorsing it
    /// vouches for.
    pub handles: Vec<Carried>,
}

impl NewApproval {
    /// The call of `tool` by `process` with `arguments` as the model wrote them.
    pub fn of(process: &ProcessId, tool: &str, arguments: &str, reason: &str, label: &str) -> Self {
        NewApproval {
            process: process.clone(),
            tool: tool.to_owned(),
            arguments: crate::flow::shown(arguments),
            digest: ArgsDigest::of(arguments),
            reason: reason.to_owned(),
            label: label.to_owned(),
            handles: Vec::new(),
        }
    }
}

/// A parked call and what became of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Approval {
    /// Its number.
    #[schema(value_type = u64)]
    pub id: ApprovalId,
    /// The process that made the call, e.g. `worker:3`.
    #[schema(value_type = String)]
    pub process: ProcessId,
    /// The tool.
    pub tool: String,
    /// The arguments as shown: canonical, deceptive characters escaped, configured
    /// secrets' values removed.
    pub arguments: String,
    /// SHA-256 of the canonical arguments, in hex.
    #[schema(value_type = String)]
    pub digest: ArgsDigest,
    /// Why it needs a person.
    pub reason: String,
    /// The labels that required it.
    pub label: String,
    /// Where it stands.
    pub state: ApprovalState,
    /// When it was parked, Unix seconds.
    pub requested_at: i64,
    /// When it was decided or withdrawn.
    pub decided_at: Option<i64>,
    /// Who decided.
    pub decided_by: Option<String>,
    /// When an approval's lease expires.
    pub expires_at: Option<i64>,
    /// The calls an approval's lease still covers.
    pub uses_left: u32,
    /// The handles whose values the host put into the arguments (`$h1:SHA256`).
    #[schema(value_type = Vec<String>)]
    pub handles: Vec<Carried>,
    /// Whether the person endorsed those values: every later use of them by the process
    /// is trusted.
    pub endorsed: bool,
}

/// A person's decision on a parked call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Approved, with this lease.
    Approve(Lease),
    /// Approved with this lease, and the handles' values the call carried endorsed: the
    /// person vouches for them, so every later use of them by the process is trusted.
    Endorse(Lease),
    /// Denied.
    Deny,
}

impl Verdict {
    /// What a decision made at `at` (Unix seconds) leaves: the approval's state, when its
    /// lease expires and the uses it covers. Every backend writes these.
    pub fn outcome(self, at: i64) -> (ApprovalState, Option<i64>, u32) {
        match self {
            Verdict::Approve(lease) | Verdict::Endorse(lease) => {
                (ApprovalState::Approved, Some(lease.expires(at)), lease.uses)
            }
            Verdict::Deny => (ApprovalState::Denied, None, 0),
        }
    }

    /// Whether it endorses the handles' values the call carried.
    pub fn endorses(self) -> bool {
        matches!(self, Verdict::Endorse(_))
    }
}

/// How long, and for how many calls, an approval holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    /// Seconds from the decision.
    pub ttl_seconds: u64,
    /// The calls it covers.
    pub uses: u32,
}

impl Lease {
    /// The most uses one approval may cover.
    pub const MAX_USES: u32 = 1000;
    /// The longest an approval may hold: a week.
    pub const MAX_TTL_SECONDS: u64 = 7 * 86_400;

    /// One call, within ten minutes: the default.
    pub fn once() -> Self {
        Lease {
            ttl_seconds: 600,
            uses: 1,
        }
    }

    /// When a lease given at `at` (Unix seconds) expires.
    pub fn expires(&self, at: i64) -> i64 {
        at.saturating_add(i64::try_from(self.ttl_seconds).unwrap_or(i64::MAX))
    }

    /// The lease, if its uses and time to live are in range; else why not.
    pub fn checked(self) -> Result<Self, ServiceError> {
        if !(1..=Lease::MAX_USES).contains(&self.uses) {
            return Err(ServiceError::Invalid(format!(
                "an approval covers 1 to {} calls, not {}",
                Lease::MAX_USES,
                self.uses
            )));
        }
        if !(1..=Lease::MAX_TTL_SECONDS).contains(&self.ttl_seconds) {
            return Err(ServiceError::Invalid(format!(
                "an approval holds 1 to {} seconds (a week), not {}",
                Lease::MAX_TTL_SECONDS,
                self.ttl_seconds
            )));
        }
        Ok(self)
    }
}

impl Default for Lease {
    fn default() -> Self {
        Lease::once()
    }
}

/// The refusal of a decision on approval `id`, which stands as `state`.
pub fn already_decided(id: ApprovalId, state: ApprovalState) -> ServiceError {
    ServiceError::Invalid(format!(
        "approval {id} is {state}: only a pending approval can be decided"
    ))
}

/// The error for an approval that does not exist.
pub fn no_approval(id: ApprovalId) -> ServiceError {
    ServiceError::NotFound(format!(
        "approval {id} does not exist (see `capstan approvals --all`)"
    ))
}

/// The endorsements of each endorsing approval's values, as a store reads them.
pub fn endorsements(lists: Vec<(ApprovalId, CarriedList)>) -> Vec<Endorsement> {
    lists
        .into_iter()
        .flat_map(|(approval, list)| {
            list.0
                .into_iter()
                .map(move |value| Endorsement { approval, value })
        })
        .collect()
}

/// The most [`Approvals::list`] returns.
pub const APPROVALS_LIST_MAX: u32 = 1000;
