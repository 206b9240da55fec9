//! Locks in the process: the deployment behind `LockClient::in_memory()` (feature `test-util`),
//! for users' own tests.
//!
//! It keeps Redis's semantics, not a toy's: a lease is a key with a value and an expiry, taken
//! only when free, extended only while it holds our value, released by compare-and-delete with
//! an announcement when a waiter marked it or someone listens for its releases (as the scripts
//! do), or handed straight to the caller it is reserved for, or to the next waiter of the same
//! client (a hand-over, as Redis's), expiring silently (as Redis keys do) when its time is up.
//! Waiting callers are counted and served as the scripts count and serve them, and data that is
//! no lock ([`MemoryHooks::put_foreign`]) is never written. Fencing tokens follow the clock floor
//! of `protocol::fencing_floor`, as Redis's do. Time is tokio's clock, so under
//! `#[tokio::test(start_paused = true)]` a test crosses a 30 s lease in milliseconds.
//! [`MemoryHooks`] provokes what is rare against a real Redis, and shows what is stored and
//! announced.
//!
//! # Beside the scripts
//!
//! Each Lua script of the Redis deployments (`store/scripts/`) is one function of `Data` here,
//! run under the store's lock as Redis runs a script, alone and at one `now`
//! (`MemoryStore::run`); the scripts' helpers keep their names. So a change to a script has its
//! twin here, found by name, and `tests/differential.rs` holds the two against each other:
//!
//! | Lua | Rust |
//! |---|---|
//! | `acquire.lua` | `Data::acquire`, taking through `Data::take` |
//! | … its `queue_head`, `busy`, `free_in` | `Data::queue_head`, `Data::busy`, `Held::remaining` |
//! | … the writers' claims (`ZADD`, `ZCARD`) | `Data::writers`, `Data::writer_waits` |
//! | `acquire_many.lua` | `Data::acquire_many` |
//! | `extend.lua` | `Data::extend` |
//! | `release_plain.lua`, `release.lua`, `release_shared.lua` | `Data::release` |
//! | … `kept` (a `hold_at_least` that runs), `free` | `Data::keep`, `Data::free` |
//! | `release_many.lua`, its `reserved_all_here` | `Data::release_many`, `reserved_all_here` |
//! | `hand_over.lua` | `Data::hand_over` |
//! | the scripts' `SET key {reserved}+ PX {ttl}` (a key handed to a reservation) | `Data::hand_to` |
//! | `leave.lua` | `Data::leave` |
//! | `watch.lua` | `Data::watch` |
//! | `force_release.lua` | `Data::force_release` |
//! | `inspect.lua` | `Data::inspect` |
//! | `values.lua`: `look_at` | `Data::foreign`, `Data::live`, `Data::watched` |
//! | … `token_of`, `parts` | `protocol::holder_token`; `Held::Exclusive`'s `waited`, `reserved` |
//! | … `before`, `mark` | `Reserved::before`, `Held::mark` |
//! | … `later_attempt` | `protocol::is_later_attempt` |
//! | `waiters.lua`: `count_waiter`, `served`, `estimate`, `forget_when_idle`, `others_waiting` | `Data::` the same |
//! | … `unreserve`; acquire.lua's `reserve`, `standing` | `Waiters::unreserve`; `Data::reserve` |
//! | `reservations.lua`: `reservations`, `queued`, `requeue`; `drop_reservation`, `unrecorded` | `Waiters::reserved`, `more`; `Waiters::` the same |
//! | release.lua's and release_shared.lua's naming of the caller a key is reserved for | `Data::reserver` |
//! | … the hash's expiry | `Waiters::expires`, read by `Data::waiters_of` |
//! | `holders.lua`: `live_holders` | `Data::live` |
//! | `PUBLISH`, `SPUBLISH` | `Data::publish` |
//!
//! What the scripts keep beside a lock key lives in `Data`'s maps of the same names: the fencing
//! counter (`fences`), the watch's mark (`watched`), the fair queue (`queues`), the writers
//! waiting (`writers`) and the callers waiting (`waiters`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::inspect::SCAN_COUNT;
use super::protocol;
use super::{
    AcquireRequest, Acquired, AcquiredMany, BoxFuture, Cursor, HandOver, HandsOver, LeaseRef,
    ManyRequest, Page, ReleaseFeed, Released, Renewal, Snapshot, Store, StoreError,
};
use crate::clock;
use crate::error::LostReason;
use crate::health::{Health, NodeHealth, NodeRole};
use crate::options::LockKind;
use crate::sync::{Map, Set};

/// One store: clones share it.
#[derive(Clone, Default)]
pub(crate) struct MemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    data: Mutex<Data>,
    /// Releases, for the waiters' feeds.
    releases: broadcast::Sender<Released>,
    /// Operations still to fail, set by [`MemoryHooks::fail_next`].
    failing: AtomicU32,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            data: Mutex::default(),
            releases: broadcast::channel(1024).0,
            failing: AtomicU32::new(0),
        }
    }
}

#[derive(Default)]
struct Data {
    locks: Map<String, Held>,
    /// The last fencing token handed out per key: kept for the store's life, so tokens only grow.
    fences: Map<String, u64>,
    /// How many feeds listen for releases of each key.
    listeners: Map<String, usize>,
    /// Keys a watch follows, each until its mark lapses (`protocol::WATCH_MARK_LIFE`).
    watched: Map<String, Instant>,
    /// Fair queues: waiting tokens in arrival order, each with the time its place lapses.
    queues: Map<String, VecDeque<(String, Instant)>>,
    /// Writers waiting for readers to leave, each until its claim lapses.
    writers: Map<String, Map<String, Instant>>,
    /// The callers waiting for each key, by token, each until its entry lapses; and how fast
    /// they were served (as the scripts' waiters hash and its `served` field).
    waiters: Map<String, Waiters>,
    /// What the operation running now announced, in order: sent once it ends, still under the
    /// lock, so that feeds hear the operations' announcements in the order they ran.
    published: Vec<Released>,
    /// Who else hears each key's announcements ([`MemoryHooks::announcements`]).
    recorders: Map<String, Vec<mpsc::Sender<String>>>,
}

/// The callers waiting for one key (see `protocol::Names::waiters`).
#[derive(Default)]
struct Waiters {
    entries: Map<String, Instant>,
    /// The last caller served, and the mean time between two (`None` after the first).
    served: Option<(Instant, Option<Duration>)>,
    /// The reservations of the key for callers of it alone that waited too long, in the order
    /// they go (the hash's `reserved` field, the first, and `reserved_next`, the rest; see
    /// reservations.lua): one stands while its caller is counted, and the free key waits for the
    /// first that stands; when the first is served or leaves, the next moves up.
    reserved: Vec<Reserved>,
    /// A caller past the bound went unrecorded (beyond [`RESERVATIONS_KEPT`]; the hash's
    /// `reserved_more`): the next reservation served is announced, and it looks again.
    more: bool,
    /// When the scripts' hash expires: with its longest-lived entry, or a while after the
    /// callers left ([`WAITERS_IDLE_LIFE`]); `None` before anything was counted.
    expires: Option<Instant>,
}

impl Waiters {
    /// waiters.lua's `unreserve`: `token`'s reservation leaves, and the next one moves up (it is
    /// returned).
    fn unreserve(&mut self, token: &str) -> Option<Reserved> {
        self.drop_reservation(|r| r.token() == token)
    }

    /// reservations.lua's `drop_reservation`: the reservation `owns` picks leaves; when it was
    /// the first, the next one moves up, and is returned.
    fn drop_reservation(&mut self, owns: impl Fn(&Reserved) -> bool) -> Option<Reserved> {
        let at = self.reserved.iter().position(owns)?;
        self.reserved.remove(at);
        self.more &= !self.reserved.is_empty();
        (at == 0).then(|| self.reserved.first().cloned()).flatten()
    }

    /// reservations.lua's `unrecorded`: whether a caller past the bound went unrecorded, which
    /// is forgotten.
    fn unrecorded(&mut self) -> bool {
        std::mem::take(&mut self.more)
    }
}

/// How many reservations a key's waiters keep (reservations.lua's `RESERVATIONS_KEPT`).
const RESERVATIONS_KEPT: usize = 16;

/// How long the callers waiting for a key are remembered once nobody is counted (waiters.lua's
/// `forget_when_idle`): a burst that follows at once finds how fast the last one was served.
const WAITERS_IDLE_LIFE: Duration = Duration::from_secs(1);

/// What a lock key holds: one exclusive holder, or shared holders each with its own expiry; or
/// data of another application ([`MemoryHooks::put_foreign`]).
enum Held {
    Exclusive {
        /// The holder's value.
        value: String,
        expires: Instant,
        /// A caller that waits found it busy, or others were counted waiting when it was
        /// taken (Redis's value carries the waited mark): then
        /// its release is announced, as in Redis, even when nobody listens any more.
        waited: bool,
        /// The caller reservation it, when one waited too long: its release hands it over.
        reserved: Option<Reserved>,
    },
    Shared {
        kind: LockKind,
        /// Each holder's value, and its expiry.
        holders: Map<String, Instant>,
    },
    /// Not a lock: what the key holds, as `NotALock` names it.
    Foreign(String),
}

/// A reservation ([`protocol::Reservation`]).
#[derive(Clone)]
struct Reserved {
    since_ms: u64,
    ttl: Duration,
    keys: usize,
    value: String,
}

impl Reserved {
    /// What a request that has waited too long reserves, if anything: only an exclusive,
    /// unfair one.
    fn of(request: &AcquireRequest<'_>) -> Option<Self> {
        let since_ms = request.reserving_since?;
        (request.kind == LockKind::Exclusive && !request.fair).then(|| Self {
            since_ms,
            ttl: request.ttl,
            keys: 1,
            value: request.value.to_owned(),
        })
    }

    /// As values.lua's `before`: whether it goes before `other`, being of this key alone while
    /// `other` is of several, or else having begun waiting earlier (ties: the smaller token).
    fn before(&self, other: &Self) -> bool {
        self.rank() < other.rank()
    }

    fn rank(&self) -> (bool, u64, &str) {
        (self.keys != 1, self.since_ms, self.token())
    }

    fn token(&self) -> &str {
        protocol::holder_token(&self.value)
    }

    /// As the scripts write it after the waiter's mark (`protocol::Reservation`).
    fn stored(&self) -> String {
        let separator = protocol::RESERVATION_SEPARATOR;
        format!(
            "{}{separator}{}{separator}{}{separator}{}",
            self.since_ms,
            clock::millis(self.ttl),
            self.keys,
            self.value
        )
    }
}

impl Held {
    /// Whether it is an exclusive lock of `token` (values.lua's `token_of(v) == token`).
    fn of_token(&self, token: &str) -> bool {
        matches!(self, Self::Exclusive { value, .. } if protocol::holds(value, token))
    }

    /// When it is free: its holder's expiry, or its last holder's; never for foreign data.
    fn expires(&self) -> Option<Instant> {
        match self {
            Self::Exclusive { expires, .. } => Some(*expires),
            Self::Shared { holders, .. } => holders.values().copied().max(),
            Self::Foreign(_) => None,
        }
    }

    /// As acquire.lua's `free_in`: how long until it is free, as the scripts tell a caller
    /// (`None`: never).
    fn remaining(&self, now: Instant) -> Option<Duration> {
        self.expires().map(|at| at.saturating_duration_since(now))
    }

    /// As values.lua's `mark`: a caller that waits marks an exclusive holder, and one that
    /// waited too long reserves it, unless a caller that began waiting earlier did.
    fn mark(&mut self, reservation: Option<Reserved>) {
        if let Self::Exclusive {
            waited, reserved, ..
        } = self
        {
            *waited = true;
            if let Some(reservation) = reservation
                && reserved
                    .as_ref()
                    .is_none_or(|reserved| reservation.before(reserved))
            {
                *reserved = Some(reservation);
            }
        }
    }
}

/// values.lua: what a key holds, and the marks on it.
impl Data {
    /// `look_at`'s `foreign`: `NotALock` when `key` holds data of another application.
    fn foreign(&self, key: &str) -> Result<(), StoreError> {
        match self.locks.get(key) {
            Some(Held::Foreign(found)) => Err(StoreError::from(crate::LockError::NotALock {
                key: key.to_owned(),
                found: found.clone(),
            })),
            _ => Ok(()),
        }
    }

    /// What `key` holds now, dropping holders whose time is up (as Redis expires keys, and as
    /// holders.lua's `live_holders` drops a shared lock's lapsed holders).
    fn live(&mut self, key: &str, now: Instant) -> Option<&mut Held> {
        let gone = match self.locks.get_mut(key) {
            Some(Held::Exclusive { expires, .. }) => *expires <= now,
            Some(Held::Shared { holders, .. }) => {
                holders.retain(|_, expires| *expires > now);
                holders.is_empty()
            }
            Some(Held::Foreign(_)) | None => false,
        };
        if gone {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

    /// `look_at`'s `watched` (the watch's mark beside the key lives): its releases and
    /// hand-overs are announced.
    fn watched(&self, key: &str, now: Instant) -> bool {
        self.watched.get(key).is_some_and(|until| *until > now)
    }

    /// `PUBLISH` on `key`'s release channel: sent when the operation ends (`MemoryStore::run`).
    fn publish(&mut self, key: &str, message: String) {
        self.published.push(Released {
            key: key.to_owned(),
            message,
        });
    }
}

/// waiters.lua: the callers waiting for a key.
impl Data {
    /// The callers waiting for `key`, all gone once the scripts' hash would have expired.
    fn waiters_of(&mut self, key: &str, now: Instant) -> &mut Waiters {
        let waiters = self.waiters.entry(key.to_owned()).or_default();
        if waiters.expires.is_some_and(|expires| expires <= now) {
            *waiters = Waiters::default();
        }
        waiters
    }

    /// `count_waiter`: `token` waits for `key` until `now + life`; the hash lives as long as
    /// its longest entry.
    fn count_waiter(&mut self, key: &str, token: &str, life: Duration, now: Instant) {
        let waiters = self.waiters_of(key, now);
        waiters.entries.insert(token.to_owned(), now + life);
        waiters.expires = waiters.expires.max(Some(now + life));
    }

    /// `others_waiting`: whether a caller other than `token` is counted waiting for `key` (a
    /// lock taken on the free key is then marked; an entry that lapsed counts until the hash
    /// goes, as in the scripts); then, when the free key stands reserved for another caller,
    /// when that reservation lapses.
    fn others_waiting(
        &mut self,
        key: &str,
        token: &str,
        now: Instant,
    ) -> (bool, Option<(Instant, Reserved)>) {
        let waiters = self.waiters_of(key, now);
        let others = waiters.entries.keys().any(|waiter| waiter != token);
        for reserved in &waiters.reserved {
            if reserved.token() == token {
                return (others, None);
            }
            if let Some(lapses) = waiters.entries.get(reserved.token())
                && *lapses > now
            {
                return (others, Some((*lapses, reserved.clone())));
            }
        }
        (others, None)
    }

    /// release.lua's undo: a reservation written by the attempt of `value` (it arrived late,
    /// after its call left, say) is taken off, among the waiters and after the holder's mark.
    fn unreserve_attempt(&mut self, key: &str, value: &str, now: Instant) {
        let waiters = self.waiters_of(key, now);
        waiters.drop_reservation(|r| r.value == value);
        if let Some(Held::Exclusive { reserved, .. }) = self.live(key, now)
            && reserved.as_ref().is_some_and(|r| r.value == value)
        {
            *reserved = None;
        }
    }

    /// The caller `key` stands reserved for among its waiters, while it is counted.
    fn reserver(&mut self, key: &str, now: Instant) -> Option<String> {
        let waiters = self.waiters_of(key, now);
        let reserved = waiters.reserved.first()?;
        let lapses = waiters.entries.get(reserved.token())?;
        (*lapses > now).then(|| reserved.token().to_owned())
    }

    /// acquire.lua's `reserve`: a caller that waited too long reserves `key` among its
    /// waiters, in its place among the callers still counted there that did: first, unless one
    /// of them began waiting earlier. Reservations of callers no longer counted, and this
    /// caller's earlier one, go; past [`RESERVATIONS_KEPT`], the last.
    fn reserve(&mut self, key: &str, reservation: Reserved, now: Instant) {
        let waiters = self.waiters_of(key, now);
        let entries = &waiters.entries;
        waiters.reserved.retain(|current| {
            current.token() != reservation.token()
                && entries
                    .get(current.token())
                    .is_some_and(|lapses| *lapses > now)
        });
        let at = waiters
            .reserved
            .iter()
            .position(|current| reservation.before(current))
            .unwrap_or(waiters.reserved.len());
        waiters.reserved.insert(at, reservation);
        if waiters.reserved.len() > RESERVATIONS_KEPT {
            waiters.reserved.truncate(RESERVATIONS_KEPT);
            waiters.more = true;
        }
    }

    /// `forget_when_idle`: once the hash holds one field at most (the `served` field, or one
    /// caller's entry), it lives [`WAITERS_IDLE_LIFE`] more.
    fn forget_when_idle(&mut self, key: &str, now: Instant) {
        let waiters = self.waiters_of(key, now);
        let fields = waiters.entries.len()
            + usize::from(waiters.served.is_some())
            + waiters.reserved.len().min(2);
        if fields <= 1 {
            waiters.expires = Some(now + WAITERS_IDLE_LIFE);
        }
    }

    /// `served`: a waiting caller got `key` (and its reservation is served). Returns the
    /// reservation that moved up, if any: the new holder is marked with it.
    fn served(&mut self, key: &str, token: &str, now: Instant) -> Option<Reserved> {
        let waiters = self.waiters_of(key, now);
        waiters.entries.remove(token)?;
        let moved = waiters.unreserve(token);
        let mean = match waiters.served {
            Some((last, mean)) => {
                let gap = now.saturating_duration_since(last);
                Some(mean.map_or(gap, |mean| (mean * 3 + gap) / 4))
            }
            None => None,
        };
        waiters.served = Some((now, mean));
        self.forget_when_idle(key, now);
        moved
    }

    /// `estimate`: how long a caller coming back now may wait for `key`.
    fn estimate(
        &mut self,
        key: &str,
        remaining: Option<Duration>,
        now: Instant,
    ) -> Option<Duration> {
        let waiters = self.waiters_of(key, now);
        let Some((_, Some(mean))) = waiters.served else {
            return remaining;
        };
        let ahead = u32::try_from(waiters.entries.len()).unwrap_or(u32::MAX);
        Some(remaining.map_or(mean, |remaining| remaining.min(mean)) + mean * ahead)
    }
}

/// acquire.lua and acquire_many.lua.
impl Data {
    /// acquire.lua: takes `request` if it may be taken now (with a fencing token when asked);
    /// else what the caller is told.
    fn acquire(
        &mut self,
        request: &AcquireRequest<'_>,
        now: Instant,
    ) -> Result<Acquired, StoreError> {
        self.foreign(request.key)?;
        if let Err(busy) = self.take(request, now) {
            return Ok(busy);
        }
        let fencing_token = request.fencing.then(|| {
            // As Redis's: never below the clock, and above the key's last token.
            let clock = clock::epoch_micros();
            let fence = self.fences.entry(request.key.to_owned()).or_insert(0);
            *fence = (*fence + 1).max(protocol::fencing_floor(clock));
            *fence
        });
        Ok(Acquired::Taken { fencing_token })
    }

    /// The fair queue's first live waiter, dropping those whose place lapsed.
    fn queue_head(&mut self, key: &str, now: Instant) -> Option<String> {
        let queue = self.queues.get_mut(key)?;
        while queue.front().is_some_and(|(_, lapses)| *lapses <= now) {
            queue.pop_front();
        }
        queue.front().map(|(token, _)| token.clone())
    }

    /// Whether a live writer waits for `key`'s readers to leave.
    fn writer_waits(&mut self, key: &str, now: Instant) -> bool {
        self.writers.get_mut(key).is_some_and(|writers| {
            writers.retain(|_, lapses| *lapses > now);
            !writers.is_empty()
        })
    }

    /// `busy`: a caller that waits is counted, marks an exclusive holder (reserving it once it
    /// waited too long) and keeps its place in a fair queue.
    fn busy(
        &mut self,
        request: &AcquireRequest<'_>,
        remaining: Option<Duration>,
        now: Instant,
    ) -> Acquired {
        if request.waiting {
            let life = request.waiter_place() + remaining.unwrap_or_default().mul_f64(1.1);
            self.count_waiter(request.key, request.token(), life, now);
            let reservation = Reserved::of(request);
            if let Some(reservation) = reservation.clone() {
                self.reserve(request.key, reservation, now);
            }
            if let Some(held) = self.live(request.key, now) {
                held.mark(reservation);
            }
            if request.fair {
                self.keep_place(request, now);
            }
        }
        Acquired::Busy {
            remaining,
            estimate: self.estimate(request.key, remaining, now),
        }
    }

    /// The body of acquire.lua: takes `request` if it may be taken now; else what the caller
    /// is told.
    fn take(&mut self, request: &AcquireRequest<'_>, now: Instant) -> Result<(), Acquired> {
        let key = request.key;
        let token = request.token();
        if request.fair
            && let Some(head) = self.queue_head(key, now)
            && head != token
        {
            return Err(self.busy(request, None, now));
        }
        let lease_end = now + request.ttl;
        let writer_waits = request.kind == LockKind::Read && self.writer_waits(key, now);
        let watched = self.watched(key, now);
        // A free key reserved for another caller waits for it, unless this caller reserves too
        // and began waiting earlier: the one it passes stays owed the key next.
        let mut others = false;
        let mut owed = None;
        if self.live(key, now).is_none() {
            let reserved;
            (others, reserved) = self.others_waiting(key, token, now);
            if let Some((lapses, standing)) = reserved {
                if !Reserved::of(request).is_some_and(|mine| mine.before(&standing)) {
                    return Err(self.busy(request, Some(lapses - now), now));
                }
                owed = Some(standing);
            }
        }
        match (request.kind, self.live(key, now)) {
            (LockKind::Exclusive, None) => {
                // Fair waiters all look at each release: a fair holder's is announced, as a
                // watched key's holder's, and as one taken while others are counted waiting (a
                // reader kept out only by a writer's claim marked nothing; a caller kept out by
                // a reservation).
                let waited = request.fair || watched || others;
                let held = Held::Exclusive {
                    value: request.value.to_owned(),
                    expires: lease_end,
                    waited,
                    reserved: None,
                };
                self.locks.insert(key.to_owned(), held);
            }
            (LockKind::Exclusive, Some(Held::Exclusive { value, expires, .. }))
                if protocol::holds(value, token) =>
            {
                // Ours already: a call retried after it ran, or handed to this waiter by a
                // release. It takes this attempt's value and the ttl; its marks stay. An
                // attempt that came after its call's next one took the key changes nothing.
                if !protocol::is_later_attempt(value, request.value) {
                    request.value.clone_into(value);
                    *expires = lease_end;
                }
            }
            (LockKind::Exclusive, Some(held)) => {
                let remaining = held.remaining(now);
                if matches!(held, Held::Shared { .. }) && request.waiting {
                    // A writer waiting on readers keeps new readers out.
                    self.writers
                        .entry(key.to_owned())
                        .or_default()
                        .insert(token.to_owned(), lease_end);
                }
                return Err(self.busy(request, remaining, now));
            }
            (kind, held) => {
                let (count, earliest, ours) = match held {
                    None => (0, None, false),
                    Some(Held::Shared {
                        kind: shared,
                        holders,
                    }) if *shared == kind => (
                        holders.len(),
                        holders.values().min().copied(),
                        holders.contains_key(request.value),
                    ),
                    Some(other) => {
                        let remaining = other.remaining(now);
                        return Err(self.busy(request, remaining, now));
                    }
                };
                if !ours {
                    if writer_waits {
                        return Err(self.busy(request, None, now));
                    }
                    if let LockKind::Permits(permits) = kind
                        && count >= permits as usize
                    {
                        let remaining = earliest.map(|at| at.saturating_duration_since(now));
                        return Err(self.busy(request, remaining, now));
                    }
                }
                let holders = match self.locks.get_mut(key) {
                    Some(Held::Shared { holders, .. }) => holders,
                    _ => {
                        self.locks.insert(
                            key.to_owned(),
                            Held::Shared {
                                kind,
                                holders: Map::default(),
                            },
                        );
                        match self.locks.get_mut(key) {
                            Some(Held::Shared { holders, .. }) => holders,
                            _ => unreachable!("just inserted a shared lock"),
                        }
                    }
                };
                holders.insert(request.value.to_owned(), lease_end);
            }
        }
        if let Some(writers) = self.writers.get_mut(key) {
            writers.remove(token);
        }
        if let Some(queue) = self.queues.get_mut(key) {
            queue.retain(|(queued, _)| queued != token);
        }
        if request.waiting
            && let Some(moved) = self.served(key, token, now).or(owed)
            && request.kind == LockKind::Exclusive
            && let Some(held) = self.live(key, now)
        {
            // The next caller the key is reserved for: this holder's release hands it on.
            held.mark(Some(moved));
        }
        Ok(())
    }

    /// Keeps a fair waiter's place in the queue (joining at the back the first time).
    fn keep_place(&mut self, request: &AcquireRequest<'_>, now: Instant) {
        let lapses = now + request.waiter_place();
        let token = request.token();
        let queue = self.queues.entry(request.key.to_owned()).or_default();
        match queue.iter_mut().find(|(queued, _)| queued == token) {
            Some((_, place)) => *place = lapses,
            None => queue.push_back((token.to_owned(), lapses)),
        }
    }

    /// acquire_many.lua: the first key held by another makes the whole set busy (a caller that
    /// waits marks every such key, and is counted on every key); otherwise every key is taken,
    /// or kept when ours.
    fn acquire_many(
        &mut self,
        request: &ManyRequest<'_>,
        now: Instant,
    ) -> Result<AcquiredMany, StoreError> {
        let token = protocol::holder_token(request.value);
        for key in request.keys {
            self.foreign(key)?;
        }
        // The first key held by another, or free but reserved for another caller of it alone
        // (as acquire.lua's), and when it may be free.
        let mut others = vec![false; request.keys.len()];
        let mut busy = None;
        for (index, key) in request.keys.iter().enumerate() {
            match self.live(key, now) {
                Some(held) if !held.of_token(token) => {
                    busy = Some((index, held.remaining(now)));
                    break;
                }
                Some(_) => {}
                None => {
                    let reserved;
                    (others[index], reserved) = self.others_waiting(key, token, now);
                    if let Some((lapses, _)) = reserved {
                        busy = Some((index, Some(lapses - now)));
                        break;
                    }
                }
            }
        }
        if let Some((index, remaining)) = busy {
            if request.waiting {
                let life = request.waiter_place() + remaining.unwrap_or_default().mul_f64(1.1);
                let reservation = request.reserving_since.map(|since_ms| Reserved {
                    since_ms,
                    ttl: request.ttl,
                    keys: request.keys.len(),
                    value: request.value.to_owned(),
                });
                for key in request.keys {
                    self.count_waiter(key, token, life, now);
                    if let Some(held) = self.live(key, now)
                        && !held.of_token(token)
                    {
                        held.mark(reservation.clone());
                    }
                }
            }
            let estimate = self.estimate(&request.keys[index], remaining, now);
            return Ok(AcquiredMany::Busy {
                key: index,
                remaining,
                estimate,
            });
        }
        for (index, key) in request.keys.iter().enumerate() {
            let watched = self.watched(key, now);
            match self.live(key, now) {
                Some(Held::Exclusive { value, expires, .. }) => {
                    // An attempt that came after its call's next one took the key changes
                    // nothing.
                    if !protocol::is_later_attempt(value, request.value) {
                        request.value.clone_into(value);
                        *expires = now + request.ttl;
                    }
                }
                _ => {
                    // Marked when watched, or when others are counted waiting for it.
                    let waited = watched || others[index];
                    let held = Held::Exclusive {
                        value: request.value.to_owned(),
                        expires: now + request.ttl,
                        waited,
                        reserved: None,
                    };
                    self.locks.insert(key.clone(), held);
                }
            }
            if request.waiting
                && let Some(moved) = self.served(key, token, now)
                && let Some(held) = self.live(key, now)
            {
                held.mark(Some(moved));
            }
        }
        Ok(AcquiredMany::Taken)
    }
}

/// extend.lua.
impl Data {
    /// Extends every lease still held by its value; a key gone is never re-created.
    fn extend(&mut self, leases: &[LeaseRef<'_>], now: Instant) -> Vec<Renewal> {
        leases
            .iter()
            .map(|lease| match self.live(lease.key, now) {
                Some(Held::Exclusive { value, expires, .. }) if value == lease.value => {
                    *expires = now + lease.ttl;
                    Renewal::Extended
                }
                Some(Held::Shared { holders, .. }) if holders.contains_key(lease.value) => {
                    holders.insert(lease.value.to_owned(), now + lease.ttl);
                    Renewal::Extended
                }
                // Another owner's (another value, or a string of another application), or
                // gone (a shared lock without our field, or a hash that is no lock): never
                // re-created.
                Some(Held::Exclusive { .. }) => Renewal::Lost(LostReason::Taken),
                Some(Held::Foreign(found)) if found != protocol::FOREIGN_HASH => {
                    Renewal::Lost(LostReason::Taken)
                }
                _ => Renewal::Lost(LostReason::Gone),
            })
            .collect()
    }
}

/// The release scripts: release.lua (with release_plain.lua and release_shared.lua) and
/// release_many.lua.
impl Data {
    /// release.lua: `true` when `lease` was ours and is gone now (or kept while its
    /// `hold_at_least` runs, or handed to the caller of one key it is reserved for). An
    /// exclusive lock's release is announced only when a waiter marked it or a watch follows
    /// it (or to the caller it is handed to); a shared holder's always.
    fn release(&mut self, lease: LeaseRef<'_>, now: Instant) -> bool {
        let key = lease.key;
        let message = announcement(lease);
        if lease.undone {
            self.unreserve_attempt(key, lease.value, now);
        }
        if let Some(kept) = lease.kept_for() {
            // `kept`: the holder stays until the hold is over, and whoever waits or watches is
            // told to look again.
            let listened = self.watched(key, now)
                || matches!(
                    self.live(key, now),
                    Some(Held::Exclusive { waited: true, .. } | Held::Shared { .. })
                );
            // The key frees itself when the hold ends, unannounced: a caller it is reserved for
            // is named, so that it looks now (and learns when).
            let reserver = match self.live(key, now) {
                Some(Held::Exclusive {
                    reserved: Some(next),
                    ..
                }) if next.keys == 1 => Some(next.token().to_owned()),
                Some(Held::Shared { .. }) => self.reserver(key, now),
                _ => None,
            };
            let ours = self.keep(lease, now + kept, now);
            if ours && listened {
                let message = reserver.map_or_else(String::new, |next| handed("", &next));
                self.publish(key, message);
            }
            return ours;
        }
        let watched = self.watched(key, now);
        match self.live(key, now) {
            Some(Held::Exclusive {
                value,
                waited: marked,
                reserved,
                ..
            }) if value == lease.value => {
                let marked = *marked;
                // A caller of one key the lock is reserved for takes it now, marked, and only it
                // is told.
                // Not from an undone attempt (an empty message): it held no lock to pass on.
                if let Some(next) = reserved.clone()
                    && next.keys == 1
                    && !message.is_empty()
                {
                    self.hand_to(key, &next, now);
                    self.publish(key, handed(message, next.token()));
                    return true;
                }
                self.free(key);
                if marked || watched {
                    self.publish(key, message.to_owned());
                }
                true
            }
            // release_shared.lua.
            Some(Held::Shared { holders, .. }) => {
                if holders.remove(lease.value).is_none() {
                    return false;
                }
                let mut message = message.to_owned();
                if holders.is_empty() {
                    self.locks.remove(key);
                    // The last holder out names a caller the free key is reserved for.
                    if !message.is_empty()
                        && let Some(reserver) = self.reserver(key, now)
                    {
                        message = handed(&message, &reserver);
                    }
                }
                self.publish(key, message);
                true
            }
            _ => false,
        }
    }

    /// release.lua's `kept`: a release while `lease`'s `hold_at_least` runs, its holder staying
    /// until `until`, sooner or later than its lease would end. `true` when the lease was ours.
    fn keep(&mut self, lease: LeaseRef<'_>, until: Instant, now: Instant) -> bool {
        match self.live(lease.key, now) {
            Some(Held::Exclusive { value, expires, .. }) if value == lease.value => {
                *expires = until;
                true
            }
            Some(Held::Shared { holders, .. }) => match holders.get_mut(lease.value) {
                Some(expires) => {
                    *expires = until;
                    true
                }
                None => false,
            },
            _ => false,
        }
    }

    /// release.lua's `free`: the key goes (a watch's mark beside it stays, and marks the next
    /// holder, as the scripts' `+` left on the free key does).
    fn free(&mut self, key: &str) {
        self.locks.remove(key);
    }

    /// The scripts' `SET key {reserved}+ PX {ttl}`: `key` passes to the caller it is reserved for,
    /// marked, with that caller's ttl; it takes it, and is served, at its next look.
    fn hand_to(&mut self, key: &str, reservation: &Reserved, now: Instant) {
        let held = Held::Exclusive {
            value: reservation.value.clone(),
            expires: now + reservation.ttl,
            waited: true,
            reserved: None,
        };
        self.locks.insert(key.to_owned(), held);
    }

    /// release_many.lua: every key of a multi-key lease still ours goes (or is kept while its
    /// `hold_at_least` runs, or passes to the caller it is reserved for), announced when a
    /// waiter marked it or a watch follows it; `true` when every key was ours.
    fn release_many(&mut self, lease: LeaseRef<'_>, now: Instant) -> bool {
        let keys = lease.keys;
        let message = announcement(lease);
        let kept = lease.kept_for();
        // Each key of ours: whether a waiter marked it, and the caller it is reserved for.
        let found: Vec<Option<(bool, Option<Reserved>)>> = keys
            .iter()
            .map(|key| match self.live(key, now) {
                Some(Held::Exclusive {
                    value,
                    waited,
                    reserved,
                    ..
                }) if value == lease.value => Some((*waited, reserved.clone())),
                _ => None,
            })
            .collect();
        let mut released = 0;
        for (key, ours) in keys.iter().zip(&found) {
            let Some((marked, reservation)) = ours else {
                continue;
            };
            let listened = *marked || self.watched(key, now);
            if let Some(kept) = kept {
                if let Some(Held::Exclusive { expires, .. }) = self.locks.get_mut(key.as_str()) {
                    *expires = now + kept;
                }
                // A caller of it alone it is reserved for is named, as in `release`.
                if listened {
                    let message = match reservation.as_ref().filter(|next| next.keys == 1) {
                        Some(next) => handed("", next.token()),
                        None => String::new(),
                    };
                    self.publish(key, message);
                }
            } else if let Some(next) = reservation.as_ref().filter(|next| {
                !message.is_empty() && (next.keys == 1 || reserved_all_here(&found, next))
            }) {
                // Handed to the caller it is reserved for, marked; only it is told.
                self.hand_to(key, next, now);
                self.publish(key, handed(message, next.token()));
            } else {
                self.free(key);
                if listened {
                    self.publish(key, message.to_owned());
                }
            }
            released += 1;
        }
        released == keys.len()
    }
}

/// hand_over.lua.
impl Data {
    /// Passes the exclusive `lease` straight to `next` (a waiter of the same client, same key)
    /// while the key still holds our value: `next`'s value and ttl, with no moment free, and
    /// the waiter's mark kept. A caller of one key elsewhere that reserved the key is handed it
    /// instead (announced to it alone). Announced too when a watch follows the key, and when
    /// the hand-over serves `next`'s own reservation (every other caller that reserved the key
    /// went unrecorded, and looks again to reserve it in turn).
    fn hand_over(&mut self, lease: LeaseRef<'_>, next: LeaseRef<'_>, now: Instant) -> HandOver {
        let key = lease.key;
        let ours = lease.value;
        let next_token = protocol::holder_token(next.value);
        let watched = self.watched(key, now);
        let (marked, reservation) = match self.live(key, now) {
            Some(Held::Exclusive {
                value,
                waited,
                reserved,
                ..
            }) if value == ours => (*waited, reserved.clone()),
            _ => return HandOver::NotOurs,
        };
        let reserved_token = reservation.as_ref().map(Reserved::token);
        let reserved_one_key = reservation
            .as_ref()
            .is_some_and(|reservation| reservation.keys == 1);
        if let Some(reservation) = reservation.as_ref().filter(|_| reserved_one_key)
            && reserved_token != Some(next_token)
        {
            self.hand_to(key, reservation, now);
            self.publish(key, handed(ours, reservation.token()));
            return HandOver::ToReservation;
        }
        // Announced when watched, and when it serves the next holder's reservation while a
        // caller past the bound went unrecorded: it looks again. The others keep their places.
        if watched
            || (reserved_one_key
                && reserved_token == Some(next_token)
                && self.waiters_of(key, now).unrecorded())
        {
            self.publish(key, handed(ours, next_token));
        }
        // A reservation for a caller of several keys stays for a release of them all; one for
        // the next holder is served. Watched: the next holder's release is announced too.
        let reserved =
            reservation.filter(|reservation| marked && reservation.token() != next_token);
        let held = Held::Exclusive {
            value: next.value.to_owned(),
            expires: now + next.ttl,
            waited: marked || watched,
            reserved,
        };
        self.locks.insert(key.to_owned(), held);
        // The next holder waited: it is served, and a claim it made against new readers while
        // readers held the key goes, as when it takes the key itself.
        if let Some(moved) = self.served(key, next_token, now)
            && let Some(Held::Exclusive {
                waited, reserved, ..
            }) = self.live(key, now)
            && reserved.is_none()
        {
            // The next caller the key is reserved for: this holder's release hands it on.
            *waited = true;
            *reserved = Some(moved);
        }
        if let Some(writers) = self.writers.get_mut(key) {
            writers.remove(next_token);
        }
        HandOver::Handed
    }
}

/// release_many.lua's `reserved_all_here`: a caller of several keys is handed them only when they
/// are all released here at once, each reserved for it (it waits for no other key, or it would
/// not own them all). `found`: each key of the lease that is ours, with its reservation.
fn reserved_all_here(found: &[Option<(bool, Option<Reserved>)>], next: &Reserved) -> bool {
    next.keys == found.len()
        && found.iter().all(
            |ours| matches!(ours, Some((_, Some(reservation))) if reservation.value == next.value),
        )
}

/// What a release of `lease` announces: its value, or "look again" for an undone attempt.
fn announcement<'a>(lease: LeaseRef<'a>) -> &'a str {
    if lease.undone { "" } else { lease.value }
}

/// The announcement of `released` handing the key to the caller of `token`.
fn handed(released: &str, token: &str) -> String {
    format!("{released}{}{token}", protocol::HANDED_TO)
}

/// leave.lua, watch.lua, force_release.lua and inspect.lua.
impl Data {
    /// leave.lua: the waiter of `token` leaves `key` without the lock: no longer counted, its
    /// place in a fair queue, its claim against new readers and its reservation taken off, and
    /// the key given back (and announced) if a release handed it to it meanwhile. A fair
    /// queue's head that leaves others behind it while no exclusive holder holds the key is
    /// announced as "look again": the next in line may take it now.
    fn leave(&mut self, key: &str, token: &str, now: Instant) {
        let waiters = self.waiters_of(key, now);
        waiters.entries.remove(token);
        // Whether the free key stood reserved for it: the next caller moves up.
        let reserved = waiters
            .reserved
            .first()
            .is_some_and(|reserved| reserved.token() == token);
        waiters.unreserve(token);
        self.forget_when_idle(key, now);
        if let Some(writers) = self.writers.get_mut(key) {
            writers.remove(token);
        }
        // Whether it headed the queue (its place lapsed or not) with others behind it.
        let headed = self.queues.get_mut(key).is_some_and(|queue| {
            let headed = queue.front().is_some_and(|(queued, _)| queued == token);
            if let Some(place) = queue.iter().position(|(queued, _)| queued == token) {
                queue.remove(place);
            }
            headed && !queue.is_empty()
        });
        // Callers it kept out of a free key: those behind it in the queue, or any, when
        // reserved for it.
        let kept_out = headed || reserved;
        match self.live(key, now) {
            Some(Held::Exclusive { value, .. }) if protocol::holds(value, token) => {
                let value = value.clone();
                self.locks.remove(key);
                self.publish(key, value);
            }
            Some(Held::Exclusive { reserved, .. })
                if reserved.as_ref().is_some_and(|next| next.token() == token) =>
            {
                *reserved = None;
            }
            // Held by another, or another application's string: nothing to tell.
            Some(Held::Exclusive { .. }) => {}
            Some(Held::Foreign(found)) if found != protocol::FOREIGN_HASH => {}
            _ => {
                if kept_out {
                    self.publish(key, String::new());
                }
            }
        }
    }

    /// watch.lua: a watch follows `key` for a while: its releases are announced, and its
    /// holder is marked, so that its release is announced even once the watch has gone.
    fn watch(&mut self, key: &str, now: Instant) {
        self.watched
            .insert(key.to_owned(), now + protocol::WATCH_MARK_LIFE);
        if let Some(Held::Exclusive { waited, .. }) = self.live(key, now) {
            *waited = true;
        }
    }

    /// force_release.lua: every holder of `key` goes, each announced, and the key on the
    /// forced releases' channel; `true` when there was one. The fair queue and writers' claims
    /// stay: the next in line keeps its turn.
    fn force_release(&mut self, key: &str, now: Instant) -> bool {
        self.live(key, now);
        // Data that is no lock is no lock to release.
        if matches!(self.locks.get(key), Some(Held::Foreign(_))) {
            return false;
        }
        let removed = match self.locks.remove(key) {
            Some(Held::Exclusive { value, .. }) => vec![value],
            Some(Held::Shared { holders, .. }) => holders.into_keys().collect(),
            _ => Vec::new(),
        };
        for value in &removed {
            self.publish(key, value.clone());
        }
        if !removed.is_empty() {
            self.publish(protocol::FORCED_RELEASES, key.to_owned());
        }
        !removed.is_empty()
    }

    /// inspect.lua: what `key` holds now, as inspection reports it.
    fn inspect(&mut self, key: &str, now: Instant) -> Option<Snapshot> {
        let mut reserved_for = None;
        let (kind, holders) = match self.live(key, now)? {
            Held::Exclusive {
                value,
                expires,
                reserved,
                ..
            } => {
                reserved_for = reserved
                    .as_ref()
                    .map(|reservation| (reservation.value.clone(), reservation.since_ms));
                (
                    LockKind::Exclusive,
                    vec![(value.clone(), expires.saturating_duration_since(now))],
                )
            }
            Held::Shared { kind, holders } => (
                *kind,
                holders
                    .iter()
                    .map(|(value, expires)| (value.clone(), expires.saturating_duration_since(now)))
                    .collect(),
            ),
            Held::Foreign(_) => return None,
        };
        let waiters = self.waiters_of(key, now);
        let waiters = waiters
            .entries
            .values()
            .filter(|lapses| **lapses > now)
            .count();
        Some(Snapshot {
            key: key.to_owned(),
            kind,
            holders,
            fencing: self.fences.get(key).copied(),
            waiters,
            reserved_for,
        })
    }
}

impl MemoryStore {
    fn data(&self) -> MutexGuard<'_, Data> {
        self.inner.data.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `script` on the store's data as Redis runs a script: alone, at one `now`; what it
    /// published is sent before anyone else runs.
    fn run<R>(&self, script: impl FnOnce(&mut Data, Instant) -> R) -> R {
        let mut data = self.data();
        let result = script(&mut data, Instant::now());
        let data = &mut *data;
        for released in data.published.drain(..) {
            if let Some(recorders) = data.recorders.get_mut(&released.key) {
                recorders.retain(|recorder| recorder.send(released.message.clone()).is_ok());
            }
            // Nobody listening is fine: waiters also go by the holder's remaining lease.
            let _ = self.inner.releases.send(released);
        }
        result
    }

    /// Fails this operation if [`MemoryHooks::fail_next`] asked for it.
    fn injected_failure(&self) -> Result<(), StoreError> {
        let failing = &self.inner.failing;
        let took = failing.fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
            left.checked_sub(1)
        });
        match took {
            Ok(_) => Err(StoreError::unavailable(
                "injected failure (MemoryHooks::fail_next)",
            )),
            Err(_) => Ok(()),
        }
    }

    pub(crate) fn hooks(&self) -> MemoryHooks {
        MemoryHooks {
            store: self.clone(),
        }
    }
}

impl Store for MemoryStore {
    fn health(&self) -> BoxFuture<'_, Health> {
        Box::pin(async move {
            let node = match self.injected_failure() {
                Ok(()) => NodeHealth::answered("in memory", NodeRole::Server, Duration::ZERO),
                Err(error) => error.node_health("in memory", NodeRole::Server),
            };
            let ready = node.answers();
            let verdict = if ready {
                "the store answers"
            } else {
                "the store fails (injected)"
            };
            Health::new("in memory", ready, verdict, vec![node])
        })
    }

    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
        _budget: Duration,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        Box::pin(async move {
            self.injected_failure()?;
            self.run(|data, now| data.acquire(&request, now))
        })
    }

    fn acquire_many<'a>(
        &'a self,
        request: ManyRequest<'a>,
        _budget: Duration,
    ) -> BoxFuture<'a, Result<AcquiredMany, StoreError>> {
        Box::pin(async move {
            self.injected_failure()?;
            self.run(|data, now| data.acquire_many(&request, now))
        })
    }

    fn extend<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Renewal>> {
        Box::pin(async move {
            if let Err(error) = self.injected_failure() {
                return vec![Renewal::Failed(error); leases.len()];
            }
            self.run(|data, now| data.extend(leases, now))
        })
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.injected_failure()?;
            Ok(self.run(|data, now| {
                if lease.keys.is_empty() {
                    data.release(lease, now)
                } else {
                    data.release_many(lease, now)
                }
            }))
        })
    }

    fn leave<'a>(&'a self, key: &'a str, token: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.injected_failure()?;
            self.run(|data, now| data.leave(key, token, now));
            Ok(())
        })
    }

    fn hands_over(&self) -> Option<&dyn HandsOver> {
        Some(self)
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        Box::pin(async move {
            Ok(Box::new(MemoryFeed {
                store: self.clone(),
                releases: self.inner.releases.subscribe(),
                watched: Set::default(),
            }) as Box<dyn ReleaseFeed>)
        })
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Snapshot>, StoreError>> {
        Box::pin(async move { Ok(self.run(|data, now| data.inspect(key, now))) })
    }

    fn mark_watched<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.run(|data, now| data.watch(key, now));
            Ok(())
        })
    }

    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Cursor,
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut data = self.data();
            // Keys in order, from the last key of the previous page on.
            let mut keys: Vec<String> = data
                .locks
                .keys()
                .filter(|key| {
                    (prefix.is_empty()
                        || key
                            .strip_prefix(prefix)
                            .is_some_and(|rest| rest.starts_with(':')))
                        && (cursor.position.is_empty() || key.as_str() > cursor.position.as_str())
                })
                .cloned()
                .collect();
            keys.sort_unstable();
            let more = keys.len() > SCAN_COUNT;
            keys.truncate(SCAN_COUNT);
            let next = more.then(|| Cursor {
                position: keys.last().cloned().unwrap_or_default(),
                ..Cursor::default()
            });
            let locks = keys
                .iter()
                .filter_map(|key| data.inspect(key, now))
                .collect();
            Ok(Page { locks, next })
        })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.injected_failure()?;
            Ok(self.run(|data, now| data.force_release(key, now)))
        })
    }
}

impl HandsOver for MemoryStore {
    fn hand_over<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        next: LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<HandOver, StoreError>> {
        Box::pin(async move {
            // A hand-over is a release: an injected failure fails it as it would a release.
            self.injected_failure()?;
            Ok(self.run(|data, now| data.hand_over(lease, next, now)))
        })
    }
}

/// Release announcements within the process.
struct MemoryFeed {
    store: MemoryStore,
    releases: broadcast::Receiver<Released>,
    watched: Set<String>,
}

impl ReleaseFeed for MemoryFeed {
    fn watch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if self.watched.insert(key.to_owned()) {
                *self
                    .store
                    .data()
                    .listeners
                    .entry(key.to_owned())
                    .or_insert(0) += 1;
            }
            Ok(())
        })
    }

    fn unwatch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if self.watched.remove(key) {
                forget_listener(&mut self.store.data(), key);
            }
            Ok(())
        })
    }

    fn settle<'a>(&'a mut self, _key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        // A release is sent to every feed before it returns: nothing is in flight.
        Box::pin(async { Ok(()) })
    }

    fn next_release(&mut self) -> BoxFuture<'_, Option<Released>> {
        Box::pin(async move {
            loop {
                match self.releases.recv().await {
                    Ok(released) if self.watched.contains(&released.key) => return Some(released),
                    Ok(_) => {}
                    // Some announcements were missed: let a waiter of some key look again.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        if let Some(key) = self.watched.iter().next() {
                            return Some(Released {
                                key: key.clone(),
                                message: String::new(),
                            });
                        }
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
    }
}

impl Drop for MemoryFeed {
    fn drop(&mut self) {
        let mut data = self.store.data();
        for key in &self.watched {
            forget_listener(&mut data, key);
        }
    }
}

fn forget_listener(data: &mut Data, key: &str) {
    if let Some(count) = data.listeners.get_mut(key) {
        *count -= 1;
        if *count == 0 {
            data.listeners.remove(key);
        }
    }
}

/// Provokes, in an in-memory client's store, what is rare against a real Redis: a key that
/// expires now, another owner taking a key, a store that fails. From
/// [`LockClient::memory_hooks`](crate::LockClient::memory_hooks).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use lockmacro_runtime::{LockClient, LockError, LockOptions};
///
/// let locks = LockClient::in_memory();
/// let hooks = locks.memory_hooks().expect("an in-memory client");
/// hooks.fail_next(1);
/// let outcome = locks.run_locked("jobs:1", LockOptions::new(), async {}).await;
/// assert!(matches!(outcome, Err(LockError::Redis { .. })));
/// assert!(locks.run_locked("jobs:1", LockOptions::new(), async {}).await.is_ok());
/// # }
/// ```
#[derive(Clone)]
pub struct MemoryHooks {
    pub(crate) store: MemoryStore,
}

impl std::fmt::Debug for MemoryHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryHooks").finish_non_exhaustive()
    }
}

impl MemoryHooks {
    /// The token holding `key`, `None` when the key is free (or holds no lock).
    pub fn holder(&self, key: &str) -> Option<String> {
        self.holders(key).into_iter().next()
    }

    /// Every token holding `key` now, in order: one for an exclusive lock, each reader or
    /// permit holder for a shared one.
    pub fn holders(&self, key: &str) -> Vec<String> {
        let mut data = self.store.data();
        let mut holders: Vec<String> = match data.live(key, Instant::now()) {
            Some(Held::Exclusive { value, .. }) => vec![value.clone()],
            Some(Held::Shared { holders, .. }) => holders.keys().cloned().collect(),
            _ => Vec::new(),
        };
        let mut holders: Vec<String> = holders
            .drain(..)
            .map(|value| protocol::holder_token(&value).to_owned())
            .collect();
        holders.sort();
        holders
    }

    /// The value of the exclusive lock on `key` as Redis stores it: its holder's value, then
    /// `+` once a caller waits for it, then the reservation of a caller it is reserved for
    /// ([`protocol::Stored`](crate::protocol::Stored) reads it). `None` when no exclusive lock
    /// holds `key`.
    pub fn stored(&self, key: &str) -> Option<String> {
        let mut data = self.store.data();
        let Some(Held::Exclusive {
            value,
            waited,
            reserved,
            ..
        }) = data.live(key, Instant::now())
        else {
            return None;
        };
        let mut stored = value.clone();
        if *waited {
            stored.push(protocol::WAITED_MARK);
        }
        if let Some(reserved) = reserved {
            stored.push_str(&reserved.stored());
        }
        Some(stored)
    }

    /// Hears the release announcements of `key` from now on, as a subscriber to its release
    /// channel would: each message as Redis would publish it
    /// ([`protocol::Announcement`](crate::protocol::Announcement) reads one), in order, so a
    /// test sees what a release told the waiters (`try_iter` takes what came so far).
    pub fn announcements(&self, key: &str) -> mpsc::Receiver<String> {
        let (recorder, heard) = mpsc::channel();
        let mut data = self.store.data();
        data.recorders
            .entry(key.to_owned())
            .or_default()
            .push(recorder);
        heard
    }

    /// Puts another application's string under `key` (as its `SET key hello` would): taking
    /// `key` is then [`LockError::NotALock`](crate::LockError::NotALock), and the string is
    /// never written, as in Redis.
    pub fn put_foreign_string(&self, key: &str) {
        self.put_foreign(key, protocol::FOREIGN_STRING);
    }

    /// Puts another application's hash under `key` (as its `HSET key field value` would), as
    /// [`put_foreign_string`](Self::put_foreign_string) does a string.
    pub fn put_foreign_hash(&self, key: &str) {
        self.put_foreign(key, protocol::FOREIGN_HASH);
    }

    fn put_foreign(&self, key: &str, found: &str) {
        self.store
            .data()
            .locks
            .insert(key.to_owned(), Held::Foreign(found.to_owned()));
    }

    /// Whether `key` still holds the data put there by
    /// [`put_foreign_string`](Self::put_foreign_string) or
    /// [`put_foreign_hash`](Self::put_foreign_hash).
    pub fn holds_foreign(&self, key: &str) -> bool {
        matches!(self.store.data().locks.get(key), Some(Held::Foreign(_)))
    }

    /// Expires `key` now, as if its lease ran out: its holder learns `Lost` at its next renewal,
    /// and waiters find it free when they look (an expiry announces nothing, as in Redis).
    pub fn expire(&self, key: &str) {
        self.store.data().locks.remove(key);
    }

    /// Lets another owner take `key` for `ttl`, replacing any holder: the holder learns `Lost`
    /// at its next renewal. Returns the other owner's token.
    pub fn take_over(&self, key: &str, ttl: Duration) -> String {
        let token = protocol::new_token();
        let value = protocol::Origin::new("another-host", 1, "another-owner").value(&token, 0);
        self.store.data().locks.insert(
            key.to_owned(),
            Held::Exclusive {
                value,
                expires: Instant::now() + ttl,
                waited: false,
                reserved: None,
            },
        );
        token
    }

    /// Makes the next `operations` calls to the store (acquire, a renewal batch, release or
    /// hand-over) fail as an unreachable Redis would: `LockError::Redis` for callers, retries
    /// for the watchdog.
    pub fn fail_next(&self, operations: u32) {
        self.store
            .inner
            .failing
            .store(operations, Ordering::Release);
    }

    /// How many clients listen for releases of `key` (waiters that found it busy subscribe).
    pub fn listeners(&self, key: &str) -> usize {
        self.store.data().listeners.get(key).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(3);

    fn lease<'a>(key: &'a str, keys: &'a [String], value: &'a str) -> LeaseRef<'a> {
        LeaseRef {
            key,
            keys,
            value,
            kind: LockKind::Exclusive,
            ttl: TTL,
            hold_until: None,
            undone: true,
        }
    }

    fn held_value<'d>(data: &'d Data, key: &str) -> Option<&'d str> {
        match data.locks.get(key) {
            Some(Held::Exclusive { value, .. }) => Some(value),
            _ => None,
        }
    }

    /// An attempt whose reply timed out lands after its call's next attempt took the key: it
    /// changes nothing, and its undo (a compare-and-delete of its value) deletes nothing.
    #[test]
    fn an_attempt_that_lands_after_its_calls_next_one_changes_nothing() {
        let origin = protocol::Origin::new("h", 1, "a");
        let token = protocol::new_token();
        let (late, next) = (origin.value(&token, 5), origin.value(&token, 9));
        let now = Instant::now();
        let mut data = Data::default();
        let request = |value| AcquireRequest {
            key: "k",
            value,
            kind: LockKind::Exclusive,
            ttl: TTL,
            fencing: false,
            waiting: true,
            fair: false,
            reserving_since: None,
        };
        let taken = Acquired::Taken {
            fencing_token: None,
        };
        assert!(matches!(data.acquire(&request(&next), now), Ok(a) if a == taken));
        assert!(matches!(data.acquire(&request(&late), now), Ok(a) if a == taken));
        assert_eq!(held_value(&data, "k"), Some(next.as_str()));
        assert!(!data.release(lease("k", &[], &late), now));
        assert_eq!(held_value(&data, "k"), Some(next.as_str()));

        let keys = ["a".to_owned(), "b".to_owned()];
        let many = |value| ManyRequest {
            keys: &keys,
            value,
            ttl: TTL,
            waiting: true,
            reserving_since: None,
        };
        assert!(matches!(
            data.acquire_many(&many(&next), now),
            Ok(AcquiredMany::Taken)
        ));
        assert!(matches!(
            data.acquire_many(&many(&late), now),
            Ok(AcquiredMany::Taken)
        ));
        for key in &keys {
            assert_eq!(held_value(&data, key), Some(next.as_str()));
        }
    }
}
