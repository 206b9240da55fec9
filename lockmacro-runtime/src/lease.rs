//! A held lock: the guard that runs work under the lease and ends it.
//!
//! The guard ([`Lease`]) is what makes "released on every exit path" hold by construction: until
//! a release is *confirmed*, dropping it (a panic, a cancelled future, a timeout that fires while
//! the release is in flight) hands the compare-and-delete to the client's own runtime, which
//! outlives any caller's runtime.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::context;
use crate::engine::Engine;
use crate::error::LockError;
use crate::metrics::End;
use crate::right::ReleaseRight;
use crate::state::LeaseState;
use crate::store::protocol::hint;

/// A held lock. Renewed in the background while alive; released when [`release`](Lease::release)d
/// or dropped.
///
/// Dropping a `Lease` (a panic, a cancelled future) schedules the release on the client's
/// own runtime, so it needs no runtime and never blocks.
#[must_use = "dropping a Lease releases the lock at once"]
pub struct Lease {
    state: Arc<LeaseState>,
    engine: Arc<Engine>,
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
    pub(crate) fn new(state: Arc<LeaseState>, engine: Arc<Engine>) -> Self {
        Self { state, engine }
    }

    /// The Redis key: the first of [`keys`](Self::keys) for a lease over several.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// Every Redis key the lease holds, in the order given, each once (one for a lock on one key).
    pub fn keys(&self) -> &[String] {
        self.state.all_keys()
    }

    /// The random value stored under the key: proof of ownership.
    pub fn token(&self) -> &str {
        self.state.token()
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
    /// locked calls on the same key through the same client re-enter. It runs inside a DEBUG
    /// span `lock` with the `key` (as tower-http's request spans), so with DEBUG enabled the
    /// work's own log lines say which lock they ran under, and at INFO it costs nothing.
    ///
    /// # Errors
    /// [`LockError::RenewalsExhausted`] or [`LockError::Lost`] when the work was cut short.
    ///
    /// # Cancellation safety
    /// Dropping the returned future drops `work`; the lease stays held until the `Lease` goes.
    pub async fn run<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        match lock_span(&self.state.key) {
            Some(span) => self.run_unspanned(work).instrument(span).await,
            None => self.run_unspanned(work).await,
        }
    }

    /// [`run`](Self::run) inside whatever span the caller is in: a locked call's span wraps
    /// its acquire and release too.
    pub(crate) async fn run_unspanned<F: Future>(&self, work: F) -> Result<F::Output, LockError> {
        let state = &self.state;
        let work = context::scope(state.clone(), work);
        let mut work = std::pin::pin!(work);
        if !state.is_cancelled() && Instant::now() < state.deadline() {
            // Work that finishes at its first poll needs neither a deadline timer nor a
            // cancellation waiter: arming them costs more than a short critical section.
            let first = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx))).await;
            if let Poll::Ready(output) = first {
                return Ok(output);
            }
            let expiry = tokio::time::sleep_until(state.deadline());
            let mut expiry = std::pin::pin!(expiry);
            loop {
                tokio::select! {
                    biased;
                    () = state.cancelled() => break,
                    () = &mut expiry => {
                        // An extension confirmed meanwhile moved the deadline: wait for it.
                        let deadline = state.deadline();
                        if deadline <= Instant::now() {
                            break;
                        }
                        expiry.as_mut().reset(deadline);
                    }
                    output = &mut work => return Ok(output),
                }
            }
        }
        let error = state.ending_error();
        state.record_end(match error {
            LockError::Lost { .. } => End::Lost,
            LockError::RenewalsExhausted { .. } => End::Exhausted,
            _ => End::Cancelled,
        });
        tracing::warn!(key = %state.key, token_hint = %hint(state.token()), renewals = state.renewals(), reason = %error, "lock work cancelled");
        Err(error)
    }

    /// Records how the work under it ended (once; later calls change nothing).
    pub(crate) fn record_end(&self, end: End) {
        self.state.record_end(end);
    }

    /// Releases the lock with a compare-and-delete and waits for Redis to confirm it, bounded
    /// by the client's response timeout and by what is left of the lease: the key expires
    /// with its lease anyway, so a caller never waits on a release past the lease's end. A key
    /// that is no longer ours is left untouched.
    ///
    /// A lease that was lost (the key found gone or another's, or its deadline passed with no
    /// renewal confirmed) has nothing of ours left to wait for: `Ok(())` at once, and a lease
    /// past its deadline is still released in the background, in case the key is ours. A lease
    /// whose renewals ran out is released as any other, so the next caller finds the key free.
    ///
    /// # Errors
    /// [`LockError::Redis`] when Redis answered with an error or not at all within the
    /// response timeout, with lease left; the release is then retried in the background and the
    /// key expires at the latest at the end of its lease.
    ///
    /// # Cancellation safety
    /// Dropping the returned future before Redis answered hands the release to the background,
    /// as dropping the `Lease` does.
    pub async fn release(self) -> Result<(), LockError> {
        let state = &self.state;
        state.record_end(End::Ok);
        // Lost, or the client's shutdown took its release on: nothing of ours to release.
        let Some(right) = ReleaseRight::claim(state, &self.engine) else {
            return Ok(());
        };
        if state.unconfirmed() {
            // Lost at its deadline, Redis having confirmed no renewal in time: released in the
            // background, the caller not held up by a Redis that does not answer.
            drop(right);
            return Ok(());
        }
        // The right travels with the request: dropping this future before the answer, or an
        // error, releases in the background.
        let release = self.engine.release(right);
        let left = state.time_left();
        let deleted = if !left.is_zero() && left < self.engine.response_timeout() {
            // The lease ends before the request would time out: wait no longer than it lasts.
            match tokio::time::timeout(left, release).await {
                Ok(deleted) => deleted?,
                Err(_) => return Ok(()),
            }
        } else {
            release.await?
        };
        if deleted {
            tracing::debug!(key = %state.key, token_hint = %hint(state.token()), "lock released");
        } else {
            tracing::warn!(key = %state.key, token_hint = %hint(state.token()), "lock had already expired or changed owner at release");
        }
        Ok(())
    }
}

/// The DEBUG span `lock` with the `key` a locked call runs in (as tower-http's request spans),
/// `None` when DEBUG is off. Asked first: a disabled span still records its fields and logs its
/// entering and leaving at every poll when tracing's `log` feature is on (axum's default
/// features turn it on); no span at all costs nothing.
pub(crate) fn lock_span(key: &str) -> Option<tracing::Span> {
    tracing::enabled!(tracing::Level::DEBUG).then(|| tracing::debug_span!("lock", key = %key))
}

impl Drop for Lease {
    fn drop(&mut self) {
        // Recorded once: after `release` this records nothing, and its right is spent.
        self.state.record_end(if std::thread::panicking() {
            End::Panic
        } else {
            End::Cancelled
        });
        drop(ReleaseRight::claim(&self.state, &self.engine));
    }
}
