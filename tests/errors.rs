//! Errors that say what happened and what to do: credentials refused or missing, a peer that is
//! no Redis, sentinels that name no master, a Redlock given one server twice, a cluster node
//! taken for one server. Every password stays out of every message.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::opts;
use lockmacro_runtime::{LockClient, LockError};
use testkit::{RedisCluster, RedisServer};

fn message(outcome: Result<LockClient, LockError>) -> String {
    match outcome {
        Ok(client) => panic!("built {client:?}"),
        Err(error) => error.to_string(),
    }
}

/// A port that answers like an HTTP server: whatever it reads, a `400 Bad Request`.
fn http_peer() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut request = [0; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    port
}

/// A free loopback port nobody listens on.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Regression: a wrong password read "cannot reach"; a missing one gave eight `NOAUTH`
/// pipeline failures with no hint.
#[tokio::test]
async fn refused_or_missing_credentials_say_so_and_what_to_write() {
    let server = RedisServer::start();
    server.command(&["ACL", "SETUSER", "app", "on", ">right", "~*", "&*", "+@all"]);
    server.command(&["CONFIG", "SET", "requirepass", "default-pw"]);
    let port = server.port();

    for url in [
        format!("redis://app:wrong-pw@127.0.0.1:{port}"),
        format!("redis://:wrong-pw@127.0.0.1:{port}"),
    ] {
        let said = message(LockClient::connect(&url).await);
        assert!(
            said.contains(&format!("authentication to 127.0.0.1:{port} failed")),
            "{said}"
        );
        assert!(!said.contains("cannot reach"), "{said}");
        assert!(!said.contains("wrong-pw"), "{said}");
    }

    let said = message(LockClient::connect(&format!("redis://127.0.0.1:{port}")).await);
    assert!(said.contains("requires a password"), "{said}");
    assert!(said.contains("redis://:password@host:port"), "{said}");
    assert_eq!(
        said.matches("NOAUTH").count(),
        1,
        "one error, not one per script: {said}"
    );

    LockClient::connect(&format!("redis://app:right@127.0.0.1:{port}"))
        .await
        .expect("the right password is taken");
}

/// Regression: a peer that is no Redis gave "Parse error at 1 / Unexpected `84`".
#[tokio::test]
async fn a_peer_that_does_not_speak_resp_is_named_as_such() {
    let port = http_peer();
    let said = message(LockClient::connect(&format!("redis://127.0.0.1:{port}")).await);
    assert!(
        said.contains(&format!("127.0.0.1:{port} does not speak RESP")),
        "{said}"
    );
    assert!(said.contains("Redis or Valkey server"), "{said}");
}

/// Regression: Sentinel errors named no address, and the documented URL of several sentinels
/// printed as `<malformed url>` in `Debug` and in errors.
#[tokio::test]
async fn sentinel_errors_name_the_sentinels_and_the_service_and_urls_show_redacted() {
    let (a, b) = (closed_port(), closed_port());
    let url = format!("redis+sentinel://:s3cret@127.0.0.1:{a},127.0.0.1:{b}/orders");
    let said = message(LockClient::connect(&url).await);
    assert!(
        said.contains(&format!("127.0.0.1:{a}, 127.0.0.1:{b}")) && said.contains("`orders`"),
        "{said}"
    );
    assert!(!said.contains("s3cret"), "{said}");

    let client = LockClient::builder(&url).build_lazy().unwrap();
    let shown = format!("{client:?}");
    assert!(
        shown.contains(&format!(
            "redis+sentinel://:***@127.0.0.1:{a},127.0.0.1:{b}/orders"
        )),
        "{shown}"
    );
    let bad = "redis+sentinel://:s3cret@h1:26379,h2:port/orders";
    let said = message(LockClient::builder(bad).build_lazy());
    assert!(
        said.contains("redis+sentinel://:***@h1:26379,h2:port/orders") && said.contains("port"),
        "{said}"
    );
    assert!(
        !said.contains("s3cret") && !said.contains("malformed"),
        "{said}"
    );
}

/// Regression: the same master given three times built a Redlock whose free keys read `Busy`.
#[tokio::test]
async fn a_redlock_given_one_server_twice_is_refused_when_built() {
    let server = RedisServer::start();
    let url = server.url();
    for masters in [
        vec![url.clone(), url.clone(), url.clone()],
        vec![url.clone(), format!("{url}/0"), RedisServer::start().url()],
    ] {
        match LockClient::redlock_builder(&masters).build_lazy() {
            Err(LockError::Config { message }) => {
                assert!(message.contains("independent masters"), "{message}");
            }
            other => panic!("{masters:?}: expected Config, got {other:?}"),
        }
    }
    // Another database of the same server is another keyspace: accepted.
    LockClient::redlock_builder([format!("{url}/1"), format!("{url}/2"), format!("{url}/3")])
        .build_lazy()
        .unwrap();
}

/// Regression: `builder` on a cluster node built, then failed key by key (the command line
/// alone detected it). Now the build says so; a client built lazily says so at its first key
/// of another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_taken_for_one_server_is_refused_when_built() {
    let cluster = RedisCluster::start(3, 0);
    let node = cluster.masters()[0].url();
    match LockClient::builder(&node).build().await {
        Err(LockError::Config { message }) => {
            assert!(message.contains("Redis Cluster node"), "{message}");
            assert!(message.contains("cluster_builder"), "{message}");
        }
        other => panic!("expected Config, got {other:?}"),
    }
    let lazy = LockClient::builder(&node)
        .response_timeout(Duration::from_secs(2))
        .build_lazy()
        .unwrap();
    let elsewhere = (0..100)
        .map(|i| format!("elsewhere:{i}"))
        .find(|key| cluster.master_of(key).url() != node)
        .unwrap();
    let outcome = lazy.run_locked(elsewhere, opts(5_000), async {}).await;
    assert!(
        matches!(&outcome, Err(LockError::Config { message }) if message.contains("cluster_builder")),
        "{outcome:?}"
    );
}
