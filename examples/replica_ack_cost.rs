//! What waiting for a replica costs the uncontended cycle on Sentinel: lock and unlock through
//! `run_locked`, with `replica_acks(1)` (the default where the master has a replica: `WAIT`
//! behind each grant) against `replica_acks(0)`, in the same run. Run by hand:
//!
//! ```text
//! cargo run --release --example replica_ack_cost [-- REPETITIONS SECONDS]
//! ```
//!
//! It starts a Sentinel deployment (a master, a replica, three sentinels) and, for 1 task (W1)
//! and 64 tasks on their own keys (W2), alternates the two clients for REPETITIONS windows of
//! SECONDS each (5 × 2 s by default). It prints cycles per second, median and range, and the
//! ratio acks ÷ no acks of each repetition.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockOptions};
use testkit::RedisSentinel;

/// Cycles per second of `tasks` tasks locking their own keys for `window`.
async fn cycles_per_second(locks: &LockClient, tasks: usize, window: Duration) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let options = LockOptions::new().ttl(Duration::from_secs(5));
    let started = Instant::now();
    let mut running = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (locks, done, stop) = (locks.clone(), done.clone(), stop.clone());
        running.spawn(async move {
            let key = format!("cost:{task}");
            while !stop.load(Ordering::Relaxed) {
                locks
                    .run_locked(key.as_str(), options, async {})
                    .await
                    .expect("an uncontended cycle");
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    tokio::time::sleep(window).await;
    stop.store(true, Ordering::Relaxed);
    while running.join_next().await.is_some() {}
    done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64()
}

fn median_and_range(values: &[f64]) -> (f64, f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (
        sorted[sorted.len() / 2],
        sorted[0],
        sorted[sorted.len() - 1],
    )
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let repetitions: usize = args.next().and_then(|n| n.parse().ok()).unwrap_or(5);
    let seconds: f64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let window = Duration::from_secs_f64(seconds);
    let sentinel = RedisSentinel::start();
    let client = |acks| {
        LockClient::builder(&sentinel.url())
            .replica_acks(acks)
            .build()
    };
    let (with_acks, without) = (client(1).await.unwrap(), client(0).await.unwrap());
    println!("Sentinel, master with one replica; {repetitions} × {seconds} s windows, alternated");
    for (name, tasks) in [("W1", 1), ("W2", 64)] {
        let (mut acked, mut plain, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..repetitions {
            let a = cycles_per_second(&with_acks, tasks, window).await;
            let p = cycles_per_second(&without, tasks, window).await;
            acked.push(a);
            plain.push(p);
            ratios.push(a / p);
        }
        let show = |values: &[f64]| {
            let (median, low, high) = median_and_range(values);
            format!("{median:.0} [{low:.0}–{high:.0}]")
        };
        let (ratio, low, high) = median_and_range(&ratios);
        println!(
            "{name} ({tasks} tasks): replica_acks(1) {} cycles/s, replica_acks(0) {} cycles/s, \
             ratio {ratio:.2}× [{low:.2}–{high:.2}]",
            show(&acked),
            show(&plain),
        );
    }
}
