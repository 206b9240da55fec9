//! Locks in the process: the deployment behind `LockClient::in_memory()` (feature `test-util`),
//! for users' own tests.
//!
//! It keeps Redis's semantics, not a toy's: a lease is a key with a token and an expiry, taken
//! only when free, extended only while it holds our token, released by compare-and-delete with
//! an announcement when a waiter marked it or someone listens for its releases (as the scripts
//! do), expiring silently (as Redis keys do) when its time is
//! up. Fencing tokens follow the clock floor of `protocol::fencing_floor`, as Redis's do. Time is tokio's
//! clock, so under `#[tokio::test(start_paused = true)]` a test crosses a 30 s lease in
//! milliseconds. [`MemoryHooks`] provokes what is rare against a real Redis.

use std::collections::{HashMap, HashSet, VecDeque};
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
use crate::error::LostReason;
use crate::health::{Health, NodeHealth, NodeRole};
use crate::options::LockKind;

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
    locks: HashMap<String, Held>,
    /// The last fencing token handed out per key: kept for the store's life, so tokens only grow.
    fences: HashMap<String, u64>,
    /// How many feeds listen for releases of each key.
    listeners: HashMap<String, usize>,
    /// Keys a watch follows, each until its mark lapses (`protocol::WATCH_MARK_LIFE`).
    watched: HashMap<String, Instant>,
    /// Fair queues: waiting tokens in arrival order, each with the time its place lapses.
    queues: HashMap<String, VecDeque<(String, Instant)>>,
    /// Writers waiting for readers to leave, each until its claim lapses.
    writers: HashMap<String, HashMap<String, Instant>>,
}

/// What a lock key holds: one exclusive holder, or shared holders each with its own expiry.
enum Held {
    Exclusive {
        token: String,
        expires: Instant,
        /// A caller that waits found it busy (Redis's value carries the waited mark): then
        /// its release is announced, as in Redis, even when nobody listens any more.
        waited: bool,
    },
    Shared {
        kind: LockKind,
        holders: HashMap<String, Instant>,
    },
}

impl Held {
    /// Whether `token` holds it now.
    fn held_by(&self, token: &str, now: Instant) -> bool {
        match self {
            Self::Exclusive {
                token: holder,
                expires,
                ..
            } => holder == token && *expires > now,
            Self::Shared { holders, .. } => {
                holders.get(token).is_some_and(|expires| *expires > now)
            }
        }
    }

    /// When it is free: its holder's expiry, or its last holder's.
    fn expires(&self) -> Instant {
        match self {
            Self::Exclusive { expires, .. } => *expires,
            Self::Shared { holders, .. } => {
                holders.values().copied().max().unwrap_or_else(Instant::now)
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
            None => false,
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
            Some(Held::Exclusive { token, expires, .. }) if token == lease.token => {
                *expires = until;
                true
            }
            Some(Held::Shared { holders, .. }) => match holders.get_mut(lease.token) {
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
        let (kind, holders) = match self.live(key, now)? {
            Held::Exclusive { token, expires, .. } => (
                LockKind::Exclusive,
                vec![(token.clone(), expires.saturating_duration_since(now))],
            ),
            Held::Shared { kind, holders } => (
                *kind,
                holders
                    .iter()
                    .map(|(token, expires)| (token.clone(), expires.saturating_duration_since(now)))
                    .collect(),
            ),
        };
        let queued = self.queues.get(key).map_or(0, |queue| {
            queue.iter().filter(|(_, lapses)| *lapses > now).count()
        });
        let listeners = self.listeners.get(key).copied().unwrap_or(0);
        Some(Snapshot {
            key: key.to_owned(),
            kind,
            holders,
            fencing: self.fences.get(key).copied(),
            waiters: listeners.max(queued),
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

    /// Takes `request` if it may be taken now; else how long until it may, if known.
    fn take(&mut self, request: &AcquireRequest<'_>, now: Instant) -> Result<(), Option<Duration>> {
        let key = request.key;
        if request.fair
            && let Some(head) = self.queue_head(key, now)
            && head != request.token
        {
            return Err(None);
        }
        let lease_end = now + request.ttl;
        let writer_waits = request.kind == LockKind::Read && self.writer_waits(key, now);
        match (request.kind, self.live(key, now)) {
            (LockKind::Exclusive, None) => {
                let token = request.token.to_owned();
                self.locks.insert(
                    key.to_owned(),
                    Held::Exclusive {
                        token,
                        expires: lease_end,
                        // Fair waiters all look at each release: a fair holder's is announced.
                        waited: request.fair,
                    },
                );
            }
            (LockKind::Exclusive, Some(held)) => {
                // A call retried after it ran finds itself; anything else keeps it out.
                if !(matches!(held, Held::Exclusive { .. }) && held.held_by(request.token, now)) {
                    let remaining = held.expires().saturating_duration_since(now);

                    if matches!(held, Held::Shared { .. }) && request.waiting {
                        // A writer waiting on readers keeps new readers out.
                        let token = request.token.to_owned();
                        self.writers
                            .entry(key.to_owned())
                            .or_default()
                            .insert(token, lease_end);
                    }
                    return Err(Some(remaining));
                }
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
                        holders.contains_key(request.token),
                    ),
                    Some(other) => {
                        return Err(Some(other.expires().saturating_duration_since(now)));
                    }
                };
                if !ours {
                    if writer_waits {
                        return Err(None);
                    }
                    if let LockKind::Permits(permits) = kind
                        && count >= permits as usize
                    {
                        return Err(earliest.map(|at| at.saturating_duration_since(now)));
                    }
                }
                let holders = match self.locks.get_mut(key) {
                    Some(Held::Shared { holders, .. }) => holders,
                    _ => {
                        self.locks.insert(
                            key.to_owned(),
                            Held::Shared {
                                kind,
                                holders: HashMap::new(),
                            },
                        );
                        match self.locks.get_mut(key) {
                            Some(Held::Shared { holders, .. }) => holders,
                            _ => unreachable!("just inserted a shared lock"),
                        }
                    }
                };
                holders.insert(request.token.to_owned(), lease_end);
            }
        }
        if let Some(writers) = self.writers.get_mut(key) {
            writers.remove(request.token);
        }
        if let Some(queue) = self.queues.get_mut(key) {
            queue.retain(|(token, _)| token != request.token);
        }
        Ok(())
    }

    /// Keeps a fair waiter's place in the queue (joining at the back the first time).
    fn keep_place(&mut self, request: &AcquireRequest<'_>, now: Instant) {
        let lapses = now + request.queue_place();
        let queue = self.queues.entry(request.key.to_owned()).or_default();
        match queue.iter_mut().find(|(token, _)| token == request.token) {
            Some((_, place)) => *place = lapses,
            None => queue.push_back((request.token.to_owned(), lapses)),
        }
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
        let _ = self.inner.releases.send(Released {
            key: key.to_owned(),
            token: String::new(),
        });
    }

    fn announce(&self, lease: LeaseRef<'_>) {
        // Nobody listening is fine: waiters also go by the holder's remaining lease.
        let _ = self.inner.releases.send(Released {
            key: lease.key.to_owned(),
            token: lease.token.to_owned(),
        });
    }

    /// As release_many.lua: every key of a multi-key lease still ours goes (or is kept while
    /// its `hold_at_least` runs), announced when a waiter marked it or a watch follows it;
    /// `true` when every key was ours.
    fn release_many(&self, lease: LeaseRef<'_>) -> bool {
        let mut announced = Vec::new();
        let mut looks_again = Vec::new();
        let mut ours = 0;
        {
            let mut data = self.data();
            let now = Instant::now();
            let kept = lease.kept_for();
            for key in lease.keys {
                let listening = data.watched(key, now);
                if let Some(held @ Held::Exclusive { .. }) = data.live(key, now)
                    && held.held_by(lease.token, now)
                {
                    let listened =
                        listening || matches!(held, Held::Exclusive { waited: true, .. });
                    match kept {
                        Some(kept) => {
                            if let Held::Exclusive { expires, .. } = held {
                                *expires = now + kept;
                            }
                            if listened {
                                looks_again.push(key);
                            }
                        }
                        None => {
                            data.locks.remove(key);
                            if listened {
                                announced.push(key);
                            }
                        }
                    }
                    ours += 1;
                }
            }
        }
        for key in announced {
            self.announce(LeaseRef {
                key,
                keys: &[],
                ..lease
            });
        }
        for key in looks_again {
            self.look_again(key);
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
            if let Err(remaining) = data.take(&request, now) {
                if request.waiting
                    && let Some(Held::Exclusive { waited, .. }) = data.live(request.key, now)
                {
                    // As the script's busy path: a caller that waits marks an exclusive holder.
                    *waited = true;
                }
                if request.fair && request.waiting {
                    data.keep_place(&request, now);
                }
                return Ok(Acquired::Busy { remaining });
            }
            let fencing_token = request.fencing.then(|| {
                // As Redis's: never below the clock, and above the key's last token.
                let clock = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |since| since.as_micros() as u64);
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
            // As acquire_many.lua: the first key held by another makes the whole set busy (a
            // caller that waits marks it); otherwise every key is taken, or kept when ours.
            for (index, key) in request.keys.iter().enumerate() {
                match data.live(key, now) {
                    Some(Held::Exclusive {
                        token,
                        expires,
                        waited,
                    }) if token != request.token => {
                        *waited |= request.waiting;
                        let remaining = expires.saturating_duration_since(now);
                        return Ok(AcquiredMany::Busy {
                            key: index,
                            remaining: Some(remaining),
                        });
                    }
                    Some(shared @ Held::Shared { .. }) => {
                        let remaining = shared.expires().saturating_duration_since(now);
                        return Ok(AcquiredMany::Busy {
                            key: index,
                            remaining: Some(remaining),
                        });
                    }
                    _ => {}
                }
            }
            for key in request.keys {
                match data.live(key, now) {
                    Some(Held::Exclusive { expires, .. }) => *expires = now + request.ttl,
                    _ => {
                        let held = Held::Exclusive {
                            token: request.token.to_owned(),
                            expires: now + request.ttl,
                            waited: false,
                        };
                        data.locks.insert(key.clone(), held);
                    }
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
                    Some(Held::Exclusive { token, expires, .. }) if token == lease.token => {
                        *expires = now + lease.ttl;
                        Renewal::Extended
                    }
                    Some(Held::Shared { holders, .. }) if holders.contains_key(lease.token) => {
                        holders.insert(lease.token.to_owned(), now + lease.ttl);
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
            // (ours, announced): as the release script, an exclusive lock's release is announced
            // only when a waiter marked it or a watch follows it; a shared holder's always.
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
                    Some(held @ Held::Exclusive { .. }) if held.held_by(lease.token, now) => {
                        let waited = matches!(held, Held::Exclusive { waited: true, .. });
                        data.locks.remove(lease.key);
                        (true, waited || data.watched(lease.key, now))
                    }
                    Some(Held::Shared { holders, .. }) => {
                        let ours = holders.remove(lease.token).is_some();
                        if holders.is_empty() {
                            data.locks.remove(lease.key);
                        }
                        (ours, ours)
                    }
                    _ => (false, false),
                }
            };
            if announced {
                self.announce(lease);
            }
            Ok(ours)
        })
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        Box::pin(async move {
            Ok(Box::new(MemoryFeed {
                store: self.clone(),
                releases: self.inner.releases.subscribe(),
                watched: HashSet::new(),
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
                match data.locks.remove(key) {
                    Some(Held::Exclusive { token, .. }) => vec![token],
                    Some(Held::Shared { holders, .. }) => holders.into_keys().collect(),
                    None => Vec::new(),
                }
            };
            for token in &removed {
                let _ = self.inner.releases.send(Released {
                    key: key.to_owned(),
                    token: token.clone(),
                });
            }
            Ok(!removed.is_empty())
        })
    }
}

/// Release announcements within the process.
struct MemoryFeed {
    store: MemoryStore,
    releases: broadcast::Receiver<Released>,
    watched: HashSet<String>,
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
                                token: String::new(),
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
    store: MemoryStore,
}

impl std::fmt::Debug for MemoryHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryHooks").finish_non_exhaustive()
    }
}

impl MemoryHooks {
    /// Another client over the same store, as another process would have: its own watchdog,
    /// waiters and reentrancy (clones of one client share those).
    pub fn client(&self) -> crate::LockClient {
        crate::LockClient::over_memory(self.store.clone())
    }

    /// The token stored under `key`, `None` when the key is free.
    pub fn holder(&self, key: &str) -> Option<String> {
        let mut data = self.store.data();
        match data.live(key, Instant::now())? {
            Held::Exclusive { token, .. } => Some(token.clone()),
            Held::Shared { holders, .. } => holders.keys().min().cloned(),
        }
    }

    /// Every token holding `key` now: one for an exclusive lock, each reader or permit holder
    /// for a shared one.
    pub fn holders(&self, key: &str) -> Vec<String> {
        let mut data = self.store.data();
        let mut holders: Vec<String> = match data.live(key, Instant::now()) {
            Some(Held::Exclusive { token, .. }) => vec![token.clone()],
            Some(Held::Shared { holders, .. }) => holders.keys().cloned().collect(),
            None => Vec::new(),
        };
        holders.sort();
        holders
    }

    /// Expires `key` now, as if its lease ran out: its holder learns `Lost` at its next renewal,
    /// and waiters find it free when they look (an expiry announces nothing, as in Redis).
    pub fn expire(&self, key: &str) {
        self.store.data().locks.remove(key);
    }

    /// Lets another owner take `key` for `ttl`, replacing any holder: the holder learns `Lost`
    /// at its next renewal. Returns the other owner's token.
    pub fn take_over(&self, key: &str, ttl: Duration) -> String {
        let token = format!("another-owner-{:032x}", rand::random::<u128>());
        self.store.data().locks.insert(
            key.to_owned(),
            Held::Exclusive {
                token: token.clone(),
                expires: Instant::now() + ttl,
                waited: false,
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
