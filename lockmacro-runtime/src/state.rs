//! What the holder of a lease and the watchdog both see of it.
//!
//! Lease times are nanoseconds on the engine's clock ([`crate::clock`]), kept in atomics so the
//! watchdog can record an extension while the holder reads its deadline.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::clock;
use crate::error::{LockError, LostReason};

/// [`LeaseState::mark_lost`]'s codes.
const LOST_TAKEN: u8 = 1;
const LOST_GONE: u8 = 2;
use crate::metrics::{self, End, Prefix};
use crate::options::{LockKind, LockOptions};
use crate::store::LeaseRef;

/// One held lease.
pub(crate) struct LeaseState {
    pub(crate) id: u64,
    /// The engine that took it: reentrancy is per client.
    pub(crate) engine_id: u64,
    pub(crate) key: String,
    /// Every key of a multi-key lease, `key` first; empty for a lease of one key.
    pub(crate) keys: Box<[String]>,
    /// What the key holds for it (`protocol::lock_value`): its token, when and by whom it was
    /// taken.
    pub(crate) value: String,
    pub(crate) kind: LockKind,
    pub(crate) ttl: Duration,
    pub(crate) max_renewals: Option<u32>,
    pub(crate) fencing_token: Option<u64>,
    /// The lease's milestones after a confirmed send, in nanos: computed once, read every scan.
    pub(crate) timing: Timing,
    /// The metrics' `prefix` label.
    pub(crate) prefix: Prefix,
    /// When it was taken (the acquire's send, in the clock's nanos), for how long it was held:
    /// the lease's time starts then, and no second clock read is needed.
    acquired_at: u64,
    /// Until when (nanos) a release keeps the key rather than deletes it (`hold_at_least`,
    /// counted from `acquired_at`); 0 for none.
    hold_until: AtomicU64,
    /// How the work under it ended has been recorded.
    end_recorded: AtomicBool,
    /// When the last confirmed acquire or extension was sent.
    confirmed_sent_at: AtomicU64,
    renewals: AtomicU32,
    /// An extension is on the wire; the watchdog sends no second one.
    pub(crate) extending: AtomicBool,
    /// After a failed extension: not retried before this time (nanos).
    retry_at: AtomicU64,
    /// Consecutive failed extensions, for the backoff.
    failures: AtomicU32,
    /// An extension found the key gone or holding another token: [`LOST_TAKEN`] or
    /// [`LOST_GONE`], 0 while not lost.
    lost: AtomicU8,
    /// The guard is gone: an extension still in flight has nothing to report to.
    finished: AtomicBool,
    /// The client was shut down under it.
    shut_down: AtomicBool,
    /// Someone (its guard, or the client's shutdown) has taken on releasing it.
    release_claimed: AtomicBool,
    /// Cancelled when the lease is lost or the client shuts down; the holder's work stops at
    /// its next `.await`. Made on first use: most work ends before anyone waits on it, and a
    /// token costs an allocation and a mutex.
    cancel: OnceLock<CancellationToken>,
}

impl LeaseState {
    pub(crate) fn new(
        id: u64,
        engine_id: u64,
        key: String,
        value: String,
        options: &LockOptions,
        fencing_token: Option<u64>,
        sent_at: u64,
    ) -> Self {
        let prefix = Prefix::of(options.label);
        Self {
            id,
            engine_id,
            key,
            keys: Box::default(),
            value,
            kind: options.kind,
            ttl: options.ttl,
            max_renewals: options.max_renewals,
            fencing_token,
            timing: Timing::of(options.ttl),
            prefix,
            acquired_at: sent_at,
            hold_until: AtomicU64::new(
                options
                    .hold_at_least
                    .map_or(0, |hold| sent_at.saturating_add(clock::nanos(hold))),
            ),
            end_recorded: AtomicBool::new(false),
            confirmed_sent_at: AtomicU64::new(sent_at),
            renewals: AtomicU32::new(0),
            extending: AtomicBool::new(false),
            retry_at: AtomicU64::new(0),
            failures: AtomicU32::new(0),
            lost: AtomicU8::new(0),
            finished: AtomicBool::new(false),
            shut_down: AtomicBool::new(false),
            release_claimed: AtomicBool::new(false),
            cancel: OnceLock::new(),
        }
    }

    /// The token of its value: proof that the lease is ours.
    pub(crate) fn token(&self) -> &str {
        crate::store::protocol::holder_token(&self.value)
    }

    /// The same lease over every key of `keys` (the first is its `key`): a multi-key lease.
    pub(crate) fn covering(mut self, keys: Vec<String>) -> Self {
        self.keys = keys.into_boxed_slice();
        self
    }

    /// Every key it holds, `key` first.
    pub(crate) fn all_keys(&self) -> &[String] {
        if self.keys.is_empty() {
            std::slice::from_ref(&self.key)
        } else {
            &self.keys
        }
    }

    /// Whether it holds `key`.
    pub(crate) fn covers(&self, key: &str) -> bool {
        self.key == key || self.keys.iter().any(|held| held == key)
    }

    /// What the store needs to extend or release this lease.
    pub(crate) fn lease_ref(&self) -> LeaseRef<'_> {
        LeaseRef {
            key: &self.key,
            keys: &self.keys,
            value: &self.value,
            kind: self.kind,
            ttl: self.ttl,
            hold_until: self.hold_until(),
            undone: false,
        }
    }

    /// Until when (nanos) its release keeps the key, when `hold_at_least` asked for it.
    pub(crate) fn hold_until(&self) -> Option<u64> {
        Some(self.hold_until.load(Ordering::Acquire)).filter(|&until| until != 0)
    }

    /// Whether its release now would keep the key rather than delete it.
    pub(crate) fn holds_on(&self) -> bool {
        self.hold_until().is_some_and(|until| until > clock::now())
    }

    /// Its work never started (taken while the client shut down): a release deletes the key.
    pub(crate) fn drop_hold(&self) {
        self.hold_until.store(0, Ordering::Release);
    }

    /// Returns once no extension of it is on the wire. Called after it left the watchdog (so
    /// none starts again): an extension that landed after a release that keeps the key would
    /// set the key's expiry back to a ttl.
    pub(crate) async fn extension_settled(&self) {
        while self.extending.load(Ordering::Acquire) {
            // Rare and short: only a release during an extension's round trip waits here.
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }

    pub(crate) fn renewals(&self) -> u32 {
        self.renewals.load(Ordering::Acquire)
    }

    pub(crate) fn confirmed_sent_at(&self) -> u64 {
        self.confirmed_sent_at.load(Ordering::Acquire)
    }

    /// The local deadline (nanos): last confirmed send + ttl − drift. Past it the lease may have
    /// lapsed in Redis.
    pub(crate) fn deadline_nanos(&self) -> u64 {
        self.confirmed_sent_at()
            .saturating_add(self.timing.validity)
    }

    pub(crate) fn deadline(&self) -> Instant {
        clock::instant_at(self.deadline_nanos())
    }

    pub(crate) fn time_left(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    pub(crate) fn renewals_left(&self) -> bool {
        self.max_renewals.is_none_or(|max| self.renewals() < max)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire) != 0
    }

    /// When the watchdog wants to extend it next (nanos): a third through, or after a failure,
    /// when its backoff allows.
    pub(crate) fn due_at(&self) -> u64 {
        let third = self.confirmed_sent_at().saturating_add(self.timing.third);
        third.max(self.retry_at.load(Ordering::Acquire))
    }

    /// Records a confirmed extension sent at `sent_at`; returns the renewal count.
    pub(crate) fn extended(&self, sent_at: u64) -> u32 {
        self.confirmed_sent_at.fetch_max(sent_at, Ordering::AcqRel);
        self.failures.store(0, Ordering::Release);
        self.retry_at.store(0, Ordering::Release);
        self.renewals.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Records a failed extension attempt: the next waits `pause` (the batch's backoff), but at
    /// most half the time left, so a lease close to its deadline still gets a last try or two.
    /// Retry times are rounded up to a 10 ms grid, so the leases of one failed batch are retried
    /// together in one batch rather than each on a wake-up of its own. Returns how many attempts
    /// failed in a row.
    pub(crate) fn extension_failed(&self, now: u64, pause: Duration) -> u32 {
        const GRID: u64 = 10_000_000;
        let half_left = self.deadline_nanos().saturating_sub(now) / 2;
        let retry_at = now.saturating_add(clock::nanos(pause).min(half_left).max(GRID / 2));
        self.retry_at.store(
            retry_at.div_ceil(GRID).saturating_mul(GRID),
            Ordering::Release,
        );
        self.failures.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Extension attempts that failed in a row so far.
    pub(crate) fn failures(&self) -> u32 {
        self.failures.load(Ordering::Acquire)
    }

    pub(crate) fn finish(&self) {
        self.finished.store(true, Ordering::Release);
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// The key was found gone or replaced (`reason`): stop the work now.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let code = match reason {
            LostReason::Taken => LOST_TAKEN,
            _ => LOST_GONE,
        };
        self.lost.store(code, Ordering::Release);
        self.cancel_work();
    }

    fn cancel_work(&self) {
        self.cancel.get_or_init(CancellationToken::new).cancel();
    }

    /// Whether the work under it was told to stop (lost, or shut down).
    pub(crate) fn is_cancelled(&self) -> bool {
        self.cancel
            .get()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// Resolves once the work under it is told to stop.
    pub(crate) fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.get_or_init(CancellationToken::new).cancelled()
    }

    /// Records how the work under it ended, and how long it held the lock: once.
    pub(crate) fn record_end(&self, end: End) {
        if !self.end_recorded.swap(true, Ordering::AcqRel) {
            metrics::held(&self.prefix, self.acquired_at, end);
        }
    }

    /// The client shuts down: stop the work now; the shutdown releases the lease.
    pub(crate) fn shut_down(&self) {
        self.shut_down.store(true, Ordering::Release);
        self.cancel_work();
    }

    /// Takes on releasing it: `true` for the first to ask (its guard, or the client's shutdown).
    /// Only [`ReleaseRight`](crate::right::ReleaseRight) asks.
    pub(crate) fn claim_release(&self) -> bool {
        !self.release_claimed.swap(true, Ordering::AcqRel)
    }

    /// Nobody has taken on releasing it (again).
    pub(crate) fn unclaim_release(&self) {
        self.release_claimed.store(false, Ordering::Release);
    }

    /// Whether it ended at its deadline with renewals left and no renewal confirmed in time:
    /// lost to a Redis that did not answer ([`LostReason::Unconfirmed`]).
    pub(crate) fn unconfirmed(&self) -> bool {
        !self.is_lost() && self.renewals_left() && self.deadline_nanos() <= clock::now()
    }

    /// The error that ends work cut short by this lease.
    pub(crate) fn ending_error(&self) -> LockError {
        let key = self.key.clone();
        if self.shut_down.load(Ordering::Acquire) {
            return LockError::ShutDown { key };
        }
        let reason = match self.lost.load(Ordering::Acquire) {
            LOST_TAKEN => LostReason::Taken,
            LOST_GONE => LostReason::Gone,
            _ if !self.renewals_left() => {
                return LockError::RenewalsExhausted {
                    key,
                    renewals: self.renewals(),
                };
            }
            _ => LostReason::Unconfirmed,
        };
        LockError::Lost { key, reason }
    }
}

/// When, after a confirmed send, a lease is due for extension and when it ends, in nanos.
pub(crate) struct Timing {
    /// A third through: due for extension.
    pub(crate) third: u64,
    /// Half through: a lease that would pass this before the next scan needs a wake-up of its own.
    pub(crate) half: u64,
    /// The ttl less the drift margin: the local deadline.
    pub(crate) validity: u64,
    /// A twelfth: the grid its own wake-ups are rounded to, so leases taken together share one.
    pub(crate) grid: u64,
}

impl Timing {
    fn of(ttl: Duration) -> Self {
        Self {
            third: clock::nanos(ttl / 3),
            half: clock::nanos(ttl / 2),
            validity: clock::nanos(ttl.saturating_sub(clock::drift(ttl))),
            grid: clock::nanos(ttl / 12).max(1),
        }
    }
}
