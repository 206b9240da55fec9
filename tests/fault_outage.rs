//! Redis down, refusing, or reached by many callers at once: no retry storm, no connect inside a
//! lease, one connection per runtime, and no release of a key that was never set.
//!
//! Figures worth reporting are printed with `eprintln!`, which nextest shows for failing tests
//! and `--no-capture` always.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{command_calls, connected_clients, connections_received, cpu_time, eventually, opts};
use lockmacro_runtime::{LockClient, LockContext, LockError};
use testkit::{Fault, FaultProxy, RedisServer};

/// The watchdog's and the release subscriber's connections are opened by `build()`, not by the
/// first renewal or the first waiter: a lease never pays for a connect (or a TLS handshake).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_opens_the_watchdog_and_subscriber_connections() {
    let server = RedisServer::start();
    let before = connected_clients(&server);
    let _locks = LockClient::connect(&server.url()).await.unwrap();
    // The caller's runtime, the client's own runtime (watchdog), the release subscription.
    let opened = connected_clients(&server) - before;
    assert_eq!(opened, 3, "connections open right after build()");
}

/// Over a slow link, the first renewal of a short lease is one round trip: a cold connect (and
/// loading the scripts) on the watchdog's runtime would take several and lose the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_renewal_over_a_slow_link_pays_no_connect() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = LockClient::builder(&proxy.url())
        .scan_interval(Duration::from_millis(50))
        .build()
        .await
        .unwrap();
    // Every chunk 100 ms late each way: a round trip is 200 ms, a cold connect at least 600 ms.
    proxy.set(Fault::Delay(Duration::from_millis(100)));
    let outcome = locks
        .run_locked("slow:1", opts(900).max_renewals(1), async {
            while LockContext::current().unwrap().renewals() == 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
    assert!(
        outcome.is_ok(),
        "renewed in time over a slow link: {outcome:?}"
    );
}

/// With 1 000 leases held and Redis gone for 3 s, failed extensions back off (and so do
/// reconnects): a few connection attempts a second and a sliver of CPU, not a busy loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_under_a_thousand_leases_costs_little_cpu_and_few_connection_attempts() {
    const LEASES: usize = 1_000;
    let mut server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = LockClient::builder(&proxy.url())
        .scan_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let held = Arc::new(AtomicUsize::new(0));
    let mut holders = tokio::task::JoinSet::new();
    for n in 0..LEASES {
        let (locks, held) = (locks.clone(), held.clone());
        holders.spawn(async move {
            locks
                .run_locked(
                    format!("outage:{n}"),
                    opts(2_000).unlimited_renewals(),
                    async move {
                        held.fetch_add(1, Ordering::SeqCst);
                        std::future::pending::<()>().await
                    },
                )
                .await
        });
    }
    eventually(Duration::from_secs(10), "1 000 leases held", || async {
        held.load(Ordering::SeqCst) == LEASES
    })
    .await;

    server.kill();
    let (attempts_before, cpu_before, started) = (proxy.accepted(), cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (attempts, cpu, took) = (
        proxy.accepted() - attempts_before,
        cpu_time() - cpu_before,
        started.elapsed(),
    );
    let attempts_per_second = attempts as f64 / took.as_secs_f64();
    let core_share = cpu.as_secs_f64() / took.as_secs_f64();
    eprintln!(
        "3 s outage under {LEASES} leases: {attempts} connection attempts ({attempts_per_second:.1}/s), {cpu:?} CPU ({:.1} % of a core)",
        core_share * 100.0
    );
    assert!(
        attempts_per_second < 50.0,
        "{attempts} connection attempts in {took:?}"
    );
    // A busy loop burns a whole core; backing off costs about 5 % of one here (a debug build,
    // 1 000 leases failing), so the bound tells the two apart without riding on machine noise.
    assert!(core_share < 0.25, "{cpu:?} of CPU in {took:?}");
    // Every holder learnt its lease was lost once its deadline passed.
    let mut lost = 0;
    while let Some(outcome) = holders.join_next().await {
        assert!(matches!(outcome.unwrap(), Err(LockError::Lost { .. })));
        lost += 1;
    }
    assert_eq!(lost, LEASES);
}

/// A connection that was refused carried no `SET`: nothing is released afterwards (the old code
/// treated it as "may have landed" and released the never-set key every 100 ms for a whole ttl).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_at_acquire_sends_no_release() {
    let mut server = RedisServer::start();
    let url = server.url();
    server.kill();
    let locks = LockClient::builder(&url).build_lazy().unwrap();
    let outcome = locks.run_locked("refused:1", opts(30_000), async {}).await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    server.restart();
    // Give a background release every chance to arrive: it would retry within ~100 ms.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        command_calls(&server, "evalsha"),
        0,
        "a release reached the server"
    );
    assert_eq!(
        command_calls(&server, "eval"),
        0,
        "a release reached the server"
    );
}

/// Fifty first callers on a fresh runtime share one connection (and one `SCRIPT LOAD`), instead
/// of each opening its own and keeping only the last.
#[test]
fn concurrent_first_callers_on_a_runtime_open_one_connection() {
    let server = RedisServer::start();
    let locks = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(LockClient::connect(&server.url()))
        .unwrap();
    let loads_before = command_calls(&server, "script|load");
    let connections_before = connections_received(&server);
    let fresh = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    fresh.block_on(async {
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..50 {
            let locks = locks.clone();
            calls.spawn(async move {
                locks
                    .run_locked(format!("first:{n}"), opts(5_000), async {})
                    .await
            });
        }
        while let Some(call) = calls.join_next().await {
            call.unwrap().unwrap();
        }
    });
    // Each look at INFO opens a connection of its own: the one reading this count is in it.
    let opened = connections_received(&server) - connections_before - 1;
    let loads = command_calls(&server, "script|load") - loads_before;
    assert_eq!(opened, 1, "connections opened by 50 first callers");
    // Acquire, the plain and the announcing release, extend, hand-over, inspect, force-release,
    // the multi-key acquire and release, a waiter's leave, and a watch's look.
    assert_eq!(loads, 11, "one SCRIPT LOAD of each script");
}
