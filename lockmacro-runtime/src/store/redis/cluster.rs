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
//!   on the node that owns the slot; a node that gives the slot up (a failover, a reshard)
//!   unsubscribes us, and the subscription is opened again where the slot went; a
//!   hand-over to a waiter of the same client counts other clients' waiters there too
//!   (`PUBSUB SHARDNUMSUB`);
//! - a script unknown to one node (`NOSCRIPT` from a promoted replica) is loaded on that node
//!   alone, then the call is sent again.

use std::collections::HashMap;
use std::future::Future;
use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::try_join_all;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{FromRedisValue, ProtocolVersion, PushKind, RedisError, Value};
use tokio::sync::mpsc;

use super::connections::PerRuntime;
use super::replicas::Replication;
use super::{Layout, RedisStore, Request, SendError, Transport, bounded, unanswered};
use crate::health::{Health, NodeHealth, NodeRole};
use crate::store::protocol::{self, Names};
use crate::store::scripts;
use crate::store::{BoxFuture, ReleaseFeed, Released, Settings, StoreError, TimedOut, Unreachable};

/// How many slots a cluster has.
const SLOTS: usize = 16_384;

/// A Redis Cluster.
pub(crate) struct Cluster {
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

impl RedisStore<Cluster> {
    /// The lock on the cluster `configure` reaches; `seeds` names it in messages.
    pub(crate) fn cluster(
        seeds: String,
        tls: bool,
        configure: Configure,
        settings: Settings,
    ) -> Result<Self, RedisError> {
        // redis-rs times each node's replies out (`response_timeout`). A request's whole time,
        // its redirections and retries included, is bounded by the caller's budget with a timer
        // of ours (`within`), so redis-rs's timer over the whole request, a second one per
        // request, is off.
        let client = configure()
            .connection_timeout(settings.connect_timeout)
            .response_timeout(settings.response_timeout)
            .overall_response_timeout(None)
            .build()?;
        Ok(Self::new(Arc::new(Cluster {
            client,
            seeds,
            tls,
            configure,
            connections: PerRuntime::new(),
            settings,
        })))
    }
}

impl Transport for Cluster {
    type Connection = ClusterConnection;

    const LAYOUT: Layout = Layout::Cluster;

    fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The current runtime's cluster connection; a new one has every script loaded on every
    /// node. redis-rs reconnects it by itself, so it is never dropped here.
    async fn connection(&self) -> Result<ClusterConnection, StoreError> {
        let lent = self
            .connections
            .lend(|| async {
                let budget = self.settings.connect_timeout;
                let open = async {
                    let mut connection = self.client.get_async_connection().await?;
                    // `SCRIPT LOAD` alone (not in a pipeline) is routed to every node.
                    for load in scripts::load_all().cmd_iter() {
                        load.exec_async(&mut connection).await?;
                    }
                    Ok::<_, RedisError>(connection)
                };
                let server = format!("the cluster at {}", self.seeds);
                match tokio::time::timeout(budget, open).await {
                    Ok(Ok(connection)) => Ok(connection),
                    // A plain server answers, but not as a cluster: say so, not "cannot reach".
                    Ok(Err(err)) if err.to_string().contains("cluster support disabled") => {
                        Err(StoreError::unavailable(format!(
                            "{server} is not a cluster: the server answered that it has cluster \
                             support disabled; build the client with `LockClient::builder(url)` \
                             for one Redis ({err})"
                        )))
                    }
                    Ok(Err(err)) => Err(Unreachable::connecting(server, self.tls, err)),
                    Err(_) => Err(Unreachable::error(server, self.tls, TimedOut(budget))),
                }
            })
            .await?;
        Ok(lent.connection)
    }

    /// A pipeline's commands (a renewal batch, all in one slot) are sent as commands of their
    /// own, all at once: redis-rs writes those of one node together, and follows `MOVED`/`ASK`
    /// for each.
    async fn send_once<R: FromRedisValue + Send>(
        &self,
        connection: &mut ClusterConnection,
        request: Request<'_>,
        budget: Duration,
    ) -> Result<R, SendError> {
        match request {
            Request::Cmd(cmd) => within(budget, cmd.query_async(connection)).await,
            Request::Pipeline(pipe) => {
                let replies = pipe.cmd_iter().map(|cmd| {
                    let mut connection = connection.clone();
                    async move { cmd.query_async::<Value>(&mut connection).await }
                });
                let replies = async {
                    let replies = try_join_all(replies).await?;
                    Ok(R::from_redis_value(Value::Array(replies))?)
                };
                within(budget, replies).await
            }
        }
    }

    /// Routed to the master of `key`'s slot: redis-rs sends a `WAIT` of its own to every
    /// master (and answers the least of their counts), and a pipeline's keyless command to
    /// whichever node its first key names.
    async fn wait_replicas(
        &self,
        connection: &mut ClusterConnection,
        key: &str,
        wait: &redis::Cmd,
        timeout: Duration,
    ) -> Result<u32, SendError> {
        let budget = timeout + self.settings.response_timeout;
        let acked = within(
            budget,
            connection.route_command(wait.clone(), master_of(key)),
        );
        redis::from_redis_value(acked.await?)
            .map_err(|err| SendError::Unknown(StoreError::unavailable(err)))
    }

    /// `INFO replication` and `CLUSTER SLOTS` of `key`'s master in one request: the count
    /// covers every slot that master serves. A master that refuses `CLUSTER SLOTS` (an ACL) is
    /// counted for `key`'s slot alone.
    async fn replication(
        &self,
        connection: &mut ClusterConnection,
        key: &str,
    ) -> Result<Replication, SendError> {
        let mut both = redis::pipe();
        both.cmd("INFO").arg("replication");
        both.cmd("CLUSTER").arg("SLOTS");
        let node = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
        let budget = self.settings.response_timeout;
        let replies = match within(budget, connection.route_pipeline(both, 0, 2, node)).await {
            Err(SendError::Answered(_)) => {
                // One of the two refused: `INFO` alone.
                let info = redis::cmd("INFO").arg("replication").clone();
                let info = within(budget, connection.route_command(info, master_of(key))).await?;
                vec![info]
            }
            replies => replies?,
        };
        let mut replies = replies.into_iter();
        let (info, slots) = (replies.next(), replies.next());
        let info = redis::from_redis_value(info.unwrap_or(Value::Nil))
            .map_err(|err| SendError::Answered(err.into()))?;
        let served = slots.map_or_else(Vec::new, |slots| {
            served_with(&slots, protocol::slot_number(key))
        });
        Ok(Replication { info, served })
    }

    /// Loads the scripts on the node that owns `key` alone (a promoted replica, say).
    async fn load_scripts(
        &self,
        connection: &mut ClusterConnection,
        key: &str,
        budget: Duration,
    ) -> Result<(), SendError> {
        let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
            key,
            SlotAddr::Master,
        )));
        let load = async {
            for load in scripts::load_all().cmd_iter() {
                connection.route_command(load.clone(), node.clone()).await?;
            }
            Ok(())
        };
        within(budget, load).await
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        Box::pin(async move {
            let (pushes, received) = mpsc::unbounded_channel();
            let client = (self.configure)()
                .connection_timeout(self.settings.connect_timeout)
                .response_timeout(self.settings.response_timeout)
                .use_protocol(ProtocolVersion::RESP3)
                .push_sender(pushes)
                .build()
                .map_err(StoreError::unavailable)?;
            let connection =
                bounded(self.settings.connect_timeout, client.get_async_connection()).await?;
            Ok(Box::new(ShardedFeed {
                connection,
                pushes: received,
                names: self.settings.names.clone(),
                watched: HashMap::new(),
                unwatching: HashMap::new(),
                response_timeout: self.settings.response_timeout,
            }) as Box<dyn ReleaseFeed>)
        })
    }

    /// Every node `CLUSTER NODES` names (asked of any node that answers), each asked with a
    /// `PING`: ready when every slot is served by a master that answers.
    fn health(&self) -> BoxFuture<'_, Health> {
        Box::pin(async move {
            let nodes = async {
                let mut connection = self.connection().await?;
                let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
                let nodes = redis::cmd("CLUSTER").arg("NODES").clone();
                let nodes = bounded(
                    self.settings.response_timeout,
                    connection.route_command(nodes, any),
                );
                let nodes: String =
                    redis::from_redis_value(nodes.await?).map_err(StoreError::unavailable)?;
                Ok::<_, StoreError>(crate::store::inspect::cluster_nodes(&nodes))
            };
            let bound = self.settings.connect_timeout + self.settings.response_timeout;
            let nodes = match tokio::time::timeout(bound, nodes).await {
                Ok(Ok(nodes)) => nodes,
                failed => {
                    let error = match failed {
                        Ok(Err(error)) => error.to_string(),
                        _ => TimedOut(bound).to_string(),
                    };
                    let seeds = NodeHealth::silent(self.seeds.clone(), NodeRole::Master, error);
                    return Health::new(
                        "cluster",
                        false,
                        "no node answers `CLUSTER NODES`",
                        vec![seeds],
                    );
                }
            };
            let ping = redis::cmd("PING");
            let asked = nodes.iter().map(|node| {
                let ping = &ping;
                async move {
                    let role = if node.master {
                        NodeRole::Master
                    } else {
                        NodeRole::Replica
                    };
                    let started = tokio::time::Instant::now();
                    let health = match self.on_master(&node.address, Request::Cmd(ping)).await {
                        Ok(_) => NodeHealth::answered(&node.address, role, started.elapsed()),
                        Err(error) => error.node_health(&node.address, role),
                    };
                    match node.master {
                        true => health.serving(node.slots),
                        false => health,
                    }
                }
            });
            let mut asked = futures_util::future::join_all(asked).await;
            asked.sort_by(|a, b| {
                (a.role() != NodeRole::Master, a.address())
                    .cmp(&(b.role() != NodeRole::Master, b.address()))
            });
            let served: usize = asked
                .iter()
                .filter(|node| node.answers())
                .filter_map(NodeHealth::slots)
                .sum();
            let masters = asked
                .iter()
                .filter(|node| {
                    node.role() == NodeRole::Master && node.slots().is_some_and(|slots| slots > 0)
                })
                .count();
            let (ready, verdict) = if served >= SLOTS {
                (
                    true,
                    format!("every slot's master answers ({masters} masters)"),
                )
            } else {
                (
                    false,
                    format!(
                        "{} of {SLOTS} slots have no master that answers",
                        SLOTS - served.min(SLOTS)
                    ),
                )
            };
            Health::new("cluster", ready, verdict, asked)
        })
    }

    /// Every master, from `CLUSTER NODES` asked of any node.
    fn masters(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        Box::pin(async move {
            let mut connection = self.connection().await?;
            let any = RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random);
            let nodes = connection.route_command(redis::cmd("CLUSTER").arg("NODES").clone(), any);
            let nodes = bounded(self.settings.response_timeout, nodes).await?;
            let nodes: String = redis::from_redis_value(nodes).map_err(StoreError::unavailable)?;
            Ok(crate::store::inspect::cluster_masters(&nodes))
        })
    }

    fn on_master<'a>(
        &'a self,
        master: &'a str,
        request: Request<'a>,
    ) -> BoxFuture<'a, Result<Value, StoreError>> {
        Box::pin(async move {
            let mut connection = self.connection().await?;
            let (host, port) = master
                .rsplit_once(':')
                .and_then(|(host, port)| Some((host.to_owned(), port.parse().ok()?)))
                .ok_or_else(|| StoreError::unavailable(format!("no node at `{master}`")))?;
            let node = SingleNodeRoutingInfo::ByAddress { host, port };
            let budget = self.settings.response_timeout;
            match request {
                Request::Cmd(cmd) => {
                    let reply =
                        connection.route_command(cmd.clone(), RoutingInfo::SingleNode(node));
                    bounded(budget, reply).await
                }
                Request::Pipeline(pipe) => {
                    let replies = connection.route_pipeline(pipe.clone(), 0, pipe.len(), node);
                    bounded(budget, replies).await.map(Value::Array)
                }
            }
        })
    }
}

/// `request`'s reply within `budget`: the one timer over a whole request, its redirections and
/// retries included (redis-rs's overall timer is off, see [`RedisStore::cluster`]). A mapped
/// future rather than an `async fn`: as one, it made every request's future larger, and more to
/// copy into the store's boxes.
fn within<T>(
    budget: Duration,
    request: impl Future<Output = redis::RedisResult<T>>,
) -> impl Future<Output = Result<T, SendError>> {
    tokio::time::timeout(budget, request).map(move |reply| match reply {
        Ok(reply) => reply.map_err(classify),
        Err(_) => Err(SendError::Unknown(StoreError::unavailable(TimedOut(
            budget,
        )))),
    })
}

/// The slot ranges a `CLUSTER SLOTS` reply gives to the master of `slot` (none when the reply
/// is an error or does not name it).
fn served_with(slots: &Value, slot: u16) -> Vec<RangeInclusive<u16>> {
    let Value::Array(entries) = slots else {
        return Vec::new();
    };
    let number = |value: Option<&Value>| match value {
        Some(Value::Int(n)) => u16::try_from(*n).ok(),
        _ => None,
    };
    // Each entry: first slot, last slot, the master (address, port, id, …), its replicas.
    let ranges: Vec<(RangeInclusive<u16>, &Value)> = entries
        .iter()
        .filter_map(|entry| {
            let Value::Array(fields) = entry else {
                return None;
            };
            let range = number(fields.first())?..=number(fields.get(1))?;
            Some((range, fields.get(2)?))
        })
        .collect();
    let Some((_, master)) = ranges.iter().find(|(range, _)| range.contains(&slot)) else {
        return Vec::new();
    };
    ranges
        .iter()
        .filter(|(_, serving)| serving == master)
        .map(|(range, _)| range.clone())
        .collect()
}

/// The master of `key`'s slot.
fn master_of(key: &str) -> RoutingInfo {
    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::with_key(
        key,
        SlotAddr::Master,
    )))
}

/// Whether a failed request may have run; a cluster's own errors (`MOVED`, `TRYAGAIN`, ...) came
/// after redis-rs's retries, so the request's outcome is unknown.
fn classify(err: RedisError) -> SendError {
    let unknown = unanswered(&err) || err.is_cluster_error();
    SendError::new(err, unknown)
}

/// Release announcements heard through `SSUBSCRIBE`, over a RESP3 cluster connection of its own.
struct ShardedFeed {
    connection: ClusterConnection,
    pushes: mpsc::UnboundedReceiver<redis::PushInfo>,
    names: Names,
    /// Channel → key, for the keys watched: a channel name alone cannot always tell its key
    /// (`a` and `{a}` share one).
    watched: HashMap<String, String>,
    /// Channel → unsubscribes we asked for whose confirmation is still to come: any other
    /// `sunsubscribe` is the node's.
    unwatching: HashMap<String, usize>,
    response_timeout: Duration,
}

impl ShardedFeed {
    /// Whether a `sunsubscribe` of `channel` confirms one we asked for (and counts it).
    fn asked_to_unsubscribe(&mut self, channel: &str) -> bool {
        let Some(pending) = self.unwatching.get_mut(channel) else {
            return false;
        };
        *pending -= 1;
        if *pending == 0 {
            self.unwatching.remove(channel);
        }
        true
    }
}

impl ReleaseFeed for ShardedFeed {
    fn watch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let channel = self.names.release_channel_in_slot(key)?;
            bounded(self.response_timeout, self.connection.ssubscribe(&channel)).await?;
            self.watched.insert(channel, key.to_owned());
            Ok(())
        })
    }

    fn unwatch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let channel = self.names.release_channel_in_slot(key)?;
            self.watched.remove(&channel);
            *self.unwatching.entry(channel.clone()).or_default() += 1;
            bounded(
                self.response_timeout,
                self.connection.sunsubscribe(&channel),
            )
            .await
        })
    }

    fn settle<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            // To the node whose shard channel carries the key's releases.
            let node = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                Route::with_key(key, SlotAddr::Master),
            ));
            let ping = self
                .connection
                .route_command(redis::cmd("PING").clone(), node);
            bounded(self.response_timeout, ping).await?;
            Ok(())
        })
    }

    fn next_release(&mut self) -> BoxFuture<'_, Option<Released>> {
        Box::pin(async move {
            loop {
                let push = self.pushes.recv().await?;
                if push.kind == PushKind::Disconnection {
                    // A node's connection dropped (a master killed, say): the client
                    // resubscribes once it reconnects, and what was announced meanwhile went
                    // by unheard. Ending the feed has its waiters look again and the leases
                    // held checked, as after any lost subscription.
                    return None;
                }
                let Some(Value::BulkString(channel)) = push.data.first() else {
                    continue;
                };
                let channel = String::from_utf8_lossy(channel);
                if push.kind == PushKind::SUnsubscribe && self.asked_to_unsubscribe(&channel) {
                    continue;
                }
                let key = self.watched.get(channel.as_ref());
                if push.kind == PushKind::SUnsubscribe && key.is_some() {
                    // Not asked for: the node gave the slot up (a failover, a reshard), and
                    // what is announced there now goes by unheard. Ending the feed reopens it
                    // on the slot's new owner; its waiters look again and the leases held are
                    // checked, as after any lost subscription.
                    return None;
                }
                if push.kind != PushKind::SMessage {
                    continue;
                }
                if let Some(key) = key {
                    let message = match push.data.get(1) {
                        Some(Value::BulkString(message)) => {
                            String::from_utf8_lossy(message).into_owned()
                        }
                        _ => String::new(),
                    };
                    return Some(Released {
                        key: key.clone(),
                        message,
                    });
                }
            }
        })
    }
}
