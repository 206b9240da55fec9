//! Calls cancelled by their callers at the worst moments (a timeout that fires while the release
//! is in flight, acquires dropped while their `SET` is on the wire): the lock is released all
//! the same, never left held for its ttl.
//!
//! Figures worth reporting are printed with `eprintln!`, which nextest shows for failing tests
//! and `--no-capture` always.

mod common;

use std::time::Duration;

use common::{fast_client, opts, scan_keys};
use lockmacro_runtime::LockClient;
use testkit::{Fault, FaultProxy, RedisServer};

/// Waits until no key matches `pattern`, failing with the keys left after `within`.
async fn all_freed(server: &RedisServer, pattern: &str, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = scan_keys(server, pattern).await;
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} keys still held after {within:?} (ttl 30 s): {:?}",
            left.len(),
            &left[..left.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `call` until it has waited `waits` times, then drops it there (`None`), as a timeout
/// firing at that wait would.
async fn cut_at_wait<F: std::future::Future>(call: F, waits: u32) -> Option<F::Output> {
    let mut call = std::pin::pin!(call);
    let mut left = waits;
    std::future::poll_fn(|cx| match call.as_mut().poll(cx) {
        std::task::Poll::Ready(output) => std::task::Poll::Ready(Some(output)),
        std::task::Poll::Pending if left == 0 => std::task::Poll::Ready(None),
        std::task::Poll::Pending => {
            left -= 1;
            std::task::Poll::Pending
        }
    })
    .await
}

/// A random number in `[0, below)`.
fn random_below(below: u64) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    random % below
}

/// A random duration in `[0, max)`, for cancelling at scattered points.
fn scattered(max: Duration) -> Duration {
    Duration::from_nanos(random_below(max.as_nanos() as u64))
}

/// A release dropped after its first poll, before Redis answered it (on a current-thread
/// runtime the connection has not even written it yet: a timeout that fires as the work ends
/// does this) is finished in the background: the guard is disarmed only by a confirmed release.
/// 30 of 30 used to stay held for their whole ttl.
#[tokio::test]
async fn releases_dropped_before_their_answer_still_free_the_keys() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    for n in 0..30 {
        let lease = locks
            .acquire(format!("interrupted:{n}"), opts(30_000))
            .await
            .unwrap();
        let mut release = Box::pin(lease.release());
        tokio::select! {
            biased;
            _ = &mut release => panic!("a release needs an answer from Redis"),
            () = std::future::ready(()) => {}
        }
        drop(release);
    }
    all_freed(&server, "interrupted:*", Duration::from_secs(3)).await;
}

/// 2 000 calls on 50 keys, each dropped at a random one of its first eight waits (acquiring,
/// working, releasing) as a timeout firing there would drop it, on a current-thread runtime:
/// afterwards every key is free, long before its 30 s ttl. (A timer cannot aim this well: tokio
/// rounds a deadline up to its millisecond tick, longer than a whole call on loopback.)
#[tokio::test]
async fn timeouts_firing_anywhere_in_a_call_leave_no_key_held() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let mut cut_short = 0;
    for n in 0..2_000 {
        let call = locks.run_locked(format!("storm:{}", n % 50), opts(30_000), async {
            tokio::task::yield_now().await;
        });
        if cut_at_wait(call, random_below(8) as u32).await.is_none() {
            cut_short += 1;
        }
    }
    eprintln!("{cut_short} of 2 000 calls cut short at one of their waits");
    assert!(cut_short >= 100, "only {cut_short} calls were cut short");
    all_freed(&server, "storm:*", Duration::from_secs(3)).await;
}

/// Thousands of acquires dropped while their `SET` is on a slow wire: the undo of each is sent
/// after its own `SET` (on the same connection), so none finds the key missing, gives up, and
/// leaves it to be set a moment later and held for its ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_dropped_in_flight_leave_no_key_held() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = LockClient::builder(&proxy.url())
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    proxy.set(Fault::Delay(Duration::from_millis(2)));
    let mut cut_short = 0;
    for round in 0..30 {
        let mut attempts = tokio::task::JoinSet::new();
        for n in 0..100 {
            let locks = locks.clone();
            attempts.spawn(async move {
                let key = format!("dropped:{round}:{n}");
                tokio::time::timeout(
                    scattered(Duration::from_millis(8)),
                    locks.acquire(key, opts(30_000)),
                )
                .await
                .is_err()
            });
        }
        while let Some(attempt) = attempts.join_next().await {
            cut_short += usize::from(attempt.unwrap());
        }
    }
    eprintln!("{cut_short} of 3 000 acquires dropped in flight");
    // Most timeouts fire before the 4 ms round trip through the delaying proxy.
    assert!(
        cut_short >= 300,
        "only {cut_short} acquires were dropped in flight"
    );
    proxy.heal();
    all_freed(&server, "dropped:*", Duration::from_secs(3)).await;
}
