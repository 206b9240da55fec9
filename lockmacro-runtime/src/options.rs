//! What one lock asks for: its kind, lease length, renewals, waiting, fencing.

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
    pub(crate) kind: LockKind,
    pub(crate) fair: bool,
    /// The key is not freed before this long after it was taken (`hold_at_least`).
    pub(crate) hold_at_least: Option<Duration>,
    /// The attribute's prefix, for the metrics' `prefix` label (else the key's first part).
    pub(crate) label: Option<&'static str>,
}

/// Who may hold one key at the same time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockKind {
    /// One holder at a time, excluding readers too: `mode = write`, the default.
    Exclusive,
    /// Shared with other readers; excluded by an exclusive holder: `mode = read`.
    Read,
    /// At most this many holders at once, a semaphore: `permits = N`. Zero is refused at acquire.
    Permits(u32),
}

impl LockKind {
    /// Whether holding this kind of lock on a key includes holding `asked` on it: a nested call
    /// asking for `asked` then re-enters.
    pub const fn grants(self, asked: LockKind) -> bool {
        matches!(
            (self, asked),
            (Self::Exclusive, _) | (Self::Read, Self::Read) | (Self::Permits(_), Self::Permits(_))
        )
    }

    /// How it is called in messages.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            Self::Exclusive => "exclusive (write)",
            Self::Read => "read",
            Self::Permits(_) => "permit",
        }
    }
}

impl LockOptions {
    /// The defaults: a 30 s lease renewed at most 3 times, failing fast when busy, no fencing.
    pub const fn new() -> Self {
        Self {
            ttl: Duration::from_secs(30),
            max_renewals: Some(3),
            wait: None,
            fencing: false,
            kind: LockKind::Exclusive,
            fair: false,
            hold_at_least: None,
            label: None,
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

    /// Shared with other readers of the key, excluded by an exclusive holder (`mode = read`).
    pub const fn read(mut self) -> Self {
        self.kind = LockKind::Read;
        self
    }

    /// Exclusive, the default, spelled out next to [`read`](Self::read) (`mode = write`).
    pub const fn write(mut self) -> Self {
        self.kind = LockKind::Exclusive;
        self
    }

    /// At most `permits` holders of the key at once (`permits = N`).
    pub const fn permits(mut self, permits: u32) -> Self {
        self.kind = LockKind::Permits(permits);
        self
    }

    /// Serve waiters in arrival order across processes, with no barging (`fair = true`).
    pub const fn fair(mut self, fair: bool) -> Self {
        self.fair = fair;
        self
    }

    /// Keep the key at least `hold` after it was taken (`hold_at_least = "5m"`), for jobs that
    /// several instances fire a little apart: once the work has started, its release, on every
    /// exit path, sets the key to expire when `hold` has passed since the acquiring command was
    /// sent, instead of deleting it (longer than the ttl if need be). The key keeps its holder's
    /// token meanwhile; nothing is announced and nothing handed over, so waiters wait it out as
    /// they wait out a lease. A release after `hold` deletes as usual. A shared lock's holder
    /// (`read`, `permits`) keeps its place in the key until then. Zero turns it off.
    pub const fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = if hold.is_zero() { None } else { Some(hold) };
        self
    }

    /// Who may hold the key at the same time.
    pub const fn lock_kind(&self) -> LockKind {
        self.kind
    }

    /// Whether waiters are served in arrival order.
    pub const fn is_fair(&self) -> bool {
        self.fair
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

    /// How long the key is held at least after it was taken, `None` when freed at release.
    pub const fn hold_at_least_duration(&self) -> Option<Duration> {
        self.hold_at_least
    }
}

impl Default for LockOptions {
    fn default() -> Self {
        Self::new()
    }
}
