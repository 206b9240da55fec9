//! Tier two's ground: the real `RedisStore` (its scripts, the undo of an abandoned acquire,
//! replica counting, the release feed) over one simulated [`Node`], each client reaching it
//! through the world's simulated [`Network`] as a one-server deployment ([`Layout::Server`]).
//!
//! A connection keeps the order of its requests and of its replies (and of the messages pushed
//! to a subscriber, on the replies' side), as one TCP connection does; a request runs on the
//! node when it arrives, whether its caller still waits or not. redis-rs itself encodes every
//! request and reads every reply ([`ConnectionLike`]), so the store's own reply handling
//! (`NOSCRIPT`, errors in a pipeline, `FromRedisValue`) is what runs.
//!
//! The faults are tier one's (latencies leaning to the protocol's edges, replies lost with their
//! command run or not, subscriptions closed, partitions, pauses), plus connections broken: what
//! was on its way on a connection when it broke is lost, and its callers hear a reset. Some
//! worlds give the master replicas, lagging or not (the store then `WAIT`s behind its grants),
//! and some of those fail over to the best replica before the faults heal, breaking every
//! connection open then, as a Sentinel switch behind one address does. Every draw comes from
//! the world's seed.

use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisError, RedisFuture, Value};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;

use super::{Node, Published};
use crate::health::{Health, NodeHealth, NodeRole};
use crate::sim::net::{self, Net, Network, Wire};
use crate::sim::{Backing, Stream, sometimes};
use crate::store::redis::connections::{Lent, PerRuntime};
use crate::store::redis::{Layout, RedisStore, Request, SendError, Transport};
use crate::store::{
    BoxFuture, Names, ReleaseFeed, Released, Settings, StoreError, TimedOut, Unreachable, scripts,
};
use crate::sync::lock;

/// How the simulated server is named in errors and health.
const SERVER: &str = "simulated-redis:6379";

/// How long the store's `WAIT` waits for a replica (the builder's default).
const REPLICA_ACK_TIMEOUT: Duration = Duration::from_millis(500);

/// The kinds of fault tier two adds to the network's, each drawn from the seed.
#[derive(Debug, Clone)]
struct Faults {
    /// Connections break now and then, until the network's faults heal.
    broken_connections: bool,
    /// The lag of each replica of the master (none: no `WAIT` behind grants).
    replica_lags: Vec<Duration>,
    /// When the master fails over to its best replica, before the faults heal, and how long
    /// after the world's start that is (for the trace).
    failover: Option<(Instant, Duration)>,
}

/// One simulated Redis server in a world, shared by every client's connections.
#[derive(Clone)]
pub struct SimRedis(Arc<Shared>);

struct Shared {
    node: Mutex<Node>,
    network: Network,
    faults: Faults,
    /// The leases the world's calls ask for: a request's latency may land near the end of one
    /// (the network's edges), and a command's lease is not known to the transport.
    lease_lengths: Vec<Duration>,
    /// Connections opened so far: the next one's id.
    opened: AtomicU64,
    /// Whether the drawn failover happened on the node (it happens at the first command or look
    /// at the node from its time on).
    failed_over: AtomicBool,
    /// The connections of open subscriptions, by id: where what is published goes.
    subscribers: Mutex<BTreeMap<u64, Weak<Connection>>>,
}

/// Labels of tier two's streams.
const REDIS: u64 = u64::from_be_bytes(*b"simredis");
const FAULTS: u64 = 1;
const NODE: u64 = 2;

impl SimRedis {
    /// A server reached over `network`, whose calls ask for leases of `lease_lengths`; its
    /// faults and ids drawn from the world's seed.
    pub fn new(network: &Network, lease_lengths: &[Duration]) -> Self {
        let mut stream = crate::sim::stream(&[REDIS, FAULTS]);
        let broken_connections = stream.percent(50);
        // Drawn after the faults above, so that a seed without replicas keeps its world.
        let replica_lags: Vec<Duration> = match stream.percent(40) {
            true => (0..stream.between(1, 2))
                .map(|_| match stream.percent(50) {
                    true => stream.millis(5, 30),
                    false => Duration::ZERO,
                })
                .collect(),
            false => Vec::new(),
        };
        let healed_after = network.healed_after().as_millis() as u64;
        let failover = (!replica_lags.is_empty() && stream.percent(60)).then(|| {
            let after = stream.millis(20, healed_after.saturating_sub(1).max(20));
            (Instant::now() + after, after)
        });
        let mut node = Node::new(crate::sim::stream(&[REDIS, NODE]).number());
        for lag in &replica_lags {
            node.add_replica(*lag);
        }
        Self(Arc::new(Shared {
            node: Mutex::new(node),
            network: network.clone(),
            faults: Faults {
                broken_connections,
                replica_lags,
                failover,
            },
            lease_lengths: lease_lengths.to_vec(),
            opened: AtomicU64::new(1),
            failed_over: AtomicBool::new(false),
            subscribers: Mutex::default(),
        }))
    }

    /// Client `client`'s way to the server, for
    /// [`LockClient::simulated`](crate::LockClient::simulated).
    pub fn link(&self, client: usize) -> RedisLink {
        assert!(
            client < self.0.network.clients(),
            "no client {client} in this network"
        );
        RedisLink {
            redis: self.clone(),
            client,
        }
    }

    /// Runs `look` on the node, for a scenario's own checks.
    pub fn with_node<R>(&self, look: impl FnOnce(&mut Node) -> R) -> R {
        look(&mut self.0.node_now())
    }

    /// How much longer than over the network alone a grant may take once the faults healed. Its
    /// `WAIT` waits for the slowest replica, through the round in flight on its connection and
    /// then its own. After a failover that left the new master no replica, a client's first
    /// rounds there (the one in flight and the next, both counted before) wait out `WAIT`'s
    /// timeout before the store counts the replicas again: it learns of a failover no sooner.
    pub fn acknowledgement_allowance(&self) -> Duration {
        let faults = &self.0.faults;
        let slowest = faults
            .replica_lags
            .iter()
            .max()
            .copied()
            .unwrap_or_default();
        let bereft = faults.failover.is_some() && faults.replica_lags.len() == 1;
        2 * slowest
            + if bereft {
                2 * REPLICA_ACK_TIMEOUT
            } else {
                Duration::ZERO
            }
    }

    /// The faults tier two adds, for a trace.
    pub fn describe(&self) -> String {
        let mut text = String::from("redis faults [");
        let faults = &self.0.faults;
        let mut kinds = Vec::new();
        if faults.broken_connections {
            kinds.push("broken-connections".to_owned());
        }
        if !faults.replica_lags.is_empty() {
            let lags: Vec<String> = faults
                .replica_lags
                .iter()
                .map(|lag| format!("{}ms", lag.as_millis()))
                .collect();
            let mut replicas = format!(
                "replicas {} lag {}",
                faults.replica_lags.len(),
                lags.join(",")
            );
            if let Some((_, after)) = faults.failover {
                let _ = write!(replicas, " failover at {}ms", after.as_millis());
            }
            kinds.push(replicas);
        }
        let _ = write!(text, "{}]", kinds.join("; "));
        text
    }
}

impl Shared {
    /// Opens a connection of `client`: refused while it is partitioned. It breaks at `breaks_at`
    /// if ever (then at the client's next partition at the latest).
    async fn connect(
        self: &Arc<Self>,
        client: usize,
        breaks_at: Option<Instant>,
    ) -> Result<Arc<Connection>, RedisError> {
        let net = self.network.net(client);
        let round_trip = net.latency(client, None) + net.latency(client, None);
        tokio::time::sleep_until(net.unpaused(client, Instant::now()) + round_trip).await;
        if net.partitioned(client, Instant::now()) {
            sometimes("a Redis connection refused by a partition");
            return Err(net::refused_error());
        }
        // A connection open at the failover breaks then.
        let failover = self.failover_at().filter(|at| Instant::now() < *at);
        let breaks_at = [breaks_at, net.next_partition(client), failover]
            .into_iter()
            .flatten()
            .min();
        Ok(Arc::new(Connection {
            id: self.opened.fetch_add(1, Ordering::Relaxed),
            client,
            shared: self.clone(),
            net,
            wire: Mutex::new(Wire::new()),
            breaks_at,
            inbox: Mutex::default(),
            heard: Notify::new(),
        }))
    }

    /// When a connection of `client` opened now for commands breaks on its own, if it does
    /// before the faults heal.
    fn command_connection_breaks_at(&self, client: usize) -> Option<Instant> {
        let net = self.network.net(client);
        if !(net.faulty() && self.faults.broken_connections) {
            return None;
        }
        let mut stream = net.stream(client);
        let at = Instant::now() + stream.millis(5, 2_500);
        (stream.percent(40) && at < net.healed_at()).then_some(at)
    }

    /// A lease length for a request's latency to land near the end of.
    fn lease_length(&self, stream: &mut Stream) -> Option<Duration> {
        let lengths = &self.lease_lengths;
        let at = stream.below(lengths.len() as u64) as usize;
        lengths.get(at).copied()
    }

    /// When the master fails over, if it does.
    fn failover_at(&self) -> Option<Instant> {
        self.faults.failover.map(|(at, _)| at)
    }

    /// The node, its clock set to now, failed over first if that was due: to the replica that
    /// applied the most by the failover's time, as a Sentinel promotes.
    fn node_now(&self) -> std::sync::MutexGuard<'_, Node> {
        let mut node = lock(&self.node);
        let Some(micros) = crate::world::epoch_micros() else {
            return node;
        };
        let now = Instant::now();
        if let Some(at) = self.failover_at().filter(|at| *at <= now)
            && !self.failed_over.swap(true, Ordering::Relaxed)
        {
            let since = u64::try_from(now.duration_since(at).as_micros()).unwrap_or(u64::MAX);
            node.set_clock(micros.saturating_sub(since));
            if let Some(best) = node.best_replica() {
                sometimes("a Redis failover");
                node.fail_over(best);
            }
        }
        node.set_clock(micros);
        node
    }

    /// Runs `cmds` on the node as they came on `connection`, now, and sends what they published
    /// to its subscribers.
    fn execute(&self, connection: u64, cmds: &[Cmd]) -> Vec<Value> {
        let mut node = self.node_now();
        let now = Instant::now();
        // Its grant's `WAIT` may still wait when the master fails over.
        if self
            .failover_at()
            .is_some_and(|at| now < at && at <= now + REPLICA_ACK_TIMEOUT)
            && cmds.iter().any(is_hand_over)
        {
            sometimes("a hand-over in flight during a failover");
        }
        // Subscriptions whose connection broke meanwhile are gone.
        let mut subscribers = lock(&self.subscribers);
        subscribers.retain(|id, subscriber| {
            let live = subscriber.upgrade().is_some_and(|s| !s.broken(now));
            if !live {
                node.disconnect(*id);
            }
            live
        });
        let replies: Vec<Value> = cmds
            .iter()
            .map(|cmd| node.cmd_on(connection, cmd))
            .collect();

        for published in node.take_published() {
            for id in node.listeners(&published) {
                if let Some(subscriber) = subscribers.get(&id).and_then(Weak::upgrade) {
                    sometimes("a message published to a subscriber");
                    subscriber.push(published.clone());
                }
            }
        }
        replies
    }

    /// `connection` closed: its subscriptions end.
    fn disconnect(&self, connection: u64) {
        lock(&self.node).disconnect(connection);
        lock(&self.subscribers).remove(&connection);
    }
}

/// One connection to the simulated server (see the module's docs).
pub(crate) struct Connection {
    id: u64,
    client: usize,
    shared: Arc<Shared>,
    net: Arc<Net>,
    wire: Mutex<Wire>,
    /// When it breaks, if it does: what is on its way then is lost.
    breaks_at: Option<Instant>,
    /// Messages pushed to it as a subscriber, each with when it arrives, in order.
    inbox: Mutex<VecDeque<(Instant, Published)>>,
    heard: Notify,
}

impl Connection {
    fn broken(&self, at: Instant) -> bool {
        self.breaks_at.is_some_and(|breaks| breaks <= at)
    }

    /// A message published to a channel it subscribed to, sent to it now.
    fn push(&self, published: Published) {
        let delay = self.net.announcement_delay(self.client);
        let arrives = self
            .net
            .reply_arrives(self.client, &mut lock(&self.wire), delay);
        lock(&self.inbox).push_back((arrives, published));
        self.heard.notify_one();
    }

    /// Sends `cmds` (one request, a pipeline's commands back to back) and waits for their
    /// replies, for as long as it takes: the caller bounds it.
    async fn request(self: Arc<Self>, cmds: Vec<Cmd>) -> Result<Vec<Value>, RedisError> {
        let (net, client) = (self.net.clone(), self.client);
        let cmds_hand_over = cmds.iter().any(is_hand_over);
        if self.broken(Instant::now()) {
            return Err(net::reset_error());
        }
        let fate = {
            let ttl = self.shared.lease_length(&mut net.stream(client));
            net.fate(client, ttl)
        };
        let arrives = net.request_arrives(client, &mut lock(&self.wire), fate.request);
        let (replied, replies) = oneshot::channel();
        if fate.lost.is_none_or(|loss| loss.ran) {
            let connection = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(arrives).await;
                if connection.broken(Instant::now()) {
                    return;
                }
                let mut replies = connection.shared.execute(connection.id, &cmds);
                connection.block_on_wait(&cmds, &mut replies, arrives).await;
                let _ = replied.send(replies);
            });
        }
        let reply = async {
            let replies = replies.await.ok();
            if let Some(loss) = fate.lost {
                sometimes("a Redis reply lost");
                if replies.is_some() {
                    sometimes("a Redis reply lost after its command ran");
                }
                if !loss.reset {
                    return std::future::pending().await;
                }
                tokio::time::sleep(fate.reply).await;
                return Err(net::reset_error());
            }
            let Some(replies) = replies else {
                return Err(net::reset_error());
            };
            let arrives = net.reply_arrives(client, &mut lock(&self.wire), fate.reply);
            tokio::time::sleep_until(arrives).await;
            Ok(replies)
        };
        let breaks = async {
            match self.breaks_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        crate::sync::select! {
            replied = reply => replied,
            () = breaks => {
                sometimes("a Redis connection broke under a request");
                if self.breaks_at == self.shared.failover_at() && cmds_hand_over {
                    sometimes("a hand-over in flight during a failover");
                }
                Err(net::reset_error())
            }
        }
    }

    /// A `WAIT` that found fewer replicas than it asked for blocks its connection until its
    /// timeout ran out, as Redis's does, then answers what it finds then.
    async fn block_on_wait(&self, cmds: &[Cmd], replies: &mut [Value], arrived: Instant) {
        for (cmd, reply) in cmds.iter().zip(replies.iter_mut()) {
            let Some((wanted, timeout)) = wait_of(cmd) else {
                continue;
            };
            if matches!(reply, Value::Int(acked) if *acked >= wanted) || timeout.is_zero() {
                continue;
            }
            // Answered once enough replicas applied the write (looked at each millisecond), or
            // with the count at the timeout.
            let deadline = arrived + timeout;
            loop {
                let step = Instant::now() + Duration::from_millis(1);
                tokio::time::sleep_until(step.min(deadline)).await;
                if self.broken(Instant::now()) {
                    return;
                }
                *reply = self.shared.node_now().cmd_on(self.id, cmd);
                if matches!(reply, Value::Int(acked) if *acked >= wanted) {
                    sometimes("a WAIT answered once a lagging replica applied the write");
                    break;
                }
                if Instant::now() >= deadline {
                    sometimes("a WAIT blocked until its timeout");
                    break;
                }
            }
        }
    }
}

/// Whether `cmd` runs the hand-over script.
fn is_hand_over(cmd: &Cmd) -> bool {
    let mut args = super::arguments(cmd);
    args.next()
        .is_some_and(|name| name.eq_ignore_ascii_case(b"EVALSHA"))
        && args.next() == Some(scripts::HAND_OVER.get_hash().as_bytes())
}

/// `WAIT numreplicas timeout`'s numbers, when `cmd` is one.
fn wait_of(cmd: &Cmd) -> Option<(i64, Duration)> {
    let mut args = super::arguments(cmd).map(String::from_utf8_lossy);
    if !args.next()?.eq_ignore_ascii_case("WAIT") {
        return None;
    }
    let wanted = args.next()?.parse().ok()?;
    let millis = args.next()?.parse().ok()?;
    Some((wanted, Duration::from_millis(millis)))
}

/// A connection as the store holds it: redis-rs encodes the requests and reads the replies.
#[derive(Clone)]
pub(crate) struct SimConnection(Arc<Connection>);

impl ConnectionLike for SimConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let connection = self.0.clone();
        Box::pin(async move {
            let mut replies = connection.request(vec![cmd.clone()]).await?;
            Ok(replies.pop().unwrap_or(Value::Nil))
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let connection = self.0.clone();
        Box::pin(async move {
            if pipeline.is_transaction() {
                let message = "MULTI/EXEC is not simulated";
                return Err(RedisError::from((redis::ErrorKind::Client, message)));
            }
            let cmds = pipeline.cmd_iter().cloned().collect();
            let replies = connection.request(cmds).await?;
            Ok(replies.into_iter().skip(offset).take(count).collect())
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

/// One simulated client's way to the simulated Redis (see [`SimRedis`]).
#[derive(Clone)]
pub struct RedisLink {
    redis: SimRedis,
    client: usize,
}

impl From<&RedisLink> for Backing {
    fn from(link: &RedisLink) -> Self {
        let settings = Settings {
            // The builder's defaults.
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(1),
            names: Names::new("lockmacro"),
            replica_acks: 1,
            replica_ack_timeout: REPLICA_ACK_TIMEOUT,
            background: tokio::runtime::Handle::current(),
        };
        let transport = SimTransport {
            shared: link.redis.0.clone(),
            client: link.client,
            settings,
            connections: PerRuntime::new(),
        };
        Self {
            store: Arc::new(RedisStore::new(Arc::new(transport))),
            memory: None,
        }
    }
}

/// The store's [`Transport`] to the simulated server, for one client.
pub(crate) struct SimTransport {
    shared: Arc<Shared>,
    client: usize,
    settings: Settings,
    connections: PerRuntime<SimConnection>,
}

impl SimTransport {
    /// Whether a failed request may have run, dropping the connection when it proved broken
    /// (as the real one-server transport does).
    fn classify(&self, generation: u64, err: RedisError) -> SendError {
        let broken = crate::store::redis::unanswered(&err);
        if broken {
            self.connections.invalidate(generation);
        }
        SendError::new(err, broken)
    }
}

impl Transport for SimTransport {
    type Connection = Lent<SimConnection>;

    const LAYOUT: Layout = Layout::Server;

    fn settings(&self) -> &Settings {
        &self.settings
    }

    async fn connection(&self) -> Result<Self::Connection, StoreError> {
        self.connections
            .lend(|| async {
                let budget = self.settings.connect_timeout;
                let breaks_at = self.shared.command_connection_breaks_at(self.client);
                let open = async {
                    let opened = self.shared.connect(self.client, breaks_at).await?;
                    let mut connection = SimConnection(opened);
                    scripts::load_all().exec_async(&mut connection).await?;
                    Ok::<_, RedisError>(connection)
                };
                match tokio::time::timeout(budget, open).await {
                    Ok(Ok(connection)) => Ok(connection),
                    Ok(Err(err)) => Err(Unreachable::connecting(SERVER, false, err)),
                    Err(_) => Err(Unreachable::error(SERVER, false, TimedOut(budget))),
                }
            })
            .await
    }

    async fn send_once<R: FromRedisValue + Send>(
        &self,
        lent: &mut Self::Connection,
        request: Request<'_>,
        budget: Duration,
    ) -> Result<R, SendError> {
        let limit = budget.min(self.settings.response_timeout);
        let connection = &mut lent.connection;
        let reply = match request {
            Request::Cmd(cmd) => tokio::time::timeout(limit, cmd.query_async(connection)).await,
            Request::Pipeline(pipe) => {
                tokio::time::timeout(limit, pipe.query_async(connection)).await
            }
        };
        match reply {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(self.classify(lent.generation, err)),
            Err(_) => {
                // Its reply may still come, in the place of a later request's: never lent again.
                sometimes("a Redis request timed out");
                self.connections.invalidate(lent.generation);
                Err(SendError::Unknown(StoreError::unavailable(TimedOut(limit))))
            }
        }
    }

    async fn wait_replicas(
        &self,
        lent: &mut Self::Connection,
        _key: &str,
        wait: &Cmd,
        timeout: Duration,
    ) -> Result<u32, SendError> {
        let limit = timeout + self.settings.response_timeout;
        let connection = &mut lent.connection;
        match tokio::time::timeout(limit, wait.query_async(connection)).await {
            Ok(Ok(acked)) => Ok(acked),
            Ok(Err(err)) => Err(self.classify(lent.generation, err)),
            Err(_) => {
                self.connections.invalidate(lent.generation);
                Err(SendError::Unknown(StoreError::unavailable(TimedOut(limit))))
            }
        }
    }

    fn shared(lent: &Self::Connection) -> Option<u64> {
        (lent.generation != u64::MAX).then_some(lent.generation)
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        Box::pin(async move {
            let net = self.shared.network.net(self.client);
            let closes_at = net.feed_closes_at(self.client);
            let budget = self.settings.connect_timeout;
            let opened = tokio::time::timeout(budget, self.shared.connect(self.client, closes_at));
            let connection = match opened.await {
                Ok(Ok(connection)) => connection,
                Ok(Err(err)) => return Err(Unreachable::connecting(SERVER, false, err)),
                Err(_) => return Err(Unreachable::error(SERVER, false, TimedOut(budget))),
            };
            lock(&self.shared.subscribers).insert(connection.id, Arc::downgrade(&connection));
            Ok(Box::new(SimFeed {
                connection,
                names: self.settings.names.clone(),
                response_timeout: self.settings.response_timeout,
            }) as Box<dyn ReleaseFeed>)
        })
    }

    fn health(&self) -> BoxFuture<'_, Health> {
        Box::pin(async move {
            let bound = self.settings.connect_timeout + self.settings.response_timeout;
            let probe = async {
                let mut lent = self.connection().await?;
                let started = Instant::now();
                let ping = redis::cmd("PING");
                let budget = self.settings.response_timeout;
                self.send_once::<Value>(&mut lent, Request::Cmd(&ping), budget)
                    .await
                    .map_err(SendError::into_store_error)?;
                Ok::<_, StoreError>(started.elapsed())
            };
            let node = match tokio::time::timeout(bound, probe).await {
                Ok(Ok(latency)) => NodeHealth::answered(SERVER, NodeRole::Server, latency),
                Ok(Err(error)) => error.node_health(SERVER, NodeRole::Server),
                Err(_) => NodeHealth::silent(SERVER, NodeRole::Server, TimedOut(bound)),
            };
            let (ready, verdict) = match node.answers() {
                true => (true, "the server answers"),
                false => (false, "the server does not answer"),
            };
            Health::new("redis (simulated)", ready, verdict, vec![node])
        })
    }

    fn masters(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        Box::pin(async { Ok(vec![String::new()]) })
    }

    fn on_master<'a>(
        &'a self,
        _master: &'a str,
        request: Request<'a>,
    ) -> BoxFuture<'a, Result<Value, StoreError>> {
        Box::pin(async move {
            let mut connection = self.connection().await?;
            let budget = self.settings.response_timeout;
            self.send_once(&mut connection, request, budget)
                .await
                .map_err(SendError::into_store_error)
        })
    }
}

/// Release announcements from the simulated server, on a subscription connection of its own:
/// what is published reaches it after the network's delay, in order with its replies; it closes
/// when its connection breaks.
struct SimFeed {
    connection: Arc<Connection>,
    names: Names,
    response_timeout: Duration,
}

impl SimFeed {
    /// `cmd` on the subscription's connection, bounded by the response timeout.
    async fn round_trip(&self, cmd: Cmd) -> Result<(), StoreError> {
        let request = self.connection.clone().request(vec![cmd]);
        match tokio::time::timeout(self.response_timeout, request).await {
            Ok(Ok(replies)) => match replies.into_iter().next() {
                Some(Value::ServerError(error)) => {
                    Err(StoreError::unavailable(RedisError::from(error)))
                }
                _ => Ok(()),
            },
            Ok(Err(err)) => Err(StoreError::unavailable(err)),
            Err(_) => Err(StoreError::unavailable(TimedOut(self.response_timeout))),
        }
    }

    fn subscription(&self, command: &str, key: &str) -> Cmd {
        let mut cmd = redis::cmd(command);
        cmd.arg(self.names.release_channel(key));
        cmd
    }
}

impl ReleaseFeed for SimFeed {
    fn watch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.round_trip(self.subscription("SUBSCRIBE", key)))
    }

    fn unwatch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.round_trip(self.subscription("UNSUBSCRIBE", key)))
    }

    fn settle<'a>(&'a mut self, _key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        // Its reply comes after every message published before it.
        Box::pin(self.round_trip(redis::cmd("PING")))
    }

    fn next_release(&mut self) -> BoxFuture<'_, Option<Released>> {
        Box::pin(async move {
            let connection = &self.connection;
            loop {
                let now = Instant::now();
                if connection.broken(now) {
                    sometimes("a Redis subscription closed");
                    return None;
                }
                let next = lock(&connection.inbox).front().map(|(at, _)| *at);
                if next.is_some_and(|at| at <= now) {
                    let (_, published) = lock(&connection.inbox).pop_front()?;
                    let channel = String::from_utf8_lossy(&published.channel);
                    if let Some(key) = self.names.released_key(&channel) {
                        return Some(Released {
                            key: key.to_owned(),
                            message: String::from_utf8_lossy(&published.message).into_owned(),
                        });
                    }
                    continue;
                }
                let arrives = async {
                    match next {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                let breaks = async {
                    match connection.breaks_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                crate::sync::select! {
                    () = connection.heard.notified() => {}
                    () = arrives => {}
                    () = breaks => {}
                }
            }
        })
    }
}

impl Drop for SimFeed {
    fn drop(&mut self) {
        self.connection.shared.disconnect(self.connection.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LockClient, LockContext, LockOptions};

    /// What each call saw, stamped with simulated time.
    fn turns(seed: u64) -> Vec<String> {
        crate::sim::run(seed, || async {
            let network = Network::new(3);
            let redis = SimRedis::new(&network, &[Duration::from_millis(400)]);
            // After the faults healed: every call gets the lock.
            tokio::time::sleep(network.healed_after()).await;
            let start = Instant::now();
            let seen = Arc::new(Mutex::new(Vec::new()));
            let mut calls = Vec::new();
            for client in 0..3 {
                let locks = LockClient::simulated(&redis.link(client), client as u32, 0);
                for task in 0..2 {
                    let (locks, seen) = (locks.clone(), seen.clone());
                    calls.push(tokio::spawn(async move {
                        let options = LockOptions::new()
                            .ttl(Duration::from_millis(400))
                            .wait(Duration::from_secs(5));
                        let body = async {
                            let token = LockContext::current().expect("held").token().to_owned();
                            let at = start.elapsed().as_micros();
                            lock(&seen).push(format!("{at} p{client}.t{task} in {token}"));
                            tokio::time::sleep(Duration::from_millis(30)).await;
                            let at = start.elapsed().as_micros();
                            lock(&seen).push(format!("{at} p{client}.t{task} out"));
                        };
                        locks.run_locked("k", options, body).await
                    }));
                }
            }
            for call in calls {
                call.await
                    .expect("no panic")
                    .expect("every call gets the lock");
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            let left = redis.with_node(|node| node.keys());
            let held: Vec<_> = left
                .iter()
                .filter(|(key, _)| key == b"lockmacro:k")
                .collect();
            assert!(held.is_empty(), "the lock outlived its calls: {held:?}");
            lock(&seen).clone()
        })
        .expect("a runtime")
    }

    #[test]
    fn callers_take_turns_through_the_real_scripts_and_a_seed_replays_them() {
        crate::sim::take_coverage();
        let first = turns(3);
        let coverage = crate::sim::take_coverage();
        assert_eq!(first.len(), 12, "{first:#?}");
        for pair in first.chunks(2) {
            let who = pair[0].split(' ').nth(1);
            assert!(pair[0].contains(" in "), "{first:#?}");
            assert_eq!(who, pair[1].split(' ').nth(1), "overlap: {first:#?}");
        }
        assert!(
            coverage.contains_key("a message published to a subscriber"),
            "no release was announced to a waiter: {coverage:?}"
        );
        assert_eq!(turns(3), first);
        assert_ne!(turns(4), first);
    }
}
