//! `LockClient::health` on every deployment: each server, whether it answers and how fast, and
//! whether locks can be taken, with servers down too. The outputs are printed (`--no-capture`).

use std::time::Duration;

use lockmacro_runtime::{Health, LockClient, NodeRole};
use testkit::{RedisCluster, RedisSentinel, RedisServer};

fn shown(what: &str, health: &Health) {
    eprintln!("{what}:\n{health}\n");
}

async fn built(builder: lockmacro_runtime::LockClientBuilder) -> LockClient {
    builder.build().await.unwrap()
}

#[tokio::test]
async fn one_redis_answers_until_it_is_down() {
    let mut server = RedisServer::start();
    let locks = built(LockClient::builder(&server.url())).await;
    let health = locks.health().await;
    shown("one Redis", &health);
    assert!(health.is_ready(), "{health}");
    assert_eq!(health.deployment(), "redis");
    let node = &health.nodes()[0];
    assert_eq!(node.address(), format!("127.0.0.1:{}", server.port()));
    assert_eq!(node.role(), NodeRole::Server);
    assert!(
        node.latency()
            .is_some_and(|latency| latency < Duration::from_secs(1))
    );
    assert_eq!(node.error(), None);

    server.kill();
    let health = locks.health().await;
    shown("one Redis, down", &health);
    assert!(!health.is_ready(), "{health}");
    assert_eq!(health.answering(), 0);
    let error = health.nodes()[0].error().unwrap();
    assert!(
        error.contains(&format!("127.0.0.1:{}", server.port())),
        "{error}"
    );
    assert!(health.to_string().contains("NOT READY"), "{health}");
}

/// A client built lazily while Redis is down is a readiness probe: not ready, no error.
#[tokio::test]
async fn a_lazy_client_probes_a_redis_that_is_down() {
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let locks = LockClient::builder(&format!("redis://127.0.0.1:{port}"))
        .build_lazy()
        .unwrap();
    let health = locks.health().await;
    assert!(!health.is_ready(), "{health}");
    assert!(
        health.nodes()[0].error().unwrap().contains("cannot reach"),
        "{health}"
    );
}

/// Sentinel: the master the sentinels name now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_shows_the_master_the_sentinels_name() {
    let sentinel = RedisSentinel::start();
    let locks = built(LockClient::builder(&sentinel.url())).await;
    let health = locks.health().await;
    shown("Sentinel", &health);
    assert!(health.is_ready(), "{health}");
    assert!(health.deployment().starts_with("sentinel `"), "{health}");
    let node = &health.nodes()[0];
    assert_eq!(node.role(), NodeRole::Master);
    assert_eq!(
        node.address(),
        format!("127.0.0.1:{}", sentinel.master().port())
    );
}

/// Cluster: every node, each master with its slots; not ready once a slot's master is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_is_ready_while_every_slots_master_answers() {
    let mut cluster = RedisCluster::start(3, 0);
    let locks = built(
        LockClient::cluster_builder(cluster.seed_urls())
            .response_timeout(Duration::from_millis(500)),
    )
    .await;
    let health = locks.health().await;
    shown("Cluster", &health);
    assert!(health.is_ready(), "{health}");
    assert_eq!(health.nodes().len(), 3);
    let slots: usize = health.nodes().iter().filter_map(|node| node.slots()).sum();
    assert_eq!(slots, 16_384);

    let killed = cluster.kill_master_now("down:1");
    let health = locks.health().await;
    shown("Cluster, one master down", &health);
    assert!(!health.is_ready(), "{health}");
    assert!(
        health.verdict().contains("slots have no master"),
        "{health}"
    );
    let down = health
        .nodes()
        .iter()
        .find(|node| node.address().ends_with(&format!(":{killed}")))
        .expect("the killed master is shown");
    assert!(!down.answers(), "{health}");
}

/// Redlock: ready while a majority of the masters answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_is_ready_while_a_majority_of_masters_answers() {
    let mut masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let locks = built(LockClient::redlock_builder(&urls)).await;
    let health = locks.health().await;
    shown("Redlock", &health);
    assert!(health.is_ready(), "{health}");
    assert_eq!(health.answering(), 3);

    masters[2].kill();
    let health = locks.health().await;
    shown("Redlock, one master down", &health);
    assert!(health.is_ready(), "{health}");
    assert_eq!(health.answering(), 2);
    assert_eq!(health.verdict(), "2 of 3 masters answer (2 needed)");
    let down = &health.nodes()[2];
    assert_eq!(down.address(), format!("127.0.0.1:{}", masters[2].port()));
    assert!(down.error().unwrap().contains("cannot reach"), "{health}");

    masters[1].kill();
    let health = locks.health().await;
    shown("Redlock, two masters down", &health);
    assert!(!health.is_ready(), "{health}");
}

#[tokio::test(start_paused = true)]
async fn in_memory_is_always_ready() {
    let health = LockClient::in_memory().health().await;
    assert!(health.is_ready(), "{health}");
    assert_eq!(health.deployment(), "in memory");
}
