//! Graceful shutdown against a process that exits: a SIGTERM wired to `LockClient::shutdown`
//! frees its locks at once, where a process that just dies leaves them to expire with their
//! lease. And a shutdown that cannot reach Redis still ends within its timeout.
//!
//! Figures worth reporting are printed with `eprintln!`, which nextest shows for failing tests
//! and `--no-capture` always.

mod common;

use std::time::{Duration, Instant};

use common::{Worker, get, pttl};
use lockmacro_runtime::{LockClient, LockError, LockOptions};
use testkit::RedisServer;

/// SIGTERM → `shutdown()`: the next owner finds the 30 s lock free within a moment; SIGKILL: the
/// lock stays until its lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_exit_frees_its_locks_at_once_and_a_crash_leaves_them_for_the_ttl() {
    let server = RedisServer::start();
    let graceful = Worker::spawn(&["hold-graceful", &server.url(), "exit:graceful", "30000"]);
    graceful.line_starting("held", Duration::from_secs(10));
    let terminated_at = Instant::now();
    graceful.signal(libc::SIGTERM);
    graceful.line_starting("shut down", Duration::from_secs(10));
    let freed_after = terminated_at.elapsed();
    assert_eq!(
        get(&server, "exit:graceful").await,
        None,
        "released before the process ended"
    );

    let crashed = Worker::spawn(&["hold", &server.url(), "exit:crashed", "30000"]);
    crashed.line_starting("held", Duration::from_secs(10));
    crashed.signal(libc::SIGKILL);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let left = pttl(&server, "exit:crashed").await;
    eprintln!(
        "lock of a 30 s lease after the process ends: SIGTERM + shutdown() freed it in {freed_after:?}; \
         after SIGKILL it stays, {left} ms left"
    );
    assert!(freed_after < Duration::from_secs(2), "{freed_after:?}");
    assert!(
        left > 25_000,
        "a crashed holder's lock stays for its lease: {left} ms left"
    );
}

/// A shutdown whose releases get no answer (Redis frozen) still returns within its timeout, with
/// an error that says the releases go on in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_against_a_frozen_redis_ends_within_its_timeout() {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url())
        .response_timeout(Duration::from_millis(300))
        .shutdown_timeout(Duration::from_millis(800))
        .build()
        .await
        .unwrap();
    let _lease = locks
        .acquire("frozen:1", LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    server.pause();
    let started = Instant::now();
    let outcome = locks.shutdown().await;
    let took = started.elapsed();
    server.resume();
    match &outcome {
        Err(error @ LockError::Redis { .. }) => {
            let message = error.to_string();
            assert!(
                message.contains("1 of 1 releases") && message.contains("timeout of 800ms"),
                "names the shutdown timeout: {message}"
            );
        }
        other => panic!("expected a Redis error, got {other:?}"),
    }
    assert!(
        took >= Duration::from_millis(800),
        "gave up before its timeout: {took:?}"
    );
    assert!(took < Duration::from_secs(2), "{took:?}");
    // Retried in the background once Redis answers again.
    common::key_gone(&server, "frozen:1", Duration::from_secs(5)).await;
}

/// A Redis that stalls at SIGTERM and comes back within the shutdown timeout still gets every
/// release: they are sent again until confirmed, for up to the shutdown timeout (10 s by
/// default), not given up after the 1 s response timeout (which left every lock held for its
/// ttl, with an error naming the 10 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_outlasts_a_redis_stall_shorter_than_its_timeout() {
    const LEASES: usize = 100;
    const STALL: Duration = Duration::from_secs(3);
    let server = std::sync::Arc::new(RedisServer::start());
    // The default timeouts: 1 s a response, 2 s a connection, 10 s the shutdown.
    let locks = LockClient::connect(&server.url()).await.unwrap();
    let mut leases = Vec::new();
    for i in 0..LEASES {
        let options = LockOptions::new().ttl(Duration::from_secs(30));
        leases.push(locks.acquire(format!("stall:{i}"), options).await.unwrap());
    }
    server.pause();
    let stopped_at = Instant::now();
    let resumed = tokio::spawn({
        let server = server.clone();
        async move {
            tokio::time::sleep(STALL).await;
            server.resume();
        }
    });
    let outcome = locks.shutdown().await;
    let took = stopped_at.elapsed();
    resumed.await.unwrap();
    outcome.expect("every release confirmed once Redis came back");
    assert!(took >= STALL, "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    for i in 0..LEASES {
        assert_eq!(get(&server, &format!("stall:{i}")).await, None, "stall:{i}");
    }
    eprintln!("{LEASES} leases, Redis stopped for {STALL:?} at shutdown: all released in {took:?}");
}
