//! Redlock's availability while one master of three is in trouble, measured on real servers
//! the example starts itself (loopback, free ports).
//!
//! `cargo run --example redlock_outage -- split [CLIENTS] [SECONDS]`: one master killed; CLIENTS
//! clients (each on its own connections, as processes would be) × 8 tasks take one key in turn
//! (`wait = 10s`, 1 ms bodies) for SECONDS; prints how the calls ended (`NoQuorum` should be 0).
//!
//! `cargo run --example redlock_outage -- silent [ACQUIRES]`: one master frozen (SIGSTOP: it
//! accepts connections and never answers) before the client is built; prints how long `build()`
//! took, then the latency of ACQUIRES acquires (each released), 20 ms apart (ttl 2 s, default
//! timeouts).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use lockmacro_runtime::{LockClient, LockError, LockOptions};
use testkit::Redlock;
use tokio::time::Instant;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let number = |at: usize, default: u64| args.get(at).map_or(default, |n| n.parse().unwrap());
    match args.get(1).map(String::as_str) {
        Some("split") => split(number(2, 3), number(3, 10)).await,
        Some("silent") => silent(number(2, 300)).await,
        _ => eprintln!("usage: redlock_outage split [CLIENTS] [SECONDS] | silent [ACQUIRES]"),
    }
}

async fn split(clients: u64, seconds: u64) {
    let mut quorum = Redlock::start(3);
    quorum.servers[2].kill();
    let mut locks = Vec::new();
    for _ in 0..clients {
        locks.push(
            LockClient::redlock_builder(quorum.urls())
                .build()
                .await
                .expect("a majority connects"),
        );
    }
    let counts: Arc<[AtomicU64; 4]> = Arc::default();
    let (ok, busy, no_quorum, other) = (0, 1, 2, 3);
    let until = Instant::now() + Duration::from_secs(seconds);
    let options = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(10));
    let mut tasks = tokio::task::JoinSet::new();
    for client in &locks {
        for _ in 0..8 {
            let (locks, counts) = (client.clone(), counts.clone());
            tasks.spawn(async move {
                while Instant::now() < until {
                    let outcome = locks
                        .run_locked("outage:split", options, async {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        })
                        .await;
                    let slot = match outcome {
                        Ok(()) => ok,
                        Err(LockError::Busy { .. }) => busy,
                        Err(LockError::NoQuorum { .. }) => no_quorum,
                        Err(error) => {
                            eprintln!("{error}");
                            other
                        }
                    };
                    counts[slot].fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    }
    while tasks.join_next().await.is_some() {}
    let count = |slot: usize| counts[slot].load(Ordering::Relaxed);
    println!(
        "split: {clients} clients x 8 tasks, one master of 3 down, {seconds} s: \
         {} acquired, {} Busy, {} NoQuorum, {} other errors",
        count(ok),
        count(busy),
        count(no_quorum),
        count(other)
    );
}

async fn silent(acquires: u64) {
    let quorum = Redlock::start(3);
    quorum.servers[2].pause();
    let started = Instant::now();
    let locks = LockClient::redlock_builder(quorum.urls())
        .build()
        .await
        .expect("a majority connects");
    let build = started.elapsed();
    let options = LockOptions::new().ttl(Duration::from_secs(2));
    let mut took = Vec::new();
    let mut failed = 0;
    for i in 0..acquires {
        // Spread over seconds, as an application's calls are: reconnections show.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        let outcome = locks.acquire(format!("outage:silent:{i}"), options).await;
        took.push(started.elapsed());
        match outcome {
            Ok(lease) => {
                let _ = lease.release().await;
            }
            Err(error) => {
                failed += 1;
                eprintln!("{error}");
            }
        }
    }
    took.sort_unstable();
    let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    println!(
        "silent: build {build:?}; {} acquires (failed ones too): median {:?}, p99 {:?}, max {:?}; {failed} failed",
        took.len(),
        at(0.5),
        at(0.99),
        at(1.0)
    );
    quorum.servers[2].resume();
}
