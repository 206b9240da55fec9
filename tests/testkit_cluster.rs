//! The test kit's Redis Cluster and Sentinel: they start, route, fail over and clean up.

use std::time::Instant;

use testkit::{RedisCluster, RedisSentinel};

/// A 3 + 3 cluster forms; a key's master answers for it and another master redirects with
/// `MOVED`; a killed master is replaced by its replica.
#[test]
fn cluster_forms_routes_and_fails_over() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start(3, 1);
    eprintln!("3 + 3 cluster ready in {:?}", started.elapsed());
    assert_eq!(cluster.masters().len(), 3);
    let owner = cluster.master_of("orders:1");
    assert_eq!(owner.command(&["SET", "orders:1", "x"]), redis::Value::Okay);
    let other = cluster
        .masters()
        .into_iter()
        .find(|master| master.port() != owner.port())
        .unwrap();
    match other.command(&["GET", "orders:1"]) {
        redis::Value::ServerError(err) => assert_eq!(err.code(), "MOVED"),
        reply => panic!("expected MOVED, got {reply:?}"),
    }
    let failing_over = Instant::now();
    let killed = cluster.kill_master_of("orders:1");
    eprintln!(
        "failover after a killed master in {:?}",
        failing_over.elapsed()
    );
    assert_ne!(cluster.master_of("orders:1").port(), killed);
    assert_eq!(cluster.masters().len(), 3);
}

/// A slot being migrated answers `ASK` for keys already moved, and `MOVED` once handed over.
#[test]
fn a_migrating_slot_asks_then_moves() {
    let cluster = RedisCluster::start(2, 0);
    let key = "migrating:1";
    let from = cluster.master_of(key).port();
    let to = cluster
        .masters()
        .into_iter()
        .find(|master| master.port() != from)
        .unwrap()
        .port();
    let source = cluster
        .nodes()
        .iter()
        .find(|node| node.port() == from)
        .unwrap();
    assert_eq!(source.command(&["SET", key, "x"]), redis::Value::Okay);
    let migration = cluster.begin_migration(cluster.slot_of(key), to);
    match source.command(&["GET", key]) {
        redis::Value::ServerError(err) => assert_eq!(err.code(), "ASK"),
        reply => panic!("expected ASK, got {reply:?}"),
    }
    migration.finish();
    match source.command(&["GET", key]) {
        redis::Value::ServerError(err) => assert_eq!(err.code(), "MOVED"),
        reply => panic!("expected MOVED, got {reply:?}"),
    }
    assert_eq!(cluster.master_of(key).port(), to);
}

/// Three sentinels settle on the master and know the replica and each other; a killed master is
/// replaced by its replica.
#[test]
fn sentinels_settle_and_fail_over() {
    let started = Instant::now();
    let mut deployment = RedisSentinel::start();
    eprintln!(
        "master + replica + 3 sentinels ready in {:?}",
        started.elapsed()
    );
    let master = deployment.master().port();
    let failing_over = Instant::now();
    deployment.kill_master();
    eprintln!(
        "sentinel failover after a killed master in {:?}",
        failing_over.elapsed()
    );
    assert_ne!(deployment.master().port(), master);
    assert!(deployment.url().starts_with("redis+sentinel://127.0.0.1:"));
}
