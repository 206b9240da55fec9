//! Locks in the process: the deployment behind `LockClient::in_memory()` (feature `test-util`),
//! for users' own tests.
//!
//! It keeps Redis's semantics, not a toy's: a lease is a key with a value and an expiry, taken
//! only when free, extended only while it holds our value, released by compare-and-delete with
//! an announcement when a waiter marked it or someone listens for its releases (as the scripts
//! do), or handed straight to the caller it is reserved for, expiring silently (as Redis keys
//! do) when its time is up. Waiting callers are counted and served as the scripts count and
//! serve them, and data that is no lock ([`MemoryHooks::put_foreign`]) is never written. Fencing tokens follow the clock floor of `protocol::fencing_floor`, as Redis's do. Time is tokio's
//! clock, so under `#[tokio::test(start_paused = true)]` a test crosses a 30 s lease in
//! milliseconds. [`MemoryHooks`] provokes what is rare against a real Redis.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use super::inspect::SCAN_COUNT;
use super::protocol;
use super::{
    AcquireRequest, Acquired, AcquiredMany, BoxFuture, Cursor, LeaseRef, ManyRequest, Page,
    ReleaseFeed, Released, Renewal, Snapshot, Store, StoreError,
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
}

/// The callers waiting for one key (see `protocol::Names::waiters`).
#[derive(Default)]
struct Waiters {
    entries: Map<String, Instant>,
    /// The last caller served, and the mean time between two (`None` after the first).
    served: Option<(Instant, Option<Duration>)>,
}

/// What a lock key holds: one exclusive holder, or shared holders each with its own expiry; or
/// data of another application ([`MemoryHooks::put_foreign`]).
enum Held {
    Exclusive {
        /// The holder's value.
        value: String,
        expires: Instant,
        /// A caller that waits found it busy (Redis's value carries the waited mark): then
        /// its release is announced, as in Redis, even when nobody listens any more.
        waited: bool,
        /// The caller owed it, when one waited too long: its release hands it over.
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
        let since_ms = request.starving_since?;
        (request.kind == LockKind::Exclusive && !request.fair).then(|| Self {
            since_ms,
            ttl: request.ttl,
            keys: 1,
            value: request.value.to_owned(),
        })
    }

    /// Whether it goes before `other`: it began waiting earlier (ties: the smaller token).
    fn before(&self, other: &Self) -> bool {
        (self.since_ms, protocol::holder_token(&self.value))
            < (other.since_ms, protocol::holder_token(&other.value))
    }

    fn token(&self) -> &str {
        protocol::holder_token(&self.value)
    }
}

impl Held {
    /// Whether the lease of `value` holds it now (an exclusive lock's value, a shared holder's
    /// field).
    fn held_by(&self, value: &str, now: Instant) -> bool {
        match self {
            Self::Exclusive {
                value: holder,
                expires,
                ..
            } => holder == value && *expires > now,
            Self::Shared { holders, .. } => {
                holders.get(value).is_some_and(|expires| *expires > now)
            }
            Self::Foreign(_) => false,
        }
    }

    /// When it is free: its holder's expiry, or its last holder's; never for foreign data.
    fn expires(&self) -> Option<Instant> {
        match self {
            Self::Exclusive { expires, .. } => Some(*expires),
            Self::Shared { holders, .. } => holders.values().copied().max(),
            Self::Foreign(_) => None,
        }
    }

    /// How long until it is free, as the scripts tell a caller (`None`: never).
    fn remaining(&self, now: Instant) -> Option<Duration> {
        self.expires().map(|at| at.saturating_duration_since(now))
    }

    /// As the scripts' busy path: a caller that waits marks an exclusive holder, and one that
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

impl Data {
    /// Whether a watch follows `key` now: as the release scripts, its releases are announced.
    fn watched(&self, key: &str, now: Instant) -> bool {
        self.watched.get(key).is_some_and(|until| *until > now)
    }

    /// What `key` holds now, dropping holders whose time is up (as Redis expires keys, and as
    /// the scripts drop a shared lock's lapsed holders).
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

    /// A release while `lease`'s `hold_at_least` runs: its holder stays until `until`, sooner
    /// or later than its lease would end. `true` when the lease was ours.
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

    /// What `key` holds now, as inspection reports it.
    fn snapshot(&mut self, key: &str, now: Instant) -> Option<Snapshot> {
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
                    .map(|owed| (owed.value.clone(), owed.since_ms));
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
        let waiters = self.waiters.get(key).map_or(0, |waiters| {
            waiters
                .entries
                .values()
                .filter(|lapses| **lapses > now)
                .count()
        });
        Some(Snapshot {
            key: key.to_owned(),
            kind,
            holders,
            fencing: self.fences.get(key).copied(),
            waiters,
            reserved_for,
        })
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

    /// The callers waiting for `key`, their entries gone once every one lapsed (as the
    /// scripts' hash expires with its longest entry).
    fn waiters_of(&mut self, key: &str, now: Instant) -> &mut Waiters {
        let waiters = self.waiters.entry(key.to_owned()).or_default();
        if !waiters.entries.is_empty() && waiters.entries.values().all(|lapses| *lapses <= now) {
            *waiters = Waiters::default();
        }
        waiters
    }

    /// As the scripts' `count_waiter`: `token` waits for `key` until `now + life`.
    fn count_waiter(&mut self, key: &str, token: &str, life: Duration, now: Instant) {
        let waiters = self.waiters_of(key, now);
        waiters.entries.insert(token.to_owned(), now + life);
    }

    /// As the scripts' `served`: a waiting caller got `key`.
    fn served(&mut self, key: &str, token: &str, now: Instant) {
        let waiters = self.waiters_of(key, now);
        if waiters.entries.remove(token).is_none() {
            return;
        }
        let mean = match waiters.served {
            Some((last, mean)) => {
                let gap = now.saturating_duration_since(last);
                Some(mean.map_or(gap, |mean| (mean * 3 + gap) / 4))
            }
            None => None,
        };
        waiters.served = Some((now, mean));
    }

    /// As the scripts' `estimate`: how long a caller coming back now may wait for `key`.
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

    /// As the scripts' busy path: a caller that waits is counted, marks an exclusive holder
    /// (reserving it once it waited too long) and keeps its place in a fair queue.
    fn busy(
        &mut self,
        request: &AcquireRequest<'_>,
        remaining: Option<Duration>,
        now: Instant,
    ) -> Acquired {
        if request.waiting {
            let life = request.waiter_place() + remaining.unwrap_or_default().mul_f64(1.1);
            self.count_waiter(request.key, request.token(), life, now);
            if let Some(held) = self.live(request.key, now) {
                held.mark(Reserved::of(request));
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

    /// Takes `request` if it may be taken now; else what the caller is told.
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
        match (request.kind, self.live(key, now)) {
            (LockKind::Exclusive, None) => {
                let held = Held::Exclusive {
                    value: request.value.to_owned(),
                    expires: lease_end,
                    // Fair waiters all look at each release: a fair holder's is announced.
                    waited: request.fair,
                    reserved: None,
                };
                self.locks.insert(key.to_owned(), held);
            }
            (LockKind::Exclusive, Some(Held::Exclusive { value, expires, .. }))
                if protocol::holds(value, token) =>
            {
                // Ours already: a call retried after it ran, or handed to this waiter by a
                // release. It takes this attempt's value and the ttl; its marks stay.
                request.value.clone_into(value);
                *expires = lease_end;
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
        if request.waiting {
            self.served(key, token, now);
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

    /// `NotALock` when `key` holds data of another application.
    fn foreign(&self, key: &str) -> Result<(), StoreError> {
        match self.locks.get(key) {
            Some(Held::Foreign(found)) => Err(StoreError::from(crate::LockError::NotALock {
                key: key.to_owned(),
                found: found.clone(),
            })),
            _ => Ok(()),
        }
    }

    /// As release.lua and release_many.lua for one key of ours: the key goes, or passes to the
    /// caller of one key it is reserved for (or, with `all_owed`, of several keys all released
    /// here); the announcement to send, if any.
    fn free(&mut self, key: &str, message: &str, all_owed: bool, now: Instant) -> Option<String> {
        let listening = self.watched(key, now);
        let Some(Held::Exclusive {
            waited, reserved, ..
        }) = self.locks.get(key)
        else {
            return None;
        };
        let waited = *waited;
        // An undone attempt (an empty message) held no lock to pass on.
        if let Some(next) = reserved.clone()
            && !message.is_empty()
            && (next.keys == 1 || all_owed)
        {
            let held = Held::Exclusive {
                value: next.value.clone(),
                expires: now + next.ttl,
                waited: true,
                reserved: None,
            };
            self.locks.insert(key.to_owned(), held);
            return Some(format!("{message}{}{}", protocol::HANDED_TO, next.token()));
        }
        self.locks.remove(key);
        (waited || listening).then(|| message.to_owned())
    }
}

impl MemoryStore {
    fn data(&self) -> MutexGuard<'_, Data> {
        self.inner.data.lock().unwrap_or_else(|e| e.into_inner())
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

    /// An announcement of no release: the key's end moved, and its waiters look again.
    fn look_again(&self, key: &str) {
        self.announce(key, String::new());
    }

    fn announce(&self, key: &str, message: String) {
        // Nobody listening is fine: waiters also go by the holder's remaining lease.
        let _ = self.inner.releases.send(Released {
            key: key.to_owned(),
            message,
        });
    }

    /// What a release of `lease` announces: its value, or "look again" for an undone attempt.
    fn message(lease: LeaseRef<'_>) -> &str {
        if lease.undone { "" } else { lease.value }
    }

    /// As release_many.lua: every key of a multi-key lease still ours goes (or is kept while
    /// its `hold_at_least` runs, or passes to the caller it is reserved for), announced when a
    /// waiter marked it or a watch follows it; `true` when every key was ours.
    fn release_many(&self, lease: LeaseRef<'_>) -> bool {
        let mut announced = Vec::new();
        let mut ours = 0;
        {
            let mut data = self.data();
            let now = Instant::now();
            let kept = lease.kept_for();
            let held: Vec<bool> = lease
                .keys
                .iter()
                .map(|key| {
                    data.live(key, now).is_some_and(|held| {
                        matches!(held, Held::Exclusive { .. }) && held.held_by(lease.value, now)
                    })
                })
                .collect();
            // A caller of several keys owed all of them here is handed them all at once.
            let owed: Vec<Option<(String, usize)>> = lease
                .keys
                .iter()
                .map(|key| match data.locks.get(key) {
                    Some(Held::Exclusive {
                        reserved: Some(next),
                        ..
                    }) => Some((next.value.clone(), next.keys)),
                    _ => None,
                })
                .collect();
            let all_owed = owed[0].as_ref().is_some_and(|(first, keys)| {
                *keys == lease.keys.len()
                    && owed
                        .iter()
                        .all(|next| next.as_ref().is_some_and(|(value, _)| value == first))
            });
            for (key, ours_here) in lease.keys.iter().zip(held) {
                if !ours_here {
                    continue;
                }
                ours += 1;
                let listened = data.watched(key, now)
                    || matches!(
                        data.locks.get(key),
                        Some(Held::Exclusive { waited: true, .. })
                    );
                match kept {
                    Some(kept) => {
                        if let Some(Held::Exclusive { expires, .. }) = data.locks.get_mut(key) {
                            *expires = now + kept;
                        }
                        if listened {
                            announced.push((key, String::new()));
                        }
                    }
                    None => {
                        let message = Self::message(lease);
                        if let Some(message) = data.free(key, message, all_owed, now) {
                            announced.push((key, message));
                        }
                    }
                }
            }
        }
        for (key, message) in announced {
            self.announce(key, message);
        }
        ours == lease.keys.len()
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
                Err(error) => NodeHealth::silent("in memory", NodeRole::Server, error),
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
            let now = Instant::now();
            let mut data = self.data();
            data.foreign(request.key)?;
            if let Err(busy) = data.take(&request, now) {
                return Ok(busy);
            }
            let fencing_token = request.fencing.then(|| {
                // As Redis's: never below the clock, and above the key's last token.
                let clock = clock::epoch_micros();
                let fence = data.fences.entry(request.key.to_owned()).or_insert(0);
                *fence = (*fence + 1).max(protocol::fencing_floor(clock));
                *fence
            });
            Ok(Acquired::Taken { fencing_token })
        })
    }

    fn acquire_many<'a>(
        &'a self,
        request: ManyRequest<'a>,
        _budget: Duration,
    ) -> BoxFuture<'a, Result<AcquiredMany, StoreError>> {
        Box::pin(async move {
            self.injected_failure()?;
            let now = Instant::now();
            let mut data = self.data();
            let token = protocol::holder_token(request.value);
            for key in request.keys {
                data.foreign(key)?;
            }
            // As acquire_many.lua: the first key held by another makes the whole set busy (a
            // caller that waits marks every such key, and is counted on every key); otherwise
            // every key is taken, or kept when ours.
            let busy = request
                .keys
                .iter()
                .position(|key| match data.live(key, now) {
                    Some(Held::Exclusive { value, .. }) => !protocol::holds(value, token),
                    Some(_) => true,
                    None => false,
                });
            if let Some(index) = busy {
                let remaining = data
                    .live(&request.keys[index], now)
                    .and_then(|held| held.remaining(now));
                if request.waiting {
                    let life = request.waiter_place() + remaining.unwrap_or_default().mul_f64(1.1);
                    let reservation = request.starving_since.map(|since_ms| Reserved {
                        since_ms,
                        ttl: request.ttl,
                        keys: request.keys.len(),
                        value: request.value.to_owned(),
                    });
                    for key in request.keys {
                        data.count_waiter(key, token, life, now);
                        if let Some(held) = data.live(key, now)
                            && !matches!(held, Held::Exclusive { value, .. } if protocol::holds(value, token))
                        {
                            held.mark(reservation.clone());
                        }
                    }
                }
                let estimate = data.estimate(&request.keys[index], remaining, now);
                return Ok(AcquiredMany::Busy {
                    key: index,
                    remaining,
                    estimate,
                });
            }
            for key in request.keys {
                match data.live(key, now) {
                    Some(Held::Exclusive { value, expires, .. }) => {
                        request.value.clone_into(value);
                        *expires = now + request.ttl;
                    }
                    _ => {
                        let held = Held::Exclusive {
                            value: request.value.to_owned(),
                            expires: now + request.ttl,
                            waited: false,
                            reserved: None,
                        };
                        data.locks.insert(key.clone(), held);
                    }
                }
                if request.waiting {
                    data.served(key, token, now);
                }
            }
            Ok(AcquiredMany::Taken)
        })
    }

    fn extend<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Renewal>> {
        Box::pin(async move {
            if let Err(error) = self.injected_failure() {
                return vec![Renewal::Failed(error); leases.len()];
            }
            let now = Instant::now();
            let mut data = self.data();
            leases
                .iter()
                .map(|lease| match data.live(lease.key, now) {
                    Some(Held::Exclusive { value, expires, .. }) if value == lease.value => {
                        *expires = now + lease.ttl;
                        Renewal::Extended
                    }
                    Some(Held::Shared { holders, .. }) if holders.contains_key(lease.value) => {
                        holders.insert(lease.value.to_owned(), now + lease.ttl);
                        Renewal::Extended
                    }
                    // Another owner's, or gone: never re-created.
                    Some(Held::Exclusive { .. }) => Renewal::Lost(LostReason::Taken),
                    _ => Renewal::Lost(LostReason::Gone),
                })
                .collect()
        })
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.injected_failure()?;
            if !lease.keys.is_empty() {
                return Ok(self.release_many(lease));
            }
            // (ours, announcement): as the release script, an exclusive lock's release is
            // announced only when a waiter marked it or a watch follows it (or to the caller
            // it is handed to); a shared holder's always.
            let (ours, announced) = {
                let mut data = self.data();
                let now = Instant::now();
                if let Some(kept) = lease.kept_for() {
                    // `hold_at_least`, as the release script: the holder stays until the hold
                    // is over, and whoever waits or watches is told to look again.
                    let listened = data.watched(lease.key, now)
                        || matches!(
                            data.live(lease.key, now),
                            Some(Held::Exclusive { waited: true, .. } | Held::Shared { .. })
                        );
                    let ours = data.keep(lease, now + kept, now);
                    drop(data);
                    if ours && listened {
                        self.look_again(lease.key);
                    }
                    return Ok(ours);
                }
                match data.live(lease.key, now) {
                    Some(held @ Held::Exclusive { .. }) if held.held_by(lease.value, now) => {
                        (true, data.free(lease.key, Self::message(lease), false, now))
                    }
                    Some(Held::Shared { holders, .. }) => {
                        let ours = holders.remove(lease.value).is_some();
                        if holders.is_empty() {
                            data.locks.remove(lease.key);
                        }
                        (ours, ours.then(|| Self::message(lease).to_owned()))
                    }
                    _ => (false, None),
                }
            };
            if let Some(message) = announced {
                self.announce(lease.key, message);
            }
            Ok(ours)
        })
    }

    fn leave<'a>(&'a self, key: &'a str, token: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.injected_failure()?;
            let now = Instant::now();
            let given_back = {
                let mut data = self.data();
                data.waiters_of(key, now).entries.remove(token);
                if let Some(writers) = data.writers.get_mut(key) {
                    writers.remove(token);
                }
                match data.live(key, now) {
                    Some(Held::Exclusive { value, .. }) if protocol::holds(value, token) => {
                        let value = value.clone();
                        data.locks.remove(key);
                        Some(value)
                    }
                    Some(Held::Exclusive { reserved, .. }) => {
                        if reserved.as_ref().is_some_and(|next| next.token() == token) {
                            *reserved = None;
                        }
                        None
                    }
                    _ => None,
                }
            };
            if let Some(value) = given_back {
                self.announce(key, value);
            }
            Ok(())
        })
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
        Box::pin(async move { Ok(self.data().snapshot(key, Instant::now())) })
    }

    fn mark_watched<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let until = Instant::now() + protocol::WATCH_MARK_LIFE;
            self.data().watched.insert(key.to_owned(), until);
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
                .filter_map(|key| data.snapshot(key, now))
                .collect();
            Ok(Page { locks, next })
        })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.injected_failure()?;
            let removed = {
                let mut data = self.data();
                data.live(key, Instant::now());
                // The fair queue and writers' claims stay: the next in line keeps its turn.
                // Data that is no lock is no lock to release.
                if matches!(data.locks.get(key), Some(Held::Foreign(_))) {
                    return Ok(false);
                }
                match data.locks.remove(key) {
                    Some(Held::Exclusive { value, .. }) => vec![value],
                    Some(Held::Shared { holders, .. }) => holders.into_keys().collect(),
                    _ => Vec::new(),
                }
            };
            for value in &removed {
                self.announce(key, value.clone());
            }
            if !removed.is_empty() {
                self.announce(protocol::FORCED_RELEASES, key.to_owned());
            }
            Ok(!removed.is_empty())
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

    /// Makes the next `operations` calls to the store (acquire, a renewal batch, release) fail
    /// as an unreachable Redis would: `LockError::Redis` for callers, retries for the watchdog.
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
