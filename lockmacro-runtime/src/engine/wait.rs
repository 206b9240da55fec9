//! Waiting for a busy lock: parked on a release of the key (announced, or made by this client),
//! offered a hand-over by this client's releases, or looking again when the holder's lease would
//! have run out. A caller that has waited longer than `protocol::STARVING_AFTER` reserves the
//! key at its looks: the key's next release (or hand-over) passes it straight to the
//! longest-waiting such caller, in whichever process it runs, and tells that caller alone. So a
//! busy client cannot keep a key to itself for longer than that bound.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::{Attempt, Looking};
use super::{Engine, Waited, new_token};
use crate::clock;
use crate::error::LockError;
use crate::metrics::Prefix;
use crate::options::{LockKind, LockOptions};
use crate::state::LeaseState;
use crate::store::protocol::STARVING_AFTER;
use crate::store::protocol::hint;
use crate::waiters::{Expecting, Handing, Offer, Ticket};

/// When a waiter began, and when it is owed the lock: the bound of `protocol::STARVING_AFTER`
/// on its own clock, and the wall-clock time its reservation names (of two reservations, the
/// earlier one wins).
#[derive(Debug, Clone, Copy)]
pub(super) struct Since {
    starving_at: Instant,
    wall_millis: u64,
}

impl Since {
    pub(super) fn now(wall: clock::Wall) -> Self {
        Self {
            starving_at: Instant::now() + STARVING_AFTER,
            wall_millis: wall.millis(),
        }
    }

    /// Whether it has waited too long: its looks reserve the key.
    pub(super) fn starving(&self) -> bool {
        Instant::now() >= self.starving_at
    }

    /// How a look of a caller that may reserve the key goes on now.
    pub(super) fn looking(&self, may_reserve: bool) -> Looking {
        Looking::Waiting {
            starving_since: (may_reserve && self.starving()).then_some(self.wall_millis),
        }
    }

    /// How long until it has waited too long, while it has not (a waiter wakes then, to
    /// reserve the key).
    pub(super) fn until_starving(&self) -> Option<Duration> {
        let left = self.starving_at.saturating_duration_since(Instant::now());
        (!left.is_zero()).then_some(left)
    }
}

/// A waiter's stay on keys it looked at while waiting: it may be counted there, have reserved
/// them, or even have been handed them by a release it has not heard of yet. Unless it took the
/// lock ([`took`](Self::took)), it leaves them in the background when dropped (its wait ran out,
/// it failed, or its caller went away).
pub(super) struct Stay<'e> {
    engine: &'e Engine,
    keys: Vec<String>,
    token: Option<String>,
    ttl: Duration,
}

impl<'e> Stay<'e> {
    pub(super) fn new(engine: &'e Engine, keys: &[String], ttl: Duration) -> Self {
        Self {
            engine,
            keys: keys.to_vec(),
            token: None,
            ttl,
        }
    }

    /// The caller looks with `token` while waiting: from now on it has something to leave.
    pub(super) fn looks_as(&mut self, token: &str) {
        if self.token.as_deref() != Some(token) {
            self.leave();
            self.token = Some(token.to_owned());
        }
    }

    /// The caller took the lock: nothing to leave.
    pub(super) fn took(mut self) {
        self.token = None;
    }

    fn leave(&mut self) {
        if let Some(token) = self.token.take() {
            for key in &self.keys {
                self.engine.leave_in_background(key, &token, self.ttl);
            }
        }
    }
}

impl Drop for Stay<'_> {
    fn drop(&mut self) {
        self.leave();
    }
}

/// A waiting call's looks that the deployment failed on something that heals (a connection
/// lost, a failover, an unacknowledged grant, no majority): each is made again after a jittered
/// pause of tens of milliseconds that grows to about a second, inside the wait. What cannot
/// heal (a refused password, a script error, a key that is not a lock) ends the call at once.
pub(super) struct LooksAgain {
    pauses: clock::Backoff,
    /// What the last look the deployment answered said: busy (with `Busy`'s estimate).
    busy: Option<Option<Duration>>,
}

impl LooksAgain {
    pub(super) fn new() -> Self {
        Self {
            pauses: clock::Backoff::new(Duration::from_millis(25), Duration::from_secs(1)),
            busy: None,
        }
    }

    /// A look was answered: the key was busy, with `Busy`'s estimate.
    pub(super) fn busy(&mut self, estimate: Option<Duration>) {
        self.busy = Some(estimate);
        self.pauses.reset();
    }

    /// The pause before looking again after a look failed with `error`; or what ends the call:
    /// the error itself when it cannot heal, else, once the wait ran out at `give_up`, `Busy`
    /// if the deployment last said the key was held, or the error if it never answered.
    pub(super) fn after(
        &mut self,
        error: LockError,
        key: &str,
        give_up: Instant,
        prefix: &Prefix,
    ) -> Result<Duration, LockError> {
        let Some(healing) = error.healing() else {
            return Err(error);
        };
        let left = give_up.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(match self.busy {
                Some(retry_after) => LockError::Busy {
                    key: key.to_owned(),
                    retry_after,
                },
                None => error,
            });
        }
        let pause = self.pauses.next_delay().min(left);
        crate::metrics::looked_again(prefix, healing.label());
        tracing::info!(key = %key, reason = healing.label(), error = %error, retry_in_ms = clock::millis(pause), "the deployment failed a look; looking again within the wait");
        Ok(pause)
    }
}

impl Engine {
    /// Takes `key`, waiting at most `wait` for it.
    pub(super) async fn wait_for(
        &self,
        key: String,
        options: &LockOptions,
        wait: Duration,
    ) -> Result<(Arc<LeaseState>, Waited), LockError> {
        let give_up = clock::after(Instant::now(), wait);
        let since = Since::now(self.wall);
        // Only an exclusive, unfair caller is handed a lock it reserved: readers share a hash,
        // and a fair queue serves its waiters in their order already.
        let may_reserve = options.kind == LockKind::Exclusive && !options.fair;
        // One token for every attempt of this wait: it keeps its place in a fair queue, its
        // claim as a waiting writer and its reservation. Only `Busy` leads to another attempt,
        // and a busy attempt took nothing, so nothing of an earlier attempt can be mistaken for
        // the new lease (a key handed to this token is this caller's: its next look confirms it).
        let mut token = new_token();
        let mut stay = Stay::new(self, std::slice::from_ref(&key), options.ttl);
        let mut ticket: Option<Ticket<'_>> = None;
        let mut expecting: Option<Expecting> = None;
        let mut polls = clock::Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let mut waited = Waited::No;
        // A fair waiter keeps its place in the queue from its first attempt. An exclusive
        // lock's first attempt is a plain `SET NX` (most find the key free, and no earlier
        // attempt of this token left a claim to clear); from its second attempt a writer that
        // waits on readers also keeps new readers out, and a busy key is marked as waited for
        // (its release is announced only then).
        let mut keeps_place = options.fair || options.kind != LockKind::Exclusive;
        // The next look is one made only to reserve the key, after waiting too long; and what
        // the last look that was answered saw.
        let mut reserving_only = false;
        let mut last_seen = (None, None);
        let mut looks_again = LooksAgain::new();
        let prefix = Prefix::of(options.label);
        if options.kind == LockKind::Exclusive && !options.fair && self.waits.anyone_waits(&key) {
            // Others of this client already wait for the key: queue behind them rather than
            // barge in ahead of the waiter a release just woke (a releaser that comes straight
            // back would otherwise take the lock again and again). A release wakes the longest
            // parked first; a short poll covers a queue that has nobody left to release.
            waited = Waited::Yes;
            let joined = ticket.insert(self.waits.join(&key, false, Prefix::of(options.label)));
            let heard = joined.releases_heard();
            let turn = clock::after(Instant::now(), polls.next_delay()).min(give_up);
            let parking = Parking {
                until: turn,
                heard,
                expecting: None,
                starving: false,
            };
            if let Some(lease) = self
                .park(joined, &key, &mut token, options, parking)
                .await?
            {
                return Ok((lease, waited));
            }
            // Subscribed already: an attempt that finds the key busy marks it, so that its
            // holder's release is announced.
            keeps_place = true;
        }
        loop {
            // A release the shutdown sent wakes a waiter too: it must not take the key again.
            self.shut(&key)?;
            let heard = ticket.as_ref().map_or(0, Ticket::releases_heard);
            let looking = match keeps_place {
                true => since.looking(may_reserve),
                false => Looking::Once,
            };
            if let Looking::Waiting { starving_since } = looking {
                stay.looks_as(&token);
                if starving_since.is_some()
                    && let Some(ticket) = &ticket
                    && expecting.is_none()
                {
                    // Heard from before the look that reserves the key: a release may hand it
                    // over the moment the reservation lands.
                    tracing::debug!(key = %key, token_hint = %hint(&token), "waited past the starvation bound; reserving the lock");
                    expecting = Some(ticket.expect(&token));
                }
            }
            // Whether this look reserves the key, or (failing) need not be made again at once.
            let mut reserves = matches!(
                looking,
                Looking::Waiting {
                    starving_since: Some(_)
                }
            );
            let attempt = self.try_acquire(&key, &token, options, looking);
            let (remaining, estimate) = match attempt.await {
                Ok(Attempt::Taken(lease)) => {
                    stay.took();
                    return Ok((lease, waited));
                }
                Ok(Attempt::Busy {
                    remaining,
                    estimate,
                }) => (remaining, estimate),
                // A look made only to reserve the key (nothing was heard of it) that failed
                // costs the waiter nothing: it waits on as it did before that look.
                Err(error) if reserving_only => {
                    tracing::debug!(key = %key, error = %error, "a look to reserve the lock failed; waiting on");
                    reserves = true;
                    last_seen
                }
                Err(error) => {
                    // The same token looks again: a key the failed look took, or handed to
                    // its reservation, is this caller's at its next look. The deployment's undo
                    // of the failed look compares that look's whole value (its time included),
                    // so it never removes what a later look took.
                    let pause = looks_again.after(error, &key, give_up, &prefix)?;
                    waited = Waited::Yes;
                    crate::sync::select! {
                        () = tokio::time::sleep(pause) => continue,
                        () = self.closing.cancelled() => return Err(LockError::ShutDown { key }),
                    }
                }
            };
            looks_again.busy(estimate);
            last_seen = (remaining, estimate);
            keeps_place = true;
            waited = Waited::Yes;
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::debug!(key = %key, token_hint = %hint(&token), "lock still busy when the wait ran out");
                return Err(LockError::Busy {
                    key,
                    retry_after: estimate,
                });
            }
            let ticket = match &ticket {
                Some(ticket) => ticket,
                None => {
                    tracing::debug!(key = %key, token_hint = %hint(&token), "lock busy; waiting for its release");
                    // Readers can all go in at once, and a fair queue's head may be anyone:
                    // every such waiter looks at each release, not just one.
                    let everyone = options.fair || options.kind != LockKind::Exclusive;
                    let prefix = Prefix::of(options.label);
                    let joined = ticket.insert(self.waits.join(&key, everyone, prefix));
                    let heard = crate::sync::select! {
                        heard = joined.subscribed(left) => heard,
                        () = self.closing.cancelled() => return Err(LockError::ShutDown { key }),
                    };
                    if heard {
                        // Subscribed: no release can slip by unheard from now on. Look again.
                        continue;
                    }
                    joined
                }
            };
            // A holder that died announces nothing: sleep at most its remaining lease.
            let mut fallback = match remaining {
                Some(remaining) => clock::jittered(remaining, 0.05) + Duration::from_millis(1),
                None => polls.next_delay(),
            };
            if options.fair {
                // Come back well within the time a place in the fair queue is kept.
                fallback = fallback.min(options.ttl.max(Duration::from_secs(1)) / 3);
            }
            let mut wakes_to_reserve = false;
            if may_reserve && !reserves {
                // Look again once it has waited too long: that look reserves the key. A look
                // sent before the bound and answered after it reserved nothing: look again at
                // once (a busy client may hand the key around inside itself, announcing
                // nothing, for as long as the holder's lease).
                let until = since.until_starving().unwrap_or_default();
                wakes_to_reserve = until <= fallback;
                fallback = fallback.min(until);
            }
            let parking = Parking {
                until: clock::after(Instant::now(), fallback).min(give_up),
                heard,
                expecting: expecting.as_ref(),
                starving: may_reserve && since.starving(),
            };
            let parked = self.park(ticket, &key, &mut token, options, parking);
            if let Some(lease) = parked.await? {
                stay.took();
                return Ok((lease, waited));
            }
            reserving_only = wakes_to_reserve && ticket.releases_heard() == heard;
            if expecting
                .as_ref()
                .is_some_and(|expecting| !expecting.is_for(&token))
            {
                // The token changed (a hand-over that got no answer): expect the new one.
                expecting = Some(ticket.expect(&token));
            }
        }
    }

    /// Waits for a release of the key (heard since `parking.heard`), at most its fallback, or
    /// for an announcement that the key was handed to this caller. A waiter that asks for
    /// nothing but the exclusive lock also offers to be handed it by a release of this client,
    /// saving the release's announcement and its own `SET`: `Some` is the lease handed to it. A
    /// hand-over that got no answer leaves `token` given up and replaced. `ShutDown` when the
    /// client shuts down.
    async fn park(
        &self,
        ticket: &Ticket<'_>,
        key: &str,
        token: &mut String,
        options: &LockOptions,
        parking: Parking<'_>,
    ) -> Result<Option<Arc<LeaseState>>, LockError> {
        let takes_hand_over = options.kind == LockKind::Exclusive
            && !options.fair
            && !options.fencing
            && self.store.hands_over().is_some();
        let _parked = ticket.park(parking.starving);
        let mut offer = takes_hand_over.then(|| {
            tracing::debug!(key = %key, token_hint = %hint(token), "parked until the lock is released or handed to this caller");
            ticket.offer(token, options)
        });
        let handed_elsewhere = async {
            match parking.expecting {
                Some(expecting) => expecting.handed().await,
                None => std::future::pending().await,
            }
        };
        let mut handed_elsewhere = std::pin::pin!(handed_elsewhere);
        loop {
            let settled = crate::sync::select! {
                () = ticket.released_or(parking.until, parking.heard) => None,
                () = &mut handed_elsewhere => {
                    tracing::debug!(key = %key, token_hint = %hint(token), "the lock was handed to this caller by a release");
                    None
                }
                handing = Offer::settled(&mut offer) => Some(handing),
                () = self.closing.cancelled() => {
                    return Err(LockError::ShutDown { key: key.to_owned() });
                }
            };
            let handing = match (settled, offer.take()) {
                (Some(handing), _) => handing,
                (None, None) => return Ok(None),
                // News came (a release, or the key handed to this caller): a release that
                // declined the offer meanwhile is that news, or older; look again. (The
                // hand-over announcement, once heard, is not awaited again.)
                (None, Some(offer)) => match offer.withdraw().await {
                    None | Some(Handing::Declined) => return Ok(None),
                    Some(handing) => handing,
                },
            };
            match handing {
                Handing::Handed(right) => return Ok(Some(right.surrender())),
                Handing::Look => return Ok(None),
                // Wait for the announcement of that release (or the fallback).
                Handing::Declined => {}
                Handing::Uncertain => {
                    self.give_up_token(key, token, options.ttl);
                    *token = new_token();
                    return Ok(None);
                }
            }
        }
    }

    /// Gives back, in the background, whatever `token` may hold of `key`: a token a hand-over
    /// may have put there without either side learning it. No work ran under it, so the key is
    /// freed whatever `hold_at_least` says; `ttl` bounds the tries.
    pub(super) fn give_up_token(&self, key: &str, token: &str, ttl: Duration) {
        self.leave_in_background(key, token, ttl);
    }
}

/// How a waiter parks.
struct Parking<'a> {
    /// When it wakes without news: its fallback, or the end of its wait. A hand-over declined
    /// meanwhile does not push it back.
    until: Instant,
    /// The releases heard before its last look.
    heard: u64,
    /// It reserved the key: an announcement that the key was handed to it wakes it.
    expecting: Option<&'a Expecting>,
    /// It waited too long: one that reserves the key at each look.
    starving: bool,
}
