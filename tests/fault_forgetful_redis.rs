//! Redis itself drops, forgets or holds the unexpected: an evicted lock key, a flushed script
//! cache, a lock key replaced by a value of another type.
//!
//! Figures worth reporting are printed with `eprintln!`, which nextest shows for failing tests
//! and `--no-capture` always.

mod common;

use std::time::{Duration, Instant};

use common::{assert_clean, client_for, dropped_at, get, opts, start_holder};
use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions, LostReason, protocol};
use redis::AsyncCommands;
use testkit::RedisServer;
use tokio::sync::oneshot;

/// Under `maxmemory-policy volatile-ttl` a lock key, having the nearest expiry, is the first
/// thing Redis evicts under memory pressure: the holder must learn that it lost the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_lock_key_is_reported_lost() {
    let server = RedisServer::start_with(&[
        "--maxmemory",
        "2mb",
        "--maxmemory-policy",
        "volatile-ttl",
        "--maxmemory-samples",
        "10",
    ]);
    let locks = client_for(&server.url(), 50, 500).await;
    let key = "evict:lock";
    let (dropped, holder) = start_holder(
        &locks,
        key,
        LockOptions::new()
            .ttl(Duration::from_millis(1_500))
            .unlimited_renewals(),
    )
    .await;

    let mut conn = server.connection().await;
    let filler = "x".repeat(16 * 1024);
    let mut written = 0;
    while get(&server, key).await.is_some() {
        assert!(written < 2_000, "the lock key was never evicted");
        let _: () = conn
            .set_ex(format!("evict:fill:{written}"), &filler, 3_600)
            .await
            .expect("filler write");
        written += 1;
    }
    let evicted_at = Instant::now();
    let dropped_at = dropped_at(dropped, Duration::from_secs(3)).await;
    let outcome = holder.await.unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { ref key, reason: LostReason::Gone }) if key == "evict:lock"),
        "{outcome:?}"
    );
    let noticed = dropped_at.saturating_duration_since(evicted_at);
    assert!(
        noticed <= Duration::from_millis(1_500),
        "noticed the eviction {noticed:?} later"
    );
    eprintln!(
        "eviction: lock key evicted after {written} filler writes; work cancelled {noticed:?} later"
    );
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    assert_clean(&server, &locks, "evict:*").await;
}

/// `SCRIPT FLUSH` (or a failover to a replica without the scripts) mid-hold: the watchdog meets
/// `NOSCRIPT`, reloads, and renewals go on; release and a fenced acquire work after it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_hold_keeps_renewals_going() {
    let server = RedisServer::start();
    let locks = client_for(&server.url(), 50, 500).await;
    let (flushed_tx, flushed) = oneshot::channel::<()>();
    let (ready_tx, ready) = oneshot::channel::<u32>();
    let holder = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked("flush:1", opts(600).unlimited_renewals(), async move {
                    let lock = LockContext::current().unwrap();
                    while lock.renewals() < 2 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    ready_tx.send(lock.renewals()).unwrap();
                    flushed.await.unwrap();
                    let at_flush = lock.renewals();
                    // Three more renewals need ~600 ms; the lease itself is 600 ms.
                    tokio::time::sleep(Duration::from_millis(1_000)).await;
                    (at_flush, lock.renewals())
                })
                .await
        }
    });
    ready.await.unwrap();
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]), redis::Value::Okay);
    flushed_tx.send(()).unwrap();
    let (at_flush, at_end) = holder
        .await
        .unwrap()
        .expect("no lease lapses across SCRIPT FLUSH");
    assert!(
        at_end >= at_flush + 3,
        "renewals stalled after SCRIPT FLUSH: {at_flush} then {at_end}"
    );
    assert_eq!(
        get(&server, "flush:1").await,
        None,
        "released after the flush"
    );

    assert_eq!(server.command(&["SCRIPT", "FLUSH"]), redis::Value::Okay);
    let fence = locks
        .run_locked("flush:2", opts(600).fencing(true), async {
            LockContext::current().unwrap().fencing_token()
        })
        .await
        .expect("the acquire script is reloaded too");
    assert!(fence.is_some());
    eprintln!("SCRIPT FLUSH: renewals went from {at_flush} to {at_end} within 1 s after the flush");
    let counter = protocol::Names::default().fencing_counter("flush:2");
    let _ = server.command(&["DEL", &counter]);
    assert_clean(&server, &locks, "flush:*").await;
}

/// A lock key replaced by a hash fails the renewal script of its batch with WRONGTYPE unless the
/// script is careful: the replaced lease must be `Lost`, and the others renewed in the same call
/// must live on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_replaced_by_another_type_is_lost_and_its_batch_lives_on() {
    let server = RedisServer::start();
    let locks = client_for(&server.url(), 50, 500).await;
    let options = LockOptions::new()
        .ttl(Duration::from_millis(600))
        .unlimited_renewals();
    // Taken together, so their renewals share one script call.
    let replaced = locks.acquire("typed:replaced", options).await.unwrap();
    let kept = locks.acquire("typed:kept", options).await.unwrap();
    let mut conn = server.connection().await;
    let () = redis::pipe()
        .del("typed:replaced")
        .hset("typed:replaced", "field", "value")
        .query_async(&mut conn)
        .await
        .unwrap();
    let work_of_the_replaced = replaced.run(std::future::pending::<()>());
    let outcome = tokio::time::timeout(Duration::from_secs(3), work_of_the_replaced)
        .await
        .expect("the replaced lease ends at its next renewal");
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
    // The other lease outlives several of its ttls.
    let renewals = kept
        .run(async {
            tokio::time::sleep(Duration::from_millis(2_000)).await;
            LockContext::current().unwrap().renewals()
        })
        .await
        .expect("the other lease of the batch lives on");
    assert!(renewals >= 3, "{renewals}");
    assert_eq!(
        common::holder(&server, "typed:kept").await.as_deref(),
        Some(kept.token())
    );
    kept.release().await.unwrap();
    drop(replaced);
    let kind: String = redis::cmd("TYPE")
        .arg("typed:replaced")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(kind, "hash", "the other owner's value is left alone");
}

/// A restart that loses the data (no persistence) stops a holder when its client's connection
/// is back, not at its next renewal: the subscription that reopens checks every lease at once.
/// With a 60 s lease the next renewal would come 20 s after it was taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_that_lost_the_key_stops_its_holder_when_the_client_reconnects() {
    let mut server = RedisServer::start();
    let locks = LockClient::builder(&server.url())
        .build()
        .await
        .expect("client connects");
    let lease = locks
        .acquire(
            "restart:lock",
            LockOptions::new()
                .ttl(Duration::from_secs(60))
                .unlimited_renewals(),
        )
        .await
        .unwrap();
    let holder = tokio::spawn(async move { lease.run(std::future::pending::<()>()).await });
    let restarted_at = Instant::now();
    let _server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(15), holder)
        .await
        .expect("the holder learns of the loss before its next renewal (20 s)")
        .unwrap();
    assert!(
        matches!(
            outcome,
            Err(LockError::Lost {
                reason: LostReason::Gone,
                ..
            })
        ),
        "{outcome:?}"
    );
    eprintln!(
        "holder stopped {:?} after the restart began",
        restarted_at.elapsed()
    );
}
