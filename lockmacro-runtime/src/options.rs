//! What one lock asks for: its kind, lease length, renewals, waiting, fencing.

use std::time::Duration;

use crate::error::LockError;

/// The shortest lease: a `ttl` must outlast its drift margin (ttl/100 + 2 ms, taken off every
/// lease), or the lease would end before it began.
pub const MIN_TTL: Duration = Duration::from_millis(3);

/// The longest `ttl` or `hold_at_least`: a year. Longer is no lease but a key kept for good,
/// and past what every platform's clock and Redis's expiry arithmetic can add.
pub const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 60 * 60);

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
///
/// # Validation
///
/// The builders store what they are given; a locked call checks the options before any I/O
/// and refuses what the attribute refuses, with [`LockError::InvalidOptions`] (the work never
/// runs):
///
/// - `ttl` between [`MIN_TTL`] (3 ms, so that the lease outlasts its drift margin) and
///   [`MAX_TTL`] (a year); zero is refused, as `ttl = 0` is a compile error;
/// - `wait`, when set, not zero: to fail fast, leave `wait` out;
/// - `hold_at_least`, when set, not zero and at most [`MAX_TTL`]: to free the key at release,
///   leave it out;
/// - `permits` at least 1;
/// - over several keys ([`LockClient::run_locked_many`](crate::LockClient::run_locked_many)):
///   exclusive, unfenced and not fair.
///
/// A call that finds the lock busy gets [`LockError::Busy`] with `retry_after`, how long the
/// holder's lease had left when last seen, whether it waited or failed fast.
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
    /// The metrics' `prefix` label: the attribute's prefix, or [`label`](Self::label).
    pub(crate) label: Option<&'static str>,
}

/// How a waiting caller waits: decided once from its options, for one key or a list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaitPolicy {
    /// Its looks reserve the key once it has waited past `protocol::RESERVE_AFTER`: an
    /// exclusive caller that is not fair (readers share the key, and a fair queue serves its
    /// waiters in their order already).
    pub(crate) reserves: bool,
    /// Its first look already keeps its place: in a fair queue, or as a waiting writer that keeps
    /// new readers out. An exclusive lock's first look is a plain `SET NX` instead (most find the
    /// key free), and it keeps its place from its second.
    pub(crate) keeps_place_at_once: bool,
    /// Each release of the key wakes it, with every waiter like it of this client: readers can
    /// all go in at once, a fair queue's head may be anyone, and a caller of several keys may
    /// still find another one busy. Otherwise a release wakes the longest-parked waiter of the
    /// client, and a new waiter queues behind the client's others.
    pub(crate) wakes_everyone: bool,
    /// A release of this client may hand it the key, saving the release's announcement and its
    /// own look (where the deployment hands over): an exclusive caller of one key, neither fair
    /// nor fenced.
    pub(crate) takes_hand_over: bool,
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

    /// Lease length: how long the key lives in Redis unless extended (default 30 s), from
    /// [`MIN_TTL`] to [`MAX_TTL`]; anything else is refused when the lock is taken.
    pub const fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
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

    /// Wait up to `wait` for a busy lock instead of failing fast. Zero is refused when the lock
    /// is taken (as `wait = 0` is by the attribute): to fail fast, leave `wait` out.
    /// `Duration::MAX` waits for as long as it takes.
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
    /// (`read`, `permits`) keeps its place in the key until then. Zero, or more than
    /// [`MAX_TTL`], is refused when the lock is taken (as `hold_at_least = 0` is by the
    /// attribute): to free the key at release, leave it out.
    pub const fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = Some(hold);
        self
    }

    /// The `prefix` label of this lock's metrics (feature `metrics`), for a key taken through
    /// the programmatic API: a bounded name such as `"invoices"`, never a part of the key that
    /// varies (a tenant, an id), since each label value is a time series of its own. Without
    /// it a programmatic key's label is `(none)`; the attribute labels with its `prefix`.
    pub const fn label(mut self, label: &'static str) -> Self {
        self.label = Some(label);
        self
    }

    /// Refuses, before any I/O, what a lock cannot be taken with (see [Validation](Self#validation)).
    pub(crate) fn validate(&self) -> Result<(), LockError> {
        let refused = |message: String| Err(LockError::InvalidOptions { message });
        if self.ttl.is_zero() {
            return refused(
                "`ttl` is zero; give the lease a positive length, such as `Duration::from_secs(30)`"
                    .into(),
            );
        }
        if self.ttl < MIN_TTL {
            return refused(format!(
                "`ttl` of {:?} is shorter than {MIN_TTL:?}: the drift margin taken off every lease \
                 (ttl/100 + 2 ms) would leave it no time at all; give a longer lease",
                self.ttl
            ));
        }
        if self.ttl > MAX_TTL {
            return refused(format!(
                "`ttl` of {:?} is longer than a lease may be ({MAX_TTL:?}); keep leases short \
                 and let `max_renewals` (or `unlimited_renewals`) extend them",
                self.ttl
            ));
        }
        if self.wait.is_some_and(|wait| wait.is_zero()) {
            return refused(
                "`wait` is zero; to fail fast when the lock is busy, leave `wait` out".into(),
            );
        }
        match self.hold_at_least {
            Some(hold) if hold.is_zero() => {
                return refused(
                    "`hold_at_least` is zero; to free the key at release, leave `hold_at_least` out"
                        .into(),
                );
            }
            Some(hold) if hold > MAX_TTL => {
                return refused(format!(
                    "`hold_at_least` of {hold:?} is longer than {MAX_TTL:?}, the longest a key is kept"
                ));
            }
            _ => {}
        }
        if self.kind == LockKind::Permits(0) {
            return refused(
                "`permits` must be at least 1: a semaphore of no permits is never free".into(),
            );
        }
        Ok(())
    }

    /// How a caller with these options waits for `keys` keys (one, or a list).
    pub(crate) fn wait_policy(&self, keys: usize) -> WaitPolicy {
        let exclusive = self.kind == LockKind::Exclusive;
        let shared_or_fair = !exclusive || self.fair;
        WaitPolicy {
            reserves: exclusive && !self.fair,
            keeps_place_at_once: shared_or_fair,
            wakes_everyone: shared_or_fair || keys > 1,
            takes_hand_over: exclusive && !self.fair && !self.fencing && keys == 1,
        }
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
