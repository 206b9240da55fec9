//! One Redis master: the deployment behind `redis://`, `rediss://` and `valkey://` URLs, and,
//! found through Sentinel, behind `redis+sentinel://` ([`sentinel`]).
//!
//! Acquire is one `SET NX PX` (the acquire script when fencing or waiting), extensions are one
//! pipelined round trip per batch, releases a compare-and-delete that announces itself on the
//! key's release channel.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind};
use tokio::runtime::Handle;

use super::inspect::{self, Commands, Cursor, Page, Snapshot};
use super::protocol;
use super::scripts::{self, Announce};
use super::{
    AcquireRequest, Acquired, BoxFuture, HandOver, HandsOver, LeaseRef, Names, ReleaseFeed,
    Renewal, Store, StoreError, TimedOut, Unreachable,
};

pub(crate) mod connections;
mod feed;
pub(crate) mod sentinel;

use connections::{Lent, PerRuntime};
use sentinel::SentinelSource;

/// Where the master is.
#[allow(clippy::large_enum_variant)] // one per client
pub(crate) enum Source {
    /// At a fixed address.
    Direct(redis::Client),
    /// Wherever the sentinels say it is now.
    Sentinel(SentinelSource),
}

impl Source {
    async fn master(&self) -> Result<redis::Client, StoreError> {
        match self {
            Self::Direct(client) => Ok(client.clone()),
            Self::Sentinel(sentinel) => sentinel.master().await,
        }
    }

    /// The master we knew may be gone or demoted: ask the sentinels again next time.
    fn forget_master(&self) {
        if let Self::Sentinel(sentinel) = self {
            sentinel.forget_master();
        }
    }
}

/// How a Redis deployment is reached and timed.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) names: Names,
    /// The client's own runtime: undoing an abandoned acquire runs there.
    pub(crate) background: Handle,
}

/// One Redis server.
#[derive(Clone)]
pub(crate) struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    config: AsyncConnectionConfig,
    settings: Settings,
    connections: PerRuntime<MultiplexedConnection>,
}

impl RedisStore {
    pub(crate) fn new(source: Source, settings: Settings) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.response_timeout));
        let store = Self {
            inner: Arc::new(Inner {
                source,
                config,
                connections: PerRuntime::new(),
                settings,
            }),
        };
        if let Source::Sentinel(sentinel) = &store.inner.source {
            sentinel.follow_switches(&store);
        }
        store
    }

    /// Drops every connection: the master changed.
    pub(crate) fn master_switched(&self) {
        self.inner.source.forget_master();
        self.inner.connections.invalidate_all();
    }

    /// A handle that does not keep the store alive, for tasks that should end with it.
    pub(crate) fn downgrade(&self) -> WeakRedisStore {
        WeakRedisStore(Arc::downgrade(&self.inner))
    }

    fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The current runtime's connection; a new one has every script loaded.
    async fn lend(&self) -> Result<Lent<MultiplexedConnection>, StoreError> {
        self.inner
            .connections
            .lend(|| async {
                let master = self.inner.source.master().await?;
                let server = master.get_connection_info().addr().clone();
                let tls = matches!(server, redis::ConnectionAddr::TcpTls { .. });
                let budget = self.settings().connect_timeout;
                let open = async {
                    let mut connection = master
                        .get_multiplexed_async_connection_with_config(&self.inner.config)
                        .await?;
                    scripts::load_all().exec_async(&mut connection).await?;
                    Ok::<_, RedisError>(connection)
                };
                match tokio::time::timeout(budget, open).await {
                    Ok(Ok(connection)) => Ok(connection),
                    Ok(Err(err)) => Err(Unreachable::error(&server, tls && err.is_timeout(), err)),
                    Err(_) => Err(Unreachable::error(&server, tls, TimedOut(budget))),
                }
            })
            .await
    }

    /// Sends `request` on `lent`, waiting at most `budget` for the reply. A script the server
    /// does not know (`NOSCRIPT`: restarted or flushed; none of the request ran) is loaded and
    /// the request sent once more.
    async fn send<T: redis::FromRedisValue>(
        &self,
        lent: &mut Lent<MultiplexedConnection>,
        request: Request<'_>,
        budget: Duration,
    ) -> Result<T, SendError> {
        match self.send_once(lent, request, budget).await {
            Err(SendError::Answered(err))
                if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
            {
                let load = scripts::load_all();
                self.send_once::<()>(lent, Request::Pipeline(&load), budget)
                    .await?;
                self.send_once(lent, request, budget).await
            }
            other => other,
        }
    }

    async fn send_once<T: redis::FromRedisValue>(
        &self,
        lent: &mut Lent<MultiplexedConnection>,
        request: Request<'_>,
        budget: Duration,
    ) -> Result<T, SendError> {
        let connection = &mut lent.connection;
        let reply = match request {
            Request::Cmd(cmd) => self.within(budget, cmd.query_async(connection)).await,
            Request::Pipeline(pipe) => self.within(budget, pipe.query_async(connection)).await,
        };
        match reply {
            Some(Ok(value)) => Ok(value),
            Some(Err(err)) => Err(self.classify(lent.generation, err)),
            None => {
                // The request keeps its place in the connection's reply queue: if its reply
                // comes late, that place would take the next request's reply. Never lend it again.
                self.inner.connections.invalidate(lent.generation);
                Err(SendError::Unknown(StoreError::unavailable(TimedOut(
                    budget,
                ))))
            }
        }
    }

    /// The reply, or `None` when `budget` ran out first. The connection itself bounds every
    /// request by the response timeout, so a timer of our own is only armed for a shorter budget.
    async fn within<T>(
        &self,
        budget: Duration,
        reply: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Option<redis::RedisResult<T>> {
        if budget < self.settings().response_timeout {
            tokio::time::timeout(budget, reply).await.ok()
        } else {
            Some(reply.await)
        }
    }

    /// Whether a failed request may have run, dropping the connection when it proved broken.
    fn classify(&self, generation: u64, err: RedisError) -> SendError {
        let connections = &self.inner.connections;
        let broken = err.is_io_error()
            || err.is_connection_dropped()
            || err.is_timeout()
            || err.is_unrecoverable_error()
            // A reply of the wrong shape means replies and requests are out of step.
            || matches!(err.kind(), ErrorKind::UnexpectedReturnType | ErrorKind::Parse);
        if err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
            // A replica now: a failover demoted this server. Every connection goes.
            self.master_switched();
        } else if broken {
            connections.invalidate(generation);
            self.inner.source.forget_master();
        }
        if broken {
            SendError::Unknown(StoreError::unavailable(err))
        } else {
            SendError::Answered(err)
        }
    }

    /// A script whose reply is a number, on this runtime's connection.
    async fn run_script(&self, cmd: &redis::Cmd) -> Result<i64, StoreError> {
        let mut lent = self.lend().await?;
        let budget = self.settings().response_timeout;
        self.send(&mut lent, Request::Cmd(cmd), budget)
            .await
            .map_err(SendError::into_store_error)
    }

    /// Compare-and-delete on this runtime's connection.
    async fn release_here(&self, lease: LeaseRef<'_>) -> Result<bool, StoreError> {
        Ok(self.run_script(&self.release_cmd(lease)).await? == 1)
    }

    async fn hand_over_here(
        &self,
        lease: LeaseRef<'_>,
        next: LeaseRef<'_>,
    ) -> Result<HandOver, StoreError> {
        let channel = self.settings().names.release_channel(lease.key);
        let cmd = scripts::hand_over(lease, next, &channel, Announce::Publish);
        Ok(HandOver::from_reply(self.run_script(&cmd).await?))
    }

    fn release_cmd(&self, lease: LeaseRef<'_>) -> redis::Cmd {
        let channel = self.settings().names.release_channel(lease.key);
        scripts::release(lease, &channel, Announce::Publish)
    }

    /// Undoes an acquire whose outcome is unknown: a compare-and-delete sent on the connection
    /// that carried the `SET`, so it reaches Redis after it whatever happened; if that
    /// connection is gone, retried on a fresh one until the lease would have lapsed anyway.
    fn undo_acquire(&self, connection: MultiplexedConnection, abandoned: LeaseRef<'_>) {
        let store = self.clone();
        let (key, token, kind, ttl) = (
            abandoned.key.to_owned(),
            abandoned.token.to_owned(),
            abandoned.kind,
            abandoned.ttl,
        );
        self.settings().background.spawn(async move {
            let lease = LeaseRef {
                key: &key,
                token: &token,
                kind,
                ttl,
            };
            let cmd = store.release_cmd(lease);
            let mut same = Lent {
                connection,
                generation: u64::MAX,
            };
            let budget = store.settings().response_timeout;
            match store
                .send::<i64>(&mut same, Request::Cmd(&cmd), budget)
                .await
            {
                Ok(deleted) => {
                    tracing::debug!(key = %key, deleted = deleted == 1, "abandoned acquire undone");
                }
                Err(_) => {
                    super::release_until_settled(&store, lease).await;
                }
            }
        });
    }
}

impl Store for RedisStore {
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        Box::pin(async move {
            let lent = self.lend().await?;
            let plain = request.is_plain();
            let cmd = if plain {
                scripts::set_nx(request.key, request.token, request.ttl)
            } else {
                scripts::acquire(&request, &self.settings().names.for_acquire(request.key))
            };
            // From here the SET may reach Redis: if this future is dropped, or the reply is
            // lost, the guard undoes it on the same connection.
            let mut undo = UndoGuard {
                store: self,
                lent,
                armed: true,
                abandoned: LeaseRef {
                    key: request.key,
                    token: request.token,
                    kind: request.kind,
                    ttl: request.ttl,
                },
            };
            let lent = &mut undo.lent;
            let reply = if plain {
                self.send::<SetNx>(lent, Request::Cmd(&cmd), budget)
                    .await
                    .map(|SetNx(taken)| {
                        if taken {
                            Acquired::Taken {
                                fencing_token: None,
                            }
                        } else {
                            Acquired::Busy { remaining: None }
                        }
                    })
            } else {
                self.send::<(i64, i64)>(lent, Request::Cmd(&cmd), budget)
                    .await
                    .map(|reply| scripts::acquired(&request, reply))
            };
            match reply {
                Ok(Acquired::Busy { remaining: None }) if plain => {
                    undo.disarm();
                    // A caller that fails fast learns when to come back, as from the script.
                    let pttl = scripts::remaining(request.key);
                    let lent = &mut undo.lent;
                    let remaining = self.send::<i64>(lent, Request::Cmd(&pttl), budget).await;
                    Ok(Acquired::Busy {
                        remaining: remaining.ok().and_then(protocol::remaining),
                    })
                }
                Ok(acquired) => {
                    undo.disarm();
                    Ok(acquired)
                }
                Err(SendError::Answered(err)) => {
                    // Redis answered with an error: the SET did not run.
                    undo.disarm();
                    Err(StoreError::unavailable(err))
                }
                Err(SendError::Unknown(error)) => Err(error),
            }
        })
    }

    fn extend<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Renewal>> {
        Box::pin(async move {
            let extended = async {
                let mut lent = self.lend().await?;
                let batch = scripts::extend(leases);
                let replies: Vec<Vec<i64>> = self
                    .send(
                        &mut lent,
                        Request::Pipeline(&batch),
                        self.settings().response_timeout,
                    )
                    .await
                    .map_err(SendError::into_store_error)?;
                Ok::<_, StoreError>(replies)
            };
            match extended.await {
                Ok(replies) => replies
                    .into_iter()
                    .flatten()
                    .map(|reply| {
                        if reply == 1 {
                            Renewal::Extended
                        } else {
                            Renewal::Lost
                        }
                    })
                    .collect(),
                Err(error) => vec![Renewal::Failed(error); leases.len()],
            }
        })
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(self.release_here(lease))
    }

    fn hands_over(&self) -> Option<&dyn HandsOver> {
        Some(self)
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        Box::pin(async move {
            let master = self.inner.source.master().await?;
            let feed = feed::PubSubFeed::open(
                &master,
                self.settings().names.clone(),
                self.settings().connect_timeout,
                self.settings().response_timeout,
            )
            .await?;
            Ok(Box::new(feed) as Box<dyn ReleaseFeed>)
        })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a str,
        mark: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, StoreError>> {
        Box::pin(inspect::look(self, key, mark))
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

    fn connect(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let mut lent = self.lend().await?;
            let ping = redis::cmd("PING");
            let _: String = self
                .send(
                    &mut lent,
                    Request::Cmd(&ping),
                    self.settings().response_timeout,
                )
                .await
                .map_err(SendError::into_store_error)?;
            Ok(())
        })
    }
}

impl Commands for RedisStore {
    fn names(&self) -> &Names {
        &self.settings().names
    }

    fn is_cluster(&self) -> bool {
        false
    }

    fn on_key<'a>(
        &'a self,
        _key: &'a str,
        cmd: &'a redis::Cmd,
    ) -> BoxFuture<'a, Result<redis::Value, StoreError>> {
        Box::pin(async move {
            let mut lent = self.lend().await?;
            let budget = self.settings().response_timeout;
            self.send(&mut lent, Request::Cmd(cmd), budget)
                .await
                .map_err(SendError::into_store_error)
        })
    }

    fn masters(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        Box::pin(async { Ok(vec![String::new()]) })
    }

    fn on_master<'a>(
        &'a self,
        _master: &'a str,
        cmd: &'a redis::Cmd,
    ) -> BoxFuture<'a, Result<redis::Value, StoreError>> {
        self.on_key("", cmd)
    }
}

impl HandsOver for RedisStore {
    fn hand_over<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        next: LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<HandOver, StoreError>> {
        Box::pin(self.hand_over_here(lease, next))
    }
}

/// A [`RedisStore`] that may be gone.
pub(crate) struct WeakRedisStore(std::sync::Weak<Inner>);

impl WeakRedisStore {
    pub(crate) fn upgrade(&self) -> Option<RedisStore> {
        self.0.upgrade().map(|inner| RedisStore { inner })
    }
}

/// Undoes a `SET` whose outcome is unknown, on the connection that carried it, unless disarmed
/// once the reply is known.
struct UndoGuard<'a> {
    store: &'a RedisStore,
    lent: Lent<MultiplexedConnection>,
    armed: bool,
    abandoned: LeaseRef<'a>,
}

impl UndoGuard<'_> {
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for UndoGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.store
                .undo_acquire(self.lent.connection.clone(), self.abandoned);
        }
    }
}

/// A command or a pipeline.
#[derive(Clone, Copy)]
enum Request<'a> {
    Cmd(&'a redis::Cmd),
    Pipeline(&'a redis::Pipeline),
}

/// Why a request failed, and whether it may have run.
enum SendError {
    /// Redis answered with an error: the request ran, or was refused; its outcome is known.
    Answered(RedisError),
    /// No usable answer (timeout, broken connection, a reply out of step): it may have run.
    Unknown(StoreError),
}

impl SendError {
    fn into_store_error(self) -> StoreError {
        match self {
            Self::Answered(err) => StoreError::unavailable(err),
            Self::Unknown(error) => error,
        }
    }
}

/// The reply to `SET NX`: `OK` when set, nil when the key exists. Anything else is a parse
/// error, so the connection that produced it is dropped.
struct SetNx(bool);

impl redis::FromRedisValue for SetNx {
    fn from_redis_value(value: redis::Value) -> Result<Self, redis::ParsingError> {
        match value {
            redis::Value::Okay => Ok(Self(true)),
            redis::Value::Nil => Ok(Self(false)),
            other => Err(format!("unexpected reply to SET NX: {other:?}").into()),
        }
    }
}
