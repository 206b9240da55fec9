//! Waiters whose release subscription fails: they go by the holder's remaining lease at once,
//! a release that went by while they could not hear it is looked for once they can again, and a
//! subscription lost for one key does not leave the waiters of other keys deaf.

mod common;

use std::time::Duration;

use common::{Log, eventually, get, listeners_in, opts, waiter_subscribed};
use lockmacro_runtime::{LockClient, protocol};
use redis::AsyncCommands;
use testkit::{Fault, FaultProxy, RedisServer};
use tokio::time::Instant;

/// What the client logs when the `UNSUBSCRIBE` of waiter A's key got no answer (`waiters.rs`).
const UNSUBSCRIBE_FAILED: &str = "unsubscribing failed key=unsub:a";

/// A waiter whose subscription is refused (here an ACL that grants no channel) goes by the
/// holder's remaining lease: a key whose holder died takes over when it expires, not when the
/// wait runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_cannot_subscribe_goes_by_the_holders_remaining_lease() {
    let server = RedisServer::start();
    server.command(&[
        "ACL",
        "SETUSER",
        "deaf",
        "on",
        ">deaf-pw",
        "~*",
        "+@all",
        "resetchannels",
    ]);
    let url = format!("redis://deaf:deaf-pw@127.0.0.1:{}", server.port());
    let locks = LockClient::builder(&url)
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    // A holder that died: its key lives 800 ms more and nobody will announce its end.
    let mut conn = server.connection().await;
    let () = conn
        .set_options(
            "deaf:1",
            protocol::Origin::new("dead-host", 1, "dead-holder").value(&"d".repeat(32), 0),
            redis::SetOptions::default().with_expiration(redis::SetExpiry::PX(800)),
        )
        .await
        .unwrap();
    let started = Instant::now();
    let outcome = locks
        .run_locked("deaf:1", opts(5_000).wait(Duration::from_secs(5)), async {})
        .await;
    let took = started.elapsed();
    assert!(outcome.is_ok(), "{outcome:?}");
    assert!(
        took >= Duration::from_millis(700),
        "taken before the key expired: {took:?}"
    );
    assert!(
        took < Duration::from_millis(2_500),
        "taken long after the key expired: {took:?}"
    );
}

/// A release announced while a waiter's client could not subscribe is not missed: once the
/// subscription is back, its waiters look at the key again instead of sleeping out the holder's
/// remaining lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_unheard_while_the_subscription_was_down_is_looked_for_once_it_is_back() {
    let server = RedisServer::start();
    let (waiting, holding) = a_deaf_waiter_and_a_holder(&server).await;
    let held = holding.acquire("gap:1", opts(30_000)).await.unwrap();
    let waiter = tokio::spawn(async move {
        waiting
            .run_locked("gap:1", opts(5_000).wait(Duration::from_secs(20)), async {
                Instant::now()
            })
            .await
    });
    // The next try comes well after the release below.
    tries_at_their_longest(&server, "gap:1").await;
    // Announced while nobody can hear it; then subscribing is allowed again.
    let released_at = Instant::now();
    held.release().await.unwrap();
    server.command(&["ACL", "SETUSER", "waiter", "allchannels"]);
    // Without looking again it would sleep until its wait runs out, about 15 s from here.
    let ran_at = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter looks again once it is subscribed")
        .unwrap()
        .unwrap();
    let took = ran_at - released_at;
    assert!(
        took < Duration::from_secs(5),
        "the waiter took the lock {took:?} after the release"
    );
}

/// A key newly waited for while the subscription is down has it reopened (at once, or at the
/// backoff's next try, at most 250 ms apart), and hears its release: unsubscribed, the waiter
/// would sleep out the holder's whole lease after a release it cannot hear. (Seen in the safety
/// campaign: after a Sentinel failover a new waiter slept through a release.) How soon is the
/// simulator's to bound; this test reports it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_newly_waited_for_reopens_a_lost_subscription() {
    let server = RedisServer::start();
    let (waiting, holding) = a_deaf_waiter_and_a_holder(&server).await;
    let first = holding.acquire("reopen:1", opts(30_000)).await.unwrap();
    let second = holding.acquire("reopen:2", opts(30_000)).await.unwrap();
    let wait = || opts(5_000).wait(Duration::from_secs(20));
    let first_waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.run_locked("reopen:1", wait(), async {}).await }
    });
    let tried = tries_at_their_longest(&server, "reopen:1").await;
    // Redis lets it subscribe now. A new key reopens the subscription unless it was tried a
    // moment (100 ms) ago: wait that out.
    server.command(&["ACL", "SETUSER", "waiter", "allchannels"]);
    tokio::time::sleep(Duration::from_millis(120)).await;
    let second_waiter = tokio::spawn({
        let waiting = waiting.clone();
        async move { waiting.run_locked("reopen:2", wait(), async {}).await }
    });
    waiter_subscribed(&server, "reopen:2").await;
    eprintln!("subscribed {:?} after the last failed try", tried.elapsed());
    first.release().await.unwrap();
    second.release().await.unwrap();
    for waiter in [first_waiter, second_waiter] {
        let outcome = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("each waiter hears its release")
            .unwrap();
        assert!(outcome.is_ok(), "{outcome:?}");
    }
}

/// A client whose user may not subscribe until the test allows it (`ACL SETUSER waiter
/// allchannels`), and a client of another user that holds keys: its releases are announced,
/// never handed over.
async fn a_deaf_waiter_and_a_holder(server: &RedisServer) -> (LockClient, LockClient) {
    server.command(&[
        "ACL",
        "SETUSER",
        "waiter",
        "on",
        ">waiter-pw",
        "~*",
        "+@all",
        "resetchannels",
    ]);
    let client = |url: String| async move {
        LockClient::builder(&url)
            .scan_interval(Duration::from_millis(100))
            .build()
            .await
            .unwrap()
    };
    let waiting = client(format!(
        "redis://waiter:waiter-pw@127.0.0.1:{}",
        server.port()
    ))
    .await;
    (waiting, client(server.url()).await)
}

/// Returns once the deaf waiter of `key` has just looked after a failed try to subscribe, with
/// its tries at their longest apart (the backoff's cap, 250 ms less a quarter of jitter): its
/// next try is at least 187 ms away. Unsubscribed, a waiter looks at the key after each failed
/// try, and the tries come ever less often.
async fn tries_at_their_longest(server: &RedisServer, key: &str) -> Instant {
    let mut last = next_look(server, key).await;
    loop {
        let look = next_look(server, key).await;
        if look - last >= Duration::from_millis(180) {
            return look;
        }
        last = look;
    }
}

/// When the waiter next looks at `key`: a look of a waiter marks the holder's value (a trailing
/// mark, so that its release is announced); the mark is cleared here and awaited again.
async fn next_look(server: &RedisServer, key: &str) -> Instant {
    let value = get(server, key).await.expect("the key is held");
    let holder = protocol::Stored::parse(&value).expect("a lock").holder;
    server.command(&["SET", key, holder, "XX", "KEEPTTL"]);
    eventually(Duration::from_secs(5), "the waiter looks again", || async {
        get(server, key)
            .await
            .is_some_and(|value| protocol::is_waited_for(&value))
    })
    .await;
    Instant::now()
}

/// When unsubscribing fails (no answer while one waiter leaves), the subscription is reopened
/// for every other waited-for key: a waiter on another key still hears its release.
///
/// Only the subscription's connection is cut off (a proxy swallows what it carries), while
/// the client's commands go through: the failure wakes the other waiter to look (a release may
/// have gone by unheard), and a look at a Redis that does not answer would end its call with
/// `LockError::Redis`, as DESIGN asks, leaving no waiter to test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_unsubscribe_leaves_no_other_waiter_deaf() {
    let log = Log::everywhere();
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = LockClient::builder(&proxy.url())
        .scan_interval(Duration::from_millis(100))
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let long = opts(30_000).unlimited_renewals();
    let holder_a = locks.acquire("unsub:a", long).await.unwrap();
    let holder_b = locks.acquire("unsub:b", long).await.unwrap();
    let waiter = |key: &'static str| {
        let locks = locks.clone();
        tokio::spawn(async move {
            locks
                .run_locked(key, opts(5_000).wait(Duration::from_secs(20)), async {
                    Instant::now()
                })
                .await
        })
    };
    let (waiter_a, waiter_b) = (waiter("unsub:a"), waiter("unsub:b"));
    waiter_subscribed(&server, "unsub:a").await;
    waiter_subscribed(&server, "unsub:b").await;
    // Waiter A leaves (its call is dropped) while the subscription hears nothing: its
    // UNSUBSCRIBE gets no answer.
    proxy.set(Fault::BlackholeSubscribers);
    waiter_a.abort();
    assert!(waiter_a.await.unwrap_err().is_cancelled());
    log.seen(UNSUBSCRIBE_FAILED).await;
    // The failed subscription is closed; none can be opened until the proxy heals.
    eventually(
        Duration::from_secs(5),
        "the failed subscription closed",
        || async { listeners_in(&server, "lockmacro", "unsub:b").await == 0 },
    )
    .await;
    proxy.heal();
    // The subscription is back for B (reopened after the failure), and B still waits.
    waiter_subscribed(&server, "unsub:b").await;
    assert!(!waiter_b.is_finished(), "waiter B still waits");
    let released_at = Instant::now();
    holder_b.release().await.unwrap();
    let ran_at = tokio::time::timeout(Duration::from_secs(5), waiter_b)
        .await
        .expect("waiter B hears the release")
        .unwrap()
        .unwrap();
    let heard_after = ran_at - released_at;
    assert!(
        heard_after < Duration::from_secs(2),
        "waiter B woke {heard_after:?} after the release"
    );
    holder_a.release().await.unwrap();
}
