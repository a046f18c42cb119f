//! How long a host's run lease lasts, and the figures that follow from it.

use std::time::{Duration, Instant};

/// A run's lease: how long it lasts unrenewed (`store.lease_secs`). It is renewed every
/// third of that, so one slow renewal loses nothing; a host that cannot renew it (the
/// database unreachable) stops once it is over by its own clock.
///
/// ```
/// use std::time::Duration;
/// use capstan_host::postgres::Lease;
///
/// let lease = Lease::new(Duration::from_secs(15));
/// assert_eq!(lease.period(), Duration::from_secs(5));
/// assert_eq!(lease.transaction_limit(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    ttl: Duration,
}

/// How much sooner than the database a host counts its lease over: what the two clocks
/// may drift apart within a lease, many times over.
const MARGIN: Duration = Duration::from_secs(1);

impl Lease {
    /// The shortest lease: its renewal period must leave room for a slow statement.
    pub const MIN: Duration = Duration::from_secs(6);
    /// The longest lease: a host cut off holds its conversations no longer than this.
    pub const MAX: Duration = Duration::from_secs(600);

    /// A lease of `ttl`, within [`Lease::MIN`] and [`Lease::MAX`].
    pub fn new(ttl: Duration) -> Lease {
        Lease {
            ttl: ttl.clamp(Self::MIN, Self::MAX),
        }
    }

    /// How long it lasts unrenewed.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long it lasts unrenewed, in seconds, as the database is told.
    pub(super) fn ttl_seconds(&self) -> f64 {
        self.ttl.as_secs_f64()
    }

    /// How often it is renewed.
    pub fn period(&self) -> Duration {
        self.ttl / 3
    }

    /// How long a transaction may sit idle or wait for a lock: under the lease's life, so
    /// a takeover never waits on a host that lost its lease.
    pub fn transaction_limit(&self) -> Duration {
        self.ttl * 2 / 3
    }

    /// The end of a lease renewed by a statement sent at `sent`, by this host's clock: the
    /// database set it `ttl` after it ran the statement, which is later.
    pub(super) fn local_term(&self, sent: Instant) -> Instant {
        sent + self.ttl - MARGIN
    }
}

impl Default for Lease {
    /// 15 s.
    fn default() -> Self {
        Lease::new(Duration::from_secs(15))
    }
}
