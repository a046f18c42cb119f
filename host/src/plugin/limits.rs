//! The bounds on every tool call, and the resource limiter that enforces the memory bound.

use std::time::Duration;

/// How often the epoch ticker advances; the deadline's precision.
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Stderr kept per call, to quote a panic message in the error. Bounds what a plugin that
/// floods stderr can make the host hold.
pub(crate) const STDERR_CAPTURE_BYTES: usize = 16 * 1024;

/// Log lines one call may write; more are dropped (with one warning) so a plugin cannot
/// flood the host log.
pub(crate) const LOG_LINES_PER_CALL: u32 = 100;

/// The longest log line kept; longer lines are cut.
pub(crate) const LOG_LINE_BYTES: usize = 4 * 1024;

/// Resources (files, streams, pollables) one instance's guest may hold at once; bounds the
/// host memory behind its resource table, which a kept instance carries to its next call.
pub(crate) const MAX_RESOURCES: usize = 16 * 1024;

/// Table elements one instance may grow to; bounds host memory behind `table.grow`.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// Bounds on tool calls. Each applies to every call, `describe()` included.
///
/// ```
/// use std::time::Duration;
/// use capstan_host::plugin::Limits;
///
/// let limits = Limits { deadline: Duration::from_secs(2), ..Limits::default() };
/// assert_eq!(limits.memory_bytes, 64 << 20);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Wall-clock time one call may run before it is stopped. Default 10 s.
    pub deadline: Duration,
    /// Linear memory one call's instance may grow to. Default 64 MiB.
    pub memory_bytes: usize,
    /// The longest result text passed on; longer results are cut with a marker naming
    /// `limits.tool_output_kib`. Default 1 MiB.
    pub max_output_bytes: usize,
    /// Calls running at once; more wait for a slot. Sizes the pooling allocator. Default 64.
    pub max_concurrent_calls: u32,
    /// Instances kept between calls by processes whose plugins reuse them
    /// ([`InstanceReuse::Process`](crate::policy::InstanceReuse::Process)), over all
    /// processes; past it a call runs in a fresh instance as usual. Each holds its memory
    /// and a pooling-allocator slot of its own, apart from the call slots. Default 64.
    pub max_warm_instances: u32,
    /// Whether each call's instructions are counted (wasmtime's fuel, about one unit per
    /// Wasm instruction) for its receipt. Off by default: the counting is compiled into
    /// every plugin's code and slows every call.
    pub fuel: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            deadline: Duration::from_secs(10),
            memory_bytes: 64 << 20,
            max_output_bytes: 1 << 20,
            max_concurrent_calls: 64,
            max_warm_instances: 64,
            fuel: false,
        }
    }
}

impl Limits {
    /// These limits for a command that makes one call and exits (`capstan tool call`): the
    /// pool has room for as many instances as there are cores, which a cold load fills with
    /// `describe()` calls, and keeps none. Building and tearing down a pool sized for the
    /// configured concurrency (a guard page set up for each fiber stack, the memories'
    /// reservation) was a tenth of such a process.
    ///
    /// ```
    /// use capstan_host::plugin::Limits;
    ///
    /// let one = Limits::default().for_one_call();
    /// assert_eq!(one.max_warm_instances, 0);
    /// assert!(one.max_concurrent_calls >= 1 && one.max_concurrent_calls <= 64);
    /// assert_eq!(one.memory_bytes, Limits::default().memory_bytes);
    /// ```
    pub fn for_one_call(&self) -> Limits {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
        Limits {
            max_concurrent_calls: self.max_concurrent_calls.clamp(1, cores),
            max_warm_instances: 0,
            ..self.clone()
        }
    }
}

/// The fuel a store is given when [`Limits::fuel`] is on: never used up (the deadline
/// stops a call), so what is left tells what the call used.
pub(crate) const FUEL: u64 = 1 << 62;

/// Enforces [`Limits::memory_bytes`] and remembers that it did, so a trap that follows a
/// refused growth is reported as running out of memory rather than as a bare trap. It
/// also keeps the most memory the instance held during the call, for its receipt.
pub(crate) struct CallLimiter {
    memory_bytes: usize,
    /// The size a refused growth asked for.
    pub(crate) refused_growth: Option<usize>,
    /// What the instance's memories hold now, together.
    held: usize,
    /// The most they held since the call began.
    peak: usize,
}

impl CallLimiter {
    pub(crate) fn new(memory_bytes: usize) -> Self {
        CallLimiter {
            memory_bytes,
            refused_growth: None,
            held: 0,
            peak: 0,
        }
    }

    /// Readies a kept instance's limiter for its next call: the peak starts at what the
    /// instance holds.
    pub(crate) fn begin_call(&mut self) {
        self.refused_growth = None;
        self.peak = self.held;
    }

    /// The most linear memory the instance held since the call began, in bytes.
    pub(crate) fn peak(&self) -> usize {
        self.peak
    }
}

impl wasmtime::ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_bytes {
            // Refuse rather than trap: a guest that checks allocation failures may recover.
            self.refused_growth = Some(desired);
            return Ok(false);
        }
        // Each memory is created (from 0) and grown through here, so the sum is exact.
        self.held = self.held.saturating_add(desired.saturating_sub(current));
        self.peak = self.peak.max(self.held);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}
