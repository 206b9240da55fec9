//! Taking a lock: at once, or by waiting (`wait.rs`), then registering the lease with the
//! watchdog.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Engine, Waited, new_token};
use crate::clock;
use crate::error::LockError;
use crate::metrics::{self, Prefix};
use crate::options::LockOptions;
use crate::right::ReleaseRight;
use crate::rt::{self, Driver};
use crate::state::LeaseState;
use crate::store::protocol::hint;
use crate::store::{AcquireRequest, Acquired};

/// What one attempt found.
pub(super) enum Attempt {
    Taken(Arc<LeaseState>),
    Busy(Busy),
}

/// What a look that found the lock busy saw.
#[derive(Debug, Clone, Copy)]
pub(super) struct Busy {
    /// Which of the keys asked for kept it out (0 for a lock on one key).
    pub(super) key: usize,
    /// How long until the holder's lease runs out, when known.
    pub(super) remaining: Option<Duration>,
    /// How long a caller coming back now may wait (`Busy`'s `retry_after`), when known.
    pub(super) estimate: Option<Duration>,
}

/// How an attempt that finds the lock busy goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Looking {
    /// It fails fast, or looks for the first time: it leaves nothing behind.
    Once,
    /// It waits: it is counted, marks the key and keeps its place; once it has waited longer
    /// than `protocol::RESERVE_AFTER` (since the time given, ms since the Unix epoch), it
    /// reserves the key.
    Waiting { reserving_since: Option<u64> },
}

impl Engine {
    /// Takes `key` (waiting for it when `options` say so) and registers the lease with the
    /// watchdog.
    pub(crate) async fn acquire(
        self: &Arc<Self>,
        key: String,
        options: &LockOptions,
    ) -> Result<Arc<LeaseState>, LockError> {
        // Read only for a wait's metrics: a clock read is not free.
        let started = options.wait.map(|_| Instant::now());
        let taken = self.take(key, options).await;
        record(options, started, taken)
    }

    async fn take(
        self: &Arc<Self>,
        key: String,
        options: &LockOptions,
    ) -> Result<(Arc<LeaseState>, Waited), LockError> {
        rt::require(Driver::Time)?;
        options.validate()?;
        let Some(_taking) = self.closing.taking() else {
            return Err(LockError::ShutDown { key });
        };
        self.background.ensure_running();
        let (lease, waited) = self.acquire_or_wait(key, options).await?;
        Ok((self.unless_shut(lease).await?, waited))
    }

    /// `lease`, unless the client began to shut down while it was taken: then it is given back
    /// at once, and the call ends `ShutDown`.
    pub(super) async fn unless_shut(
        self: &Arc<Self>,
        lease: Arc<LeaseState>,
    ) -> Result<Arc<LeaseState>, LockError> {
        if !self.closing.takes.is_closed() {
            return Ok(lease);
        }
        // Its work never started, so a hold does not apply. Unconfirmed, the right drops: it
        // releases in the background.
        lease.drop_hold();
        if let Some(right) = ReleaseRight::claim(&lease, self)
            && self.store.release(lease.lease_ref()).await.is_ok()
        {
            right.disarm();
        }
        Err(LockError::ShutDown {
            key: lease.key.clone(),
        })
    }

    async fn acquire_or_wait(
        &self,
        key: String,
        options: &LockOptions,
    ) -> Result<(Arc<LeaseState>, Waited), LockError> {
        let Some(wait) = options.wait else {
            return match self
                .try_acquire(
                    &key,
                    self.value_of(&new_token(), 0).0,
                    options,
                    Looking::Once,
                )
                .await?
            {
                Attempt::Taken(lease) => Ok((lease, Waited::No)),
                Attempt::Busy(busy) => Err(LockError::Busy {
                    key,
                    retry_after: busy.estimate,
                }),
            };
        };
        // Boxed: the waiting path's state machine is large, and inline it would make every
        // caller's future as large, copied on each acquisition, waiting or not.
        let keys = [key];
        Box::pin(self.wait_for(&keys, options, wait)).await
    }

    /// One attempt to take every key of `keys` (one, or a list) for `value` (see
    /// [`value_of`](Engine::value_of)).
    pub(super) async fn try_acquire_keys(
        &self,
        keys: &[String],
        value: String,
        options: &LockOptions,
        looking: Looking,
    ) -> Result<Attempt, LockError> {
        match keys {
            [key] => self.try_acquire(key, value, options, looking).await,
            keys => self.try_acquire_many(keys, value, options, looking).await,
        }
    }

    /// One attempt to take `key` for `value`; a waiting attempt keeps the caller's place when
    /// busy.
    pub(super) async fn try_acquire(
        &self,
        key: &str,
        value: String,
        options: &LockOptions,
        looking: Looking,
    ) -> Result<Attempt, LockError> {
        let ttl = options.ttl;
        let budget = self.acquire_budget(ttl);
        let (waiting, reserving_since) = match looking {
            Looking::Once => (false, None),
            Looking::Waiting { reserving_since } => (true, reserving_since),
        };
        let request = AcquireRequest {
            key,
            value: &value,
            kind: options.kind,
            ttl,
            fencing: options.fencing,
            waiting,
            fair: options.fair,
            reserving_since,
        };
        let (reply, sent_at) = self
            .acquire_in_turn(self.store.acquire(request, budget))
            .await;
        match reply {
            Ok(Acquired::Taken { fencing_token }) => {
                let lease = Arc::new(LeaseState::new(
                    self.next_lease_id(),
                    self.id,
                    key.to_owned(),
                    value,
                    options,
                    fencing_token,
                    sent_at,
                ));
                self.hold(lease.clone());
                tracing::debug!(key = %key, token_hint = %hint(lease.token()), ttl_ms = clock::millis(ttl), fencing_token, "lock acquired");
                Ok(Attempt::Taken(lease))
            }
            Ok(Acquired::Busy {
                remaining,
                estimate,
            }) => {
                tracing::debug!(key = %key, "lock busy");
                Ok(Attempt::Busy(Busy {
                    key: 0,
                    remaining,
                    estimate,
                }))
            }
            Err(error) => Err(error.into_lock_error(Some(key))),
        }
    }

    /// How long an acquire may wait for its reply. One later than the lease itself is
    /// worthless: the lock may have lapsed already.
    pub(super) fn acquire_budget(&self, ttl: Duration) -> Duration {
        self.response_timeout.min(
            ttl.saturating_sub(clock::drift(ttl))
                .max(Duration::from_millis(1)),
        )
    }
}

/// Counts an acquisition's outcome, and how long it waited: zero when it found the lock free.
pub(super) fn record(
    options: &LockOptions,
    started: Option<Instant>,
    taken: Result<(Arc<LeaseState>, Waited), LockError>,
) -> Result<Arc<LeaseState>, LockError> {
    let prefix = Prefix::of(options.label);
    let outcome = match &taken {
        Ok(_) => "acquired",
        Err(LockError::Busy { .. }) => "busy",
        Err(_) => "error",
    };
    metrics::acquisition(&prefix, outcome);
    if let Some(started) = started {
        let waited = match &taken {
            Ok((_, Waited::No)) => Duration::ZERO,
            _ => started.elapsed(),
        };
        metrics::waited(&prefix, waited);
    }
    taken.map(|(lease, _)| lease)
}
