//! Taking several keys at once (`key = [...]`): all or none, in one attempt, so that two callers
//! asking for the same keys in opposite orders never hold one each while waiting for the other.
//! Waiting listens on the key that kept it out; the lease, its renewals and its release cover
//! every key together.

use std::sync::Arc;

use tokio::time::Instant;

use super::acquire::{Attempt, Busy, Looking, record};
use super::{Engine, Waited, new_token};
use crate::clock;
use crate::error::LockError;
use crate::options::{LockKind, LockOptions};
use crate::rt::{self, Driver};
use crate::state::LeaseState;
use crate::store::{AcquiredMany, ManyRequest};

impl Engine {
    /// Takes every key of `keys` (distinct, at least two), waiting for them when `options` say
    /// so, and registers the one lease that covers them with the watchdog.
    pub(crate) async fn acquire_many(
        self: &Arc<Self>,
        keys: Vec<String>,
        options: &LockOptions,
    ) -> Result<Arc<LeaseState>, LockError> {
        let started = options.wait.map(|_| Instant::now());
        let taken = self.take_many(keys, options).await;
        record(options, started, taken)
    }

    async fn take_many(
        self: &Arc<Self>,
        keys: Vec<String>,
        options: &LockOptions,
    ) -> Result<(Arc<LeaseState>, Waited), LockError> {
        rt::require(Driver::Time)?;
        check_many(options)?;
        let Some(_taking) = self.closing.taking() else {
            return Err(LockError::ShutDown {
                key: keys[0].clone(),
            });
        };
        self.background.ensure_running();
        let (lease, waited) = match options.wait {
            None => match self
                .try_acquire_many(
                    &keys,
                    self.value_of(&new_token(), 0).0,
                    options,
                    Looking::Once,
                )
                .await?
            {
                Attempt::Taken(lease) => (lease, Waited::No),
                Attempt::Busy(busy) => {
                    return Err(LockError::Busy {
                        key: keys[busy.key].clone(),
                        retry_after: busy.estimate,
                    });
                }
            },
            Some(wait) => Box::pin(self.wait_for(&keys, options, wait)).await?,
        };
        Ok((self.unless_shut(lease).await?, waited))
    }

    /// One attempt on every key for `value`; a waiting attempt marks the busy keys, so that
    /// their releases are announced (and reserves them, once it has waited too long).
    pub(super) async fn try_acquire_many(
        &self,
        keys: &[String],
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
        let request = ManyRequest {
            keys,
            value: &value,
            ttl,
            waiting,
            reserving_since,
        };
        let (reply, sent_at) = self
            .acquire_in_turn(self.store.acquire_many(request, budget))
            .await;
        match reply {
            Ok(AcquiredMany::Taken) => {
                let lease = LeaseState::new(
                    self.next_lease_id(),
                    self.id,
                    keys[0].clone(),
                    value,
                    options,
                    None,
                    sent_at,
                )
                .covering(keys.to_vec());
                let lease = Arc::new(lease);
                self.hold(lease.clone());
                tracing::debug!(keys = ?keys, ttl_ms = clock::millis(ttl), "locks acquired");
                Ok(Attempt::Taken(lease))
            }
            Ok(AcquiredMany::Busy {
                key,
                remaining,
                estimate,
            }) => {
                tracing::debug!(key = %keys[key], keys = keys.len(), "one of the locks is busy");
                Ok(Attempt::Busy(Busy {
                    key,
                    remaining,
                    estimate,
                }))
            }
            Err(error) => Err(error.into_lock_error(Some(&keys[0]))),
        }
    }
}

/// What a lock over several keys can be: exclusive, unfenced, not fair.
fn check_many(options: &LockOptions) -> Result<(), LockError> {
    options.validate()?;
    let refused = if options.kind != LockKind::Exclusive {
        "a lock over several keys is exclusive; `mode = read` and `permits` take one key"
    } else if options.fencing {
        "a lock over several keys hands out no fencing token; fence with a lock on one key"
    } else if options.fair {
        "a lock over several keys is not fair; `fair = true` takes one key"
    } else {
        return Ok(());
    };
    Err(LockError::InvalidOptions {
        message: refused.into(),
    })
}
