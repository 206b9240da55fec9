//! A lock client in a process of its own, for tests that need several processes or one to kill.
//!
//! `lock_worker count URL KEY TASKS INCREMENTS`: TASKS tasks each add 1 to the integer at
//! `KEY:counter` INCREMENTS times, non-atomically (GET, short sleep, SET) under the lock `KEY`
//! with `wait`; prints one line `interval START_NS END_NS` (CLOCK_MONOTONIC) per critical section.
//!
//! `lock_worker hold URL KEY TTL_MS`: takes `KEY` with unlimited renewals, prints `held`, and
//! holds it until killed.

use std::time::Duration;

use lockmacro_runtime::{LockClient, LockOptions};
use redis::AsyncCommands;

fn monotonic_ns() -> u128 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u128 * 1_000_000_000 + now.tv_nsec as u128
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("count") => count(&args[2], &args[3], parse(&args[4]), parse(&args[5])).await,
        Some("hold") => hold(&args[2], &args[3], parse(&args[4])).await,
        _ => {
            eprintln!("usage: lock_worker count URL KEY TASKS INCREMENTS | hold URL KEY TTL_MS");
            std::process::exit(2);
        }
    }
}

fn parse(arg: &str) -> u64 {
    arg.parse()
        .unwrap_or_else(|_| panic!("not a number: {arg}"))
}

async fn count(url: &str, key: &str, tasks: u64, increments: u64) {
    let locks = LockClient::connect(url).await.expect("connect");
    let redis = redis::Client::open(url).expect("url");
    let options = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(60));
    let mut workers = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (locks, redis, key) = (locks.clone(), redis.clone(), key.to_owned());
        workers.spawn(async move {
            let mut conn = redis
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let counter = format!("{key}:counter");
            let mut intervals = Vec::new();
            for step in 0..increments {
                let interval = locks
                    .run_locked(key.clone(), options, async {
                        let start = monotonic_ns();
                        let n: Option<u64> = conn.get(&counter).await.expect("GET");
                        tokio::time::sleep(Duration::from_micros((task * 7 + step * 13) % 500))
                            .await;
                        let _: () = conn.set(&counter, n.unwrap_or(0) + 1).await.expect("SET");
                        (start, monotonic_ns())
                    })
                    .await
                    .expect("locked increment");
                intervals.push(interval);
            }
            intervals
        });
    }
    while let Some(intervals) = workers.join_next().await {
        for (start, end) in intervals.expect("task") {
            println!("interval {start} {end}");
        }
    }
}

async fn hold(url: &str, key: &str, ttl_ms: u64) {
    let locks = LockClient::connect(url).await.expect("connect");
    let options = LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .unlimited_renewals();
    let _lease = locks.acquire(key, options).await.expect("acquire");
    println!("held");
    std::future::pending::<()>().await;
}
