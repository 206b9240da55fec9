//! Replica acknowledgement on Sentinel and Cluster: a lock, and each renewal, counts only once a
//! replica acknowledged it (`WAIT` behind the write). With the replica frozen (`SIGSTOP`), no
//! lock is granted and nothing stays held; with `replica_acks(0)` it is.
//!
//! Figures worth reporting are printed with `eprintln!` (`--no-capture` shows them).

mod common;

use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockError, LockOptions};
use testkit::{RedisCluster, RedisSentinel, RedisServer};

/// The data node that is not the master.
fn replica_of(sentinel: &RedisSentinel) -> &RedisServer {
    let master = sentinel.master().port();
    sentinel
        .data
        .iter()
        .find(|node| node.port() != master)
        .expect("a replica")
}

/// The replica of the master of `key`.
fn cluster_replica_of<'a>(cluster: &'a RedisCluster, key: &str) -> &'a RedisServer {
    let master = cluster.master_of(key).port().to_string();
    cluster
        .nodes()
        .iter()
        .find(|node| {
            match node.command(&["INFO", "replication"]) {
                redis::Value::BulkString(info) => String::from_utf8_lossy(&info).into_owned(),
                redis::Value::VerbatimString { text, .. } => text,
                _ => String::new(),
            }
            .contains(&format!("master_port:{master}"))
        })
        .expect("the master has a replica")
}

/// Unfreezes a server when dropped, so that a failing assertion leaves no process stopped.
struct Frozen<'a>(&'a RedisServer);

impl<'a> Frozen<'a> {
    fn freeze(server: &'a RedisServer) -> Self {
        server.pause();
        Self(server)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

fn options() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(5))
}

/// With the replica frozen, a lock is not granted: the caller gets `LockError::Redis` saying no
/// replica acknowledged it, in about the ack timeout, and the key is free afterwards.
async fn frozen_replica_grants_nothing(
    locks: &LockClient,
    no_acks: &LockClient,
    replica: &RedisServer,
    master: &RedisServer,
    key: &str,
) {
    // Healthy: granted, and the uncontended cycle works.
    locks
        .run_locked(key, options(), async {})
        .await
        .expect("granted while the replica keeps up");
    let frozen = Frozen::freeze(replica);
    let started = Instant::now();
    let error = locks
        .run_locked(key, options(), async { panic!("the body never runs") })
        .await
        .expect_err("not granted while the replica is frozen");
    let took = started.elapsed();
    eprintln!("frozen replica: {took:?}: {error}");
    assert!(
        matches!(&error, LockError::Redis { .. })
            && error.to_string().contains("no replica acknowledged"),
        "{error:?}"
    );
    assert_eq!(
        common::get(master, key).await,
        None,
        "the unacknowledged grant was undone before the caller heard"
    );
    // Several keys at once: the same.
    let keys = [format!("{key}-a"), format!("{key}-b")];
    let error = locks
        .run_locked_many(keys.clone(), options(), async {})
        .await
        .expect_err("not granted while the replica is frozen");
    assert!(
        error.to_string().contains("no replica acknowledged"),
        "{error:?}"
    );
    // With acknowledgement off, the grant does not wait for the replica.
    no_acks
        .run_locked(key, options(), async {})
        .await
        .expect("granted without acknowledgement");
    drop(frozen);
    locks
        .run_locked(key, options(), async {})
        .await
        .expect("granted again once the replica is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_grants_no_lock_its_frozen_replica_did_not_acknowledge() {
    let sentinel = RedisSentinel::start();
    let locks = LockClient::builder(&sentinel.url()).build().await.unwrap();
    let no_acks = LockClient::builder(&sentinel.url())
        .replica_acks(0)
        .build()
        .await
        .unwrap();
    frozen_replica_grants_nothing(
        &locks,
        &no_acks,
        replica_of(&sentinel),
        sentinel.master(),
        "acks:sentinel",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_grants_no_lock_its_frozen_replica_did_not_acknowledge() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .unwrap();
    // `{k}` keeps the multi-key lock's keys on the master whose replica is frozen.
    let key = "{acks}:cluster";
    let locks = LockClient::cluster_builder(cluster.seed_urls())
        .build()
        .await
        .unwrap();
    let no_acks = LockClient::cluster_builder(cluster.seed_urls())
        .replica_acks(0)
        .build()
        .await
        .unwrap();
    frozen_replica_grants_nothing(
        &locks,
        &no_acks,
        cluster_replica_of(&cluster, key),
        cluster.master_of(key),
        key,
    )
    .await;
}

/// A renewal no replica acknowledged does not move the lease's deadline: with the replica frozen
/// while the lock is held, the holder is cancelled with `Lost` at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_renewals_do_not_keep_a_lease() {
    let sentinel = RedisSentinel::start();
    let locks = LockClient::builder(&sentinel.url())
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let replica = replica_of(&sentinel);
    let (held, frozen) = tokio::sync::oneshot::channel();
    let run = locks.run_locked(
        "acks:renewal",
        LockOptions::new()
            .ttl(Duration::from_millis(1_500))
            .unlimited_renewals(),
        async move {
            held.send(()).unwrap();
            tokio::time::sleep(Duration::from_secs(4)).await;
        },
    );
    let freeze = async {
        frozen.await.unwrap();
        Frozen::freeze(replica)
    };
    let started = Instant::now();
    let (outcome, frozen) = tokio::join!(run, freeze);
    let took = started.elapsed();
    drop(frozen);
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?} after {took:?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "cancelled at its deadline: {took:?}"
    );
}

/// One Redis without replicas: acknowledgement on by default changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_without_replicas_grants_as_before() {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url()).build().await.unwrap();
    for _ in 0..3 {
        locks
            .run_locked("acks:one", options(), async {})
            .await
            .unwrap();
    }
}
