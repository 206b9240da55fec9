//! Waiting for a busy lock: parked on a release of the key (announced, or made by this client),
//! offered a hand-over by this client's releases, or looking again when the holder's lease would
//! have run out. A caller that has waited longer than `protocol::RESERVE_AFTER` reserves the
//! key at its looks: the key's next release (or hand-over) passes it straight to the
//! longest-waiting such caller, in whichever process it runs, and tells that caller alone. So a
//! busy client cannot keep a key to itself for longer than that bound.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::{Attempt, Busy, Looking};
use super::{Engine, Waited, new_token};
use crate::clock;
use crate::error::{Healing, LockError, LostReason};
use crate::metrics::Prefix;
use crate::options::{LockOptions, WaitPolicy};
use crate::state::LeaseState;
use crate::store::protocol::RESERVE_AFTER;
use crate::store::protocol::hint;
use crate::waiters::{Handing, Offer, Reservation, Ticket};

/// When a waiter began, and when the lock is reserved for it: the bound of
/// `protocol::RESERVE_AFTER` on its own clock, and the wall-clock time its reservation names
/// (of two reservations, the earlier one wins).
#[derive(Debug, Clone, Copy)]
pub(super) struct Since {
    reserving_at: Instant,
    wall_millis: u64,
}

impl Since {
    pub(super) fn now(wall: clock::Wall) -> Self {
        Self {
            reserving_at: Instant::now() + RESERVE_AFTER,
            wall_millis: wall.millis(),
        }
    }

    /// Whether it has waited too long: its looks reserve the key.
    pub(super) fn reserving(&self) -> bool {
        Instant::now() >= self.reserving_at
    }

    /// How a look of a caller that may reserve the key goes on now.
    pub(super) fn looking(&self, may_reserve: bool) -> Looking {
        Looking::Waiting {
            reserving_since: (may_reserve && self.reserving()).then_some(self.wall_millis),
        }
    }

    /// How long until it has waited too long, while it has not (a waiter wakes then, to
    /// reserve the key).
    pub(super) fn until_reserving(&self) -> Option<Duration> {
        let left = self.reserving_at.saturating_duration_since(Instant::now());
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
    pub(super) fn took(&mut self) {
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

    /// The caller was woken by news during a pause: the next failure pauses as the first did.
    pub(super) fn woken(&mut self) {
        self.pauses.reset();
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
        self.pause(healing, error, key, give_up, prefix)
    }

    /// As [`after`](Self::after), for a look that failed in a way that heals: `error` is what
    /// ends the call when the wait has run out and the deployment never said the key was busy.
    pub(super) fn pause(
        &mut self,
        healing: Healing,
        error: LockError,
        key: &str,
        give_up: Instant,
        prefix: &Prefix,
    ) -> Result<Duration, LockError> {
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
    /// Takes every key of `keys` (one, or a list), waiting at most `wait` for them.
    pub(super) async fn wait_for(
        &self,
        keys: &[String],
        options: &LockOptions,
        wait: Duration,
    ) -> Result<(Arc<LeaseState>, Waited), LockError> {
        Waiter::new(self, keys, options, wait).wait().await
    }

    /// Gives back, in the background, whatever `token` may hold of `key`: a token a hand-over
    /// may have put there without either side learning it. No work ran under it, so the key is
    /// freed whatever `hold_at_least` says; `ttl` bounds the tries.
    pub(super) fn give_up_token(&self, key: &str, token: &str, ttl: Duration) {
        self.leave_in_background(key, token, ttl);
    }
}

/// A caller waiting for a busy lock, on one key or a list: the same loop for both, which differ
/// only in how they look (`Engine::try_acquire_keys`) and in their [`WaitPolicy`].
///
/// It looks; when busy, it listens on this client's queue of the key that kept it out (and
/// subscribes to that key's releases), then parks until a release is heard, the key is handed
/// to it, or its fallback: the holder's lease running out (a holder that died announces
/// nothing), or the moment it has waited too long and its next look reserves the key.
struct Waiter<'e> {
    engine: &'e Engine,
    keys: &'e [String],
    options: &'e LockOptions,
    policy: WaitPolicy,
    prefix: Prefix,
    give_up: Instant,
    since: Since,
    /// The key was reserved for this caller by a look: an announcement that it was handed to
    /// the caller wakes it. (Dropped before the ticket it was taken from.)
    reservation: Option<Reservation>,
    /// This client's queue of the key that kept the caller out at its last look.
    ticket: Option<Ticket<'e>>,
    /// It waited for the ticket's subscription once: a ticket taken during a pause after a
    /// failed look was not, as the deployment was failing.
    listened: bool,
    stay: Stay<'e>,
    /// One token for every look of this wait: it keeps its place in a fair queue, its claim as
    /// a waiting writer and its reservation. A busy look took nothing, and a look that failed
    /// is undone by the deployment comparing its whole value, so nothing of an earlier look is
    /// mistaken for the new lease (a key handed to this token is this caller's: its next look
    /// confirms it). Replaced only after a hand-over that got no answer.
    token: String,
    /// The time in the value of its last look (ms): each look's value is later (see
    /// `Engine::value_of`).
    last_ms: u64,
    /// Its looks keep its place: every look after the first, or the first with
    /// [`WaitPolicy::keeps_place_at_once`].
    keeps_place: bool,
    /// The next look is made only to reserve the key, nothing having been heard of it: failing,
    /// it costs nothing, and the caller waits on as before.
    reserving_only: bool,
    /// What the last look that was answered saw.
    last_busy: Busy,
    polls: clock::Backoff,
    looks_again: LooksAgain,
    waited: Waited,
}

impl<'e> Waiter<'e> {
    fn new(
        engine: &'e Engine,
        keys: &'e [String],
        options: &'e LockOptions,
        wait: Duration,
    ) -> Self {
        let policy = options.wait_policy(keys.len());
        Self {
            engine,
            keys,
            options,
            policy,
            prefix: Prefix::of(options.label),
            give_up: clock::after(Instant::now(), wait),
            since: Since::now(engine.wall),
            reservation: None,
            ticket: None,
            listened: false,
            stay: Stay::new(engine, keys, options.ttl),
            token: new_token(),
            last_ms: 0,
            keeps_place: policy.keeps_place_at_once,
            reserving_only: false,
            last_busy: Busy {
                key: 0,
                remaining: None,
                estimate: None,
            },
            polls: clock::Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
            looks_again: LooksAgain::new(),
            waited: Waited::No,
        }
    }

    async fn wait(mut self) -> Result<(Arc<LeaseState>, Waited), LockError> {
        if !self.policy.wakes_everyone && self.engine.waits.anyone_waits(&self.keys[0]) {
            // Others of this client already wait for the key: queue behind them rather than
            // barge in ahead of the waiter a release just woke (a releaser that comes straight
            // back would otherwise take the lock again and again). A release wakes the longest
            // parked first; a short poll covers a queue that has nobody left to release.
            if let Some(lease) = self.queue_behind().await? {
                return Ok((lease, self.waited));
            }
        }
        loop {
            // A release the shutdown sent wakes a waiter too: it must not take the key again.
            self.engine.shut(&self.keys[0])?;
            let heard = self.ticket.as_ref().map_or(0, Ticket::releases_heard);
            let looking = self.looking();
            // Whether this look reserves the key, or (failing) need not be made again at once.
            let mut reserves = matches!(
                looking,
                Looking::Waiting {
                    reserving_since: Some(_)
                }
            );
            let (value, ms) = self.engine.value_of(&self.token, self.last_ms);
            self.last_ms = ms;
            let look = self
                .engine
                .try_acquire_keys(self.keys, value, self.options, looking);
            let busy = match look.await {
                Ok(Attempt::Taken(lease)) if lease.time_left().is_zero() => {
                    self.late(&lease)?;
                    continue;
                }
                Ok(Attempt::Taken(lease)) => return Ok(self.took(lease)),
                Ok(Attempt::Busy(busy)) => busy,
                Err(error) if self.reserving_only => {
                    tracing::debug!(key = %self.keys[0], error = %error, "a look to reserve the lock failed; waiting on");
                    reserves = true;
                    self.last_busy
                }
                Err(error) => {
                    // The same token looks again: a key the failed look took, or handed to
                    // its reservation, is this caller's at its next look.
                    self.pause_after(error, heard).await?;
                    continue;
                }
            };
            self.looks_again.busy(busy.estimate);
            self.last_busy = busy;
            self.keeps_place = true;
            self.waited = Waited::Yes;
            let left = self.give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let key = &self.keys[busy.key];
                tracing::debug!(key = %key, token_hint = %hint(&self.token), "lock still busy when the wait ran out");
                return Err(LockError::Busy {
                    key: key.clone(),
                    retry_after: busy.estimate,
                });
            }
            if !self.listens_on(busy.key) && self.listen(busy.key, left).await? {
                // Subscribed, and its looks keep its place from now on: no release can slip
                // by unheard. Look again.
                continue;
            }
            let (until, wakes_to_reserve) = self.fallback(busy.remaining, reserves);
            let parking = Parking {
                until,
                heard,
                reserving: self.policy.reserves && self.since.reserving(),
            };
            if let Some(lease) = self.park(parking).await? {
                return Ok(self.took(lease));
            }
            let Some(ticket) = &self.ticket else {
                continue;
            };
            self.reserving_only = wakes_to_reserve && ticket.releases_heard() == heard;
            if self
                .reservation
                .as_ref()
                .is_some_and(|reservation| !reservation.is_for(&self.token))
            {
                // The token changed (a hand-over that got no answer): expect the new one.
                self.reservation = Some(ticket.reservation(&self.token, self.since.wall_millis));
            }
        }
    }

    /// How its next look goes on; a look that keeps its place leaves something behind (see
    /// [`Stay`]), and one that reserves the key may have it handed over the moment the
    /// reservation lands: the caller expects that from before the look.
    fn looking(&mut self) -> Looking {
        if !self.keeps_place {
            return Looking::Once;
        }
        let looking = self.since.looking(self.policy.reserves);
        self.stay.looks_as(&self.token);
        if let Looking::Waiting {
            reserving_since: Some(_),
        } = looking
            && let Some(ticket) = &self.ticket
            && self.reservation.is_none()
        {
            tracing::debug!(key = %ticket.key(), token_hint = %hint(&self.token), "waited past the starvation bound; reserving the lock");
            self.reservation = Some(ticket.reservation(&self.token, self.since.wall_millis));
        }
        looking
    }

    /// The lease it took: nothing is left to leave.
    fn took(&mut self, lease: Arc<LeaseState>) -> (Arc<LeaseState>, Waited) {
        self.stay.took();
        (lease, self.waited)
    }

    /// Pauses after a look the deployment failed, or ends the call (see [`LooksAgain`]). A
    /// release heard since `heard` (read before that look) ends the pause early: the deployment
    /// answers again, and the key may be free.
    async fn pause_after(&mut self, error: LockError, heard: u64) -> Result<(), LockError> {
        let key = &self.keys[0];
        let pause = (self.looks_again).after(error, key, self.give_up, &self.prefix)?;
        self.pause(pause, heard).await
    }

    /// A grant confirmed only after its lease's local deadline: its work must not start, as the
    /// lease may have lapsed. The caller gives the keys back in the background (announced, so
    /// that nobody sleeps on a key it no longer wants) and looks again at once with a new
    /// token, so that the give-back cannot remove what its next look takes. Each such look
    /// costs the slow round trip that made the grant late; the call ends `Lost` if its wait ran
    /// out.
    fn late(&mut self, lease: &LeaseState) -> Result<(), LockError> {
        self.engine.renewals.deregister(lease.id);
        let lost = LockError::Lost {
            key: lease.key.clone(),
            reason: LostReason::Unconfirmed,
        };
        let key = &self.keys[0];
        (self.looks_again).pause(Healing::Late, lost, key, self.give_up, &self.prefix)?;
        let late = std::mem::replace(&mut self.token, new_token());
        self.stay.looks_as(&late);
        self.stay.looks_as(&self.token);
        self.reservation = None;
        self.waited = Waited::Yes;
        Ok(())
    }

    /// Sleeps `pause`, or less if a release of the key is heard since `heard`. A caller whose
    /// first look failed joins the key's queue now: its subscription is made once the
    /// deployment answers again, and a release heard then ends the pause.
    async fn pause(&mut self, pause: Duration, heard: u64) -> Result<(), LockError> {
        self.waited = Waited::Yes;
        let until = clock::after(Instant::now(), pause);
        let heard = match self.ticket {
            Some(_) => heard,
            None => {
                let keys = self.keys;
                self.join(&keys[0]).releases_heard()
            }
        };
        let ticket = self.ticket.as_ref();
        let released = async {
            match ticket {
                Some(ticket) => ticket.released_or(until, heard).await,
                None => tokio::time::sleep_until(until).await,
            }
        };
        crate::sync::select! {
            () = released => {}
            () = self.engine.closing.cancelled() => {
                return Err(LockError::ShutDown { key: self.keys[0].clone() });
            }
        }
        if Instant::now() < until {
            // Woken by news: a look that fails now starts its pauses over, rather than
            // doubling them for each wake-up (they would reach a second while the deployment
            // answers again, and a free key whose release was heard before would wait that).
            self.looks_again.woken();
        }
        Ok(())
    }

    /// Joins this client's queue of the key at `key` (leaving any other), and waits at most
    /// `left` for its releases to be heard: `true` when they are.
    async fn listen(&mut self, key: usize, left: Duration) -> Result<bool, LockError> {
        let (engine, keys) = (self.engine, self.keys);
        let key = &keys[key];
        tracing::debug!(key = %key, token_hint = %hint(&self.token), "lock busy; waiting for its release");
        self.listened = true;
        let ticket = self.join(key);
        crate::sync::select! {
            heard = ticket.subscribed(left) => Ok(heard),
            () = engine.closing.cancelled() => Err(LockError::ShutDown { key: keys[0].clone() }),
        }
    }

    /// Whether it listens on the queue of the key at `key` already, and hears its releases. A
    /// subscription lost (a failover, say) is asked for again by the first look answered after
    /// it, rather than at the listener's next reopening, up to a second later.
    fn listens_on(&mut self, key: usize) -> bool {
        let Some(ticket) = self.ticket.as_ref().filter(|t| t.key() == self.keys[key]) else {
            return false;
        };
        if self.listened && !ticket.hears() {
            ticket.resubscribe();
            self.listened = false;
        }
        self.listened
    }

    /// This client's queue of `key`: the ticket it has, or a new one in place of any other.
    fn join(&mut self, key: &str) -> &Ticket<'e> {
        if self
            .ticket
            .as_ref()
            .is_some_and(|ticket| ticket.key() != key)
        {
            self.reservation = None;
            self.ticket = None;
        }
        let (waits, everyone) = (&self.engine.waits, self.policy.wakes_everyone);
        (self.ticket).get_or_insert_with(|| waits.join(key, everyone, self.prefix.clone()))
    }

    /// Parks first, behind this client's other waiters for the key.
    async fn queue_behind(&mut self) -> Result<Option<Arc<LeaseState>>, LockError> {
        self.waited = Waited::Yes;
        let joined = (self.engine.waits).join(&self.keys[0], false, self.prefix.clone());
        let heard = self.ticket.insert(joined).releases_heard();
        self.listened = true;
        let turn = clock::after(Instant::now(), self.polls.next_delay()).min(self.give_up);
        let parking = Parking {
            until: turn,
            heard,
            reserving: false,
        };
        let lease = self.park(parking).await?;
        // Subscribed already: a look that finds the key busy marks it, so that its holder's
        // release is announced.
        self.keeps_place = true;
        Ok(lease)
    }

    /// When it wakes without news, and whether that is to reserve the key: a look that would
    /// have reserved it (`reserves`) or that comes after it must not.
    fn fallback(&mut self, remaining: Option<Duration>, reserves: bool) -> (Instant, bool) {
        // A holder that died announces nothing: sleep at most its remaining lease.
        let mut fallback = match remaining {
            Some(remaining) => clock::jittered(remaining, 0.05) + Duration::from_millis(1),
            None => self.polls.next_delay(),
        };
        if self.options.fair {
            // Come back well within the time a place in the fair queue is kept.
            fallback = fallback.min(self.options.ttl.max(Duration::from_secs(1)) / 3);
        }
        let mut wakes_to_reserve = false;
        if self.policy.reserves && !reserves {
            // Look again once it has waited too long: that look reserves the key. A look sent
            // before the bound and answered after it reserved nothing: look again at once (a
            // busy client may hand the key around inside itself, announcing nothing, for as
            // long as the holder's lease).
            let until = self.since.until_reserving().unwrap_or_default();
            #[cfg(feature = "sim")]
            crate::world::sometimes_if(until.is_zero(), "a look straddled the starvation bound");
            wakes_to_reserve = until <= fallback;
            fallback = fallback.min(until);
        }
        let until = clock::after(Instant::now(), fallback).min(self.give_up);
        (until, wakes_to_reserve)
    }

    /// Waits for a release of the key (heard since `parking.heard`), at most until
    /// `parking.until`, or for an announcement that the key was handed to this caller. A waiter
    /// that [takes hand-overs](WaitPolicy::takes_hand_over) also offers to be handed the key by
    /// a release of this client, saving the release's announcement and its own look: `Some` is
    /// the lease handed to it. A hand-over that got no answer leaves its token given up and
    /// replaced. `ShutDown` when the client shuts down.
    async fn park(&mut self, parking: Parking) -> Result<Option<Arc<LeaseState>>, LockError> {
        let Some(ticket) = &self.ticket else {
            return Ok(None);
        };
        let engine = self.engine;
        let key = ticket.key();
        let takes_hand_over = self.policy.takes_hand_over && engine.store.hands_over().is_some();
        let _parked = ticket.park(parking.reserving);
        let mut offer = takes_hand_over.then(|| {
            tracing::debug!(key = %key, token_hint = %hint(&self.token), "parked until the lock is released or handed to this caller");
            ticket.offer(&self.token, self.last_ms, self.options)
        });
        let reservation = &self.reservation;
        let handed = async {
            match reservation {
                Some(reservation) => reservation.handed().await,
                None => std::future::pending().await,
            }
        };
        let mut handed = std::pin::pin!(handed);
        loop {
            let settled = crate::sync::select! {
                () = ticket.released_or(parking.until, parking.heard) => None,
                () = &mut handed => {
                    tracing::debug!(key = %key, token_hint = %hint(&self.token), "the lock was handed to this caller by a release");
                    None
                }
                handing = Offer::settled(&mut offer) => Some(handing),
                () = engine.closing.cancelled() => {
                    return Err(LockError::ShutDown { key: self.keys[0].clone() });
                }
            };
            let handing = match (settled, offer.take()) {
                (Some(handing), _) => handing,
                (None, None) => return Ok(None),
                // News came (a release, or the key handed to this caller): a release that
                // declined the offer meanwhile is that news, or older; look again. (The
                // hand-over announcement, once heard, is not awaited again.)
                (None, Some(offer)) => match offer.withdraw().await {
                    None | Some(Handing::Declined | Handing::Passed) => return Ok(None),
                    Some(handing) => handing,
                },
            };
            match handing {
                Handing::Handed(right) => return Ok(Some(right.surrender())),
                Handing::Look => return Ok(None),
                // Wait for the announcement of that release (or the fallback).
                Handing::Declined => {}
                // First in line again for the next hand-over.
                Handing::Passed => {
                    offer = Some(ticket.offer_first(&self.token, self.last_ms, self.options))
                }
                Handing::Uncertain => {
                    engine.give_up_token(key, &self.token, self.options.ttl);
                    self.token = new_token();
                    return Ok(None);
                }
            }
        }
    }
}

/// How a waiter parks.
struct Parking {
    /// When it wakes without news: its fallback, or the end of its wait. A hand-over declined
    /// meanwhile does not push it back.
    until: Instant,
    /// The releases heard before its last look.
    heard: u64,
    /// It waited too long: one that reserves the key at each look.
    reserving: bool,
}
