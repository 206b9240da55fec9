//! Work dropped by its caller at every await point, and a runtime shut down under a holder:
//! no lease outlives its caller.
//!
//! Figures worth reporting are printed with `eprintln!`, which nextest shows for failing tests
//! and `--no-capture` always.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::{
    assert_clean, client_for, connected_clients, eventually, fast_client, key_gone, opts, pttl,
};
use lockmacro_runtime::LockOptions;
use testkit::{Fault, FaultProxy, RedisServer};

/// A waker that tells the test when the future asks to be polled again.
struct Wakeup(tokio::sync::Notify);

impl Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_one();
    }
}

/// Where in its life a `run_locked` future was when it was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DroppedWhile {
    NotStarted,
    Acquiring,
    Working,
    Releasing,
}

/// `run_locked` dropped after 0, 1, 2, … polls, driven by hand, behind a link that delays every
/// packet 40 ms so acquire, extensions and release each spend time in flight. After every drop:
/// no lease is left in the client, and the key is gone or only expiring, never extended again
/// (its PTTL never rises once what was already on the wire has landed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_dropped_at_every_await_point_leaves_no_renewed_key() {
    const DELAY: Duration = Duration::from_millis(40);
    const TTL: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    proxy.set(Fault::Delay(DELAY));
    let locks = client_for(&proxy.url(), 30, 1_000).await;
    let options = LockOptions::new().ttl(TTL).unlimited_renewals();
    let wakeup = Arc::new(Wakeup(tokio::sync::Notify::new()));
    let waker = Waker::from(wakeup.clone());
    let mut cx = Context::from_waker(&waker);
    let mut seen = std::collections::HashSet::new();

    for polls in 0.. {
        let key = format!("drop:{polls}");
        let started = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let work = {
            let (started, finished) = (started.clone(), finished.clone());
            async move {
                started.store(true, Ordering::SeqCst);
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_millis(120)).await;
                }
                finished.store(true, Ordering::SeqCst);
            }
        };
        let mut call = Box::pin(locks.run_locked(key.clone(), options, work));
        let mut completed = None;
        for _ in 0..polls {
            if let Poll::Ready(outcome) = call.as_mut().poll(&mut cx) {
                completed = Some(outcome);
                break;
            }
            tokio::time::timeout(Duration::from_secs(3), wakeup.0.notified())
                .await
                .expect("a pending run_locked asks to be polled again");
        }
        if let Some(outcome) = completed {
            outcome.expect("undisturbed, the call completes");
            assert!(seen.len() >= 4, "drop points covered: {seen:?}");
            break;
        }
        let state = match (
            polls,
            started.load(Ordering::SeqCst),
            finished.load(Ordering::SeqCst),
        ) {
            (0, _, _) => DroppedWhile::NotStarted,
            (_, false, _) => DroppedWhile::Acquiring,
            (_, true, false) => DroppedWhile::Working,
            (_, true, true) => DroppedWhile::Releasing,
        };
        seen.insert(state);
        drop(call);
        let dropped_at = Instant::now();
        assert_eq!(locks.held_leases(), 0, "after {polls} polls ({state:?})");

        // Watch the key for what was on the wire to land, then for a full ttl more.
        let settle = 2 * DELAY + Duration::from_millis(20);
        let mut samples = Vec::new();
        while dropped_at.elapsed() < settle + TTL + 2 * DELAY + Duration::from_millis(100) {
            samples.push((dropped_at.elapsed(), pttl(&server, &key).await));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let settled: Vec<i64> = samples
            .iter()
            .filter(|(at, _)| *at >= settle)
            .map(|(_, left)| *left)
            .collect();
        for pair in settled.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            let rose = if before < 0 {
                after >= 0
            } else {
                after > before + 5
            };
            assert!(
                !rose,
                "{key} ({state:?}) was extended or re-created after the drop: {samples:?}"
            );
        }
        assert_eq!(
            settled.last(),
            Some(&-2),
            "{key} ({state:?}) outlived its ttl after the drop: {samples:?}"
        );
    }
    eprintln!("dropped run_locked while: {seen:?}");
    for state in [
        DroppedWhile::Acquiring,
        DroppedWhile::Working,
        DroppedWhile::Releasing,
    ] {
        assert!(seen.contains(&state), "never dropped while {state:?}");
    }
    assert_clean(&server, &locks, "drop:*").await;
}

/// The caller's whole runtime goes away while its task holds a lock (a `#[tokio::test]` ending,
/// a service shutting down): nothing panics, the key is released (by the client's own watchdog
/// thread, not the dead runtime), the runtime's connection closes, and the client keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_shut_down_while_holding_releases_the_key_without_panicking() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    // Open the watchdog's connection (it sends drop-time releases) before counting connections.
    drop(locks.acquire("rt:warmup", opts(30_000)).await.unwrap());
    key_gone(&server, "rt:warmup", Duration::from_secs(2)).await;
    let baseline = connected_clients(&server);
    let key = "rt:held";

    let shutdown = tokio::task::spawn_blocking({
        let locks = locks.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let (started_tx, started) = std::sync::mpsc::channel();
            runtime.spawn(async move {
                locks
                    .run_locked(key, opts(30_000).unlimited_renewals(), async move {
                        started_tx.send(()).unwrap();
                        std::future::pending::<()>().await
                    })
                    .await
            });
            started
                .recv_timeout(Duration::from_secs(3))
                .expect("holding in the doomed runtime");
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(runtime)))
        }
    });
    shutdown
        .await
        .unwrap()
        .expect("dropping a runtime that holds a lock does not panic");
    // A 30 s lease: only a release, not expiry, clears it this soon.
    let released = key_gone(&server, key, Duration::from_secs(2)).await;
    assert_eq!(locks.held_leases(), 0);
    eventually(
        Duration::from_secs(3),
        "the dead runtime's connection closes",
        || async { connected_clients(&server) <= baseline },
    )
    .await;
    locks
        .run_locked(key, opts(1_000), async {})
        .await
        .expect("the client outlives the runtime");
    eprintln!("runtime shut down while holding: key released {released:?} later");
    assert_clean(&server, &locks, "rt:*").await;
}
