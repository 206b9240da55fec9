//! What one lock asks for: lease length, renewals, waiting, fencing.

use std::time::Duration;

/// How a lock is taken and kept. Built with `const fn`s, so options can live in a `const`.
///
/// ```
/// use std::time::Duration;
/// use lockmacro_runtime::LockOptions;
///
/// const NIGHTLY_JOB: LockOptions = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .unlimited_renewals();
/// assert_eq!(NIGHTLY_JOB.ttl_duration(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) max_renewals: Option<u32>,
    pub(crate) wait: Option<Duration>,
    pub(crate) fencing: bool,
}

impl LockOptions {
    /// The defaults: a 30 s lease renewed at most 3 times, failing fast when busy, no fencing.
    pub const fn new() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            max_renewals: Some(3),
            wait: None,
            fencing: false,
        }
    }

    /// Lease length: how long the key lives in Redis unless extended. A zero ttl is raised to 1 ms.
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = if ttl.is_zero() {
            Duration::from_millis(1)
        } else {
            ttl
        };
        self
    }

    /// How many times the watchdog may extend the lease; `0` means "at most one ttl".
    pub const fn max_renewals(mut self, renewals: u32) -> Self {
        self.max_renewals = Some(renewals);
        self
    }

    /// Extend the lease for as long as the work runs.
    pub const fn unlimited_renewals(mut self) -> Self {
        self.max_renewals = None;
        self
    }

    /// Wait up to `wait` for a busy lock instead of failing fast.
    pub const fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Hand out a fencing token that strictly increases per key across holders.
    pub const fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// The lease length.
    pub const fn ttl_duration(&self) -> Duration {
        self.ttl
    }

    /// The renewal limit, `None` when unlimited.
    pub const fn renewal_limit(&self) -> Option<u32> {
        self.max_renewals
    }

    /// How long a busy lock is waited for, `None` when failing fast.
    pub const fn wait_duration(&self) -> Option<Duration> {
        self.wait
    }

    /// Whether a fencing token is handed out.
    pub const fn is_fenced(&self) -> bool {
        self.fencing
    }
}

impl Default for LockOptions {
    fn default() -> Self {
        Self::new()
    }
}
