//! Taking several keys at once (`key = [...]`): all or none, in one attempt, so that two callers
//! asking for the same keys in opposite orders never hold one each while waiting for the other.
//! Waiting listens on the key that kept it out; the lease, its renewals and its release cover
//! every key together.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::Looking;
use super::wait::{LooksAgain, Since, Stay};
use super::{Engine, new_token};
use crate::clock;
use crate::error::LockError;
use crate::metrics::{self, Prefix};
use crate::options::{LockKind, LockOptions};
use crate::right::ReleaseRight;
use crate::rt::{self, Driver};
use crate::state::LeaseState;
use crate::store::{AcquiredMany, ManyRequest};
use crate::waiters::{Expecting, Ticket};

/// What one attempt on every key found.
enum Attempt {
    Taken(Arc<LeaseState>),
    Busy {
        key: usize,
        remaining: Option<Duration>,
        estimate: Option<Duration>,
    },
}

impl Engine {
    /// Takes every key of `keys` (distinct, at least two), waiting for them when `options` say
    /// so, and registers the one lease that covers them with the watchdog.
    pub(crate) async fn acquire_many(
        self: &Arc<Self>,
        keys: Vec<String>,
        options: &LockOptions,
    ) -> Result<Arc<LeaseState>, LockError> {
        let prefix = Prefix::of(options.label);
        let started = Instant::now();
        let taken = self.take_many(keys, options).await;
        let outcome = match &taken {
            Ok(_) => "acquired",
            Err(LockError::Busy { .. }) => "busy",
            Err(_) => "error",
        };
        metrics::acquisition(&prefix, outcome);
        if options.wait.is_some() {
            metrics::waited(&prefix, started.elapsed());
        }
        taken
    }

    async fn take_many(
        self: &Arc<Self>,
        keys: Vec<String>,
        options: &LockOptions,
    ) -> Result<Arc<LeaseState>, LockError> {
        rt::require(Driver::Time)?;
        check_many(options)?;
        let Some(_taking) = self.closing.taking() else {
            return Err(LockError::ShutDown {
                key: keys[0].clone(),
            });
        };
        self.background.ensure_running();
        let lease = match options.wait {
            None => match self
                .try_acquire_many(&keys, &new_token(), options, Looking::Once)
                .await?
            {
                Attempt::Taken(lease) => lease,
                Attempt::Busy { key, estimate, .. } => {
                    return Err(LockError::Busy {
                        key: keys[key].clone(),
                        retry_after: estimate,
                    });
                }
            },
            Some(wait) => Box::pin(self.wait_for_many(&keys, options, wait)).await?,
        };
        if self.closing.takes.is_closed() {
            // Taken while the client shut down: give it back at once.
            if let Some(right) = ReleaseRight::claim(&lease, self)
                && self.store.release(lease.lease_ref()).await.is_ok()
            {
                right.disarm();
            }
            return Err(LockError::ShutDown {
                key: lease.key.clone(),
            });
        }
        Ok(lease)
    }

    /// One attempt on every key for `token`; a waiting attempt marks the busy keys, so that
    /// their releases are announced (and reserves them, once it has waited too long).
    async fn try_acquire_many(
        &self,
        keys: &[String],
        token: &str,
        options: &LockOptions,
        looking: Looking,
    ) -> Result<Attempt, LockError> {
        let ttl = options.ttl;
        let budget = self.acquire_budget(ttl);
        let value = self.value_of(token);
        let (waiting, starving_since) = match looking {
            Looking::Once => (false, None),
            Looking::Waiting { starving_since } => (true, starving_since),
        };
        let request = ManyRequest {
            keys,
            value: &value,
            ttl,
            waiting,
            starving_since,
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
                Ok(Attempt::Busy {
                    key,
                    remaining,
                    estimate,
                })
            }
            Err(error) => Err(error.into_lock_error(Some(&keys[0]))),
        }
    }

    /// Takes every key, waiting at most `wait`: parked on the release of the key that kept it
    /// out (announced, or made by this client), or until that key's lease would have run out.
    /// Every release of a key wakes every multi-key waiter of this client parked on it, so a
    /// waiter that still finds another key busy keeps no single-key waiter from its turn.
    async fn wait_for_many(
        &self,
        keys: &[String],
        options: &LockOptions,
        wait: Duration,
    ) -> Result<Arc<LeaseState>, LockError> {
        let give_up = clock::after(Instant::now(), wait);
        let since = Since::now(self.wall);
        // One token for every attempt: a busy attempt took nothing (keys handed to this token
        // by a release are this caller's: its next look confirms them).
        let token = new_token();
        let mut stay = Stay::new(self, keys, options.ttl);
        let mut looks_again = LooksAgain::new();
        let prefix = Prefix::of(options.label);
        let mut ticket: Option<Ticket<'_>> = None;
        let mut expecting: Option<Expecting> = None;
        let mut looking = Looking::Once;
        loop {
            // A release the shutdown sent wakes a waiter too: it must not take the keys again.
            self.shut(&keys[0])?;
            let heard = ticket.as_ref().map_or(0, Ticket::releases_heard);
            if let Looking::Waiting { starving_since } = looking {
                stay.looks_as(&token);
                if starving_since.is_some()
                    && let Some(ticket) = &ticket
                    && expecting.is_none()
                {
                    tracing::debug!(keys = ?keys, "waited past the starvation bound; reserving the locks");
                    expecting = Some(ticket.expect(&token));
                }
            }
            let reserves = matches!(
                looking,
                Looking::Waiting {
                    starving_since: Some(_)
                }
            );
            let attempt = self.try_acquire_many(keys, &token, options, looking);
            let (busy, remaining, estimate) = match attempt.await {
                Ok(Attempt::Taken(lease)) => {
                    stay.took();
                    return Ok(lease);
                }
                Ok(Attempt::Busy {
                    key,
                    remaining,
                    estimate,
                }) => (&keys[key], remaining, estimate),
                Err(error) => {
                    // The same token looks again, as a single key's wait does.
                    let pause = looks_again.after(error, &keys[0], give_up, &prefix)?;
                    crate::sync::select! {
                        () = tokio::time::sleep(pause) => continue,
                        () = self.closing.cancelled() => {
                            return Err(LockError::ShutDown { key: keys[0].clone() });
                        }
                    }
                }
            };
            looks_again.busy(estimate);
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LockError::Busy {
                    key: busy.clone(),
                    retry_after: estimate,
                });
            }
            if ticket.as_ref().is_none_or(|ticket| ticket.key() != busy) {
                // Another key keeps it out now: listen on that one's releases (a release that
                // hands every key to this caller is announced on each key's channel).
                expecting = None;
                ticket = None;
                tracing::debug!(key = %busy, "one of the locks is busy; waiting for its release");
                let joined = ticket.insert(self.waits.join(busy, true, prefix.clone()));
                let heard = crate::sync::select! {
                    heard = joined.subscribed(left) => heard,
                    () = self.closing.cancelled() => {
                        return Err(LockError::ShutDown { key: keys[0].clone() });
                    }
                };
                looking = since.looking(true);
                if heard {
                    // Subscribed (and the attempt to come marks the keys): no release can slip
                    // by unheard from now on. Look again.
                    continue;
                }
            }
            looking = since.looking(true);
            let Some(ticket) = &ticket else { continue };
            // A holder that died announces nothing: sleep at most its remaining lease; look
            // again once it has waited too long, to reserve the keys.
            let mut fallback = match remaining {
                Some(remaining) => clock::jittered(remaining, 0.05) + Duration::from_millis(1),
                None => Duration::from_millis(100),
            };
            if !reserves {
                // As a single key's waiter: a look answered after the bound that reserved
                // nothing looks again at once.
                fallback = fallback.min(since.until_starving().unwrap_or_default());
            }
            let left = give_up.saturating_duration_since(Instant::now());
            let _parked = ticket.park(since.starving());
            let handed = async {
                match &expecting {
                    Some(expecting) => expecting.handed().await,
                    None => std::future::pending().await,
                }
            };
            crate::sync::select! {
                () = ticket.released_or(clock::after(Instant::now(), fallback.min(left)), heard) => {}
                () = handed => {}
                () = self.closing.cancelled() => {
                    return Err(LockError::ShutDown { key: keys[0].clone() });
                }
            }
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
