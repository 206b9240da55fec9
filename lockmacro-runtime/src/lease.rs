//! A held lock: the state the watchdog and the holder share, and the guard that ends it.
//!
//! The guard ([`Lease`]) is what makes "released on every exit path" hold by construction: its
//! `Drop` deregisters the lease from the renewal queue and hands the compare-and-delete to the
//! client's watchdog thread, which outlives any caller's runtime. The normal path
//! ([`Lease::release`]) does the same on the caller's runtime and waits for the answer.

use std::future::Future;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::client::LockClient;
use crate::context;
use crate::error::LockError;

/// Every lease time is kept as nanoseconds since this instant, so it fits in an atomic.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

pub(crate) fn now_nanos() -> u64 {
    nanos_at(Instant::now())
}

pub(crate) fn nanos_at(at: Instant) -> u64 {
    u64::try_from(at.saturating_duration_since(*EPOCH).as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) fn instant_at(nanos: u64) -> Instant {
    *EPOCH + Duration::from_nanos(nanos)
}

/// Safety margin taken off every lease for clock drift between us and Redis (as Redlock).
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// What the holder and the watchdog both see of one lease.
pub(crate) struct LeaseState {
    pub(crate) id: u64,
    pub(crate) client_id: u64,
    pub(crate) key: String,
    pub(crate) token: String,
    pub(crate) ttl: Duration,
    pub(crate) max_renewals: Option<u32>,
    pub(crate) fencing_token: Option<u64>,
    /// When the last confirmed `SET` or extension was sent.
    confirmed_sent_at: AtomicU64,
    renewals: AtomicU32,
    /// An extension is on the wire; the watchdog sends no second one.
    pub(crate) extending: AtomicBool,
    /// An extension found the key gone or holding another token.
    lost: AtomicBool,
    /// The guard is gone: an extension still in flight has nothing to report to.
    finished: AtomicBool,
    /// Cancelled when the lease is lost; the holder's work stops at its next `.await`.
    pub(crate) cancel: CancellationToken,
}

impl LeaseState {
    pub(crate) fn new(
        id: u64,
        client_id: u64,
        key: String,
        token: String,
        options: &crate::LockOptions,
        fencing_token: Option<u64>,
        sent_at: Instant,
    ) -> Self {
        Self {
            id,
            client_id,
            key,
            token,
            ttl: options.ttl,
            max_renewals: options.max_renewals,
            fencing_token,
            confirmed_sent_at: AtomicU64::new(nanos_at(sent_at)),
            renewals: AtomicU32::new(0),
            extending: AtomicBool::new(false),
            lost: AtomicBool::new(false),
            finished: AtomicBool::new(false),
            cancel: CancellationToken::new(),
        }
    }

    pub(crate) fn renewals(&self) -> u32 {
        self.renewals.load(Ordering::Acquire)
    }

    pub(crate) fn confirmed_sent_at(&self) -> u64 {
        self.confirmed_sent_at.load(Ordering::Acquire)
    }

    /// The local deadline: last confirmed send + ttl − drift. Past it the lease may have lapsed.
    pub(crate) fn deadline(&self) -> Instant {
        instant_at(self.confirmed_sent_at()) + self.ttl.saturating_sub(drift(self.ttl))
    }

    pub(crate) fn time_left(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    pub(crate) fn renewals_left(&self) -> bool {
        self.max_renewals.is_none_or(|max| self.renewals() < max)
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::Acquire)
    }

    /// Records a confirmed extension sent at `sent_at`; returns the renewal count.
    pub(crate) fn extended(&self, sent_at: u64) -> u32 {
        self.confirmed_sent_at.fetch_max(sent_at, Ordering::AcqRel);
        self.renewals.fetch_add(1, Ordering::AcqRel) + 1
    }

    pub(crate) fn finish(&self) {
        self.finished.store(true, Ordering::Release);
    }

    pub(crate) fn is_finished(&self) -> bool {
        self.finished.load(Ordering::Acquire)
    }

    /// The key was found gone or replaced: stop the work now.
    pub(crate) fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
        self.cancel.cancel();
    }

    /// The error that ends work cut short by this lease.
    fn ending_error(&self) -> LockError {
        let key = self.key.clone();
        if !self.is_lost() && !self.renewals_left() {
            LockError::RenewalsExhausted {
                key,
                renewals: self.renewals(),
            }
        } else {
            LockError::Lost { key }
        }
    }
}

/// A held lock. Renewed in the background while alive; released when [`release`](Lease::release)d
/// or dropped.
///
/// Dropping a `Lease` (a panic, a cancelled future) schedules the release on the client's
/// watchdog thread, so it needs no runtime and never blocks.
#[must_use = "dropping a Lease releases the lock at once"]
pub struct Lease {
    state: Arc<LeaseState>,
    client: LockClient,
    settled: bool,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.state.key)
            .field("renewals", &self.state.renewals())
            .field("time_left", &self.state.time_left())
            .field("lost", &self.state.is_lost())
            .finish_non_exhaustive()
    }
}

impl Lease {
    pub(crate) fn new(state: Arc<LeaseState>, client: LockClient) -> Self {
        Self {
            state,
            client,
            settled: false,
        }
    }

    /// The Redis key.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The random value stored under the key: proof of ownership.
    pub fn token(&self) -> &str {
        &self.state.token
    }

    /// The fencing token, when the lock was taken with fencing on.
    pub fn fencing_token(&self) -> Option<u64> {
        self.state.fencing_token
    }

    /// How many times the lease was extended so far.
    pub fn renewals(&self) -> u32 {
        self.state.renewals()
    }

    /// Time until the local deadline of the current lease.
    pub fn time_left(&self) -> Duration {
        self.state.time_left()
    }

    /// Whether the lease is known lost (key gone or replaced).
    pub fn is_lost(&self) -> bool {
        self.state.is_lost()
    }

    /// Runs `work` under this lease: it is dropped at its next `.await` once the lease ends
    /// (renewals used up, key lost, or no extension confirmed before the local deadline).
    /// Inside, [`LockContext::current`](crate::LockContext::current) describes this lease and
    /// locked calls on the same key through the same client re-enter.
    ///
    /// # Errors
    /// [`LockError::RenewalsExhausted`] or [`LockError::Lost`] when the work was cut short.
    ///
    /// # Cancellation safety
    /// Dropping the returned future drops `work`; the lease stays held until the `Lease` goes.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        let state = &self.state;
        let work = context::scope(state.clone(), work);
        let mut work = std::pin::pin!(work);
        let expiry = tokio::time::sleep_until(state.deadline().into());
        let mut expiry = std::pin::pin!(expiry);
        loop {
            tokio::select! {
                biased;
                () = state.cancel.cancelled() => break,
                () = &mut expiry => {
                    // An extension confirmed meanwhile moved the deadline: wait for the new one.
                    let deadline = state.deadline();
                    if deadline <= Instant::now() {
                        break;
                    }
                    expiry.as_mut().reset(deadline.into());
                }
                output = &mut work => return Ok(output),
            }
        }
        let error = state.ending_error();
        tracing::warn!(key = %state.key, renewals = state.renewals(), reason = %error, "lock work cancelled");
        Err(error)
    }

    /// Releases the lock with a compare-and-delete and waits for Redis to confirm it (bounded by
    /// the client's response timeout). A key that is no longer ours is left untouched.
    ///
    /// # Errors
    /// [`LockError::Redis`] when Redis did not confirm; the release is then retried in the
    /// background and the key expires at the latest at the end of its lease.
    pub async fn release(mut self) -> Result<(), LockError> {
        self.settled = true;
        let state = &self.state;
        self.client.renewals().deregister(state.id);
        if state.is_lost() {
            return Ok(());
        }
        match self
            .client
            .backend()
            .release(&state.key, &state.token)
            .await
        {
            Ok(true) => {
                tracing::debug!(key = %state.key, "lock released");
                Ok(())
            }
            Ok(false) => {
                tracing::warn!(key = %state.key, "lock had already expired or changed owner at release");
                Ok(())
            }
            Err(failure) => {
                self.client.renewals().release_in_background(
                    state.key.clone(),
                    state.token.clone(),
                    state.ttl,
                );
                Err(failure.into_lock_error(Some(&state.key)))
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let state = &self.state;
        let renewals = self.client.renewals();
        renewals.deregister(state.id);
        if !state.is_lost() {
            renewals.release_in_background(state.key.clone(), state.token.clone(), state.ttl);
        }
    }
}
