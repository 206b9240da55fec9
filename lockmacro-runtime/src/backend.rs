//! The one seam between the lease engine and Redis: acquire, extend, release.
//!
//! Everything above this file speaks in keys, tokens and ttls; only this file knows commands,
//! scripts and connections. Cluster, Sentinel or a Redlock quorum replace this file, not its callers.
//!
//! Connections are per tokio runtime: a multiplexed connection's driver task lives on the runtime
//! that opened it and dies with it, so each runtime that calls in gets its own, opened on first use
//! and dropped once that runtime is gone. The hot path thus stays on the caller's runtime (no hop
//! to another thread), and the watchdog thread's runtime is just one more caller.

use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, Script};
use tokio::runtime::{Handle, Id as RuntimeId};
use tokio::sync::oneshot;

use crate::error::{LockError, TimedOut};

const ACQUIRE_LUA: &str = include_str!("scripts/acquire.lua");
const RELEASE_LUA: &str = include_str!("scripts/release.lua");
const EXTEND_LUA: &str = include_str!("scripts/extend.lua");
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));

/// Keys per extend-script call: bounds how long one script blocks Redis (about 0.2 ms per 500).
const EXTEND_CHUNK: usize = 500;

/// One attempt to take a lock.
pub(crate) struct AcquireRequest<'a> {
    pub(crate) key: &'a str,
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
    pub(crate) fencing: bool,
    /// Report the holder's remaining lease when busy (a waiter sleeps at most that long).
    pub(crate) want_remaining: bool,
}

/// What an acquire attempt found.
pub(crate) enum Acquired {
    Taken { fencing_token: Option<u64> },
    Busy { remaining: Option<Duration> },
}

/// Where the fencing counter of `key` lives: outside the lock key, so it survives releases.
pub(crate) fn fencing_counter(key: &str) -> String {
    format!("lockmacro:fence:{key}")
}

/// The channel on which releases of `key` are announced.
pub(crate) fn release_channel(key: &str) -> String {
    format!("{RELEASE_CHANNEL_PREFIX}{key}")
}

pub(crate) const RELEASE_CHANNEL_PREFIX: &str = "lockmacro:released:";

/// One lease to extend: key, token, new ttl.
pub(crate) struct Extension<'a> {
    pub(crate) key: &'a str,
    pub(crate) token: &'a str,
    pub(crate) ttl: Duration,
}

/// Extensions encoded for sending: one extend-script call per chunk of keys, pipelined.
pub(crate) struct ExtendBatch(redis::Pipeline);

impl ExtendBatch {
    pub(crate) fn new(leases: &[Extension<'_>]) -> Self {
        let mut pipe = redis::pipe();
        for chunk in leases.chunks(EXTEND_CHUNK) {
            let cmd = pipe.cmd("EVALSHA").arg(EXTEND.get_hash()).arg(chunk.len());
            for lease in chunk {
                cmd.arg(lease.key);
            }
            for lease in chunk {
                cmd.arg(lease.token).arg(millis(lease.ttl));
            }
        }
        Self(pipe)
    }
}

pub(crate) struct Backend {
    client: redis::Client,
    config: AsyncConnectionConfig,
    response_timeout: Duration,
    connect_timeout: Duration,
    by_runtime: Mutex<Vec<RuntimeConnection>>,
}

struct RuntimeConnection {
    runtime: RuntimeId,
    /// Closed once the runtime is gone: a sentinel task on that runtime holds the receiver
    /// (and ends when this sender is dropped, so it never outlives the connection).
    runtime_alive: oneshot::Sender<()>,
    connection: MultiplexedConnection,
    generation: u64,
}

/// A connection lent for one call, with the generation to invalidate if it turns out broken.
struct Lent {
    connection: MultiplexedConnection,
    generation: u64,
}

impl Backend {
    pub(crate) fn new(
        client: redis::Client,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(connect_timeout)
            .set_response_timeout(response_timeout);
        Self {
            client,
            config,
            response_timeout,
            connect_timeout,
            by_runtime: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    /// Takes `key` for `token` atomically. The plain path is one `SET key token NX PX ttl`; with
    /// `fencing` or `want_remaining` it is the acquire script, which also hands out the fencing
    /// token or reports the holder's remaining lease.
    ///
    /// `budget` bounds the whole call; on a timeout or a broken connection the command may still
    /// have landed, so the caller must treat the key as possibly ours and release it.
    pub(crate) async fn acquire(
        &self,
        request: AcquireRequest<'_>,
        budget: Duration,
    ) -> Result<Acquired, RedisFailure> {
        let AcquireRequest {
            key,
            token,
            ttl,
            fencing,
            want_remaining,
        } = request;
        if !fencing && !want_remaining {
            let mut cmd = redis::cmd("SET");
            cmd.arg(key).arg(token).arg("NX").arg("PX").arg(millis(ttl));
            let SetNx(taken) = self.query(Request::Cmd(&cmd), budget).await?;
            return Ok(if taken {
                Acquired::Taken {
                    fencing_token: None,
                }
            } else {
                Acquired::Busy { remaining: None }
            });
        }
        let mut invocation = ACQUIRE.prepare_invoke();
        invocation.key(key);
        if fencing {
            invocation.key(fencing_counter(key));
        }
        invocation.arg(token).arg(millis(ttl));
        let (taken, value): (i64, i64) = self.query(Request::Script(&invocation), budget).await?;
        Ok(if taken == 1 {
            Acquired::Taken {
                fencing_token: fencing.then_some(value.max(0) as u64),
            }
        } else {
            Acquired::Busy {
                remaining: u64::try_from(value).ok().map(Duration::from_millis),
            }
        })
    }

    /// Compare-and-delete: `true` when our key was deleted, `false` when it was not ours.
    pub(crate) async fn release(&self, key: &str, token: &str) -> Result<bool, RedisFailure> {
        let mut invocation = RELEASE.prepare_invoke();
        invocation.key(key).arg(token);
        let deleted: i64 = self
            .query(Request::Script(&invocation), self.response_timeout)
            .await?;
        Ok(deleted == 1)
    }

    pub(crate) async fn ping(&self) -> Result<(), RedisFailure> {
        let _: String = self
            .query(Request::Cmd(&redis::cmd("PING")), self.response_timeout)
            .await?;
        Ok(())
    }

    /// Extends every lease of `batch` whose key still holds its token; one round trip for all.
    /// The answer lists, in order, which were extended.
    pub(crate) async fn extend(&self, batch: &ExtendBatch) -> Result<Vec<bool>, RedisFailure> {
        let replies: Vec<Vec<i64>> = match self
            .query(Request::Pipeline(&batch.0), self.response_timeout)
            .await
        {
            Err(RedisFailure::Redis(err)) if err.kind() == ErrorKind::NoScriptError => {
                // A restarted or flushed Redis has no scripts: load it, then send the batch again
                // (a NOSCRIPT reply means none of it ran).
                let mut load = redis::cmd("SCRIPT");
                load.arg("LOAD").arg(EXTEND_LUA);
                let _: String = self
                    .query(Request::Cmd(&load), self.response_timeout)
                    .await?;
                self.query(Request::Pipeline(&batch.0), self.response_timeout)
                    .await?
            }
            other => other?,
        };
        Ok(replies.into_iter().flatten().map(|r| r == 1).collect())
    }

    async fn query<T: redis::FromRedisValue>(
        &self,
        request: Request<'_>,
        budget: Duration,
    ) -> Result<T, RedisFailure> {
        let mut lent = self.lend().await?;
        let connection = &mut lent.connection;
        let reply = match request {
            Request::Cmd(cmd) => self.within(budget, cmd.query_async(connection)).await,
            Request::Pipeline(pipe) => self.within(budget, pipe.query_async(connection)).await,
            Request::Script(script) => self.within(budget, script.invoke_async(connection)).await,
        };
        self.settle(&lent, reply, budget)
    }

    /// The reply, or `None` when `budget` ran out first. The connection itself bounds every
    /// request by the response timeout, so a timer of our own is only armed for a shorter budget.
    async fn within<T>(
        &self,
        budget: Duration,
        reply: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Option<redis::RedisResult<T>> {
        if budget < self.response_timeout {
            tokio::time::timeout(budget, reply).await.ok()
        } else {
            Some(reply.await)
        }
    }

    /// Turns a reply into a result, dropping the connection when it proved broken.
    fn settle<T>(
        &self,
        lent: &Lent,
        reply: Option<redis::RedisResult<T>>,
        budget: Duration,
    ) -> Result<T, RedisFailure> {
        match reply {
            Some(Ok(value)) => Ok(value),
            Some(Err(err)) => {
                // A reply of the wrong shape means replies and requests are out of step.
                if err.is_io_error()
                    || err.is_connection_dropped()
                    || err.is_unrecoverable_error()
                    || err.is_timeout()
                    || err.kind() == ErrorKind::TypeError
                {
                    self.invalidate(lent.generation);
                }
                Err(RedisFailure::Redis(err))
            }
            None => {
                // The request keeps its place in the multiplexed connection's reply queue: if its
                // reply never comes, that place takes the next request's reply. Never lend it again.
                self.invalidate(lent.generation);
                Err(RedisFailure::TimedOut(TimedOut(budget)))
            }
        }
    }

    /// The current runtime's connection, opened on first use.
    async fn lend(&self) -> Result<Lent, RedisFailure> {
        let runtime = Handle::try_current()
            .map_err(|_| RedisFailure::NoRuntime)?
            .id();
        if let Some(lent) = self.cached(runtime) {
            return Ok(lent);
        }
        let opened = tokio::time::timeout(
            self.connect_timeout,
            self.client
                .get_multiplexed_async_connection_with_config(&self.config),
        )
        .await
        .map_err(|_| RedisFailure::TimedOut(TimedOut(self.connect_timeout)))?
        .map_err(RedisFailure::Redis)?;
        // Load the scripts up front, so a crowd of first callers does not each meet NOSCRIPT.
        let mut preload = redis::pipe();
        for source in [ACQUIRE_LUA, RELEASE_LUA, EXTEND_LUA] {
            preload.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
        }
        let mut connection = opened.clone();
        tokio::time::timeout(
            self.response_timeout,
            preload.query_async::<()>(&mut connection),
        )
        .await
        .map_err(|_| RedisFailure::TimedOut(TimedOut(self.response_timeout)))?
        .map_err(RedisFailure::Redis)?;

        let (runtime_alive, sentinel) = oneshot::channel::<()>();
        // Lives until this runtime shuts down (closing `runtime_alive`) or the entry is dropped.
        tokio::spawn(async move {
            let _ = sentinel.await;
        });
        static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let generation = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut by_runtime = self.by_runtime.lock().unwrap_or_else(|e| e.into_inner());
        by_runtime.retain(|c| !c.runtime_alive.is_closed() && c.runtime != runtime);
        by_runtime.push(RuntimeConnection {
            runtime,
            runtime_alive,
            connection: opened.clone(),
            generation,
        });
        Ok(Lent {
            connection: opened,
            generation,
        })
    }

    fn cached(&self, runtime: RuntimeId) -> Option<Lent> {
        let by_runtime = self.by_runtime.lock().unwrap_or_else(|e| e.into_inner());
        by_runtime
            .iter()
            .find(|c| c.runtime == runtime && !c.runtime_alive.is_closed())
            .map(|c| Lent {
                connection: c.connection.clone(),
                generation: c.generation,
            })
    }

    fn invalidate(&self, generation: u64) {
        let mut by_runtime = self.by_runtime.lock().unwrap_or_else(|e| e.into_inner());
        by_runtime.retain(|c| c.generation != generation);
    }
}

/// Why a call to Redis failed.
#[derive(Debug)]
pub(crate) enum RedisFailure {
    Redis(RedisError),
    TimedOut(TimedOut),
    NoRuntime,
}

impl RedisFailure {
    /// Whether the command may have reached Redis although no good answer came back.
    pub(crate) fn may_have_landed(&self) -> bool {
        match self {
            Self::Redis(err) => {
                err.is_io_error() || err.is_connection_dropped() || err.is_timeout()
            }
            Self::TimedOut(_) => true,
            Self::NoRuntime => false,
        }
    }

    pub(crate) fn into_lock_error(self, key: Option<&str>) -> LockError {
        match self {
            Self::Redis(err) => LockError::redis(key, err),
            Self::TimedOut(timed_out) => LockError::redis(key, timed_out),
            Self::NoRuntime => LockError::Config {
                message: "lockmacro needs a tokio runtime with time enabled".into(),
            },
        }
    }
}

impl std::fmt::Display for RedisFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Redis(err) => err.fmt(f),
            Self::TimedOut(timed_out) => timed_out.fmt(f),
            Self::NoRuntime => f.write_str("no tokio runtime"),
        }
    }
}

/// A command, a pipeline, or a script call (which reloads the script after `NOSCRIPT`).
enum Request<'a> {
    Cmd(&'a redis::Cmd),
    Pipeline(&'a redis::Pipeline),
    Script(&'a redis::ScriptInvocation<'a>),
}

/// The reply to `SET NX`: `OK` when set, nil when the key exists. Anything else is a `TypeError`,
/// so the connection that produced it is dropped.
struct SetNx(bool);

impl redis::FromRedisValue for SetNx {
    fn from_redis_value(value: &redis::Value) -> redis::RedisResult<Self> {
        match value {
            redis::Value::Okay => Ok(Self(true)),
            redis::Value::Nil => Ok(Self(false)),
            other => Err(RedisError::from((
                ErrorKind::TypeError,
                "unexpected reply to SET NX",
                format!("{other:?}"),
            ))),
        }
    }
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Release announcements, on a subscription connection of its own (one per client, shared by
/// every waiting key, so waiters never each take a connection).
pub(crate) struct ReleaseFeed {
    sink: redis::aio::PubSubSink,
    stream: redis::aio::PubSubStream,
    response_timeout: Duration,
}

impl Backend {
    pub(crate) async fn release_feed(&self) -> Result<ReleaseFeed, RedisFailure> {
        let pubsub = tokio::time::timeout(self.connect_timeout, self.client.get_async_pubsub())
            .await
            .map_err(|_| RedisFailure::TimedOut(TimedOut(self.connect_timeout)))?
            .map_err(RedisFailure::Redis)?;
        let (sink, stream) = pubsub.split();
        Ok(ReleaseFeed {
            sink,
            stream,
            response_timeout: self.response_timeout,
        })
    }
}

impl ReleaseFeed {
    /// Starts hearing about releases of `key`; returns once Redis confirmed the subscription.
    pub(crate) async fn watch(&mut self, key: &str) -> Result<(), RedisFailure> {
        let subscribe = self.sink.subscribe(release_channel(key));
        match tokio::time::timeout(self.response_timeout, subscribe).await {
            Ok(reply) => reply.map_err(RedisFailure::Redis),
            Err(_) => Err(RedisFailure::TimedOut(TimedOut(self.response_timeout))),
        }
    }

    pub(crate) async fn unwatch(&mut self, key: &str) -> Result<(), RedisFailure> {
        let unsubscribe = self.sink.unsubscribe(release_channel(key));
        match tokio::time::timeout(self.response_timeout, unsubscribe).await {
            Ok(reply) => reply.map_err(RedisFailure::Redis),
            Err(_) => Err(RedisFailure::TimedOut(TimedOut(self.response_timeout))),
        }
    }

    /// The next key released; `None` once the connection is gone.
    pub(crate) async fn next_release(&mut self) -> Option<String> {
        use futures_util::StreamExt;
        loop {
            let message = self.stream.next().await?;
            if let Some(key) = message
                .get_channel_name()
                .strip_prefix(RELEASE_CHANNEL_PREFIX)
            {
                return Some(key.to_owned());
            }
        }
    }
}
