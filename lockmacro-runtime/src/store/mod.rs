//! The seam between the lease engine and a deployment: what the engine asks of wherever locks
//! live (one Redis, Sentinel, Cluster, a Redlock quorum, memory).
//!
//! The engine speaks in keys, tokens and ttls; a [`Store`] turns them into commands, scripts and
//! connections. Only the modules below this one use `redis`: the builder hands over plain
//! settings and [`Deployment::store`] makes the redis clients. The Redis deployments share one
//! implementation of the lock ([`redis::RedisStore`]) over a transport each.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::clock::Backoff;
pub(crate) use crate::error::Healing;
use crate::error::{LockError, LostReason, Shared};
use crate::health::{Health, NodeHealth, NodeRole};
use crate::metrics;
use crate::options::LockKind;

mod deployment;
pub(crate) mod inspect;
#[cfg(feature = "test-util")]
pub(crate) mod memory;
pub mod protocol;
pub(crate) mod redis;
mod redlock;
pub(crate) mod scripts;
mod tls;

pub(crate) use deployment::Deployment;
pub(crate) use inspect::{Cursor, Page, Snapshot};
pub(crate) use protocol::{AcquireNames, Names};

/// How a deployment is reached and timed, and the names it keeps beside lock keys.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) names: Names,
    /// Replicas that must acknowledge a grant or renewal (`LockClientBuilder::replica_acks`),
    /// at most as many as the master has; 0: none.
    pub(crate) replica_acks: u32,
    /// How long a grant or renewal waits for its replicas' acknowledgement.
    pub(crate) replica_ack_timeout: Duration,
    /// The client's own runtime: undoing an abandoned acquire runs there.
    pub(crate) background: Handle,
}

/// A boxed future, so deployments can sit behind one `dyn Store`.
pub(crate) type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where locks live.
///
/// # Cancellation
/// Every method may be dropped at any `.await`. `acquire` owns the cleanup of its own attempt:
/// when it fails, or is dropped, after its request may have reached the store, the deployment
/// undoes that request itself, in the background and ordered after it, so the engine never
/// holds a key it does not know about.
pub(crate) trait Store: Send + Sync + 'static {
    /// One attempt to take `request.key` for `request.value`, bounded by `budget`. A key that
    /// holds anything but a lock is [`LockError::NotALock`], and left as it is.
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>>;

    /// One attempt to take every key of `request` for its token, or none of them (`Busy`
    /// names the first key found busy), bounded by `budget`. As [`acquire`](Self::acquire), a
    /// dropped or failed attempt is undone by the deployment.
    fn acquire_many<'a>(
        &'a self,
        request: ManyRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<AcquiredMany, StoreError>>;

    /// Extends every lease still held by its token; one outcome per lease, in order. Leases of
    /// one key each: the watchdog extends a multi-key lease key by key.
    fn extend<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Renewal>>;

    /// Compare-and-delete, announcing the release to waiters: `true` when our lease was removed,
    /// `false` when it was no longer ours. A multi-key lease ([`LeaseRef::keys`]) is released
    /// on every key still ours, each announced as a single key's release is: `true` when every
    /// key was ours.
    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The deployment's hand-over, if it has one; one that has none only releases.
    fn hands_over(&self) -> Option<&dyn HandsOver> {
        None
    }

    /// The waiter of `token` leaves `key` without the lock: it is no longer counted, its place
    /// in a fair queue, its claim against new readers and its reservation of the key are taken
    /// off, a key already handed to it is given back and announced, and a fair queue's head
    /// leaving a key no exclusive holder holds tells the next in line (see
    /// `scripts/leave.lua`).
    fn leave<'a>(&'a self, key: &'a str, token: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// A subscription to release announcements, for waiters.
    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>>;

    /// Opens (or checks) the current runtime's connections, so the first real call pays nothing.
    fn connect(&self) -> BoxFuture<'_, Result<(), StoreError>>;

    /// What holds `key` now (`None`: no lock of ours), changing nothing ([`inspect`]).
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Snapshot>, StoreError>>;

    /// Marks `key` as followed by a watch for a while ([`protocol::WATCH_MARK_LIFE`]): its
    /// releases are announced even when nobody waits for it.
    fn mark_watched<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// One page of the locks whose key starts with `prefix:` (`""`: every lock).
    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Cursor,
    ) -> BoxFuture<'a, Result<Page, StoreError>>;

    /// Removes every holder of `key` and announces it: `true` when there was one.
    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// Every server asked with a `PING`, bounded by the connect and response timeouts.
    fn health(&self) -> BoxFuture<'_, Health>;
}

/// Release announcements for the keys being waited for.
pub(crate) trait ReleaseFeed: Send {
    /// Starts hearing about releases of `key`; returns once the subscription is confirmed.
    fn watch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Stops hearing about `key`.
    fn unwatch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The next release heard; `None` once the feed is gone (then open a new one).
    fn next_release(&mut self) -> BoxFuture<'_, Option<Released>>;

    /// Returns once every release of `key` announced before the call is in this feed: a round
    /// trip through the subscription's own connection, which delivers in order. A look at the
    /// key followed by this tells which releases the look came after.
    fn settle<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// One release announcement: the key, and its message ([`protocol::Announcement`]: the value of
/// the lease that was released, so the announcements of one release heard from several servers
/// can be told apart from the next; empty for "look again"; and the waiter it was handed to).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Released {
    pub(crate) key: String,
    pub(crate) message: String,
}

/// One attempt to take a lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireRequest<'a> {
    pub(crate) key: &'a str,
    /// The lease's value ([`protocol::lock_value`]): its token, when and by whom it is taken.
    pub(crate) value: &'a str,
    pub(crate) kind: LockKind,
    pub(crate) ttl: Duration,
    pub(crate) fencing: bool,
    /// The caller will wait when busy: report how long until it may be free (a waiter sleeps at
    /// most that long), and keep its place (fair) or keep new readers out (a writer).
    pub(crate) waiting: bool,
    /// Waiters are served in arrival order, and nobody barges past them.
    pub(crate) fair: bool,
    /// A waiter that has waited longer than [`protocol::RESERVE_AFTER`]: when it began (ms
    /// since the Unix epoch), so that a busy key is reserved for it.
    pub(crate) reserving_since: Option<u64>,
}

impl AcquireRequest<'_> {
    /// Whether one `SET NX PX` does: an exclusive lock with nothing else asked of it.
    pub(crate) fn is_plain(&self) -> bool {
        self.kind == LockKind::Exclusive && !self.fencing && !self.waiting && !self.fair
    }

    /// How long a waiter's place lasts unless it comes back (see [`waiter_place`]).
    pub(crate) fn waiter_place(&self) -> Duration {
        waiter_place(self.ttl)
    }

    /// The token of its value.
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    pub(crate) fn token(&self) -> &str {
        protocol::holder_token(self.value)
    }

    /// The lease this attempt would take, as a release of it names it.
    pub(crate) fn lease(&self) -> LeaseRef<'_> {
        LeaseRef {
            key: self.key,
            keys: &[],
            value: self.value,
            kind: self.kind,
            ttl: self.ttl,
            // The work never ran: an undone attempt deletes.
            hold_until: None,
            undone: true,
        }
    }
}

/// How long a waiter's place (its count entry, its fair queue place) lasts unless it comes back:
/// its own ttl (a waiter that died counts no longer than a holder that died would hold), at
/// least 1 s; the scripts add the holder's remaining lease, which the waiter may sleep out.
pub(crate) fn waiter_place(ttl: Duration) -> Duration {
    ttl.max(Duration::from_secs(1))
}

/// One attempt to take several keys at once, all or none: exclusive locks, one token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ManyRequest<'a> {
    /// Distinct keys, at least two, in the caller's order (`Busy` names the first busy one).
    pub(crate) keys: &'a [String],
    /// The lease's value, as [`AcquireRequest::value`].
    pub(crate) value: &'a str,
    pub(crate) ttl: Duration,
    /// The caller will wait when busy: the busy keys are marked, so that their releases are
    /// announced, and the caller is counted as waiting for every key.
    pub(crate) waiting: bool,
    /// As [`AcquireRequest::reserving_since`].
    pub(crate) reserving_since: Option<u64>,
}

impl ManyRequest<'_> {
    /// As [`AcquireRequest::waiter_place`].
    pub(crate) fn waiter_place(&self) -> Duration {
        waiter_place(self.ttl)
    }

    /// The lease this attempt would take, as a release of it names it.
    pub(crate) fn lease(&self) -> LeaseRef<'_> {
        LeaseRef {
            key: &self.keys[0],
            keys: self.keys,
            value: self.value,
            kind: LockKind::Exclusive,
            ttl: self.ttl,
            // The work never ran: an undone attempt deletes.
            hold_until: None,
            undone: true,
        }
    }
}

/// What an attempt on several keys found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquiredMany {
    /// Every key holds the token now.
    Taken,
    /// None was taken: `keys[key]` is the first key found held by another.
    Busy {
        key: usize,
        remaining: Option<Duration>,
        estimate: Option<Duration>,
    },
}

/// What an acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    Taken {
        fencing_token: Option<u64>,
    },
    /// Held by another: how long until its lease runs out (a waiter sleeps at most that long),
    /// and how long a caller coming back now may wait for it (the callers waiting, each served
    /// in the time the key's waiters have lately been served; `Busy`'s `retry_after`), when
    /// known.
    Busy {
        remaining: Option<Duration>,
        estimate: Option<Duration>,
    },
}

/// A deployment that can pass a lock straight from its holder to the next.
pub(crate) trait HandsOver: Send + Sync {
    /// Passes an exclusive `lease` straight to `next` (a waiter of this client, same key): the
    /// key gets `next`'s value and ttl with no moment free. When a caller elsewhere waited too
    /// long and reserved the key, it passes to that caller instead.
    fn hand_over<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        next: LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<HandOver, StoreError>>;
}

/// What a hand-over did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// The next holder's value and ttl are on the key now.
    Handed,
    /// Released and announced instead (a Redlock whose masters did not agree).
    Released,
    /// Handed to a caller elsewhere that had waited too long and reserved the key.
    ToReservation,
    /// The lease was no longer ours: nothing changed.
    NotOurs,
}

impl HandOver {
    /// What the hand-over script's reply means.
    pub(crate) fn from_reply(reply: i64) -> Self {
        match reply {
            1 => Self::Handed,
            2 => Self::Released,
            3 => Self::ToReservation,
            _ => Self::NotOurs,
        }
    }
}

/// A held lease, as the store needs it to extend or release it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseRef<'a> {
    pub(crate) key: &'a str,
    /// Every key of a multi-key lease (its first is `key`); empty for a lease of one key.
    pub(crate) keys: &'a [String],
    /// What the key holds for this lease ([`protocol::lock_value`]); a shared lock's holder
    /// field.
    pub(crate) value: &'a str,
    pub(crate) kind: LockKind,
    pub(crate) ttl: Duration,
    /// `hold_at_least`: until when (nanos on [`crate::clock`]) a release keeps the key.
    pub(crate) hold_until: Option<u64>,
    /// An attempt that did not win the lock (a minority of Redlock's masters, some of a
    /// Cluster's slots, an answer lost), being undone: no work ran under it, so its release
    /// is announced as "look again", not as a holder's release a watch would report.
    pub(crate) undone: bool,
}

impl LeaseRef<'_> {
    /// How long a release sent now keeps the key (`hold_at_least`): what is left of the hold,
    /// rounded up to whole milliseconds so that the key is never freed early; `None` when
    /// nothing is left, and the release deletes.
    pub(crate) fn kept_for(&self) -> Option<Duration> {
        let left = self.hold_until?.checked_sub(crate::clock::now())?;
        (left > 0).then(|| Duration::from_millis(left.div_ceil(1_000_000)))
    }
}

/// A [`LeaseRef`] that owns its strings, for work that outlives the call that named the lease.
#[derive(Debug, Clone)]
pub(crate) struct OwnedLease {
    key: Arc<str>,
    keys: Option<Arc<[String]>>,
    value: Arc<str>,
    kind: LockKind,
    ttl: Duration,
    hold_until: Option<u64>,
    /// An undone attempt's stays one when its undo is sent later (announced as "look again").
    undone: bool,
}

impl OwnedLease {
    pub(crate) fn of(lease: LeaseRef<'_>) -> Self {
        Self {
            key: lease.key.into(),
            keys: (!lease.keys.is_empty()).then(|| lease.keys.into()),
            value: lease.value.into(),
            kind: lease.kind,
            ttl: lease.ttl,
            hold_until: lease.hold_until,
            undone: lease.undone,
        }
    }

    pub(crate) fn as_ref(&self) -> LeaseRef<'_> {
        LeaseRef {
            key: &self.key,
            keys: self.keys.as_deref().unwrap_or_default(),
            value: &self.value,
            kind: self.kind,
            ttl: self.ttl,
            hold_until: self.hold_until,
            undone: self.undone,
        }
    }
}

/// What one extension found.
#[derive(Debug, Clone)]
pub(crate) enum Renewal {
    /// Still ours; the lease runs a new ttl from the attempt's send time.
    Extended,
    /// Gone, or held by another token (or replaced by a value of another type): which.
    Lost(LostReason),
    /// No answer: unknown; retried before the lease's deadline.
    Failed(StoreError),
}

/// Why a call to a deployment failed. Cheap to clone: one failure can concern a whole batch.
#[derive(Debug, Clone)]
pub(crate) enum StoreError {
    /// The server failed, refused, or did not answer in time.
    Unavailable(Arc<dyn Error + Send + Sync>),
    /// The caller cannot use the deployment (no fitting runtime); nothing was sent.
    Unusable(Arc<LockError>),
    /// A quorum deployment heard alike from fewer than a majority of its servers.
    NoQuorum { answered: usize, needed: usize },
}

impl StoreError {
    pub(crate) fn unavailable(error: impl Into<Box<dyn Error + Send + Sync>>) -> Self {
        Self::Unavailable(Arc::from(error.into()))
    }

    /// The error of a step that fewer than the `needed` majority of a quorum deployment's
    /// servers `answered`: the first server's own error among `outcomes`, else `NoQuorum`.
    pub(crate) fn short_of_quorum<T>(
        outcomes: impl IntoIterator<Item = Result<T, StoreError>>,
        answered: usize,
        needed: usize,
    ) -> Self {
        outcomes
            .into_iter()
            .find_map(Result::err)
            .unwrap_or(Self::NoQuorum { answered, needed })
    }

    pub(crate) fn into_lock_error(self, key: Option<&str>) -> LockError {
        match self {
            Self::Unavailable(source) => {
                let healing = healing(source.as_ref());
                LockError::Redis {
                    key: key.map(str::to_owned),
                    source: Box::new(Shared::new(source, healing)),
                }
            }
            Self::Unusable(error) => {
                Arc::try_unwrap(error).unwrap_or_else(|shared| LockError::Config {
                    message: shared.to_string(),
                })
            }
            Self::NoQuorum { answered, needed } => LockError::NoQuorum {
                key: key.unwrap_or_default().to_owned(),
                answered,
                needed,
            },
        }
    }
}

impl StoreError {
    /// How a node `address` in `role` that failed with this error shows in a health report:
    /// refused when waiting does not mend it.
    pub(crate) fn node_health(&self, address: impl Into<String>, role: NodeRole) -> NodeHealth {
        let silent = NodeHealth::silent(address, role, self);
        match self.heals() {
            true => silent,
            false => silent.refusing(),
        }
    }

    /// Whether looking again may succeed with nobody changing anything (see [`healing`]).
    pub(crate) fn heals(&self) -> bool {
        match self {
            Self::Unavailable(source) => healing(source.as_ref()).is_some(),
            Self::NoQuorum { .. } => true,
            Self::Unusable(_) => false,
        }
    }
}

/// What would make looking again after `error` succeed with nobody changing anything, if
/// anything: its first source that says decides. A refused password or ACL, a peer that does
/// not speak RESP, a script's error do not heal.
pub(crate) fn healing(error: &(dyn Error + 'static)) -> Option<Healing> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(shared) = error.downcast_ref::<Shared>() {
            return shared.healing();
        }
        if error.is::<Refused>() {
            return None;
        }
        if error.is::<redis::NotAcknowledged>() {
            return Some(Healing::Unacknowledged);
        }
        if let Some(error) = error.downcast_ref::<::redis::RedisError>() {
            return redis_healing(error);
        }
        next = error.source();
    }
    Some(Healing::Unreachable)
}

fn redis_healing(error: &::redis::RedisError) -> Option<Healing> {
    use ::redis::{ErrorKind, ServerErrorKind};
    match error.kind() {
        ErrorKind::Server(
            ServerErrorKind::ReadOnly
            | ServerErrorKind::Moved
            | ServerErrorKind::Ask
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::TryAgain
            | ServerErrorKind::BusyLoading
            | ServerErrorKind::MasterDown,
        )
        | ErrorKind::MasterNameNotFoundBySentinel
        | ErrorKind::NoValidReplicasFoundBySentinel
        | ErrorKind::ClusterConnectionNotFound => Some(Healing::Failover),
        // Loaded again on the next look (a restarted or promoted server forgot its scripts).
        ErrorKind::Server(ServerErrorKind::NoScript) | ErrorKind::Io => Some(Healing::Unreachable),
        // `ERR` (a script's or a command's own error), `NOPERM`, a refused password, a reply
        // that is not RESP or not what the script returns, a client's own misuse: the same
        // look meets the same answer.
        _ => (error.is_timeout() || error.is_connection_dropped() || error.is_connection_refusal())
            .then_some(Healing::Unreachable),
    }
}

impl StoreError {
    /// What the metrics count it as: nothing for a caller that could not use the deployment.
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn failure(&self) -> Option<metrics::Failure> {
        match self {
            Self::Unavailable(_) => Some(metrics::Failure::Redis),
            Self::NoQuorum { .. } => Some(metrics::Failure::NoQuorum),
            Self::Unusable(_) => None,
        }
    }
}

impl<T> metrics::Answer for Result<T, StoreError> {
    fn failure(&self) -> Option<metrics::Failure> {
        self.as_ref().err().and_then(StoreError::failure)
    }
}

/// A renewal batch failed when any of its leases got no answer.
impl metrics::Answer for Vec<Renewal> {
    fn failure(&self) -> Option<metrics::Failure> {
        self.iter()
            .filter_map(|renewal| match renewal {
                Renewal::Failed(error) => error.failure(),
                _ => None,
            })
            .max_by_key(|failure| *failure == metrics::Failure::NoQuorum)
    }
}

impl From<LockError> for StoreError {
    fn from(error: LockError) -> Self {
        Self::Unusable(Arc::new(error))
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unavailable(source) => source.fmt(f),
            Self::Unusable(error) => error.fmt(f),
            Self::NoQuorum { answered, needed } => {
                write!(
                    f,
                    "only {answered} of the {needed} masters needed answered alike"
                )
            }
        }
    }
}

/// Retries a compare-and-delete until the store answers it, or until the lease would have lapsed
/// anyway: for releases nobody waits for (a dropped guard, an abandoned acquire). `Some`
/// whether our lease was removed; `None` when it gave up.
pub(crate) async fn release_until_settled(store: &dyn Store, lease: LeaseRef<'_>) -> Option<bool> {
    // A release that keeps the key (`hold_at_least`) is still worth sending while the hold runs.
    let give_up = tokio::time::Instant::now() + lease.ttl.max(lease.kept_for().unwrap_or_default());
    match release_before(store, lease, give_up).await {
        Ok(deleted) => {
            tracing::debug!(key = %lease.key, deleted, "lock released in the background");
            Some(deleted)
        }
        Err(error) => {
            tracing::warn!(key = %lease.key, error = %error, "background release gave up; the key expires with its lease");
            None
        }
    }
}

/// Sends a compare-and-delete, again with backoff after each failure, until the store answers
/// it: whether our lease was removed. The last failure once no attempt is left before
/// `give_up` (an attempt in flight then still runs to its response timeout).
pub(crate) async fn release_before(
    store: &dyn Store,
    lease: LeaseRef<'_>,
    give_up: tokio::time::Instant,
) -> Result<bool, StoreError> {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    loop {
        match metrics::timed("release", store.release(lease)).await {
            Ok(deleted) => return Ok(deleted),
            Err(error) => {
                let pause = backoff.next_delay();
                if tokio::time::Instant::now() + pause >= give_up {
                    return Err(error);
                }
                tracing::debug!(key = %lease.key, error = %error, retry_in = ?pause, "lock release failed; retrying");
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// A server that could not be reached, named (host and port; never a password).
#[derive(thiserror::Error)]
#[error("cannot reach {server}: {source}{hint}")]
pub(crate) struct Unreachable {
    pub(crate) server: String,
    #[source]
    pub(crate) source: Box<dyn Error + Send + Sync>,
    /// What to check, when the failure suggests something.
    pub(crate) hint: &'static str,
}

/// Without an empty `hint`: `Unreachable { server: "127.0.0.1:6379", source: … }`.
impl fmt::Debug for Unreachable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut debug = f.debug_struct("Unreachable");
        debug
            .field("server", &self.server)
            .field("source", &self.source);
        if !self.hint.is_empty() {
            debug.field("hint", &self.hint.trim());
        }
        debug.finish()
    }
}

impl Unreachable {
    /// `source` while connecting to `server`; `tls_unanswered` when a TLS connection heard
    /// nothing back, as from a port that does not speak TLS.
    pub(crate) fn error(
        server: impl fmt::Display,
        tls_unanswered: bool,
        source: impl Into<Box<dyn Error + Send + Sync>>,
    ) -> StoreError {
        StoreError::unavailable(Self {
            server: server.to_string(),
            source: source.into(),
            hint: if tls_unanswered {
                " (no TLS handshake: does this port speak TLS? `rediss://` needs a TLS port)"
            } else {
                ""
            },
        })
    }
}

/// A connection that the server at `server` answered, but refused or could not be understood
/// on: each says what to check. Made by [`Unreachable::connecting`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    #[error(
        "authentication to {server} failed: it refused the user and password of the URL ({reason}); \
         check them (`redis://user:password@host:port`, or `redis://:password@host:port` for the \
         default user)"
    )]
    WrongPassword { server: String, reason: String },
    #[error(
        "{server} requires a password (NOAUTH: authentication required) and the URL gives none: \
         add it, `redis://:password@host:port`, or `redis://user:password@host:port` for an ACL user"
    )]
    NoPassword { server: String },
    #[error(
        "{server} does not speak RESP, the protocol of Redis: its answer could not be read \
         ({first_line}); is this the port of a Redis or Valkey server?"
    )]
    NotRedis { server: String, first_line: String },
}

impl Unreachable {
    /// The error of a connection to `server` that failed with `err`: refused credentials, a
    /// missing password and a peer that does not speak RESP say so (they are no network
    /// failure); anything else is [`Unreachable`], `tls` telling that the connection used TLS.
    pub(crate) fn connecting(
        server: impl fmt::Display,
        tls: bool,
        err: ::redis::RedisError,
    ) -> StoreError {
        let server = server.to_string();
        let text = err.to_string();
        let refused = if err.kind() == ::redis::ErrorKind::AuthenticationFailed
            || err.code() == Some("WRONGPASS")
        {
            Refused::WrongPassword {
                server,
                reason: text,
            }
        } else if err.code() == Some("NOAUTH") || text.contains("NOAUTH") {
            Refused::NoPassword { server }
        } else if matches!(err.kind(), ::redis::ErrorKind::Parse) {
            let first_line = text.lines().next().unwrap_or_default().to_owned();
            Refused::NotRedis { server, first_line }
        } else {
            return Self::error(server, tls && err.is_timeout(), err);
        };
        StoreError::unavailable(refused)
    }
}

/// A call that got no answer within its budget.
#[derive(Debug, thiserror::Error)]
#[error("no answer within {0:?}")]
pub(crate) struct TimedOut(pub(crate) Duration);

#[cfg(test)]
mod tests {
    use super::*;

    /// An attempt undone in the background (its connection broke under the undo) is still
    /// undone when sent: announced as "look again", and never handing the key over.
    #[test]
    fn an_owned_lease_keeps_whether_it_is_an_undone_attempt() {
        let lease = LeaseRef {
            key: "k",
            keys: &[],
            value: "v",
            kind: LockKind::Exclusive,
            ttl: Duration::from_secs(1),
            hold_until: None,
            undone: true,
        };
        assert!(OwnedLease::of(lease).as_ref().undone);
        let held = LeaseRef {
            undone: false,
            ..lease
        };
        assert!(!OwnedLease::of(held).as_ref().undone);
    }
}
