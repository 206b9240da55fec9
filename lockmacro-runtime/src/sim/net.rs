//! The simulated network between each simulated client and the store: the faults of a world
//! ([`Network`]), and tier one's [`Store`] per client ([`Link`]) over one in-memory store, that
//! gives every call a latency and, until the faults heal, what a network does to a Redis client:
//! replies lost with their outcome unknown, announcements delayed or lost, subscriptions closed,
//! a client cut off (partitioned) or paused for a while. Tier two's transport to a simulated
//! Redis draws its connections' fates from the same [`Network`].
//!
//! Every draw comes from the world's seed, from one stream per link, so a seed replays. Which
//! kinds of fault a world has is drawn per seed (each kind on or off), and when they heal. A
//! lost reply is what a Redis connection gives: a reset or a timeout, an error that heals, so
//! waiting callers look again; an acquire whose outcome is unknown is undone by the link, as
//! the Redis store undoes it (a compare-and-delete after the request), so the engine never
//! holds a key it does not know about. Latencies lean towards the protocol's edges: the
//! starvation bound, the end of a lease, the response timeout.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::FutureExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Stream, sometimes};
use crate::health::Health;
use crate::options::LockKind;
use crate::store::memory::{MemoryHooks, MemoryStore};
use crate::store::protocol::{self, RESERVE_AFTER};
use crate::store::{
    AcquireRequest, Acquired, AcquiredMany, BoxFuture, Cursor, HandOver, HandsOver, LeaseRef,
    ManyRequest, Page, ReleaseFeed, Released, Renewal, Snapshot, Store, StoreError, TimedOut,
};
use crate::sync::lock;

/// How long a call without a budget of its own waits for its reply: the in-memory client's
/// response timeout, as a Redis store's connection would.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest one-way latency once the faults healed (ms).
const HEALED_LATENCY_MS: u64 = 2;

/// The kinds of fault a world has, each drawn on or off from its seed.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    /// Latencies near the protocol's edges, beside the ordinary small ones.
    edges: bool,
    lost_replies: bool,
    slow_announcements: bool,
    lost_announcements: bool,
    closed_feeds: bool,
    partitions: bool,
    pauses: bool,
}

impl Faults {
    fn draw(stream: &mut Stream) -> Self {
        Self {
            edges: stream.percent(60),
            lost_replies: stream.percent(50),
            slow_announcements: stream.percent(50),
            lost_announcements: stream.percent(40),
            closed_feeds: stream.percent(40),
            partitions: stream.percent(35),
            pauses: stream.percent(35),
        }
    }

    fn names(&self) -> Vec<&'static str> {
        [
            (self.edges, "edges"),
            (self.lost_replies, "lost-replies"),
            (self.slow_announcements, "slow-announcements"),
            (self.lost_announcements, "lost-announcements"),
            (self.closed_feeds, "closed-feeds"),
            (self.partitions, "partitions"),
            (self.pauses, "pauses"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect()
    }
}

/// A client cut off for a while: partitioned (nothing reaches the store, its subscription
/// drops), or paused (its requests, replies and announcements are held until the pause ends;
/// its timers run on, as a single runtime cannot stop one client's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Partition,
    Pause,
}

#[derive(Debug, Clone, Copy)]
struct Window {
    cut: Cut,
    from: Instant,
    to: Instant,
}

/// The network of one world: the faults and when they heal, each client's cuts and each
/// client's stream. Tier one's [`Link`]s and tier two's simulated Redis transport
/// ([`crate::sim::redis::transport`]) both draw from it.
pub(crate) struct Net {
    faults: Faults,
    start: Instant,
    healed_at: Instant,
    windows: Vec<Vec<Window>>,
    streams: Vec<Mutex<Stream>>,
    /// Each client's connection, which keeps the order of its requests and of its replies.
    wires: Vec<Mutex<Wire>>,
}

/// When the last request sent on a connection arrives, and when its last reply does: the next
/// ones come after them, as on one Redis connection.
#[derive(Clone, Copy)]
pub(crate) struct Wire {
    requests: Instant,
    replies: Instant,
}

impl Wire {
    /// A connection opened now.
    pub(crate) fn new() -> Self {
        let now = Instant::now();
        Self {
            requests: now,
            replies: now,
        }
    }
}

/// The simulated network of a world (see the module's docs): [`link`](Self::link) gives each
/// simulated client its own way to the store.
#[derive(Clone)]
pub struct Network(Arc<Net>);

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.describe())
    }
}

impl Network {
    /// A network for `clients` clients, its faults drawn from the world's seed (none outside a
    /// world, seed 0).
    pub fn new(clients: usize) -> Self {
        let mut stream = super::stream(&[NET]);
        let faults = Faults::draw(&mut stream);
        let start = Instant::now();
        let healed_at = start + stream.millis(500, 6_000);
        let windows = (0..clients)
            .map(|client| {
                let mut stream = stream.child(client as u64);
                let mut windows = Vec::new();
                for (on, cut) in [
                    (faults.partitions, Cut::Partition),
                    (faults.pauses, Cut::Pause),
                ] {
                    if on && stream.percent(60) {
                        let from = start + stream.millis(0, 5_000);
                        let to = (from + stream.millis(30, 1_500)).min(healed_at);
                        if from < to {
                            windows.push(Window { cut, from, to });
                        }
                    }
                }
                windows
            })
            .collect();
        let streams = (0..clients)
            .map(|client| Mutex::new(super::stream(&[NET, LINK, client as u64])))
            .collect();
        Self(Arc::new(Net {
            wires: (0..clients).map(|_| Mutex::new(Wire::new())).collect(),
            faults,
            start,
            healed_at,
            windows,
            streams,
        }))
    }

    /// Client `client`'s way to the in-memory store of `memory`, for
    /// [`LockClient::simulated`](crate::LockClient::simulated).
    pub fn link(&self, memory: &MemoryHooks, client: usize) -> Link {
        Link {
            net: self.net(client),
            client,
            inner: Arc::new(memory.store.clone()),
            memory: memory.store.clone(),
        }
    }

    /// The network, for a part of client `client`.
    pub(crate) fn net(&self, client: usize) -> Arc<Net> {
        assert!(
            client < self.0.streams.len(),
            "no client {client} in this network"
        );
        self.0.clone()
    }

    /// How many clients it has.
    pub(crate) fn clients(&self) -> usize {
        self.0.streams.len()
    }

    /// How long after the network was made every fault has healed.
    pub fn healed_after(&self) -> Duration {
        self.0.healed_at - self.0.start
    }

    /// The longest round trip once the faults healed, the engine's own rounding to whole
    /// milliseconds included.
    pub fn healed_round_trip() -> Duration {
        Duration::from_millis(2 * (HEALED_LATENCY_MS + 1))
    }

    /// The faults drawn, and each client's cuts (ms from the network's start), for a trace.
    pub fn describe(&self) -> String {
        let net = &self.0;
        let mut text = format!(
            "faults [{}] healed at {} ms",
            net.faults.names().join(" "),
            net.healed_at.duration_since(net.start).as_millis()
        );
        for (client, windows) in net.windows.iter().enumerate() {
            for window in windows {
                let _ = write!(
                    text,
                    "; p{client} {:?} {}..{} ms",
                    window.cut,
                    window.from.duration_since(net.start).as_millis(),
                    window.to.duration_since(net.start).as_millis()
                );
            }
        }
        text
    }
}

/// Labels of the network's streams.
const NET: u64 = 0x006e_6574;
const LINK: u64 = 1;

/// What becomes of one request: its latencies, and whether its reply is lost.
pub(crate) struct Fate {
    pub(crate) request: Duration,
    pub(crate) reply: Duration,
    pub(crate) lost: Option<Loss>,
}

/// A lost reply: whether the command ran first, and whether the caller hears a reset (else
/// nothing until its timeout).
#[derive(Clone, Copy)]
pub(crate) struct Loss {
    pub(crate) ran: bool,
    pub(crate) reset: bool,
}

impl Net {
    pub(crate) fn faulty(&self) -> bool {
        Instant::now() < self.healed_at
    }

    /// When every fault has healed.
    pub(crate) fn healed_at(&self) -> Instant {
        self.healed_at
    }

    /// The cut of `client` at `at`, if any.
    fn cut(&self, client: usize, at: Instant) -> Option<Window> {
        self.windows[client]
            .iter()
            .find(|window| window.from <= at && at < window.to)
            .copied()
    }

    /// When something `client` sends or receives at `at` gets through: at once, or when its
    /// pause ends.
    pub(crate) fn unpaused(&self, client: usize, at: Instant) -> Instant {
        match self.cut(client, at) {
            Some(window) if window.cut == Cut::Pause => {
                sometimes("a message held by a pause");
                window.to
            }
            _ => at,
        }
    }

    pub(crate) fn partitioned(&self, client: usize, at: Instant) -> bool {
        self.cut(client, at)
            .is_some_and(|window| window.cut == Cut::Partition)
    }

    /// The next partition of `client` from now on, if one is to come.
    pub(crate) fn next_partition(&self, client: usize) -> Option<Instant> {
        let now = Instant::now();
        self.windows[client]
            .iter()
            .filter(|window| window.cut == Cut::Partition && window.to > now)
            .map(|window| window.from.max(now))
            .min()
    }

    /// When a request of `client` sent now with `latency` on `wire` arrives: after its pause,
    /// and after the requests sent before it on that connection.
    pub(crate) fn request_arrives(
        &self,
        client: usize,
        wire: &mut Wire,
        latency: Duration,
    ) -> Instant {
        let at = self.unpaused(client, Instant::now()) + latency;
        wire.requests = wire.requests.max(at);
        wire.requests
    }

    /// When a reply (or a message pushed) to `client` sent now with `latency` on `wire`
    /// arrives, as [`request_arrives`](Self::request_arrives).
    pub(crate) fn reply_arrives(
        &self,
        client: usize,
        wire: &mut Wire,
        latency: Duration,
    ) -> Instant {
        let at = self.unpaused(client, Instant::now()) + latency;
        wire.replies = wire.replies.max(at);
        wire.replies
    }

    /// `client`'s own connection (tier one has one a client).
    fn wire(&self, client: usize) -> std::sync::MutexGuard<'_, Wire> {
        lock(&self.wires[client])
    }

    pub(crate) fn stream(&self, client: usize) -> std::sync::MutexGuard<'_, Stream> {
        lock(&self.streams[client])
    }

    /// One way's latency: small, or (with the edges fault) near the starvation bound, near
    /// the end of a lease of `ttl` (a renewal sent at a third landing at its end), or near the
    /// response timeout.
    pub(crate) fn latency(&self, client: usize, ttl: Option<Duration>) -> Duration {
        let mut stream = self.stream(client);
        if !self.faulty() {
            return stream.millis(0, HEALED_LATENCY_MS);
        }
        if !self.faults.edges {
            return stream.millis(0, 3);
        }
        match stream.below(100) {
            0..70 => stream.millis(0, 3),
            70..82 => {
                sometimes("a latency near the starvation bound");
                let bound = RESERVE_AFTER.as_millis() as u64;
                stream.millis(bound / 4, bound + 4)
            }
            82..90 => match ttl {
                Some(ttl) => {
                    sometimes("a latency near the end of a lease");
                    let end = ttl.as_millis() as u64 * 2 / 3;
                    stream.millis(end.saturating_sub(end / 20), end + end / 20)
                }
                None => stream.millis(4, 60),
            },
            90..95 => {
                sometimes("a latency near the response timeout");
                stream.millis(950, 1_050)
            }
            _ => stream.millis(4, 60),
        }
    }

    pub(crate) fn fate(&self, client: usize, ttl: Option<Duration>) -> Fate {
        let request = self.latency(client, ttl);
        let reply = self.latency(client, ttl);
        let lost = (self.faulty() && self.faults.lost_replies).then(|| {
            let mut stream = self.stream(client);
            stream.percent(8).then(|| Loss {
                ran: stream.percent(50),
                reset: stream.percent(50),
            })
        });
        Fate {
            request,
            reply,
            lost: lost.flatten(),
        }
    }

    /// Whether an announcement heard now is lost.
    fn loses_announcement(&self, client: usize) -> bool {
        self.faulty() && self.faults.lost_announcements && self.stream(client).percent(10)
    }

    /// How long an announcement heard now takes to reach the client.
    pub(crate) fn announcement_delay(&self, client: usize) -> Duration {
        if self.faulty() && self.faults.slow_announcements {
            let mut stream = self.stream(client);
            if stream.percent(30) {
                sometimes("an announcement delayed");
                return stream.millis(3, 40);
            }
        }
        self.stream(client).millis(0, HEALED_LATENCY_MS)
    }

    /// When a feed opened now closes on its own, if it does before the faults heal.
    pub(crate) fn feed_closes_at(&self, client: usize) -> Option<Instant> {
        let drawn = (self.faulty() && self.faults.closed_feeds)
            .then(|| Instant::now() + self.stream(client).millis(10, 2_000))
            .filter(|at| *at < self.healed_at);
        match (drawn, self.next_partition(client)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The error a Redis connection gives when it drops: it heals, so a waiting caller looks again.
pub(crate) fn reset_error() -> redis::RedisError {
    let error = io::Error::new(
        io::ErrorKind::ConnectionReset,
        "connection reset (simulated)",
    );
    redis::RedisError::from(error)
}

/// The error of a connection a partition refuses.
pub(crate) fn refused_error() -> redis::RedisError {
    let error = io::Error::new(
        io::ErrorKind::ConnectionRefused,
        "connection refused (simulated partition)",
    );
    redis::RedisError::from(error)
}

fn reset() -> StoreError {
    StoreError::unavailable(reset_error())
}

fn refused() -> StoreError {
    StoreError::unavailable(refused_error())
}

/// One simulated client's way to an in-memory store (see [`Network`]).
#[derive(Clone)]
pub struct Link {
    net: Arc<Net>,
    client: usize,
    inner: Arc<dyn Store>,
    memory: MemoryStore,
}

impl Link {
    /// The store behind the network, for the client a link is given to.
    pub(crate) fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.clone())
    }

    /// The in-memory store behind the network.
    pub(crate) fn memory(&self) -> MemoryStore {
        self.memory.clone()
    }

    /// Sends `apply` (the inner store's call, owning what it needs) and waits at most `budget`
    /// for its reply. `undo` is sent after it when its outcome is unknown to the caller (the
    /// reply lost, late, or the caller gone), as the Redis store undoes an acquire.
    async fn call<T: Send + 'static>(
        &self,
        budget: Duration,
        ttl: Option<Duration>,
        apply: BoxFuture<'static, T>,
        undo: Option<BoxFuture<'static, ()>>,
    ) -> Result<T, StoreError> {
        let net = &self.net;
        let now = Instant::now();
        let deadline = now + budget;
        let fate = net.fate(self.client, ttl);
        if net.partitioned(self.client, now) {
            sometimes("a request refused by a partition");
            let reset = net.stream(self.client).percent(50);
            return match reset {
                true => {
                    tokio::time::sleep(fate.request).await;
                    Err(refused())
                }
                false => {
                    tokio::time::sleep_until(deadline).await;
                    Err(StoreError::unavailable(TimedOut(budget)))
                }
            };
        }
        let arrives = net.request_arrives(self.client, &mut net.wire(self.client), fate.request);
        let runs = fate.lost.is_none_or(|loss| loss.ran);
        let handle = runs.then(|| {
            tokio::spawn(async move {
                tokio::time::sleep_until(arrives).await;
                apply.await
            })
        });
        let mut flight = InFlight {
            link: self.clone(),
            handle,
            ran: false,
            undo,
        };
        match tokio::time::timeout_at(deadline, flight.reply(arrives, &fate)).await {
            Ok(Ok(value)) => {
                flight.undo = None;
                Ok(value)
            }
            Ok(Err(error)) => Err(error),
            Err(_) => {
                sometimes("a call timed out");
                Err(StoreError::unavailable(TimedOut(budget)))
            }
        }
    }

    fn owned_lease(lease: LeaseRef<'_>) -> OwnedRef {
        OwnedRef {
            key: lease.key.to_owned(),
            keys: lease.keys.to_vec(),
            value: lease.value.to_owned(),
            kind: lease.kind,
            ttl: lease.ttl,
            hold_until: lease.hold_until,
            undone: lease.undone,
        }
    }

    /// A compare-and-delete of `lease` as an undone attempt, for [`call`](Self::call)'s `undo`.
    fn undo_of(&self, lease: LeaseRef<'_>) -> BoxFuture<'static, ()> {
        let (inner, lease) = (self.inner.clone(), Self::owned_lease(lease));
        Box::pin(async move {
            sometimes("an acquire of unknown outcome undone");
            let _ = inner.release(lease.as_ref()).await;
        })
    }
}

/// A request on the wire: its reply awaited, or its outcome left unknown (then undone).
struct InFlight<T: Send + 'static> {
    link: Link,
    /// The command, sent: it runs when it arrives, whether the caller still waits or not.
    handle: Option<JoinHandle<T>>,
    /// It ran, and its caller did not hear so.
    ran: bool,
    undo: Option<BoxFuture<'static, ()>>,
}

impl<T: Send + 'static> InFlight<T> {
    async fn reply(&mut self, arrives: Instant, fate: &Fate) -> Result<T, StoreError> {
        let net = self.link.net.clone();
        let client = self.link.client;
        let value = match self.handle.as_mut() {
            Some(handle) => handle.await.ok(),
            None => {
                tokio::time::sleep_until(arrives).await;
                None
            }
        };
        self.handle = None;
        self.ran = value.is_some();
        let lost = fate.lost.or_else(|| {
            // A partition that began while the request was out takes its reply.
            net.partitioned(client, Instant::now()).then_some(Loss {
                ran: true,
                reset: true,
            })
        });
        if let Some(loss) = lost {
            sometimes("a reply lost");
            if self.ran {
                sometimes("a reply lost after its command ran");
            }
            if !loss.reset {
                return std::future::pending().await;
            }
            tokio::time::sleep(fate.reply).await;
            return Err(reset());
        }
        let Some(value) = value else {
            return Err(reset());
        };
        let arrives = net.reply_arrives(client, &mut net.wire(client), fate.reply);
        tokio::time::sleep_until(arrives).await;
        Ok(value)
    }
}

impl<T: Send + 'static> Drop for InFlight<T> {
    fn drop(&mut self) {
        let Some(undo) = self.undo.take() else {
            return;
        };
        if self.handle.is_none() && !self.ran {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        // Sent after the request on its connection: it lands after it, whatever happened.
        let (handle, link) = (self.handle.take(), self.link.clone());
        let latency = link.net.latency(link.client, None);
        let arrives =
            link.net
                .request_arrives(link.client, &mut link.net.wire(link.client), latency);
        runtime.spawn(async move {
            if let Some(handle) = handle {
                let _ = handle.await;
            }
            // A partition drops the connection: the undo is sent again once it is over.
            let mut at = arrives;
            while let Some(window) = link.net.cut(link.client, at) {
                at = window.to + latency;
            }
            tokio::time::sleep_until(at).await;
            undo.await;
        });
    }
}

/// A [`LeaseRef`] that owns its strings and keeps `undone`, for a command sent on its own.
#[derive(Clone)]
struct OwnedRef {
    key: String,
    keys: Vec<String>,
    value: String,
    kind: LockKind,
    ttl: Duration,
    hold_until: Option<u64>,
    undone: bool,
}

impl OwnedRef {
    fn as_ref(&self) -> LeaseRef<'_> {
        LeaseRef {
            key: &self.key,
            keys: &self.keys,
            value: &self.value,
            kind: self.kind,
            ttl: self.ttl,
            hold_until: self.hold_until,
            undone: self.undone,
        }
    }
}

impl Store for Link {
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        let inner = self.inner.clone();
        let (key, value) = (request.key.to_owned(), request.value.to_owned());
        let AcquireRequest {
            kind,
            ttl,
            fencing,
            waiting,
            fair,
            reserving_since,
            ..
        } = request;
        let apply: BoxFuture<'static, _> = Box::pin(async move {
            let request = AcquireRequest {
                key: &key,
                value: &value,
                kind,
                ttl,
                fencing,
                waiting,
                fair,
                reserving_since,
            };
            inner.acquire(request, budget).await
        });
        let undo = self.undo_of(request.lease());
        Box::pin(async move {
            self.call(budget, Some(request.ttl), apply, Some(undo))
                .await?
        })
    }

    fn acquire_many<'a>(
        &'a self,
        request: ManyRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<AcquiredMany, StoreError>> {
        let inner = self.inner.clone();
        let (keys, value) = (request.keys.to_vec(), request.value.to_owned());
        let (ttl, waiting, reserving_since) =
            (request.ttl, request.waiting, request.reserving_since);
        let apply: BoxFuture<'static, _> = Box::pin(async move {
            let request = ManyRequest {
                keys: &keys,
                value: &value,
                ttl,
                waiting,
                reserving_since,
            };
            inner.acquire_many(request, budget).await
        });
        let undo = self.undo_of(request.lease());
        Box::pin(async move { self.call(budget, Some(ttl), apply, Some(undo)).await? })
    }

    fn extend<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Renewal>> {
        let inner = self.inner.clone();
        let owned: Vec<OwnedRef> = leases
            .iter()
            .map(|lease| Self::owned_lease(*lease))
            .collect();
        let ttl = leases.first().map(|lease| lease.ttl);
        let apply: BoxFuture<'static, _> = Box::pin(async move {
            let leases: Vec<LeaseRef<'_>> = owned.iter().map(OwnedRef::as_ref).collect();
            inner.extend(&leases).await
        });
        Box::pin(async move {
            match self.call(RESPONSE_TIMEOUT, ttl, apply, None).await {
                Ok(renewals) => renewals,
                Err(error) => vec![Renewal::Failed(error); leases.len()],
            }
        })
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        let inner = self.inner.clone();
        let owned = Self::owned_lease(lease);
        let apply: BoxFuture<'static, _> =
            Box::pin(async move { inner.release(owned.as_ref()).await });
        Box::pin(async move {
            self.call(RESPONSE_TIMEOUT, Some(lease.ttl), apply, None)
                .await?
        })
    }

    fn hands_over(&self) -> Option<&dyn HandsOver> {
        self.inner.hands_over().map(|_| self as &dyn HandsOver)
    }

    fn leave<'a>(&'a self, key: &'a str, token: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let inner = self.inner.clone();
        let (owned_key, owned_token) = (key.to_owned(), token.to_owned());
        let apply: BoxFuture<'static, _> =
            Box::pin(async move { inner.leave(&owned_key, &owned_token).await });
        Box::pin(async move { self.call(RESPONSE_TIMEOUT, None, apply, None).await? })
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        let inner = self.inner.clone();
        let apply: BoxFuture<'static, _> = Box::pin(async move { inner.release_feed().await });
        Box::pin(async move {
            let feed = self.call(RESPONSE_TIMEOUT, None, apply, None).await??;
            Ok(Box::new(NetFeed {
                inner: feed,
                link: self.clone(),
                pending: VecDeque::new(),
                closes_at: self.net.feed_closes_at(self.client),
                closed: false,
            }) as Box<dyn ReleaseFeed>)
        })
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let inner = self.inner.clone();
        let apply: BoxFuture<'static, _> = Box::pin(async move { inner.connect().await });
        Box::pin(async move { self.call(RESPONSE_TIMEOUT, None, apply, None).await? })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Snapshot>, StoreError>> {
        let (inner, key) = (self.inner.clone(), key.to_owned());
        let apply: BoxFuture<'static, _> = Box::pin(async move { inner.inspect(&key).await });
        Box::pin(async move { self.call(RESPONSE_TIMEOUT, None, apply, None).await? })
    }

    fn mark_watched<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let (inner, key) = (self.inner.clone(), key.to_owned());
        let apply: BoxFuture<'static, _> = Box::pin(async move { inner.mark_watched(&key).await });
        Box::pin(async move { self.call(RESPONSE_TIMEOUT, None, apply, None).await? })
    }

    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Cursor,
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        let (inner, prefix) = (self.inner.clone(), prefix.to_owned());
        let apply: BoxFuture<'static, _> =
            Box::pin(async move { inner.scan(&prefix, cursor).await });
        Box::pin(async move { self.call(RESPONSE_TIMEOUT, None, apply, None).await? })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        let (inner, key) = (self.inner.clone(), key.to_owned());
        let apply: BoxFuture<'static, _> = Box::pin(async move { inner.force_release(&key).await });
        Box::pin(async move { self.call(RESPONSE_TIMEOUT, None, apply, None).await? })
    }

    fn health(&self) -> BoxFuture<'_, Health> {
        Box::pin(async move {
            tokio::time::sleep(self.net.latency(self.client, None)).await;
            self.inner.health().await
        })
    }
}

impl HandsOver for Link {
    fn hand_over<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        next: LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<HandOver, StoreError>> {
        let inner = self.inner.clone();
        let (owned, owned_next) = (Self::owned_lease(lease), Self::owned_lease(next));
        let apply: BoxFuture<'static, _> = Box::pin(async move {
            let Some(store) = inner.hands_over() else {
                return Err(StoreError::unavailable(
                    "the inner store stopped handing over",
                ));
            };
            let handed = store.hand_over(owned.as_ref(), owned_next.as_ref()).await;
            match handed {
                Ok(HandOver::Handed) => sometimes("a key handed to a waiter of the same client"),
                Ok(HandOver::ToReservation) => {
                    sometimes("a hand-over passed this client's next waiter for a reservation");
                }
                _ => {}
            }
            handed
        });
        Box::pin(async move {
            self.call(RESPONSE_TIMEOUT, Some(lease.ttl), apply, None)
                .await?
        })
    }
}

/// A release feed through the network: announcements arrive late (in order), or are lost; the
/// feed closes on its own (its connection dropped) or when its client is partitioned.
struct NetFeed {
    inner: Box<dyn ReleaseFeed>,
    link: Link,
    /// Announcements on their way, each with when it arrives.
    pending: VecDeque<(Instant, Released)>,
    closes_at: Option<Instant>,
    closed: bool,
}

impl NetFeed {
    /// Takes in an announcement the inner feed gave: lost, or on its way.
    fn heard(&mut self, released: Released) {
        let (net, client) = (&self.link.net, self.link.client);
        if protocol::Announcement::parse(&released.message)
            .handed_to
            .is_some()
        {
            sometimes("an announcement of a key handed to a caller that reserved it");
        }
        if net.loses_announcement(client) {
            sometimes("an announcement lost");
            return;
        }
        let at = Instant::now() + net.announcement_delay(client);
        let last = self.pending.back().map_or(at, |(last, _)| *last);
        let at = net.unpaused(client, at.max(last));
        self.pending.push_back((at, released));
    }

    /// A round trip on the feed's connection: refused while its client is partitioned.
    fn round_trip(&self) -> impl Future<Output = Result<(), StoreError>> + Send + use<> {
        let (link, closed) = (self.link.clone(), self.closed);
        async move {
            let (net, client) = (&link.net, link.client);
            let latency = net.latency(client, None) + net.latency(client, None);
            tokio::time::sleep_until(net.unpaused(client, Instant::now()) + latency).await;
            match closed || net.partitioned(client, Instant::now()) {
                true => Err(reset()),
                false => Ok(()),
            }
        }
    }

    fn close(&mut self, why: &'static str) -> Option<Released> {
        sometimes(why);
        self.closed = true;
        self.pending.clear();
        None
    }
}

impl ReleaseFeed for NetFeed {
    fn watch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.round_trip().await?;
            self.inner.watch(key).await
        })
    }

    fn unwatch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.round_trip().await?;
            self.inner.unwatch(key).await
        })
    }

    fn next_release(&mut self) -> BoxFuture<'_, Option<Released>> {
        Box::pin(async move {
            loop {
                if self.closed {
                    return None;
                }
                if let Some((at, _)) = self.pending.front()
                    && *at <= Instant::now()
                {
                    return self.pending.pop_front().map(|(_, released)| released);
                }
                let arrives = self.pending.front().map(|(at, _)| *at);
                let closes_at = self.closes_at;
                let closes = async {
                    match closes_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                let next_arrives = async {
                    match arrives {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                crate::sync::select! {
                    () = closes => return self.close("a feed closed"),
                    () = next_arrives => {}
                    heard = self.inner.next_release() => match heard {
                        Some(released) => self.heard(released),
                        None => return self.close("a feed closed by the store"),
                    },
                }
            }
        })
    }

    fn settle<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.round_trip().await?;
            self.inner.settle(key).await?;
            // Whatever was announced before is in the inner feed now: on its way, then here.
            while let Some(Some(released)) = self.inner.next_release().now_or_never() {
                self.heard(released);
            }
            if let Some((at, _)) = self.pending.back() {
                tokio::time::sleep_until(*at).await;
            }
            Ok(())
        })
    }
}
