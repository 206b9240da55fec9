//! The lease engine against real redis-server processes: acquire, renew, cancel, release.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{eventually, fast_client, get, key_gone, opts};
use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};
use redis::AsyncCommands;
use testkit::RedisServer;
use tokio::sync::oneshot;

#[tokio::test]
async fn busy_key_fails_fast_and_body_never_runs() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let held = locks.acquire("orders:7", opts(5_000)).await.unwrap();

    let ran = AtomicBool::new(false);
    let started = Instant::now();
    let second = locks
        .run_locked("orders:7", opts(5_000), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;

    assert!(
        matches!(second, Err(LockError::Busy { ref key }) if key == "orders:7"),
        "{second:?}"
    );
    assert!(!ran.load(Ordering::SeqCst));
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "busy must not wait"
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn key_holds_a_fresh_random_token_with_pttl_within_ttl() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let mut conn = server.connection().await;

    let first = locks.acquire("Business1:1024", opts(3_000)).await.unwrap();
    let stored: String = conn.get("Business1:1024").await.unwrap();
    let pttl: i64 = conn.pttl("Business1:1024").await.unwrap();
    assert_eq!(stored, first.token());
    assert_eq!(stored.len(), 32, "128-bit token as hex");
    assert!(stored.chars().all(|c| c.is_ascii_hexdigit()));
    assert!(pttl > 0 && pttl <= 3_000, "pttl {pttl}");
    let first_token = stored;
    first.release().await.unwrap();

    let second = locks.acquire("Business1:1024", opts(3_000)).await.unwrap();
    assert_ne!(
        second.token(),
        first_token,
        "every acquisition gets a new token"
    );
    second.release().await.unwrap();
}

#[tokio::test]
async fn released_before_return_after_ok_and_err() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;

    let ok = locks.run_locked("jobs:ok", opts(5_000), async { 1 }).await;
    assert_eq!(ok.unwrap(), 1);
    assert_eq!(
        get(&server, "jobs:ok").await,
        None,
        "released before returning"
    );

    let err = locks
        .run_locked("jobs:err", opts(5_000), async { Err::<(), _>("failed") })
        .await;
    assert_eq!(err.unwrap(), Err("failed"));
    assert_eq!(
        get(&server, "jobs:err").await,
        None,
        "released before returning"
    );
}

#[tokio::test]
async fn released_after_panic() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let (started, running) = oneshot::channel();
    let task = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked("jobs:panic", opts(30_000), async move {
                    started.send(()).unwrap();
                    tokio::task::yield_now().await;
                    panic!("work failed");
                })
                .await
        }
    });
    running.await.unwrap();
    assert!(task.await.unwrap_err().is_panic());
    // The guard's drop hands the release to the watchdog thread: far sooner than the 30 s ttl.
    key_gone(&server, "jobs:panic", Duration::from_secs(2)).await;
}

#[tokio::test]
async fn released_when_caller_drops_future() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let (started, running) = oneshot::channel();
    let call = locks.run_locked("jobs:dropped", opts(30_000), async move {
        started.send(()).unwrap();
        std::future::pending::<()>().await
    });
    let mut call = Box::pin(call);
    tokio::select! {
        _ = &mut call => unreachable!("the work never ends"),
        _ = running => {}
    }
    assert!(get(&server, "jobs:dropped").await.is_some());
    drop(call);
    key_gone(&server, "jobs:dropped", Duration::from_secs(2)).await;
    assert_eq!(
        locks.held_leases(),
        0,
        "deregistered from the renewal queue"
    );
}

#[tokio::test]
async fn released_when_timeout_cancels_the_call() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let outcome = tokio::time::timeout(
        Duration::from_millis(200),
        locks.run_locked("jobs:timeout", opts(30_000), std::future::pending::<()>()),
    )
    .await;
    assert!(outcome.is_err());
    key_gone(&server, "jobs:timeout", Duration::from_secs(2)).await;
}

#[tokio::test]
async fn renewals_keep_a_600ms_lease_alive_past_3s() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let options = opts(600).unlimited_renewals();
    let renewals = locks
        .run_locked("reports:long", options, async {
            tokio::time::sleep(Duration::from_millis(3_200)).await;
            LockContext::current().unwrap().renewals()
        })
        .await
        .unwrap();
    assert!(
        renewals >= 5,
        "3.2 s on a 600 ms lease needs at least 5 renewals, got {renewals}"
    );
}

#[tokio::test]
async fn one_second_lease_survives_the_default_two_second_scan() {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.unwrap();
    let options = opts(1_000).unlimited_renewals();
    let outcome = locks
        .run_locked("reports:short", options, async {
            tokio::time::sleep(Duration::from_millis(2_500)).await;
        })
        .await;
    assert!(outcome.is_ok(), "{outcome:?}");
}

#[tokio::test]
async fn renewals_exhausted_after_exactly_max_renewals_and_work_dropped() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let finished = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let outcome = locks
        .run_locked("reports:exhausted", opts(600).max_renewals(2), {
            let finished = finished.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(10)).await;
                finished.store(true, Ordering::SeqCst);
            }
        })
        .await;
    let elapsed = started.elapsed();

    match outcome {
        Err(LockError::RenewalsExhausted { key, renewals }) => {
            assert_eq!(key, "reports:exhausted");
            assert_eq!(renewals, 2);
        }
        other => panic!("expected RenewalsExhausted, got {other:?}"),
    }
    // Two extensions, each sent at a third of a lease at the earliest: the last lease ends
    // no sooner than 2 × 200 ms + 600 ms − drift, and (100 ms scans) not much later.
    assert!(elapsed >= Duration::from_millis(980), "{elapsed:?}");
    assert!(elapsed < Duration::from_millis(1_600), "{elapsed:?}");
    assert!(
        !finished.load(Ordering::SeqCst),
        "the work was dropped, not finished"
    );
    assert_eq!(
        get(&server, "reports:exhausted").await,
        None,
        "released before returning"
    );
}

#[tokio::test]
async fn zero_renewals_means_at_most_one_ttl() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let started = Instant::now();
    let outcome = locks
        .run_locked(
            "reports:once",
            opts(500).max_renewals(0),
            std::future::pending::<()>(),
        )
        .await;
    assert!(
        matches!(
            outcome,
            Err(LockError::RenewalsExhausted { renewals: 0, .. })
        ),
        "{outcome:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn paused_redis_stops_the_body_at_its_local_deadline() {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url())
        .scan_interval(Duration::from_millis(100))
        .response_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    let (started, running) = oneshot::channel();
    let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<Instant>();
    let holder = tokio::spawn({
        let locks = locks.clone();
        async move {
            let guard = DropClock(Some(dropped_tx));
            locks
                .run_locked("pay:1", opts(1_000).unlimited_renewals(), async move {
                    let _guard = guard;
                    started.send(()).unwrap();
                    std::future::pending::<()>().await
                })
                .await
        }
    });
    running.await.unwrap();
    let paused_at = Instant::now();
    server.command(&["CLIENT", "PAUSE", "4000", "ALL"]);

    let dropped_at = tokio::task::spawn_blocking(move || dropped_rx.recv().unwrap())
        .await
        .unwrap();
    let stopped_after = dropped_at - paused_at;
    assert!(
        stopped_after <= Duration::from_millis(1_150),
        "body must stop by its local deadline (≤ 1 s after the pause), stopped after {stopped_after:?}"
    );
    let outcome = holder.await.unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
}

/// Sends the instant it is dropped.
struct DropClock(Option<std::sync::mpsc::Sender<Instant>>);

impl Drop for DropClock {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Instant::now());
        }
    }
}

#[tokio::test]
async fn lost_when_key_is_replaced_and_the_new_owner_keeps_it() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let (started, running) = oneshot::channel();
    let holder = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked("pay:2", opts(900).unlimited_renewals(), async move {
                    started.send(()).unwrap();
                    std::future::pending::<()>().await
                })
                .await
        }
    });
    running.await.unwrap();
    let mut conn = server.connection().await;
    let _: () = conn.set("pay:2", "someone-else").await.unwrap();

    let outcome = tokio::time::timeout(Duration::from_secs(2), holder)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { ref key }) if key == "pay:2"),
        "{outcome:?}"
    );
    assert_eq!(get(&server, "pay:2").await.as_deref(), Some("someone-else"));
}

#[tokio::test]
async fn lapsed_holder_never_deletes_the_next_owners_key() {
    // The seed's case 2: A's lease lapses, B takes the lock, then A finishes and releases.
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let a = locks
        .acquire("stock:9", opts(300).max_renewals(0))
        .await
        .unwrap();
    key_gone(&server, "stock:9", Duration::from_secs(2)).await;
    let b = locks.acquire("stock:9", opts(30_000)).await.unwrap();

    a.release().await.unwrap();
    assert_eq!(get(&server, "stock:9").await.as_deref(), Some(b.token()));

    let a_again = locks
        .acquire("stock:10", opts(300).max_renewals(0))
        .await
        .unwrap();
    key_gone(&server, "stock:10", Duration::from_secs(2)).await;
    let b_again = locks.acquire("stock:10", opts(30_000)).await.unwrap();
    drop(a_again);
    // The drop-time release runs on the watchdog thread; a later release on the same path
    // proves the first one has been processed.
    b.release().await.unwrap();
    let probe = locks.acquire("stock:probe", opts(30_000)).await.unwrap();
    drop(probe);
    key_gone(&server, "stock:probe", Duration::from_secs(2)).await;
    assert_eq!(
        get(&server, "stock:10").await.as_deref(),
        Some(b_again.token())
    );
}

#[tokio::test]
async fn unreachable_redis_is_a_redis_error_in_bounded_time() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();

    let started = Instant::now();
    let connect = LockClient::builder(&url)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await;
    assert!(
        matches!(connect, Err(LockError::Redis { .. })),
        "{connect:?}"
    );

    let locks = LockClient::builder(&url)
        .connect_timeout(Duration::from_millis(500))
        .build_lazy()
        .unwrap();
    let ran = AtomicBool::new(false);
    let outcome = locks
        .run_locked("pay:3", opts(1_000), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    assert!(
        matches!(outcome, Err(LockError::Redis { ref key, .. }) if key.as_deref() == Some("pay:3")),
        "{outcome:?}"
    );
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body never runs without the lock"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn recovers_after_redis_is_killed_and_restarted() {
    let mut server = RedisServer::start();
    let locks = fast_client(&server).await;
    locks
        .run_locked("pay:4", opts(1_000), async {})
        .await
        .unwrap();

    server.kill();
    let down = locks.run_locked("pay:4", opts(1_000), async {}).await;
    assert!(matches!(down, Err(LockError::Redis { .. })), "{down:?}");

    server.restart();
    // The first call after the restart may still meet the dead connection; the client reconnects.
    let recovered = eventually(Duration::from_secs(5), "lock works again", || async {
        locks
            .run_locked("pay:4", opts(1_000), async {})
            .await
            .is_ok()
    })
    .await;
    assert!(recovered < Duration::from_secs(5));
    // Renewal scripts are reloaded on the restarted server (NOSCRIPT handled).
    let renewals = locks
        .run_locked("pay:4", opts(300).unlimited_renewals(), async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            LockContext::current().unwrap().renewals()
        })
        .await
        .unwrap();
    assert!(renewals >= 2, "{renewals}");
}

#[tokio::test]
async fn a_thousand_one_second_leases_held_for_five_seconds_none_lapses() {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.unwrap();
    let options = opts(1_000).unlimited_renewals();
    let mut holders = tokio::task::JoinSet::new();
    for n in 0..1_000 {
        let locks = locks.clone();
        holders.spawn(async move {
            locks
                .run_locked(format!("bulk:{n}"), options, async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                })
                .await
        });
    }
    let mut ok = 0;
    while let Some(outcome) = holders.join_next().await {
        outcome.unwrap().expect("no lease lapses");
        ok += 1;
    }
    assert_eq!(ok, 1_000);
    assert_eq!(locks.held_leases(), 0);
}

#[tokio::test]
async fn password_never_shows_in_debug_or_errors() {
    let server = RedisServer::start();
    server.command(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">s3cret-pw",
        "~*",
        "+@all",
    ]);
    let url = format!("redis://locker:s3cret-pw@127.0.0.1:{}", server.port());
    let locks = LockClient::connect(&url).await.unwrap();
    assert!(!format!("{locks:?}").contains("s3cret-pw"), "{locks:?}");
    locks
        .run_locked("acl:1", opts(1_000), async {})
        .await
        .unwrap();

    let wrong = format!("redis://locker:wrong-pw@127.0.0.1:{}", server.port());
    let err = LockClient::connect(&wrong).await.unwrap_err();
    assert!(matches!(err, LockError::Redis { .. }), "{err:?}");
    assert!(!format!("{err} {err:?}").contains("wrong-pw"));
    let builder = LockClient::builder(&wrong);
    assert!(!format!("{builder:?}").contains("wrong-pw"));
}

#[tokio::test]
async fn malformed_urls_are_config_errors() {
    for url in [
        "",
        "http://127.0.0.1:6379",
        "redis://127.0.0.1:notaport",
        "redis://127.0.0.1:1/notadb",
    ] {
        let outcome = LockClient::builder(url).build_lazy();
        assert!(
            matches!(outcome, Err(LockError::Config { .. })),
            "{url}: {outcome:?}"
        );
    }
}

#[tokio::test]
async fn invalid_keys_fail_before_any_io() {
    // No server at all: an I/O attempt would be a Redis error, not InvalidKey.
    let locks = LockClient::builder("redis://127.0.0.1:1")
        .build_lazy()
        .unwrap();
    for key in [
        String::new(),
        "k".repeat(lockmacro_runtime::MAX_KEY_LEN + 1),
    ] {
        let outcome = locks.run_locked(key, LockOptions::new(), async {}).await;
        assert!(
            matches!(outcome, Err(LockError::InvalidKey { .. })),
            "{outcome:?}"
        );
    }
}
