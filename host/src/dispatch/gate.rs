//! Per-session reservations: who may prompt a session now, and whether it is busy.
//!
//! A route reserves the session before it waits for inputs to settle and before it checks
//! for activity, so two routes that see the same idle edge cannot both go on: the second
//! is told who holds the session. After every dispatch the session stays held for its
//! owner for a short time (the hold), even when the dispatch failed, so a late provider
//! error cannot race a retry by someone else.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The gate's timings (`[limits]` `settle_ms`, `dispatch_timeout_secs`,
/// `dispatch_total_secs`, `dispatch_hold_ms`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GateSettings {
    /// How long a route waits after reserving, so inputs that arrive together are
    /// answered together. A channel waits for results and notifications, not for the
    /// user's own messages, which are answered at once.
    pub settle: Duration,
    /// How long a dispatch waits for the first piece of the answer, and then between
    /// pieces, before it counts as timed out. A provider that does not stream sends its
    /// answer as one piece, so for it this bounds the whole request.
    pub timeout: Duration,
    /// How long a whole answer may take, however steadily it arrives.
    pub total: Duration,
    /// How long a session stays held for its owner after a dispatch ends, however it ended.
    pub hold: Duration,
}

impl Default for GateSettings {
    fn default() -> Self {
        GateSettings {
            settle: Duration::from_millis(50),
            timeout: Duration::from_secs(30),
            total: Duration::from_secs(600),
            hold: Duration::from_secs(2),
        }
    }
}

/// Proof of a reservation: the session, its owner and the reservation's token.
///
/// The token tells reservations apart, so a finisher holding an old ticket cannot release
/// a newer reservation of the same session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    session: String,
    owner: String,
    token: u64,
}

impl Ticket {
    /// The session reserved, e.g. `main` or `worker:3`.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Who reserved it, e.g. `channel:main:loop`.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The reservation's token.
    pub fn token(&self) -> u64 {
        self.token
    }
}

/// A session held by someone else.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the session is reserved by {by}")]
pub struct Reserved {
    /// The owner holding it.
    pub by: String,
}

/// A release the gate refuses to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// An owner prefix must end in `:`, so `worker:1` cannot release `worker:12:loop`.
    #[error(
        "owner prefix `{0}` does not end in ':'; release by exact owner, or by a prefix such as `{0}:`"
    )]
    PrefixWithoutColon(String),
}

/// Why a ticket may not dispatch now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Busy {
    /// The ticket no longer holds its session (released, timed out, or replaced).
    Stale,
    /// A dispatch is in flight, or a tool is still running, for the session.
    Active,
}

/// The reservations of every session.
#[derive(Debug, Default)]
pub struct Gate {
    sessions: Mutex<Sessions>,
    next_token: AtomicU64,
}

#[derive(Debug, Default)]
struct Sessions {
    map: HashMap<String, Session>,
    /// Sweep idle entries when the map reaches this size (amortized cleanup).
    sweep_at: usize,
}

#[derive(Debug, Default)]
struct Session {
    holder: Option<(String, u64)>,
    /// The owner of the last dispatch, and until when the session stays held for it.
    hold: Option<(String, Instant)>,
    in_flight: bool,
    tools: usize,
}

impl Session {
    fn hold_by_other(&mut self, owner: &str, now: Instant) -> Option<&str> {
        if self.hold.as_ref().is_some_and(|(_, until)| *until <= now) {
            self.hold = None;
        }
        self.hold
            .as_ref()
            .filter(|(by, _)| by != owner)
            .map(|(by, _)| by.as_str())
    }

    /// Whether `ticket`'s reservation is the one held now.
    fn held_by(&self, ticket: &Ticket) -> bool {
        self.holder
            .as_ref()
            .is_some_and(|(owner, token)| *owner == ticket.owner && *token == ticket.token)
    }

    fn idle(&self, now: Instant) -> bool {
        self.holder.is_none()
            && !self.in_flight
            && self.tools == 0
            && self.hold.as_ref().is_none_or(|(_, until)| *until <= now)
    }
}

impl Gate {
    /// Reserves `session` for `owner`. The same owner gets its current ticket back (its
    /// continuation rounds re-enter); anyone else is refused while the session is reserved
    /// or within the hold after someone else's dispatch.
    ///
    /// ```
    /// use capstan_host::dispatch::Gate;
    ///
    /// let gate = Gate::default();
    /// let ticket = gate.reserve("main", "channel:main:loop").unwrap();
    /// assert_eq!(gate.reserve("main", "hook:idle:").unwrap_err().by, "channel:main:loop");
    /// assert!(gate.release(&ticket));
    /// assert!(gate.reserve("main", "hook:idle:").is_ok());
    /// ```
    pub fn reserve(&self, session: &str, owner: &str) -> Result<Ticket, Reserved> {
        let now = Instant::now();
        let mut sessions = self.sessions.lock().unwrap();
        sessions.sweep(now);
        let entry = sessions.map.entry(session.to_owned()).or_default();
        if let Some(by) = entry.hold_by_other(owner, now) {
            return Err(Reserved { by: by.to_owned() });
        }
        let token = match &entry.holder {
            Some((by, token)) if by == owner => *token,
            Some((by, _)) => return Err(Reserved { by: by.clone() }),
            None => {
                let token = self.next_token.fetch_add(1, Ordering::Relaxed) + 1;
                entry.holder = Some((owner.to_owned(), token));
                token
            }
        };
        Ok(Ticket {
            session: session.to_owned(),
            owner: owner.to_owned(),
            token,
        })
    }

    /// Ends the reservation `ticket` proves; false if it no longer holds (a stale ticket
    /// never releases a newer reservation). The hold after its last dispatch still runs.
    pub fn release(&self, ticket: &Ticket) -> bool {
        let mut sessions = self.sessions.lock().unwrap();
        let Some(entry) = sessions.map.get_mut(&ticket.session) else {
            return false;
        };
        let held = entry.held_by(ticket);
        if held {
            entry.holder = None;
        }
        held
    }

    /// Ends every reservation held by exactly `owner`; returns how many.
    pub fn release_owner(&self, owner: &str) -> usize {
        self.release_where(|held| held == owner)
    }

    /// Ends every reservation whose owner starts with `prefix`, which must end in `:`
    /// (so `worker:1:` never matches `worker:12:loop`); returns how many.
    pub fn release_prefix(&self, prefix: &str) -> Result<usize, ReleaseError> {
        if !prefix.ends_with(':') {
            return Err(ReleaseError::PrefixWithoutColon(prefix.to_owned()));
        }
        Ok(self.release_where(|held| held.starts_with(prefix)))
    }

    fn release_where(&self, matches: impl Fn(&str) -> bool) -> usize {
        let mut sessions = self.sessions.lock().unwrap();
        let mut released = 0;
        for entry in sessions.map.values_mut() {
            if entry
                .holder
                .as_ref()
                .is_some_and(|(owner, _)| matches(owner))
            {
                entry.holder = None;
                released += 1;
            }
        }
        released
    }

    /// Who holds `session` now: its reservation's owner, else the owner of a hold still
    /// running.
    pub fn holder(&self, session: &str) -> Option<String> {
        let now = Instant::now();
        let sessions = self.sessions.lock().unwrap();
        let entry = sessions.map.get(session)?;
        entry
            .holder
            .as_ref()
            .map(|(owner, _)| owner.clone())
            .or_else(|| {
                entry
                    .hold
                    .as_ref()
                    .filter(|(_, until)| *until > now)
                    .map(|(owner, _)| owner.clone())
            })
    }

    /// How many sessions are reserved now (holds not counted).
    pub fn reservations(&self) -> usize {
        let sessions = self.sessions.lock().unwrap();
        sessions
            .map
            .values()
            .filter(|entry| entry.holder.is_some())
            .count()
    }

    /// Sessions the gate keeps state for (reserved, held, busy, or not yet swept).
    #[cfg(test)]
    pub(crate) fn tracked_sessions(&self) -> usize {
        self.sessions.lock().unwrap().map.len()
    }

    /// Marks a tool running in `session` until the guard drops; a dispatch meanwhile is
    /// refused as active.
    pub fn tool_running(&self, session: &str) -> ToolRunning<'_> {
        let mut sessions = self.sessions.lock().unwrap();
        sessions.map.entry(session.to_owned()).or_default().tools += 1;
        ToolRunning {
            gate: self,
            session: session.to_owned(),
        }
    }

    /// The activity check: starts a dispatch for `ticket`, or says why not.
    pub(crate) fn begin(&self, ticket: &Ticket) -> Result<Flight<'_>, Busy> {
        let mut sessions = self.sessions.lock().unwrap();
        let Some(entry) = sessions.map.get_mut(&ticket.session) else {
            return Err(Busy::Stale);
        };
        if !entry.held_by(ticket) {
            return Err(Busy::Stale);
        }
        if entry.in_flight || entry.tools > 0 {
            return Err(Busy::Active);
        }
        entry.in_flight = true;
        Ok(Flight {
            gate: self,
            ticket: ticket.clone(),
            hold: Duration::ZERO,
            release: false,
        })
    }
}

impl Sessions {
    fn sweep(&mut self, now: Instant) {
        if self.map.len() < self.sweep_at {
            return;
        }
        self.map.retain(|_, entry| !entry.idle(now));
        self.sweep_at = (self.map.len() * 2).max(64);
    }
}

/// A dispatch in flight. When it drops (finished, failed, timed out, or its caller was
/// cancelled) the session is no longer in flight and the hold starts.
pub(crate) struct Flight<'g> {
    gate: &'g Gate,
    ticket: Ticket,
    pub(crate) hold: Duration,
    /// End the reservation too (a timed-out dispatch).
    pub(crate) release: bool,
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        let mut sessions = self.gate.sessions.lock().unwrap();
        let Some(entry) = sessions.map.get_mut(&self.ticket.session) else {
            return;
        };
        entry.in_flight = false;
        if !self.hold.is_zero() {
            entry.hold = Some((self.ticket.owner.clone(), Instant::now() + self.hold));
        }
        if self.release && entry.held_by(&self.ticket) {
            entry.holder = None;
        }
    }
}

/// A tool running in a session; see [`Gate::tool_running`].
#[must_use = "the tool counts as running only while this guard lives"]
pub struct ToolRunning<'g> {
    gate: &'g Gate,
    session: String,
}

impl Drop for ToolRunning<'_> {
    fn drop(&mut self) {
        let mut sessions = self.gate.sessions.lock().unwrap();
        if let Some(entry) = sessions.map.get_mut(&self.session) {
            entry.tools = entry.tools.saturating_sub(1);
        }
    }
}

/// A reservation released when dropped: on every path out of the code that holds it,
/// including a cancelled or panicking task.
#[must_use = "the reservation ends when the lease drops"]
pub struct Lease<'g> {
    gate: &'g Gate,
    ticket: Ticket,
}

impl<'g> Lease<'g> {
    pub(crate) fn new(gate: &'g Gate, ticket: Ticket) -> Self {
        Lease { gate, ticket }
    }

    /// The ticket, for [`crate::dispatch::Dispatcher::send`].
    pub fn ticket(&self) -> &Ticket {
        &self.ticket
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        self.gate.release(&self.ticket);
    }
}
