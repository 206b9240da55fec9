//! How `LockClient::list` fares over a million locks: time and peak memory. Run by hand (not a
//! test: it takes tens of seconds):
//!
//! ```text
//! cargo run --release --example list_million [-- KEYS]
//! ```
//!
//! It starts its own `redis-server`, writes KEYS (1 000 000 by default) exclusive locks in the
//! library's format plus as many other keys, lists the locks under one prefix, and prints the
//! count, the time, and this process's peak resident memory before and after the listing.

use std::time::{Duration, Instant};

use lockmacro_runtime::LockClient;
use testkit::RedisServer;

/// This process's peak resident set, in KiB (`VmHWM`).
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::main]
async fn main() {
    let keys: u64 = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_000_000);
    let server = RedisServer::start();
    let filled = Instant::now();
    // In chunks, so no one script blocks the server for long.
    let chunk = 100_000;
    for start in (0..keys).step_by(chunk as usize) {
        let end = (start + chunk).min(keys);
        server.command(&[
            "EVAL",
            "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) - 1 do \
               redis.call('SET', 'bulk:' .. i, string.format('%032x', i), 'PX', 3600000) \
               redis.call('SET', 'other:' .. i, 'x') \
             end return 1",
            "0",
            &start.to_string(),
            &end.to_string(),
        ]);
    }
    println!(
        "wrote {keys} locks and {keys} other keys in {:?}",
        filled.elapsed()
    );

    let locks = LockClient::builder(&server.url())
        .response_timeout(Duration::from_secs(10))
        .build()
        .await
        .expect("a client");
    let before = peak_rss_kib();
    let started = Instant::now();
    let mut listed = locks.list("bulk");
    let mut count = 0u64;
    while let Some(lock) = listed.next().await {
        lock.expect("a lock");
        count += 1;
    }
    let took = started.elapsed();
    println!(
        "listed {count} locks in {took:?} ({:.0} locks/s); peak RSS {} KiB before listing, {} KiB after",
        count as f64 / took.as_secs_f64(),
        before,
        peak_rss_kib()
    );
    assert_eq!(count, keys);
}
