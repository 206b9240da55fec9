//! Waiters whose release subscription fails: they go by the holder's remaining lease at once,
//! a release that went by while they could not hear it is looked for once they can again, and a
//! subscription lost for one key does not leave the waiters of other keys deaf.

mod common;

use std::time::Duration;

use common::{eventually, get, opts, waiter_subscribed};
use lockmacro_runtime::{LockClient, LockError, protocol};
use redis::AsyncCommands;
use testkit::RedisServer;
use tokio::time::Instant;

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
            "dead-holder",
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
    // The waiter's user may not subscribe until the test allows it.
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
    // Another client holds the key: its release is announced, never handed over.
    let holding = client(server.url()).await;
    let held = holding.acquire("gap:1", opts(30_000)).await.unwrap();
    let waiter = tokio::spawn(async move {
        waiting
            .run_locked("gap:1", opts(5_000).wait(Duration::from_secs(20)), async {
                Instant::now()
            })
            .await
    });
    // Unsubscribed, the waiter looks at the key after each failed try to subscribe, and those
    // tries come ever less often (backoff to 2 s). Two looks far enough apart mean the next try
    // comes well after the release below.
    let mut last = next_look(&server, "gap:1").await;
    loop {
        let look = next_look(&server, "gap:1").await;
        if look - last >= Duration::from_millis(1_200) {
            break;
        }
        last = look;
    }
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

/// When the waiter next looks at `key`: a look of a waiter marks the holder's value (a trailing
/// mark, so that its release is announced); the mark is cleared here and awaited again.
async fn next_look(server: &RedisServer, key: &str) -> Instant {
    let value = get(server, key).await.expect("the key is held");
    let holder = protocol::holder_token(&value);
    server.command(&["SET", key, holder, "XX", "KEEPTTL"]);
    eventually(Duration::from_secs(5), "the waiter looks again", || async {
        get(server, key)
            .await
            .is_some_and(|value| protocol::is_waited_for(&value))
    })
    .await;
    Instant::now()
}

/// When unsubscribing fails (Redis stalled while one waiter leaves), the subscription is
/// reopened for every other waited-for key: a waiter on another key still hears its release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_unsubscribe_leaves_no_other_waiter_deaf() {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url())
        .scan_interval(Duration::from_millis(100))
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap();
    let long = opts(30_000).unlimited_renewals();
    let holder_a = locks.acquire("unsub:a", long).await.unwrap();
    let holder_b = locks.acquire("unsub:b", long).await.unwrap();
    let waiter_b = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked(
                    "unsub:b",
                    opts(5_000).wait(Duration::from_secs(20)),
                    async { Instant::now() },
                )
                .await
        }
    });
    let waiter_a = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked(
                    "unsub:a",
                    opts(5_000).wait(Duration::from_millis(600)),
                    async {},
                )
                .await
        }
    });
    waiter_subscribed(&server, "unsub:a").await;
    waiter_subscribed(&server, "unsub:b").await;
    // Stalled while waiter A's wait runs out: its UNSUBSCRIBE gets no answer.
    server.pause();
    let outcome_a = waiter_a.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    server.resume();
    // Its last look at the key may have met the stall too.
    assert!(
        matches!(
            outcome_a,
            Err(LockError::Busy { .. } | LockError::Redis { .. })
        ),
        "{outcome_a:?}"
    );
    // The subscription is back for B (reopened after the failure).
    waiter_subscribed(&server, "unsub:b").await;
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
