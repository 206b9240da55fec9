//! The lock over Redis, written once: acquire (one `SET NX PX`, or the acquire script when
//! fencing, waiting or shared), the undo of an abandoned acquire, renewal batches, releases
//! and hand-overs that announce themselves, and what every reply means.
//!
//! A deployment only supplies a [`Transport`]: one master, at a fixed address or found through
//! Sentinel ([`server`]), or a Redis Cluster ([`cluster`]). As with redis-rs's `ConnectionLike`,
//! the lock speaks in "send this command, routed by this key", and the transport decides where
//! that goes and what a failure says about the connection.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use redis::{ErrorKind, FromRedisValue, RedisError, ServerErrorKind};

use super::inspect::{self, Commands, Cursor, Page, Snapshot};
use super::protocol::{self, AcquireNames, Names};
use super::scripts::{self, Announce, PlainRelease};
use super::{
    AcquireRequest, Acquired, AcquiredMany, BoxFuture, HandOver, HandsOver, LeaseRef, ManyRequest,
    OwnedLease, ReleaseFeed, Renewal, Settings, Store, StoreError, TimedOut, release_until_settled,
};
use crate::error::{LockError, LostReason};
use crate::health::Health;
use crate::options::LockKind;
use replicas::{Needed, Replicas, Turn};
pub(crate) use replicas::{NotAcknowledged, Replication};

pub(crate) mod cluster;
pub(crate) mod connections;
mod feed;
mod replicas;
pub(crate) mod sentinel;
pub(crate) mod server;

/// How the lock's commands reach a deployment's servers.
///
/// A request goes to the server that holds its key (a script's first key): the one master, or
/// the cluster node that owns the key's slot, following `MOVED`/`ASK`. So a new command needs
/// nothing new here: a `GET` or `HGETALL` of a lock key, or a script such as a `DEL` +
/// `PUBLISH`, is a [`redis::Cmd`] sent with [`RedisStore::send`] (which also loads the scripts
/// a server forgot). A `SCAN` has no key: it reaches the one server as it is, but a cluster
/// needs a method of its own that visits every master.
pub(crate) trait Transport: Send + Sync + Sized + 'static {
    /// A connection lent for one call. The undo of an abandoned acquire is sent on the very
    /// connection that carried its `SET`, so it reaches the server after it.
    type Connection: Clone + Send + Sync + 'static;

    /// Where the lock's names live and how its releases are announced.
    const LAYOUT: Layout;

    /// How the deployment is reached and timed, and the names it uses.
    fn settings(&self) -> &Settings;

    /// The current runtime's connection, opened (with every script loaded) when there is none.
    fn connection(&self) -> impl Future<Output = Result<Self::Connection, StoreError>> + Send;

    /// Sends `request` once (a pipeline's commands all in one slot), waiting at most `budget`,
    /// and tells whether a failure may have run; a connection that proved broken is not lent
    /// again.
    fn send_once<R: FromRedisValue + Send>(
        &self,
        connection: &mut Self::Connection,
        request: Request<'_>,
        budget: Duration,
    ) -> impl Future<Output = Result<R, SendError>> + Send;

    /// `WAIT acks timeout` ([`Replicas::wait_cmd`]) on the server that holds `key`, on
    /// `connection`: how many replicas have every write sent on it so far. Sent while a write's
    /// reply is awaited, it is pipelined behind it where the transport keeps the order of one
    /// connection's requests ([`Layout::Server`]).
    fn wait_replicas(
        &self,
        connection: &mut Self::Connection,
        key: &str,
        wait: &redis::Cmd,
        timeout: Duration,
    ) -> impl Future<Output = Result<u32, SendError>> + Send;

    /// The id of `connection` when every caller of a runtime shares it (one server), so that
    /// one `WAIT` can answer for all their writes on it ([`Replicas::lead`]).
    fn shared(connection: &Self::Connection) -> Option<u64> {
        let _ = connection;
        None
    }

    /// `INFO replication` of the server that holds `key` (on a cluster, with the slots it
    /// serves). One server holds every key: its `INFO` on `connection`.
    fn replication(
        &self,
        connection: &mut Self::Connection,
        key: &str,
    ) -> impl Future<Output = Result<Replication, SendError>> + Send {
        let _ = key;
        async move {
            let mut info = redis::cmd("INFO");
            info.arg("replication");
            let budget = self.settings().response_timeout;
            let info = self
                .send_once(connection, Request::Cmd(&info), budget)
                .await?;
            Ok(Replication {
                info,
                served: Vec::new(),
            })
        }
    }

    /// Loads every script on the server that holds `key`, after it answered `NOSCRIPT`. One
    /// server holds every key: one pipeline on `connection`.
    fn load_scripts(
        &self,
        connection: &mut Self::Connection,
        key: &str,
        budget: Duration,
    ) -> impl Future<Output = Result<(), SendError>> + Send {
        let _ = key;
        async move {
            let load = scripts::load_all();
            self.send_once(connection, Request::Pipeline(&load), budget)
                .await
        }
    }

    /// A subscription to release announcements, as the deployment announces them.
    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>>;

    /// Every server of the deployment asked with a `PING`, bounded by the timeouts.
    fn health(&self) -> BoxFuture<'_, Health>;

    /// The masters to scan, as addresses [`on_master`](Self::on_master) takes (one server: a
    /// single empty name).
    fn masters(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>>;

    /// `request` (a `SCAN` page, an `INFO`, a pipeline of reads of keys it holds) on the master
    /// `master`; a pipeline's replies come as one array, an error reply in it as a
    /// [`redis::Value::ServerError`] in its place.
    fn on_master<'a>(
        &'a self,
        master: &'a str,
        request: Request<'a>,
    ) -> BoxFuture<'a, Result<redis::Value, StoreError>>;
}

/// Where a deployment keeps a lock's names, and how it announces a release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One server: names as [`Names`] spells them, releases on `PUBLISH` channels.
    Server,
    /// A cluster: every name in its lock key's slot, so no script touches two slots; releases
    /// on sharded channels (`SPUBLISH`). A plain acquire is `SET NX PX GET`: the cluster
    /// connection may send a `SET` again after it landed, and our own value coming back tells.
    Cluster,
}

impl Layout {
    /// The names the acquire script keeps beside `key`.
    fn acquire_names(self, names: &Names, key: &str) -> Result<AcquireNames, LockError> {
        match self {
            Self::Server => Ok(names.for_acquire(key)),
            Self::Cluster => names.for_acquire_in_slot(key),
        }
    }

    /// A name beside `key` (`name` spells it for a key), placed in `key`'s slot on a cluster.
    fn beside(self, key: &str, name: impl Fn(&str) -> String) -> Result<String, LockError> {
        match self {
            Self::Server => Ok(name(key)),
            Self::Cluster => Names::in_slot(key, name("")),
        }
    }

    /// Where a waiter's stay on `key` is kept, for the scripts that end it (hand_over.lua, and
    /// leave.lua through [`leaving`](Self::leaving)): the callers waiting for the key, and the
    /// writers among them that keep new readers out.
    fn waiting(self, names: &Names, key: &str) -> Result<[String; 2], LockError> {
        Ok([
            self.beside(key, |key| names.waiters(key))?,
            self.beside(key, |key| names.writers(key))?,
        ])
    }

    /// Where a waiter's every trace on `key` is kept, for leave.lua: [`waiting`](Self::waiting)'s
    /// names, then the fair queue and its places' expiries.
    fn leaving(self, names: &Names, key: &str) -> Result<[String; 4], LockError> {
        let [waiters, writers] = self.waiting(names, key)?;
        Ok([
            waiters,
            writers,
            self.beside(key, |key| names.queue(key))?,
            self.beside(key, |key| names.queue_expiry(key))?,
        ])
    }

    /// The channel releases of `key` are announced on.
    fn release_channel(self, names: &Names, key: &str) -> Result<String, LockError> {
        match self {
            Self::Server => Ok(names.release_channel(key)),
            Self::Cluster => names.release_channel_in_slot(key),
        }
    }

    /// Refuses, before anything is taken, a key whose release could not be announced: its
    /// release would fail.
    fn check(self, names: &Names, key: &str) -> Result<(), LockError> {
        match self {
            Self::Server => Ok(()),
            Self::Cluster => names.check_in_slot(key),
        }
    }

    fn announce(self) -> Announce {
        match self {
            Self::Server => Announce::Publish,
            Self::Cluster => Announce::ShardedPublish,
        }
    }

    /// `key`'s slot on a cluster: the renewal batch it goes in (a script's keys share a slot),
    /// and whose master's replicas count for it.
    fn slot(self, key: &str) -> Option<u16> {
        match self {
            Self::Server => None,
            Self::Cluster => Some(protocol::slot_number(key)),
        }
    }
}

/// The value of an `INFO` reply's `name` line (`name` ends with its colon).
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|line| line.trim().strip_prefix(name))
        .filter(|value| !value.is_empty())
}

/// A command or a pipeline.
#[derive(Clone, Copy)]
pub(crate) enum Request<'a> {
    Cmd(&'a redis::Cmd),
    Pipeline(&'a redis::Pipeline),
}

/// Why a request failed, and whether it may have run.
pub(crate) enum SendError {
    /// Redis answered with an error: the request ran, or was refused; its outcome is known.
    Answered(RedisError),
    /// No usable answer (timeout, broken connection, a reply out of step): it may have run.
    Unknown(StoreError),
}

impl SendError {
    /// `err`, whose request may have run when `unknown`.
    pub(crate) fn new(err: RedisError, unknown: bool) -> Self {
        match unknown {
            true => Self::Unknown(StoreError::unavailable(err)),
            false => Self::Answered(err),
        }
    }

    pub(crate) fn into_store_error(self) -> StoreError {
        match self {
            // A one-server client meets redirections only from a cluster node (a cluster
            // client follows them): the client was built for one server.
            Self::Answered(err)
                if matches!(
                    err.kind(),
                    ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::CrossSlot)
                ) =>
            {
                StoreError::from(a_cluster_node(&err))
            }
            Self::Answered(err) => StoreError::unavailable(err),
            Self::Unknown(error) => error,
        }
    }
}

/// The error of a client for one server that reached a Redis Cluster node: it would see only
/// that node's share of the keys, and fail on the others. `found` says how it showed.
pub(crate) fn a_cluster_node(found: &dyn std::fmt::Display) -> LockError {
    LockError::Config {
        message: format!(
            "this server is a Redis Cluster node ({found}): build the client with \
             `LockClient::cluster_builder([\"redis://node:port\", ...])`, not `builder` \
             (on the command line: `--cluster`)"
        ),
    }
}

/// Whether a failed request may have run without our hearing: no answer, a broken connection,
/// or a reply of the wrong shape (replies and requests are out of step).
pub(crate) fn unanswered(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_timeout()
        || err.is_unrecoverable_error()
        || matches!(
            err.kind(),
            ErrorKind::UnexpectedReturnType | ErrorKind::Parse
        )
}

/// `call`, failing after `budget`: for subscriptions, whose failures need no classifying.
async fn bounded<T>(
    budget: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(budget, call).await {
        Ok(reply) => reply.map_err(StoreError::unavailable),
        Err(_) => Err(StoreError::unavailable(TimedOut(budget))),
    }
}

/// The lock over one deployment's [`Transport`].
pub(crate) struct RedisStore<T> {
    transport: Arc<T>,
    /// How many replicas a write needs.
    replicas: Arc<Replicas>,
}

impl<T> Clone for RedisStore<T> {
    fn clone(&self) -> Self {
        Self {
            transport: self.transport.clone(),
            replicas: self.replicas.clone(),
        }
    }
}

impl<T: Transport> RedisStore<T> {
    pub(crate) fn new(transport: Arc<T>) -> Self {
        let settings = transport.settings();
        let mut timeout = settings.replica_ack_timeout;
        if T::LAYOUT == Layout::Cluster {
            // The node's reply timer (the response timeout) bounds the `WAIT` too.
            timeout = timeout.min(settings.response_timeout * 3 / 4);
        }
        let replicas = Replicas::new(settings.replica_acks, timeout);
        Self {
            transport,
            replicas: Arc::new(replicas),
        }
    }

    fn settings(&self) -> &Settings {
        self.transport.settings()
    }

    /// Sends `request`, whose key is `key`, waiting at most `budget` for the reply. A script
    /// the server does not know (`NOSCRIPT`: restarted, flushed or just promoted; none of the
    /// request ran) is loaded on `key`'s server and the request sent once more.
    pub(crate) async fn send<R: FromRedisValue + Send>(
        &self,
        connection: &mut T::Connection,
        key: &str,
        request: Request<'_>,
        budget: Duration,
    ) -> Result<R, SendError> {
        let transport = &*self.transport;
        match transport.send_once(connection, request, budget).await {
            Err(SendError::Answered(err))
                if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
            {
                // Boxed: rare, and inline it would make every request's future as large as a
                // script load's (copied on each request, the script known or not).
                Box::pin(async {
                    transport.load_scripts(connection, key, budget).await?;
                    transport.send_once(connection, request, budget).await
                })
                .await
            }
            other => other,
        }
    }

    /// A script whose reply is a number, on this runtime's connection.
    async fn run_script(&self, key: &str, cmd: &redis::Cmd) -> Result<i64, StoreError> {
        let mut connection = self.transport.connection().await?;
        self.script_on(&mut connection, key, cmd).await
    }

    /// How many replicas a write of `key` must reach (`None`: no `WAIT`). Replicas never counted
    /// are counted first, on `connection`; a count that is due runs in the background.
    async fn acks_needed(
        &self,
        connection: &mut T::Connection,
        key: &str,
    ) -> Result<Option<u32>, StoreError> {
        let needed = self.needed(key);
        self.acks_for(connection, key, needed).await
    }

    /// What a write of `key` needs of its replicas as far as known now, starting a count that
    /// is due in the background.
    fn needed(&self, key: &str) -> Needed {
        let (needed, stale) = self.replicas.needed(T::LAYOUT.slot(key));
        if stale {
            self.count_in_background(key);
        }
        needed
    }

    /// The acks a write of `key` waits for (`None`: no `WAIT`), given what it `needed`: replicas
    /// never counted are counted first, on `connection`.
    async fn acks_for(
        &self,
        connection: &mut T::Connection,
        key: &str,
        needed: Needed,
    ) -> Result<Option<u32>, StoreError> {
        Ok(match needed {
            Needed::Nothing => None,
            Needed::Acks(acks) => Some(acks),
            Needed::Count => Some(self.count_replicas(connection, key).await?).filter(|&n| n > 0),
        })
    }

    /// Counts the replicas of `key`'s master in the background (a count marked under way).
    fn count_in_background(&self, key: &str) {
        let store = self.clone();
        let key = key.to_owned();
        self.settings().background.spawn(async move {
            match store.transport.connection().await {
                Ok(mut connection) => {
                    let _ = store.count_replicas(&mut connection, &key).await;
                }
                Err(_) => store.replicas.count_failed(),
            }
        });
    }

    /// Counts the replicas of `key`'s master: the acks a write needs now. A server that refuses
    /// `INFO` (an ACL) is taken to have none.
    async fn count_replicas(
        &self,
        connection: &mut T::Connection,
        key: &str,
    ) -> Result<u32, StoreError> {
        match self.transport.replication(connection, key).await {
            Ok(replication) => Ok(self.replicas.counted(T::LAYOUT.slot(key), &replication)),
            Err(SendError::Answered(err)) => {
                tracing::warn!(error = %err, "cannot count the master's replicas (`INFO replication` refused): no replica acknowledgement");
                let refused = Replication {
                    info: String::new(),
                    served: Vec::new(),
                };
                Ok(self.replicas.counted(T::LAYOUT.slot(key), &refused))
            }
            Err(SendError::Unknown(error)) => {
                self.replicas.count_failed();
                Err(error)
            }
        }
    }

    /// `write`'s reply, and when `acks` replicas must have it and it `took`, `WAIT`'s answer:
    /// on one server the `WAIT` is sent at once, pipelined behind the write on its connection
    /// (no extra round trip); on a cluster once the write's reply came, to the node that took
    /// it (redis-rs keeps no order between two requests to one node).
    async fn with_wait<R>(
        &self,
        waiting: &mut T::Connection,
        key: &str,
        acks: Option<u32>,
        write: impl Future<Output = Result<R, SendError>>,
        took: impl FnOnce(&R) -> bool,
    ) -> (Result<R, SendError>, Option<Result<u32, SendError>>) {
        let Some(acks) = acks else {
            return (write.await, None);
        };
        let wait = self.replicas.wait_cmd(acks);
        let timeout = self.replicas.timeout;
        match (T::LAYOUT, T::shared(waiting)) {
            (Layout::Server, Some(shared)) if !self.replicas.lead(shared) => {
                // A `WAIT` is in flight on this connection: the next round covers this write
                // once it is answered.
                let reply = write.await;
                if !reply.as_ref().is_ok_and(took) {
                    return (reply, None);
                }
                let acked = match self.replicas.follow(shared, acks) {
                    Turn::Lead => {
                        let _round = RoundLeader::new(self, waiting, shared);
                        self.transport
                            .wait_replicas(waiting, key, &wait, timeout)
                            .await
                    }
                    Turn::Follow(answered) => match answered.await {
                        Ok(acked) => acked.map_err(SendError::Unknown),
                        Err(_) => Err(SendError::Unknown(StoreError::unavailable(
                            "the replica acknowledgement round ended unanswered",
                        ))),
                    },
                };
                (reply, Some(acked))
            }
            (Layout::Server, shared) => {
                let _round = shared.map(|shared| RoundLeader::new(self, waiting, shared));
                let waited = self.transport.wait_replicas(waiting, key, &wait, timeout);
                let (reply, acked) = futures_util::join!(write, waited);
                let took = reply.as_ref().is_ok_and(took);
                (reply, took.then_some(acked))
            }
            (Layout::Cluster, _) => {
                let reply = write.await;
                if !reply.as_ref().is_ok_and(took) {
                    return (reply, None);
                }
                let acked = self.transport.wait_replicas(waiting, key, &wait, timeout);
                (reply, Some(acked.await))
            }
        }
    }

    /// Whether `acked`, `WAIT`'s answer after a write of `key` that `needed` that many replicas,
    /// is enough. On a shortfall the replicas are counted again: one the master lost (silent for
    /// [`replicas::SILENT_AFTER`]) no longer holds the write up.
    async fn acknowledged(
        &self,
        connection: &mut T::Connection,
        key: &str,
        needed: u32,
        acked: Result<u32, SendError>,
    ) -> Result<(), StoreError> {
        let (acked, cause) = match acked {
            Ok(acked) => (acked, String::new()),
            Err(sent) => (0, format!(" (no answer: {})", sent.into_store_error())),
        };
        if acked >= needed {
            if self.replicas.confirmed(T::LAYOUT.slot(key)) {
                self.count_in_background(key);
            }
            return Ok(());
        }
        if cause.is_empty()
            && self
                .count_replicas(connection, key)
                .await
                .is_ok_and(|now| acked >= now)
        {
            return Ok(());
        }
        Err(StoreError::unavailable(NotAcknowledged {
            key: key.to_owned(),
            acked,
            needed,
            timeout_ms: self.replicas.timeout.as_millis(),
            cause,
        }))
    }

    fn release_cmd(&self, lease: LeaseRef<'_>) -> Result<redis::Cmd, LockError> {
        let names = &self.settings().names;
        let channel = T::LAYOUT.release_channel(names, lease.key)?;
        let waiters = match (lease.kind, lease.undone) {
            (LockKind::Exclusive, false) => None,
            _ => Some(T::LAYOUT.beside(lease.key, |key| names.waiters(key))?),
        };
        let announce = T::LAYOUT.announce();
        Ok(scripts::release(
            lease,
            &channel,
            waiters.as_deref(),
            announce,
        ))
    }

    /// What an acquire of `request` sends: the plain `SET NX PX` (`GET` too on a cluster, see
    /// [`Layout::Cluster`]) or the acquire script. A key whose release could not be announced is
    /// refused here, before anything is sent. Built once for all of a Redlock's masters.
    pub(crate) fn acquire_cmd(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Result<redis::Cmd, StoreError> {
        let names = &self.settings().names;
        T::LAYOUT.check(names, request.key)?;
        let (key, value, ttl) = (request.key, request.value, request.ttl);
        Ok(match (request.is_plain(), T::LAYOUT) {
            (true, Layout::Server) => scripts::set_nx(key, value, ttl),
            (true, Layout::Cluster) => scripts::set_nx_get(key, value, ttl),
            (false, _) => self.acquire_script(request)?,
        })
    }

    /// The acquire script for `request`.
    fn acquire_script(&self, request: &AcquireRequest<'_>) -> Result<redis::Cmd, StoreError> {
        let names = T::LAYOUT.acquire_names(&self.settings().names, request.key)?;
        Ok(scripts::acquire(request, &names))
    }

    /// The plain acquire's reply to `cmd`, [`acquire_cmd`](Self::acquire_cmd)'s `SET NX PX`:
    /// `true` when taken.
    async fn set_nx(
        &self,
        connection: &mut T::Connection,
        request: &AcquireRequest<'_>,
        cmd: &redis::Cmd,
        budget: Duration,
    ) -> Result<bool, SendError> {
        let (key, value) = (request.key, request.value);
        match T::LAYOUT {
            Layout::Server => {
                let reply = self.send(connection, key, Request::Cmd(cmd), budget).await;
                reply.map(|SetNx(taken)| taken)
            }
            Layout::Cluster => {
                match self
                    .send::<Option<String>>(connection, key, Request::Cmd(cmd), budget)
                    .await
                {
                    // Nothing was there, or a `SET` resent after it landed: ours.
                    Ok(previous) => Ok(previous.is_none_or(|previous| previous == value)),
                    // `GET` of a hash: a shared lock, or no lock at all (the script tells).
                    Err(SendError::Answered(err)) if err.code() == Some("WRONGTYPE") => Ok(false),
                    Err(other) => Err(other),
                }
            }
        }
    }

    /// The acquire script's answer to `cmd`, for `request`.
    async fn run_acquire(
        &self,
        connection: &mut T::Connection,
        request: &AcquireRequest<'_>,
        cmd: &redis::Cmd,
        budget: Duration,
    ) -> Result<Result<Acquired, LockError>, SendError> {
        let reply = self
            .send::<Vec<redis::Value>>(connection, request.key, Request::Cmd(cmd), budget)
            .await?;
        scripts::acquired(request, &reply).ok_or_else(|| {
            let wrong = format!("an acquire reply of the wrong shape: {reply:?}");
            SendError::Unknown(StoreError::unavailable(wrong))
        })
    }

    /// Acquires `request` by sending `cmd`, its [`acquire_cmd`](Self::acquire_cmd), waiting at
    /// most `budget`. A plain `SET` that finds the key taken is followed by the acquire script,
    /// which tells a lock from anything else under the key and when to come back (and takes
    /// the key, if it was freed meanwhile). A request whose outcome is unknown (this future
    /// dropped, the reply lost) is undone on the connection that carried it.
    pub(crate) async fn acquire_with(
        &self,
        request: AcquireRequest<'_>,
        cmd: &redis::Cmd,
        budget: Duration,
    ) -> Result<Acquired, StoreError> {
        let connection = self.transport.connection().await?;
        // From here the SET may reach Redis: if this future is dropped, or the reply is
        // lost, the guard undoes it on the same connection.
        let mut undo = UndoGuard {
            store: self,
            connection,
            armed: true,
            abandoned: request.lease(),
        };
        // The uncontended case first: a plain `SET` no replica must acknowledge, in a small
        // future. The rest (replicas to count or wait for, the acquire script) is boxed: inline
        // it made every acquire's future 2.3 KB, set up and moved on each call.
        let needed = self.needed(request.key);
        if needed == Needed::Nothing && request.is_plain() {
            match self
                .set_nx(&mut undo.connection, &request, cmd, budget)
                .await
            {
                Ok(true) => {
                    undo.disarm();
                    return Ok(TAKEN);
                }
                // Busy: the acquire script tells what holds it.
                Ok(false) => {
                    let busy =
                        Box::pin(self.acquire_fully(undo, request, cmd, budget, needed, true));
                    return busy.await;
                }
                Err(SendError::Answered(err)) => {
                    undo.disarm();
                    return Err(SendError::Answered(err).into_store_error());
                }
                Err(SendError::Unknown(error)) => return Err(error),
            }
        }
        Box::pin(self.acquire_fully(undo, request, cmd, budget, needed, false)).await
    }

    /// [`acquire_with`](Self::acquire_with) beyond the uncontended case: replicas to count or to
    /// acknowledge, the acquire script (at once when a plain `SET` already `found_busy`).
    async fn acquire_fully<'a>(
        &'a self,
        mut undo: UndoGuard<'a, T>,
        request: AcquireRequest<'a>,
        cmd: &redis::Cmd,
        budget: Duration,
        needed: Needed,
        found_busy: bool,
    ) -> Result<Acquired, StoreError> {
        let acks = self
            .acks_for(&mut undo.connection, request.key, needed)
            .await?;
        let mut waiting = undo.connection.clone();
        let connection = &mut undo.connection;
        let first = async {
            if found_busy {
                return Ok(None);
            }
            match request.is_plain() {
                true => self
                    .set_nx(connection, &request, cmd, budget)
                    .await
                    .map(|taken| taken.then_some(Ok(TAKEN))),
                false => self
                    .run_acquire(connection, &request, cmd, budget)
                    .await
                    .map(Some),
            }
        };
        let (first, mut acked) = self
            .with_wait(&mut waiting, request.key, acks, first, |reply| {
                matches!(reply, Some(Ok(Acquired::Taken { .. })))
            })
            .await;
        let reply = match first {
            Ok(Some(acquired)) => Ok(acquired),
            // The plain `SET` found the key taken: the script tells what holds it, and when to
            // come back (and takes the key, if it was freed meanwhile).
            Ok(None) => {
                let script = self.acquire_script(&request)?;
                let reply = self
                    .run_acquire(connection, &request, &script, budget)
                    .await;
                let write = async { reply };
                let (reply, then) = self
                    .with_wait(&mut waiting, request.key, acks, write, |reply| {
                        matches!(reply, Ok(Acquired::Taken { .. }))
                    })
                    .await;
                acked = then;
                reply
            }
            Err(error) => Err(error),
        };
        match reply {
            Ok(acquired) => {
                if let (Ok(Acquired::Taken { .. }), Some(needed), Some(acked)) =
                    (&acquired, acks, acked)
                {
                    let confirmed = self.acknowledged(connection, request.key, needed, acked);
                    if let Err(error) = confirmed.await {
                        self.undo_now(&mut undo).await;
                        return Err(error);
                    }
                }
                undo.disarm();
                Ok(acquired?)
            }
            Err(SendError::Answered(err)) => {
                // Redis answered with an error: the SET did not run.
                undo.disarm();
                Err(SendError::Answered(err).into_store_error())
            }
            Err(SendError::Unknown(error)) => Err(error),
        }
    }

    /// Undoes a grant its replicas did not acknowledge, before the caller hears of it, on the
    /// connection that carried it; left to the guard (in the background) when that fails.
    async fn undo_now(&self, undo: &mut UndoGuard<'_, T>) {
        #[cfg(feature = "sim")]
        crate::world::sometimes("a grant undone after missing acknowledgements");
        let abandoned = undo.abandoned;
        let plan = self.release_plan(abandoned);
        let released = self.give_back(&mut undo.connection, abandoned, plan).await;
        if released {
            undo.disarm();
        }
    }

    /// Undoes an acquire whose outcome is unknown: a compare-and-delete sent on the connection
    /// that carried the `SET`, so it reaches Redis after it whatever happened; if that
    /// connection is gone, retried on a fresh one until the lease would have lapsed anyway.
    fn undo_acquire(&self, mut connection: T::Connection, abandoned: LeaseRef<'_>) {
        #[cfg(feature = "sim")]
        crate::world::sometimes("an acquire of unknown outcome undone by the Redis store");
        let store = self.clone();
        let abandoned = OwnedLease::of(abandoned);
        self.settings().background.spawn(async move {
            let lease = abandoned.as_ref();
            // A key whose release has no channel was refused before its `SET`.
            let Ok(plan) = store.release_plan(lease) else {
                return;
            };
            match store.release_by(lease, &plan, Some(&mut connection)).await {
                Ok(deleted) => {
                    tracing::debug!(key = %lease.key, deleted, "abandoned acquire undone");
                }
                Err(_) => {
                    release_until_settled(&store, lease).await;
                }
            }
        });
    }

    /// The keys of a multi-key lock as one script call each takes them, by index: all at once on
    /// one server; slot by slot on a cluster, in slot order (a fixed order for every caller).
    fn key_groups(keys: &[String]) -> Vec<Vec<usize>> {
        match T::LAYOUT {
            Layout::Server => vec![(0..keys.len()).collect()],
            Layout::Cluster => {
                let mut slots: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
                for (index, key) in keys.iter().enumerate() {
                    slots
                        .entry(protocol::slot_number(key))
                        .or_default()
                        .push(index);
                }
                slots.into_values().collect()
            }
        }
    }

    /// The release script of the keys of `group` of a multi-key `lease`, with their channels.
    fn release_group_cmd(
        &self,
        lease: LeaseRef<'_>,
        group: &[usize],
    ) -> Result<redis::Cmd, LockError> {
        let names = &self.settings().names;
        let keys: Vec<&str> = group.iter().map(|&i| lease.keys[i].as_str()).collect();
        let channels = keys
            .iter()
            .map(|key| T::LAYOUT.release_channel(names, key))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(scripts::release_many(
            &keys,
            &channels,
            lease.value,
            T::LAYOUT.announce(),
            lease.kept_for(),
            lease.undone,
        ))
    }

    /// How `lease` is released here: built once, for a Redlock once for all its masters.
    pub(crate) fn release_plan(&self, lease: LeaseRef<'_>) -> Result<ReleasePlan, LockError> {
        if scripts::releases_plainly(&lease) {
            return Ok(ReleasePlan::Plain(scripts::release_plain(&lease)));
        }
        if lease.keys.is_empty() {
            return Ok(ReleasePlan::Full(self.release_cmd(lease)?));
        }
        self.groups_plan(lease, &Self::key_groups(lease.keys))
    }

    /// The release of `groups` of the keys of a multi-key `lease`.
    fn groups_plan(
        &self,
        lease: LeaseRef<'_>,
        groups: &[Vec<usize>],
    ) -> Result<ReleasePlan, LockError> {
        let calls = groups
            .iter()
            .map(|group| Ok((group[0], self.release_group_cmd(lease, group)?)))
            .collect::<Result<_, LockError>>()?;
        Ok(ReleasePlan::Groups(calls))
    }

    /// Runs `plan`, `lease`'s release, on `connection` (one that carried an acquire: the release
    /// reaches the server after it) or on this runtime's: whether every key was still ours.
    pub(crate) async fn release_by(
        &self,
        lease: LeaseRef<'_>,
        plan: &ReleasePlan,
        connection: Option<&mut T::Connection>,
    ) -> Result<bool, StoreError> {
        let mut runtimes;
        let connection = match connection {
            Some(connection) => connection,
            None => {
                runtimes = self.transport.connection().await?;
                &mut runtimes
            }
        };
        match plan {
            ReleasePlan::Plain(cmd) => {
                match PlainRelease::of(self.script_on(connection, lease.key, cmd).await?) {
                    PlainRelease::Released => Ok(true),
                    PlainRelease::NotOurs => Ok(false),
                    // Marked here: the full release, which tells whoever waits or watches.
                    PlainRelease::Marked => {
                        let cmd = self.release_cmd(lease)?;
                        Ok(self.script_on(connection, lease.key, &cmd).await? == 1)
                    }
                }
            }
            ReleasePlan::Full(cmd) => Ok(self.script_on(connection, lease.key, cmd).await? == 1),
            ReleasePlan::Groups(calls) => {
                // All at once, on clones of one connection: sent in order, answered together.
                let released = join_all(calls.iter().map(|(first, cmd)| {
                    let mut connection = connection.clone();
                    async move {
                        let key = &lease.keys[*first];
                        self.script_on(&mut connection, key, cmd).await
                    }
                }))
                .await;
                let mut ours = 0;
                for released in released {
                    ours += released?;
                }
                Ok(usize::try_from(ours).is_ok_and(|ours| ours == lease.keys.len()))
            }
        }
    }

    /// Gives back what an attempt took, by `plan`, on the `connection` that carried it: whether
    /// the release was answered. A plan that could not be made means a key whose release has no
    /// channel, refused before anything was taken.
    async fn give_back(
        &self,
        connection: &mut T::Connection,
        lease: LeaseRef<'_>,
        plan: Result<ReleasePlan, LockError>,
    ) -> bool {
        match plan {
            Ok(plan) => self
                .release_by(lease, &plan, Some(connection))
                .await
                .is_ok(),
            Err(_) => true,
        }
    }

    /// A script whose reply is a number, on `connection`.
    async fn script_on(
        &self,
        connection: &mut T::Connection,
        key: &str,
        cmd: &redis::Cmd,
    ) -> Result<i64, StoreError> {
        let budget = self.settings().response_timeout;
        self.send(connection, key, Request::Cmd(cmd), budget)
            .await
            .map_err(SendError::into_store_error)
    }

    /// Takes every key of `request` or none: one script call per group of
    /// [`key_groups`](Self::key_groups), in order; a busy group undoes the groups taken before
    /// it (awaited, so that the keys are free when `Busy` is answered).
    async fn acquire_many_groups(
        &self,
        request: ManyRequest<'_>,
        budget: Duration,
    ) -> Result<AcquiredMany, StoreError> {
        let names = &self.settings().names;
        for key in request.keys {
            T::LAYOUT.check(names, key)?;
        }
        let groups = Self::key_groups(request.keys);
        let connection = self.transport.connection().await?;
        let started = tokio::time::Instant::now();
        // From here the keys may be taken: if this future is dropped, or a reply is lost, the
        // guard releases every key still ours, on the same connection.
        let mut undo = UndoGuard {
            store: self,
            connection,
            armed: true,
            abandoned: request.lease(),
        };
        let acks = self
            .acks_needed(&mut undo.connection, &request.keys[0])
            .await?;
        let whole = groups.len() == 1;
        for (at, group) in groups.iter().enumerate() {
            let keys: Vec<&str> = group.iter().map(|&i| request.keys[i].as_str()).collect();
            let waiters = keys
                .iter()
                .map(|key| T::LAYOUT.beside(key, |key| names.waiters(key)))
                .collect::<Result<Vec<_>, _>>()?;
            let cmd = scripts::acquire_many(&keys, &waiters, &request, whole);
            let left = budget
                .saturating_sub(started.elapsed())
                .max(Duration::from_millis(1));
            let reply = self
                .send::<Vec<redis::Value>>(&mut undo.connection, keys[0], Request::Cmd(&cmd), left)
                .await;
            let refused = match reply {
                Ok(reply) => match scripts::acquired_many(&keys, &reply) {
                    Some(Ok(AcquiredMany::Taken)) => continue,
                    Some(Ok(AcquiredMany::Busy {
                        key,
                        remaining,
                        estimate,
                    })) => Ok(AcquiredMany::Busy {
                        key: group[key],
                        remaining,
                        estimate,
                    }),
                    Some(Err(not_a_lock)) => Err(StoreError::from(not_a_lock)),
                    None => {
                        let wrong = format!("an acquire reply of the wrong shape: {reply:?}");
                        return Err(StoreError::unavailable(wrong));
                    }
                },
                Err(SendError::Answered(err)) => {
                    // This group did not run; the groups before it are undone by the guard.
                    if at == 0 {
                        undo.disarm();
                    }
                    return Err(SendError::Answered(err).into_store_error());
                }
                Err(SendError::Unknown(error)) => return Err(error),
            };
            // Busy, or no lock: nothing of this group was taken; give back the groups before it.
            let taken = &groups[..at];
            let lease = request.lease();
            let undone = taken.is_empty() || {
                let plan = self.groups_plan(lease, taken);
                self.give_back(&mut undo.connection, lease, plan).await
            };
            if undone {
                undo.disarm();
            }
            return refused;
        }
        if let Some(needed) = acks {
            // Every key taken: each group's server is asked for its replicas, one by one (a
            // multi-key lock pays this round trip; a single key's `WAIT` is pipelined).
            let wait = self.replicas.wait_cmd(needed);
            let timeout = self.replicas.timeout;
            for group in &groups {
                let key = &request.keys[group[0]];
                let connection = &mut undo.connection;
                let acked = self
                    .transport
                    .wait_replicas(connection, key, &wait, timeout);
                let acked = acked.await;
                if let Err(error) = self.acknowledged(connection, key, needed, acked).await {
                    self.undo_now(&mut undo).await;
                    return Err(error);
                }
            }
        }
        undo.disarm();
        Ok(AcquiredMany::Taken)
    }

    /// Extends one batch of leases, all on one server, in one round trip.
    async fn extend_batch(
        &self,
        mut connection: T::Connection,
        leases: &[LeaseRef<'_>],
    ) -> Vec<Renewal> {
        let key = leases[0].key;
        let acks = match self.acks_needed(&mut connection, key).await {
            Ok(acks) => acks,
            Err(error) => return vec![Renewal::Failed(error); leases.len()],
        };
        let batch = scripts::extend(leases);
        let budget = self.settings().response_timeout;
        let mut waiting = connection.clone();
        let sent =
            self.send::<Vec<Vec<i64>>>(&mut connection, key, Request::Pipeline(&batch), budget);
        let (replied, acked) = self
            .with_wait(&mut waiting, key, acks, sent, |chunks| {
                chunks.iter().flatten().any(|&one| one == 1)
            })
            .await;
        // A renewal its replicas did not acknowledge does not count: it is retried, and the
        // lease's deadline stays where it was.
        let unacknowledged = match (acks, acked) {
            (Some(needed), Some(acked)) => self
                .acknowledged(&mut connection, key, needed, acked)
                .await
                .err(),
            _ => None,
        };
        match replied.map(|chunks| chunks.concat()) {
            Ok(extended) if extended.len() == leases.len() => extended
                .into_iter()
                .map(|one| match one {
                    1 => match &unacknowledged {
                        None => Renewal::Extended,
                        Some(error) => Renewal::Failed(error.clone()),
                    },
                    2 => Renewal::Lost(LostReason::Taken),
                    _ => Renewal::Lost(LostReason::Gone),
                })
                .collect(),
            Ok(_) => {
                let wrong = StoreError::unavailable("a renewal reply of the wrong length");
                vec![Renewal::Failed(wrong); leases.len()]
            }
            Err(sent) => vec![Renewal::Failed(sent.into_store_error()); leases.len()],
        }
    }
}

impl<T: Transport> Store for RedisStore<T> {
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        Box::pin(async move {
            let cmd = self.acquire_cmd(&request)?;
            self.acquire_with(request, &cmd, budget).await
        })
    }

    fn acquire_many<'a>(
        &'a self,
        request: ManyRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<AcquiredMany, StoreError>> {
        Box::pin(self.acquire_many_groups(request, budget))
    }

    fn extend<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Renewal>> {
        Box::pin(async move {
            let connection = match self.transport.connection().await {
                Ok(connection) => connection,
                Err(error) => return vec![Renewal::Failed(error); leases.len()],
            };
            // One batch per server (per slot on a cluster), all at once: about one round trip
            // per server a tick.
            let mut batches: HashMap<Option<u16>, Vec<usize>> = HashMap::new();
            for (index, lease) in leases.iter().enumerate() {
                let batch = batches.entry(T::LAYOUT.slot(lease.key));
                batch.or_default().push(index);
            }
            let batches = batches.values().map(|indexes| {
                let connection = connection.clone();
                let batch: Vec<LeaseRef<'_>> = indexes.iter().map(|&i| leases[i]).collect();
                async move { (indexes, self.extend_batch(connection, &batch).await) }
            });
            let mut outcomes = vec![None; leases.len()];
            for (indexes, renewed) in join_all(batches).await {
                for (&index, outcome) in indexes.iter().zip(renewed) {
                    outcomes[index] = Some(outcome);
                }
            }
            outcomes
                .into_iter()
                .map(|outcome| {
                    outcome.unwrap_or_else(|| {
                        Renewal::Failed(StoreError::unavailable("no renewal reply"))
                    })
                })
                .collect()
        })
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let plan = self.release_plan(lease)?;
            self.release_by(lease, &plan, None).await
        })
    }

    fn hands_over(&self) -> Option<&dyn HandsOver> {
        Some(self)
    }

    fn leave<'a>(&'a self, key: &'a str, token: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let names = &self.settings().names;
            let channel = T::LAYOUT.release_channel(names, key)?;
            let leaving = T::LAYOUT.leaving(names, key)?;
            let cmd = scripts::leave(key, &channel, &leaving, token, T::LAYOUT.announce());
            self.run_script(key, &cmd).await.map(drop)
        })
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        self.transport.release_feed()
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Snapshot>, StoreError>> {
        Box::pin(inspect::look(self, key))
    }

    fn mark_watched<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(inspect::mark_watched(self, key))
    }

    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Cursor,
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(inspect::scan(self, prefix, cursor))
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(inspect::force_release(self, key))
    }

    fn health(&self) -> BoxFuture<'_, Health> {
        self.transport.health()
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut connection = self.transport.connection().await?;
            // On a cluster, PING goes to every node: all of them must answer.
            let ping = redis::cmd("PING");
            let budget = self.settings().response_timeout;
            self.transport
                .send_once::<redis::Value>(&mut connection, Request::Cmd(&ping), budget)
                .await
                .map_err(SendError::into_store_error)?;
            if T::LAYOUT == Layout::Server {
                // A cluster node taken for one server is refused here, at build, rather than
                // failing key by key. A server that refuses `INFO` (an ACL) is taken as it is.
                let mut info = redis::cmd("INFO");
                info.arg("cluster");
                let found = self
                    .transport
                    .send_once::<String>(&mut connection, Request::Cmd(&info), budget)
                    .await;
                match found {
                    Ok(info) if info.contains("cluster_enabled:1") => {
                        return Err(a_cluster_node(&"INFO says `cluster_enabled:1`").into());
                    }
                    Err(SendError::Unknown(error)) => return Err(error),
                    _ => {}
                }
                // The master's replicas are counted now, so the first lock pays no `INFO` (a
                // count the acquire waited for was not bounded by its lease).
                if self.replicas.needed(None).0 == Needed::Count {
                    self.count_replicas(&mut connection, "").await?;
                }
            }
            Ok(())
        })
    }
}

/// The leader of a round of `WAIT` on a shared connection. When its `WAIT` is answered, or
/// it is dropped before (its caller gave up), the rounds that gathered meanwhile run in the
/// background until none gathers, so no follower is left waiting.
struct RoundLeader<T: Transport> {
    store: RedisStore<T>,
    connection: T::Connection,
    shared: u64,
}

impl<T: Transport> RoundLeader<T> {
    fn new(store: &RedisStore<T>, connection: &T::Connection, shared: u64) -> Self {
        Self {
            store: store.clone(),
            connection: connection.clone(),
            shared,
        }
    }
}

impl<T: Transport> Drop for RoundLeader<T> {
    fn drop(&mut self) {
        let (store, shared) = (&self.store, self.shared);
        let Some(mut round) = store.replicas.next_round(shared) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to run it on: the followers hear that, and no round stays open.
            for answer in round.1 {
                let _ = answer.send(Err(StoreError::unavailable(
                    "no runtime to wait for replicas on",
                )));
            }
            store.replicas.end_rounds(shared);
            return;
        };
        let (store, mut connection) = (store.clone(), self.connection.clone());
        runtime.spawn(async move {
            loop {
                let (acks, answers) = round;
                let wait = store.replicas.wait_cmd(acks);
                let timeout = store.replicas.timeout;
                let acked = store
                    .transport
                    .wait_replicas(&mut connection, "", &wait, timeout)
                    .await
                    .map_err(SendError::into_store_error);
                for answer in answers {
                    let _ = answer.send(acked.clone());
                }
                match store.replicas.next_round(shared) {
                    Some(next) => round = next,
                    None => return,
                }
            }
        });
    }
}

impl<T: Transport> Commands for RedisStore<T> {
    fn names(&self) -> &Names {
        &self.settings().names
    }

    fn is_cluster(&self) -> bool {
        T::LAYOUT == Layout::Cluster
    }

    fn on_key<'a>(
        &'a self,
        key: &'a str,
        cmd: &'a redis::Cmd,
    ) -> BoxFuture<'a, Result<redis::Value, StoreError>> {
        Box::pin(async move {
            let mut connection = self.transport.connection().await?;
            let budget = self.settings().response_timeout;
            self.send(&mut connection, key, Request::Cmd(cmd), budget)
                .await
                .map_err(SendError::into_store_error)
        })
    }

    fn masters(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        self.transport.masters()
    }

    fn on_master<'a>(
        &'a self,
        master: &'a str,
        request: Request<'a>,
    ) -> BoxFuture<'a, Result<redis::Value, StoreError>> {
        self.transport.on_master(master, request)
    }
}

impl<T: Transport> HandsOver for RedisStore<T> {
    fn hand_over<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        next: LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<HandOver, StoreError>> {
        Box::pin(async move {
            let names = &self.settings().names;
            let channel = T::LAYOUT.release_channel(names, lease.key)?;
            let waiting = T::LAYOUT.waiting(names, lease.key)?;
            let cmd = scripts::hand_over(lease, next, &channel, &waiting, T::LAYOUT.announce());
            // A hand-over is a grant: where replicas must acknowledge a grant, they acknowledge
            // the next holder's value before its work runs (`WAIT` behind the script, as
            // behind an acquire). A key handed to a caller elsewhere is acknowledged by that
            // caller's own look, which takes it.
            let mut connection = self.transport.connection().await?;
            let acks = self.acks_needed(&mut connection, lease.key).await?;
            let budget = self.settings().response_timeout;
            let mut waiting = connection.clone();
            let script = self.send::<i64>(&mut connection, lease.key, Request::Cmd(&cmd), budget);
            let (reply, acked) = self
                .with_wait(&mut waiting, lease.key, acks, script, |reply| *reply == 1)
                .await;
            let handed = HandOver::from_reply(reply.map_err(SendError::into_store_error)?);
            if let (HandOver::Handed, Some(needed), Some(acked)) = (handed, acks, acked)
                && let Err(error) = self
                    .acknowledged(&mut connection, lease.key, needed, acked)
                    .await
            {
                // Undone as an attempt that did not win: announced as "look again". If the
                // undo fails too, the caller hears the error and the next holder's token is
                // given up in the background.
                tracing::debug!(key = %lease.key, error = %error, "a hand-over no replica acknowledged is undone");
                #[cfg(feature = "sim")]
                crate::world::sometimes("a grant undone after missing acknowledgements");
                let undone = LeaseRef {
                    undone: true,
                    ..next
                };
                let release = self.release_cmd(undone)?;
                let request = Request::Cmd(&release);
                self.send::<i64>(&mut connection, lease.key, request, budget)
                    .await
                    .map_err(SendError::into_store_error)?;
                return Ok(HandOver::Released);
            }
            Ok(handed)
        })
    }
}

/// What a grant is, without a fencing token.
const TAKEN: Acquired = Acquired::Taken {
    fencing_token: None,
};

/// How a lease is released on one server, its script calls built once. Every path that
/// releases a lease (a release, a Redlock's on each master, an undone grant or acquire) builds
/// one with [`RedisStore::release_plan`] and runs it with [`RedisStore::release_by`].
pub(crate) enum ReleasePlan {
    /// A key nobody waits for or watches: the compare-and-delete alone
    /// ([`scripts::release_plain`]); where the key is found marked, the full release, built then.
    Plain(redis::Cmd),
    /// One key's release script.
    Full(redis::Cmd),
    /// A multi-key lease: a script call per group of its keys (all on one server; per slot on a
    /// cluster), by the index of the group's first key.
    Groups(Vec<(usize, redis::Cmd)>),
}

/// Undoes a `SET` whose outcome is unknown, on the connection that carried it, unless disarmed
/// once the reply is known.
struct UndoGuard<'a, T: Transport> {
    store: &'a RedisStore<T>,
    connection: T::Connection,
    armed: bool,
    abandoned: LeaseRef<'a>,
}

impl<T: Transport> UndoGuard<'_, T> {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl<T: Transport> Drop for UndoGuard<'_, T> {
    fn drop(&mut self) {
        if self.armed {
            self.store
                .undo_acquire(self.connection.clone(), self.abandoned);
        }
    }
}

/// The reply to `SET NX`: `OK` when set, nil when the key exists. Anything else is a parse
/// error, so the connection that produced it is dropped.
struct SetNx(bool);

impl FromRedisValue for SetNx {
    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        match value {
            redis::Value::Okay => Ok(Self(true)),
            redis::Value::Nil => Ok(Self(false)),
            other => Err(format!("unexpected reply to SET NX: {other:?}").into()),
        }
    }
}
