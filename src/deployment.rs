//! Deployments the conformance suite runs against: each starts the real thing on loopback, hands
//! out clients for it, and lets a test look at (or tamper with) lock keys around the library.

use std::time::Duration;

use lockmacro_runtime::{LockClient, LockClientBuilder, protocol};
use redis::AsyncCommands;

use crate::{RedisCluster, RedisSentinel, RedisServer};

/// A running deployment, as the conformance suite needs it.
#[allow(async_fn_in_trait)]
pub trait Deployment {
    /// A client of it, ready to use.
    async fn client(&self) -> LockClient;

    /// A client of it that has done no I/O yet.
    fn unconnected_client(&self) -> LockClient;

    /// A second client of the same deployment, as another process would have: its own
    /// engine, waiters and subscription.
    async fn another_client(&self) -> LockClient {
        self.client().await
    }

    /// The value stored under `key` (a holder's token), read around the library.
    async fn holder(&self, key: &str) -> Option<String>;

    /// Lets another owner take `key`, replacing whatever is there, for `ttl`: a lock value of
    /// another process, with a lease as the library writes it (a lock value that never expires
    /// is no lock the library would write: a look reads it as no lock, a renewal as another's).
    /// Returns its token.
    async fn impose(&self, key: &str, ttl: Duration) -> String;

    /// Puts another application's data under `key` (`SET key hello`, or `HSET key field value`
    /// for [`Foreign::Hash`]), with no expiry.
    async fn put_foreign(&self, key: &str, data: Foreign);

    /// Whether `key` still holds exactly the data [`put_foreign`](Self::put_foreign) put there,
    /// with no expiry.
    async fn holds_foreign(&self, key: &str, data: Foreign) -> bool;

    /// Returns once some client listens for releases of `key`: a waiter has found it busy and
    /// subscribed, so from now on it sleeps on the announcement.
    async fn waiter_subscribed(&self, key: &str);

    /// Whether it hands out fencing tokens (Redlock refuses them).
    fn offers_fencing(&self) -> bool {
        true
    }

    /// Whether it serves waiters in arrival order with `fair = true` (Redlock refuses it).
    fn offers_fair(&self) -> bool {
        true
    }
}

/// Another application's data under a lock's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Foreign {
    /// The string `hello`.
    String,
    /// A hash with one field, `field` = `value`.
    Hash,
    /// The string `+`: a waiter's mark alone, as a watch leaves on a free key, but set by
    /// another application, without an expiry.
    Mark,
}

impl Foreign {
    /// The string it is, for the string kinds.
    fn text(self) -> Option<&'static str> {
        match self {
            Self::String => Some("hello"),
            Self::Mark => Some("+"),
            Self::Hash => None,
        }
    }
}

/// One `redis-server`.
#[derive(Debug)]
pub struct SingleRedis {
    /// The server.
    pub server: RedisServer,
}

impl SingleRedis {
    /// Starts a server.
    pub fn start() -> Self {
        Self {
            server: RedisServer::start(),
        }
    }
}

impl Deployment for SingleRedis {
    async fn client(&self) -> LockClient {
        connected(LockClient::builder(&self.server.url())).await
    }

    fn unconnected_client(&self) -> LockClient {
        unconnected(LockClient::builder(&self.server.url()))
    }

    async fn holder(&self, key: &str) -> Option<String> {
        get(&self.server, key).await
    }

    async fn impose(&self, key: &str, ttl: Duration) -> String {
        set(&self.server, key, ttl).await
    }

    async fn put_foreign(&self, key: &str, data: Foreign) {
        put_foreign(&self.server, key, data).await;
    }

    async fn holds_foreign(&self, key: &str, data: Foreign) -> bool {
        holds_foreign(&self.server, key, data).await
    }

    async fn waiter_subscribed(&self, key: &str) {
        let channel = protocol::Names::default().release_channel(key);
        subscribed(&[&self.server], "NUMSUB", &channel).await;
    }
}

/// A master found through three sentinels.
#[derive(Debug)]
pub struct Sentinel {
    /// The master, replica and sentinels.
    pub deployment: RedisSentinel,
}

impl Sentinel {
    /// Starts a master, a replica and three sentinels.
    pub fn start() -> Self {
        Self {
            deployment: RedisSentinel::start(),
        }
    }
}

impl Deployment for Sentinel {
    async fn client(&self) -> LockClient {
        connected(LockClient::builder(&self.deployment.url())).await
    }

    fn unconnected_client(&self) -> LockClient {
        unconnected(LockClient::builder(&self.deployment.url()))
    }

    async fn holder(&self, key: &str) -> Option<String> {
        get(self.deployment.master(), key).await
    }

    async fn impose(&self, key: &str, ttl: Duration) -> String {
        set(self.deployment.master(), key, ttl).await
    }

    async fn put_foreign(&self, key: &str, data: Foreign) {
        put_foreign(self.deployment.master(), key, data).await;
    }

    async fn holds_foreign(&self, key: &str, data: Foreign) -> bool {
        holds_foreign(self.deployment.master(), key, data).await
    }

    async fn waiter_subscribed(&self, key: &str) {
        let channel = protocol::Names::default().release_channel(key);
        subscribed(&[self.deployment.master()], "NUMSUB", &channel).await;
    }
}

/// A Redis Cluster of three masters.
#[derive(Debug)]
pub struct Cluster {
    /// The nodes.
    pub cluster: RedisCluster,
}

impl Cluster {
    /// Starts three masters (no replicas: the conformance suite needs no failover).
    pub fn start() -> Self {
        Self {
            cluster: RedisCluster::start(3, 0),
        }
    }

    /// The release channel of `key`, in `key`'s slot as the library names it: the key itself
    /// after the prefix when its hash tag keeps the slot, else the key wrapped in braces.
    pub fn release_channel(&self, key: &str) -> String {
        protocol::Names::in_slot(key, protocol::Names::default().release_channel(""))
            .expect("a key whose internal names can share its slot")
    }
}

impl Deployment for Cluster {
    async fn client(&self) -> LockClient {
        connected(LockClient::cluster_builder(self.cluster.seed_urls())).await
    }

    fn unconnected_client(&self) -> LockClient {
        unconnected(LockClient::cluster_builder(self.cluster.seed_urls()))
    }

    async fn holder(&self, key: &str) -> Option<String> {
        get(self.cluster.master_of(key), key).await
    }

    async fn impose(&self, key: &str, ttl: Duration) -> String {
        set(self.cluster.master_of(key), key, ttl).await
    }

    async fn put_foreign(&self, key: &str, data: Foreign) {
        put_foreign(self.cluster.master_of(key), key, data).await;
    }

    async fn holds_foreign(&self, key: &str, data: Foreign) -> bool {
        holds_foreign(self.cluster.master_of(key), key, data).await
    }

    async fn waiter_subscribed(&self, key: &str) {
        let channel = self.release_channel(key);
        subscribed(&[self.cluster.master_of(&channel)], "SHARDNUMSUB", &channel).await;
    }
}

/// A Redlock quorum of independent servers.
#[derive(Debug)]
pub struct Redlock {
    /// The masters.
    pub servers: Vec<RedisServer>,
}

impl Redlock {
    /// Starts `masters` independent servers.
    pub fn start(masters: usize) -> Self {
        Self {
            servers: (0..masters).map(|_| RedisServer::start()).collect(),
        }
    }

    /// Every master's URL.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }
}

impl Deployment for Redlock {
    async fn client(&self) -> LockClient {
        connected(LockClient::redlock_builder(self.urls())).await
    }

    fn unconnected_client(&self) -> LockClient {
        unconnected(LockClient::redlock_builder(self.urls()))
    }

    /// The value a majority of the masters hold.
    async fn holder(&self, key: &str) -> Option<String> {
        let mut values = Vec::new();
        for server in self.servers.iter().filter(|server| server.is_running()) {
            values.push(get(server, key).await);
        }
        let majority = self.servers.len() / 2 + 1;
        values
            .iter()
            .flatten()
            .find(|value| values.iter().flatten().filter(|v| v == value).count() >= majority)
            .cloned()
    }

    async fn impose(&self, key: &str, ttl: Duration) -> String {
        let value = lock_value_of_another();
        for server in &self.servers {
            set_value(server, key, &value, ttl).await;
        }
        protocol::holder_token(&value).to_owned()
    }

    async fn put_foreign(&self, key: &str, data: Foreign) {
        for server in &self.servers {
            put_foreign(server, key, data).await;
        }
    }

    async fn holds_foreign(&self, key: &str, data: Foreign) -> bool {
        for server in &self.servers {
            if !holds_foreign(server, key, data).await {
                return false;
            }
        }
        true
    }

    async fn waiter_subscribed(&self, key: &str) {
        let channel = protocol::Names::default().release_channel(key);
        let servers: Vec<&RedisServer> = self.servers.iter().collect();
        subscribed(&servers, "NUMSUB", &channel).await;
    }

    fn offers_fencing(&self) -> bool {
        false
    }

    fn offers_fair(&self) -> bool {
        false
    }
}

/// Locks in the process (`LockClient::in_memory`): its clients are clones of one, so the fixture
/// sees their locks through the hooks.
#[derive(Debug, Clone)]
pub struct InMemory {
    /// The client every test client is a clone of.
    pub locks: LockClient,
}

impl InMemory {
    /// A new store.
    pub fn start() -> Self {
        Self {
            locks: LockClient::in_memory(),
        }
    }

    fn hooks(&self) -> lockmacro_runtime::MemoryHooks {
        self.locks.memory_hooks().expect("an in-memory client")
    }
}

impl Deployment for InMemory {
    async fn client(&self) -> LockClient {
        self.locks.clone()
    }

    async fn another_client(&self) -> LockClient {
        self.hooks().client()
    }

    fn unconnected_client(&self) -> LockClient {
        self.locks.clone()
    }

    async fn holder(&self, key: &str) -> Option<String> {
        self.hooks().holder(key)
    }

    async fn impose(&self, key: &str, ttl: Duration) -> String {
        self.hooks().take_over(key, ttl)
    }

    async fn put_foreign(&self, key: &str, data: Foreign) {
        match data {
            Foreign::String | Foreign::Mark => self.hooks().put_foreign_string(key),
            Foreign::Hash => self.hooks().put_foreign_hash(key),
        }
    }

    async fn holds_foreign(&self, key: &str, _data: Foreign) -> bool {
        self.hooks().holds_foreign(key)
    }

    async fn waiter_subscribed(&self, key: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.hooks().listeners(key) == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no waiter subscribed to `{key}` within 5 s"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// A client with a 100 ms scan, so renewal tests take a fraction of a second per lease.
async fn connected(builder: LockClientBuilder) -> LockClient {
    builder
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap_or_else(|err| panic!("cannot build a client: {err}"))
}

fn unconnected(builder: LockClientBuilder) -> LockClient {
    builder
        .build_lazy()
        .unwrap_or_else(|err| panic!("cannot build a client: {err}"))
}

/// The token holding the exclusive lock `key`, read through the library's protocol (a waiter's
/// mark is not part of it).
async fn get(server: &RedisServer, key: &str) -> Option<String> {
    let mut connection = server.connection().await;
    let value: Option<String> = connection.get(key).await.expect("GET");
    value
        .map(|value| protocol::holder_token(&value).to_owned())
        // A free key a watch follows holds the watch's mark alone: no holder.
        .filter(|token| !token.is_empty())
}

/// A lock value of another process, with a fresh token.
fn lock_value_of_another() -> String {
    static TOKENS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let token = format!(
        "{:016x}{:016x}",
        std::process::id(),
        TOKENS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    protocol::Origin::new("another-host", 1, "another-owner").value(&token, 0)
}

/// Sets `key` to another owner's lock; returns its token.
async fn set(server: &RedisServer, key: &str, ttl: Duration) -> String {
    let value = lock_value_of_another();
    set_value(server, key, &value, ttl).await;
    protocol::holder_token(&value).to_owned()
}

/// Sets `key` to `value`, for `ttl`.
async fn set_value(server: &RedisServer, key: &str, value: &str, ttl: Duration) {
    let mut connection = server.connection().await;
    let millis = ttl.as_millis().max(1) as u64;
    let () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(millis)
        .query_async(&mut connection)
        .await
        .expect("SET");
}

/// `SET key hello`, or `HSET key field value`.
async fn put_foreign(server: &RedisServer, key: &str, data: Foreign) {
    let mut connection = server.connection().await;
    let () = match data.text() {
        Some(text) => connection.set(key, text).await.expect("SET"),
        None => {
            let _: i64 = connection.hset(key, "field", "value").await.expect("HSET");
        }
    };
}

/// Whether `key` holds exactly what [`put_foreign`] put there, with no expiry.
async fn holds_foreign(server: &RedisServer, key: &str, data: Foreign) -> bool {
    let mut connection = server.connection().await;
    let pttl: i64 = connection.pttl(key).await.expect("PTTL");
    let same = match data.text() {
        Some(text) => {
            let value: Option<String> = connection.get(key).await.ok().flatten();
            value.as_deref() == Some(text)
        }
        None => {
            let fields: std::collections::HashMap<String, String> =
                connection.hgetall(key).await.unwrap_or_default();
            fields.len() == 1 && fields.get("field").map(String::as_str) == Some("value")
        }
    };
    same && pttl == -1
}

/// Waits (5 s at most) until some client of `servers` subscribes to `channel`, as counted by
/// `PUBSUB {count}` (`NUMSUB`, or `SHARDNUMSUB` for a sharded channel).
async fn subscribed(servers: &[&RedisServer], count: &str, channel: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let mut listeners = 0;
        for server in servers {
            let mut connection = server.connection().await;
            let (_, heard): (String, u64) = redis::cmd("PUBSUB")
                .arg(count)
                .arg(channel)
                .query_async(&mut connection)
                .await
                .expect("PUBSUB");
            listeners += heard;
        }
        if listeners > 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no waiter subscribed to `{channel}` within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
