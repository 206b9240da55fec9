//! Network faults between a client and Redis: a blackholed server at acquire, slow and
//! blackholed links mid-hold, replies later than the lease, replies lost on the way back.
//!
//! Figures worth reporting are printed with `eprintln!`, which nextest shows for failing tests
//! and `--no-capture` always.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{
    acquire_when_free, assert_clean, client_for, dropped_at, eventually, fast_client, get,
    key_gone, opts, pttl, retry_until_taken, start_holder,
};
use lockmacro_runtime::{LockClient, LockError, LockOptions};
use testkit::{Fault, FaultProxy, RedisServer};

/// A partition that answers nothing (no reset, no refusal) must still end an acquire within the
/// configured timeouts, as a `Redis` error, and the body must never run: both for a client that
/// has no connection yet and for one whose connection goes silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_redis_at_acquire_is_a_redis_error_within_the_timeouts() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let timeouts = Duration::from_millis(300);
    let ran = AtomicBool::new(false);

    // No connection yet: the connect (and its handshake) hangs.
    proxy.set(Fault::Blackhole);
    let cold = LockClient::builder(&proxy.url())
        .connect_timeout(timeouts)
        .response_timeout(timeouts)
        .build_lazy()
        .unwrap();
    let started = Instant::now();
    let outcome = cold
        .run_locked("bh:cold", opts(5_000), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    let cold_took = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::Redis { ref key, .. }) if key.as_deref() == Some("bh:cold")),
        "{outcome:?}"
    );
    assert!(
        cold_took < 2 * timeouts + Duration::from_millis(200),
        "cold acquire took {cold_took:?}"
    );

    // A connection that worked, then went silent: the SET gets no answer.
    proxy.heal();
    let warm = client_for(&proxy.url(), 100, 300).await;
    proxy.set(Fault::Blackhole);
    let started = Instant::now();
    let outcome = warm
        .run_locked("bh:warm", opts(5_000), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    let warm_took = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::Redis { ref key, .. }) if key.as_deref() == Some("bh:warm")),
        "{outcome:?}"
    );
    assert!(
        warm_took < timeouts + Duration::from_millis(200),
        "warm acquire took {warm_took:?}"
    );
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body never runs without the lock"
    );
    eprintln!(
        "blackhole at acquire: cold client failed after {cold_took:?}, warm after {warm_took:?}"
    );

    proxy.heal();
    assert_clean(&server, &warm, "bh:*").await;
    assert_eq!(cold.held_leases(), 0);
}

/// A partition under a running holder: the holder stops at its deadline with `Lost`; a contender
/// on the other side of the partition, polling all along, gets the key only after the holder's
/// work was dropped; after the heal the holder's client works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_mid_hold_stops_the_holder_at_its_deadline_and_the_client_recovers_after_heal() {
    const TTL: Duration = Duration::from_millis(1_000);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let holder_client = client_for(&proxy.url(), 50, 300).await;
    let contender = client_for(&server.url(), 50, 300).await;
    let key = "part:1";
    let (dropped, holder) = start_holder(
        &holder_client,
        key,
        LockOptions::new().ttl(TTL).unlimited_renewals(),
    )
    .await;

    proxy.set(Fault::Blackhole);
    let partitioned_at = Instant::now();
    let contending = tokio::spawn({
        let contender = contender.clone();
        async move { acquire_when_free(&contender, key, opts(5_000), Duration::from_secs(4)).await }
    });
    let dropped_at = dropped_at(dropped, TTL + Duration::from_secs(2)).await;
    let stopped_after = dropped_at - partitioned_at;
    let outcome = tokio::time::timeout(Duration::from_secs(3), holder)
        .await
        .expect("the holder's call returns")
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
    // By its local deadline, one ttl after the partition at most; the bound leaves a loaded
    // machine's timers a second (the body would otherwise run on: the partition does not heal).
    eprintln!("the partitioned holder stopped {stopped_after:?} after the partition began");
    assert!(
        stopped_after <= TTL + Duration::from_secs(1),
        "stopped {stopped_after:?} after the partition began"
    );
    let (won_at, lease) = contending.await.unwrap();
    assert!(
        won_at > dropped_at,
        "the contender won {:?} before the partitioned holder stopped",
        dropped_at - won_at
    );
    let margin = won_at - dropped_at;

    proxy.heal();
    let healed_at = Instant::now();
    let recovered = eventually(
        Duration::from_secs(3),
        "holder's client recovers after heal",
        || async {
            holder_client
                .run_locked("part:after-heal", opts(1_000), async {})
                .await
                .is_ok()
        },
    )
    .await;
    eprintln!(
        "blackhole mid-hold, ttl {TTL:?}: holder stopped {stopped_after:?} after the partition; contender won {margin:?} later; client recovered {recovered:?} after heal (overlap 0)"
    );
    assert_eq!(
        common::holder(&server, key).await.as_deref(),
        Some(lease.token())
    );
    lease.release().await.unwrap();
    // The healed client can take the contested key again, too.
    holder_client
        .run_locked(key, opts(1_000), async {})
        .await
        .expect("the healed client takes the key again");
    assert!(healed_at.elapsed() < Duration::from_secs(5));
    assert_clean(&server, &holder_client, "part:*").await;
}

/// A reply that arrives after the lease would have ended is worthless: the acquire fails, the
/// body never runs, our key (which did land) is removed, and retrying after the link recovers is
/// never answered "busy" by our own leftover key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_later_than_the_ttl_means_not_acquired_and_our_key_is_removed() {
    const TTL: Duration = Duration::from_millis(400);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = client_for(&proxy.url(), 50, 2_000).await;
    let key = "slow:1";

    proxy.set(Fault::Delay(Duration::from_millis(600)));
    let ran = AtomicBool::new(false);
    let started = Instant::now();
    let outcome = locks
        .run_locked(key, LockOptions::new().ttl(TTL), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    let failed_after = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "a reply later than the ttl must not count as acquired: {outcome:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the body never runs");
    assert!(
        failed_after < TTL + Duration::from_millis(100),
        "gave up after {failed_after:?}, later than the ttl"
    );

    // Our SET lands 600 ms after it was sent; watch the key on the server directly.
    let seen_ours = std::cell::Cell::new(false);
    let gone_after = eventually(Duration::from_secs(3), "our late key removed", || async {
        let there = get(&server, key).await.is_some();
        seen_ours.set(seen_ours.get() || there);
        seen_ours.get() && !there
    })
    .await;
    proxy.heal();
    // Retry on the healed link: our own leftover must never make us wait as if another held it.
    let (retried, busy) = retry_until_taken(&locks, key, Duration::from_secs(2)).await;
    eprintln!(
        "reply later than ttl: error after {failed_after:?}; our late key removed {gone_after:?} after that; retry succeeded {retried:?} after heal, busy answers: {busy}"
    );
    assert_eq!(busy, 0, "reported busy while only our own key was there");
    assert_clean(&server, &locks, "slow:*").await;
}

/// The acquire reached Redis but its reply was lost: the caller gets an error (never "held by
/// another"), our key is removed in the background long before its ttl would end, and after the
/// heal the same client takes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_whose_reply_was_lost_is_an_error_and_our_key_is_released_in_the_background() {
    const TTL: Duration = Duration::from_secs(10);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = client_for(&proxy.url(), 50, 300).await;
    // Open the watchdog's connection too (it sends background releases): one renewal.
    locks
        .run_locked("lost:warmup", opts(150), async {
            tokio::time::sleep(Duration::from_millis(200)).await;
        })
        .await
        .unwrap();
    let key = "lost:1";

    proxy.set(Fault::DropReplies);
    let ran = AtomicBool::new(false);
    let outcome = locks
        .run_locked(key, LockOptions::new().ttl(TTL), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    let failed_at = Instant::now();
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "a lost reply is a Redis error, never Busy: {outcome:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the body never runs");
    let gone_after = key_gone(&server, key, Duration::from_secs(2)).await;
    assert!(
        pttl(&server, key).await == -2,
        "our key must not sit there for its ttl"
    );

    proxy.heal();
    let (retried, busy) = retry_until_taken(&locks, key, Duration::from_secs(3)).await;
    eprintln!(
        "lost acquire reply: our key removed {gone_after:?} after the error (ttl {TTL:?}), retry succeeded {retried:?} after heal, busy answers: {busy}"
    );
    assert_eq!(busy, 0, "reported busy while only our own key was there");
    assert!(failed_at.elapsed() < TTL);
    assert_clean(&server, &locks, "lost:*").await;
}

/// A reply lost for good on a connection that stays open (a middlebox swallowing it), on an
/// acquire whose budget is cut by a short ttl, must not leave the client's connection out of
/// step: afterwards, acquires of keys that another owner holds must all be `Busy`, never taken.
/// (A multiplexed connection pairs replies with requests in order; a request given up without
/// its reply leaves a slot that swallows the next reply, which then answers the wrong request.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_never_makes_a_later_acquire_take_someone_elses_lock() {
    const TTL: Duration = Duration::from_millis(200);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    // The response timeout is longer than the ttl, so the acquire's own budget (ttl − drift)
    // is what gives up on the lost reply.
    let locks = client_for(&proxy.url(), 50, 1_000).await;
    let other = fast_client(&server).await;
    let mut held = Vec::new();
    for n in 0..10 {
        held.push(
            other
                .acquire(format!("desync:held:{n}"), opts(30_000))
                .await
                .unwrap(),
        );
    }

    proxy.set(Fault::DropReplies);
    let outcome = locks
        .acquire("desync:lost", LockOptions::new().ttl(TTL))
        .await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    proxy.heal();

    // Acquires of held and free keys, concurrently on the client's one connection.
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..10 {
        for key in [format!("desync:held:{n}"), format!("desync:free:{n}")] {
            let locks = locks.clone();
            calls.spawn(async move {
                let outcome = locks
                    .acquire(key.clone(), LockOptions::new().ttl(TTL))
                    .await;
                (key, outcome)
            });
        }
    }
    let mut stolen = Vec::new();
    let mut free_taken = 0;
    while let Some(done) = calls.join_next().await {
        let (key, outcome) = done.unwrap();
        match outcome {
            Ok(lease) if key.starts_with("desync:held:") => {
                stolen.push(key);
                drop(lease);
            }
            Ok(lease) => {
                free_taken += 1;
                drop(lease);
            }
            Err(_) => {}
        }
    }
    for lease in held {
        let token = lease.token().to_owned();
        assert_eq!(
            common::holder(&server, lease.key()).await.as_deref(),
            Some(token.as_str()),
            "the other owner's key was touched"
        );
        lease.release().await.unwrap();
    }
    eprintln!(
        "after a lost reply: {} held keys reported taken, {free_taken}/10 free keys taken",
        stolen.len()
    );
    assert!(
        stolen.is_empty(),
        "acquires reported keys held by another owner as taken: {stolen:?}"
    );
    eventually(
        Duration::from_secs(3),
        "client recovers after heal",
        || async {
            locks
                .run_locked("desync:after", opts(1_000), async {})
                .await
                .is_ok()
        },
    )
    .await;
    assert_clean(&server, &locks, "desync:*").await;
}
