//! Redis Cluster: `LockClient::cluster_builder([seed urls])`.
//!
//! Built on redis-rs's cluster connection, which routes each command by its key's slot and
//! follows `MOVED`/`ASK` and failovers. What is ours:
//! - every name that belongs to a lock (its fencing counter, its release channel) is derived in
//!   Rust so that it hashes to the lock key's own slot, and scripts get them as arguments: no
//!   script ever touches two slots, so no `CROSSSLOT`. A key for which no such name exists is
//!   `InvalidKey`;
//! - a renewal tick sends one script call per slot, all at once: redis-rs writes those of one node
//!   on that node's connection together, so a tick costs about one round trip per master;
//! - releases are announced on sharded channels (`SPUBLISH`, Redis 7), heard through `SSUBSCRIBE`
//!   on the node that owns the slot, and resubscribed by redis-rs after a failover or reshard; a
//!   hand-over to a waiter of the same client counts other clients' waiters there too
//!   (`PUBSUB SHARDNUMSUB`);
//! - a script unknown to one node (`NOSCRIPT` from a promoted replica) is loaded on that node
//!   alone, then the call is sent again.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr};
use redis::{ErrorKind, ProtocolVersion, PushKind, RedisError, ServerErrorKind, Value};
use tokio::sync::mpsc;

use super::inspect::{self, Commands, Cursor, Page, Snapshot};
use super::protocol::{self, Names};
use super::redis::Settings;
use super::scripts::{self, Announce};
use super::{
    AcquireRequest, Acquired, BoxFuture, HandOver, HandsOver, LeaseRef, ReleaseFeed, Released,
    Renewal, Store, StoreError, TimedOut, Unreachable, release_until_settled,
};
use crate::store::redis::connections::PerRuntime;

/// A Redis Cluster.
#[derive(Clone)]
pub(crate) struct ClusterStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// For commands: connections and routing.
    client: ClusterClient,
    /// The seed nodes, for messages.
    seeds: String,
    tls: bool,
    /// A builder for the same cluster (seeds, credentials, TLS), for subscription clients.
    configure: Configure,
    settings: Settings,
    connections: PerRuntime<ClusterConnection>,
}

/// Makes a client builder for the cluster, with the seeds, credentials and TLS settings applied.
pub(crate) type Configure = Box<dyn Fn() -> ClusterClientBuilder + Send + Sync>;

impl ClusterStore {
    pub(crate) fn new(
        seeds: String,
        tls: bool,
        configure: Configure,
        settings: Settings,
    ) -> Result<Self, RedisError> {
        let client = configure()
            .connection_timeout(settings.connect_timeout)
            .response_timeout(settings.response_timeout)
            .build()?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                seeds,
                tls,
                configure,
                connections: PerRuntime::new(),
                settings,
            }),
        })
    }

    fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The current runtime's cluster connection; a new one has every script loaded on every node.
    async fn connection(&self) -> Result<ClusterConnection, StoreError> {
        let lent = self
            .inner
            .connections
            .lend(|| async {
                let budget = self.settings().connect_timeout;
                let open = async {
                    let mut connection = self.inner.client.get_async_connection().await?;
                    for source in scripts::ALL {
                        // `SCRIPT LOAD` alone (not in a pipeline) is routed to every node.
                        let mut load = redis::cmd("SCRIPT");
                        load.arg("LOAD").arg(source);
                        load.exec_async(&mut connection).await?;
                    }
                    Ok::<_, RedisError>(connection)
                };
                let server = format!("the cluster at {}", self.inner.seeds);
                match tokio::time::timeout(budget, open).await {
                    Ok(Ok(connection)) => Ok(connection),
                    Ok(Err(err)) => {
                        let unanswered = self.inner.tls && err.is_timeout();
                        Err(Unreachable::error(server, unanswered, err))
                    }
                    Err(_) => Err(Unreachable::error(server, self.inner.tls, TimedOut(budget))),
                }
            })
            .await?;
        Ok(lent.connection)
    }

    /// Sends `cmd`, routed by `key`, waiting at most `budget`. A `NOSCRIPT` from the node that
    /// owns `key` loads the scripts there and sends `cmd` once more.
    async fn send<T: redis::FromRedisValue>(
        &self,
        connection: &mut ClusterConnection,
        key: &str,
        cmd: &redis::Cmd,
        budget: Duration,
    ) -> Result<T, Sent> {
        let attempt = |connection: &mut ClusterConnection| {
            let mut connection = connection.clone();
            async move {
                match tokio::time::timeout(budget, cmd.query_async::<T>(&mut connection)).await {
                    Ok(reply) => reply.map_err(Sent::from),
                    Err(_) => Err(Sent::Unknown(StoreError::unavailable(TimedOut(budget)))),
                }
            }
        };
        match attempt(connection).await {
            Err(Sent::Answered(err))
                if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
            {
                let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                    Route::with_key(key, SlotAddr::Master),
                ));
                for source in scripts::ALL {
                    let mut load = redis::cmd("SCRIPT");
                    load.arg("LOAD").arg(source);
                    connection
                        .route_command(load, node.clone())
                        .await
                        .map_err(Sent::from)?;
                }
                attempt(connection).await
            }
            other => other,
        }
    }

    fn release_cmd(&self, lease: LeaseRef<'_>) -> Result<redis::Cmd, StoreError> {
        let channel = Names::in_slot(lease.key, self.settings().names.release_channel(""))?;
        Ok(scripts::release(lease, &channel, Announce::ShardedPublish))
    }

    async fn release_now(&self, lease: LeaseRef<'_>) -> Result<bool, StoreError> {
        let cmd = self.release_cmd(lease)?;
        Ok(self.run_script(lease.key, &cmd).await? == 1)
    }

    async fn hand_over_now(
        &self,
        lease: LeaseRef<'_>,
        next: LeaseRef<'_>,
    ) -> Result<HandOver, StoreError> {
        let channel = Names::in_slot(lease.key, self.settings().names.release_channel(""))?;
        let cmd = scripts::hand_over(lease, next, &channel, Announce::ShardedPublish);
        Ok(HandOver::from_reply(
            self.run_script(lease.key, &cmd).await?,
        ))
    }

    /// A script on `key`'s node whose reply is a number.
    async fn run_script(&self, key: &str, cmd: &redis::Cmd) -> Result<i64, StoreError> {
        let mut connection = self.connection().await?;
        self.send(&mut connection, key, cmd, self.settings().response_timeout)
            .await
            .map_err(Sent::into_store_error)
    }

    /// Extends the leases of one slot with one script call.
    async fn extend_slot(
        &self,
        mut connection: ClusterConnection,
        leases: Vec<LeaseRef<'_>>,
    ) -> Vec<Renewal> {
        let batch = scripts::extend(&leases);
        let Some(cmd) = batch.cmd_iter().next() else {
            return Vec::new();
        };
        let replied: Result<Vec<i64>, Sent> = self
            .send(
                &mut connection,
                leases[0].key,
                cmd,
                self.settings().response_timeout,
            )
            .await;
        match replied {
            Ok(extended) if extended.len() == leases.len() => extended
                .into_iter()
                .map(|one| {
                    if one == 1 {
                        Renewal::Extended
                    } else {
                        Renewal::Lost
                    }
                })
                .collect(),
            Ok(_) => vec![
                Renewal::Failed(StoreError::unavailable(
                    "a renewal reply of the wrong length"
                ));
                leases.len()
            ],
            Err(sent) => vec![Renewal::Failed(sent.into_store_error()); leases.len()],
        }
    }
}

impl Store for ClusterStore {
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        Box::pin(async move {
            // A key whose release could not be announced in its slot is refused before anything
            // is taken: its release would fail.
            Names::in_slot(request.key, self.settings().names.release_channel(""))?;
            let plain = request.is_plain();
            let cmd = if plain {
                scripts::set_nx_get(request.key, request.token, request.ttl)
            } else {
                let in_slot = self.settings().names.for_acquire_in_slot(request.key)?;
                scripts::acquire(&request, &in_slot)
            };
            let mut connection = self.connection().await?;
            // From here the SET may reach a node: if this future is dropped, or the reply is
            // lost, the guard undoes it through the same connection (the same node connection,
            // so after it).
            let mut undo = UndoGuard {
                store: self,
                connection: Some(connection.clone()),
                abandoned: LeaseRef {
                    key: request.key,
                    token: request.token,
                    kind: request.kind,
                    ttl: request.ttl,
                },
            };
            let reply = if plain {
                self.send::<Option<String>>(&mut connection, request.key, &cmd, budget)
                    .await
                    .map(|previous| match previous {
                        None => Acquired::Taken {
                            fencing_token: None,
                        },
                        // A SET that redis-rs retried after it had landed: ours.
                        Some(token) if protocol::holds(&token, request.token) => Acquired::Taken {
                            fencing_token: None,
                        },
                        Some(_) => Acquired::Busy { remaining: None },
                    })
                    .or_else(|sent| match sent {
                        // `GET` of a shared lock (a hash): held by readers or permit holders.
                        Sent::Answered(err) if err.code() == Some("WRONGTYPE") => {
                            Ok(Acquired::Busy { remaining: None })
                        }
                        other => Err(other),
                    })
            } else {
                self.send::<(i64, i64)>(&mut connection, request.key, &cmd, budget)
                    .await
                    .map(|reply| scripts::acquired(&request, reply))
            };
            match reply {
                Ok(Acquired::Busy { remaining: None }) if plain => {
                    undo.disarm();
                    // A caller that fails fast learns when to come back, as from the script.
                    let pttl = scripts::remaining(request.key);
                    let remaining = self
                        .send::<i64>(&mut connection, request.key, &pttl, budget)
                        .await;
                    Ok(Acquired::Busy {
                        remaining: remaining.ok().and_then(protocol::remaining),
                    })
                }
                Ok(acquired) => {
                    undo.disarm();
                    Ok(acquired)
                }
                Err(Sent::Answered(err)) => {
                    undo.disarm();
                    Err(StoreError::unavailable(err))
                }
                Err(Sent::Unknown(error)) => Err(error),
            }
        })
    }

    fn extend<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Renewal>> {
        Box::pin(async move {
            let connection = match self.connection().await {
                Ok(connection) => connection,
                Err(error) => return vec![Renewal::Failed(error); leases.len()],
            };
            let mut by_slot: HashMap<Slot, Vec<usize>> = HashMap::new();
            for (index, lease) in leases.iter().enumerate() {
                by_slot
                    .entry(Slot::for_key(lease.key))
                    .or_default()
                    .push(index);
            }
            let calls = by_slot.values().flat_map(|indexes| {
                indexes.chunks(scripts::EXTEND_CHUNK).map(|chunk| {
                    let group: Vec<LeaseRef<'_>> = chunk.iter().map(|&i| leases[i]).collect();
                    let connection = connection.clone();
                    async move { (chunk, self.extend_slot(connection, group).await) }
                })
            });
            let mut outcomes = vec![None; leases.len()];
            for (chunk, renewed) in join_all(calls).await {
                for (&index, outcome) in chunk.iter().zip(renewed) {
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
        Box::pin(self.release_now(lease))
    }

    fn hands_over(&self) -> Option<&dyn HandsOver> {
        Some(self)
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        Box::pin(async move {
            let (pushes, received) = mpsc::unbounded_channel();
            let client = (self.inner.configure)()
                .connection_timeout(self.settings().connect_timeout)
                .response_timeout(self.settings().response_timeout)
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(pushes)
                .build()
                .map_err(StoreError::unavailable)?;
            let connection = bounded(
                self.settings().connect_timeout,
                client.get_async_connection(),
            )
            .await?;
            Ok(Box::new(ShardedFeed {
                connection,
                pushes: received,
                channel_prefix: self.settings().names.release_channel(""),
                watched: HashMap::new(),
                response_timeout: self.settings().response_timeout,
            }) as Box<dyn ReleaseFeed>)
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
            let mut connection = self.connection().await?;
            // PING is sent to every node: all of them must answer.
            let ping = redis::cmd("PING");
            bounded(
                self.settings().response_timeout,
                ping.query_async::<Value>(&mut connection),
            )
            .await
            .map(|_| ())
        })
    }
}

impl Commands for ClusterStore {
    fn names(&self) -> &Names {
        &self.settings().names
    }

    fn is_cluster(&self) -> bool {
        true
    }

    fn on_key<'a>(
        &'a self,
        key: &'a str,
        cmd: &'a redis::Cmd,
    ) -> BoxFuture<'a, Result<Value, StoreError>> {
        Box::pin(async move {
            let mut connection = self.connection().await?;
            self.send(&mut connection, key, cmd, self.settings().response_timeout)
                .await
                .map_err(Sent::into_store_error)
        })
    }

    fn masters(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let mut connection = self.connection().await?;
            let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
            let nodes = connection.route_command(redis::cmd("CLUSTER").arg("NODES").clone(), any);
            let nodes = bounded(self.settings().response_timeout, nodes).await?;
            let nodes: String = redis::from_redis_value(nodes).map_err(StoreError::unavailable)?;
            Ok(inspect::cluster_masters(&nodes))
        })
    }

    fn on_master<'a>(
        &'a self,
        master: &'a str,
        cmd: &'a redis::Cmd,
    ) -> BoxFuture<'a, Result<Value, StoreError>> {
        Box::pin(async move {
            let mut connection = self.connection().await?;
            let (host, port) = master
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
                .ok_or_else(|| StoreError::unavailable(format!("no node at `{master}`")))?;
            let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress { host, port });
            let reply = connection.route_command(cmd.clone(), node);
            bounded(self.settings().response_timeout, reply).await
        })
    }
}

impl HandsOver for ClusterStore {
    fn hand_over<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        next: LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<HandOver, StoreError>> {
        Box::pin(self.hand_over_now(lease, next))
    }
}

/// Release announcements heard through `SSUBSCRIBE`, over a RESP3 cluster connection of its own.
struct ShardedFeed {
    connection: ClusterConnection,
    pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    channel_prefix: String,
    /// Channel → key, for the keys watched: a channel name alone cannot always tell its key
    /// (`a` and `{a}` share one).
    watched: HashMap<String, String>,
    response_timeout: Duration,
}

impl ReleaseFeed for ShardedFeed {
    fn watch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let channel = Names::in_slot(key, self.channel_prefix.clone())?;
            bounded(self.response_timeout, self.connection.ssubscribe(&channel)).await?;
            self.watched.insert(channel, key.to_owned());
            Ok(())
        })
    }

    fn unwatch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let channel = Names::in_slot(key, self.channel_prefix.clone())?;
            self.watched.remove(&channel);
            bounded(
                self.response_timeout,
                self.connection.sunsubscribe(&channel),
            )
            .await
        })
    }

    fn next_release(&mut self) -> BoxFuture<'_, Option<Released>> {
        Box::pin(async move {
            loop {
                let push = self.pushes.recv().await?;
                if push.kind != PushKind::SMessage {
                    continue;
                }
                let Some(Value::BulkString(channel)) = push.data.first() else {
                    continue;
                };
                let key = std::str::from_utf8(channel)
                    .ok()
                    .and_then(|channel| self.watched.get(channel));
                if let Some(key) = key {
                    let token = match push.data.get(1) {
                        Some(Value::BulkString(token)) => {
                            String::from_utf8_lossy(token).into_owned()
                        }
                        _ => String::new(),
                    };
                    return Some(Released {
                        key: key.clone(),
                        token,
                    });
                }
            }
        })
    }
}

/// Undoes a `SET` whose outcome is unknown unless disarmed once the reply is known.
struct UndoGuard<'a> {
    store: &'a ClusterStore,
    connection: Option<ClusterConnection>,
    abandoned: LeaseRef<'a>,
}

impl UndoGuard<'_> {
    fn disarm(&mut self) {
        self.connection = None;
    }
}

impl Drop for UndoGuard<'_> {
    fn drop(&mut self) {
        let Some(mut connection) = self.connection.take() else {
            return;
        };
        let store = self.store.clone();
        let background = store.settings().background.clone();
        let (key, token, kind, ttl) = (
            self.abandoned.key.to_owned(),
            self.abandoned.token.to_owned(),
            self.abandoned.kind,
            self.abandoned.ttl,
        );
        background.spawn(async move {
            let lease = LeaseRef {
                key: &key,
                token: &token,
                kind,
                ttl,
            };
            let Ok(cmd) = store.release_cmd(lease) else {
                return;
            };
            let budget = store.settings().response_timeout;
            match store.send::<i64>(&mut connection, &key, &cmd, budget).await {
                Ok(_) => tracing::debug!(key = %key, "abandoned acquire undone"),
                Err(_) => {
                    release_until_settled(&store, lease).await;
                }
            }
        });
    }
}

/// Why a request failed, and whether it may have run.
enum Sent {
    /// A server error: the request ran or was refused; its outcome is known.
    Answered(RedisError),
    /// No usable answer: it may have run.
    Unknown(StoreError),
}

impl From<RedisError> for Sent {
    fn from(err: RedisError) -> Self {
        if err.is_io_error()
            || err.is_connection_dropped()
            || err.is_timeout()
            || err.is_unrecoverable_error()
            || err.is_cluster_error()
        {
            Self::Unknown(StoreError::unavailable(err))
        } else {
            Self::Answered(err)
        }
    }
}

impl Sent {
    fn into_store_error(self) -> StoreError {
        match self {
            Self::Answered(err) => StoreError::unavailable(err),
            Self::Unknown(error) => error,
        }
    }
}

/// `call`, failing after `budget`.
async fn bounded<T>(
    budget: Duration,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(budget, call).await {
        Ok(reply) => reply.map_err(StoreError::unavailable),
        Err(_) => Err(StoreError::unavailable(TimedOut(budget))),
    }
}
