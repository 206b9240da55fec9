//! How `LockClient::list` fares over many keys: its time and peak memory, and what it costs
//! Redis meanwhile (commands run, script calls among them, and the latency other clients see).
//! Run by hand (not a test: it takes tens of seconds):
//!
//! ```text
//! cargo run --release --example list_million [-- KEYS]
//! ```
//!
//! It starts its own `redis-server`, writes KEYS (1 000 000 by default) exclusive locks in the
//! library's format plus as many other keys, and lists every lock (`list("")`, so the other keys
//! are scanned too). It prints the count, the time, this process's peak resident memory before
//! and after, Redis's calls per command during the listing (`INFO commandstats`), and the
//! round trip of a `PING` sent every millisecond from another connection, idle and while listing.

use std::collections::BTreeMap;
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

/// Calls per command so far (`INFO commandstats`).
fn command_calls(server: &RedisServer) -> BTreeMap<String, u64> {
    let info = match server.command(&["INFO", "commandstats"]) {
        redis::Value::BulkString(info) => String::from_utf8_lossy(&info).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        _ => return BTreeMap::new(),
    };
    info.lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = stats.split(',').find_map(|s| s.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// `PING` round trips from a connection of its own, one a millisecond, until `stop`.
async fn ping_latencies(
    server: &RedisServer,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<Duration> {
    let mut connection = server.connection().await;
    let mut samples = Vec::new();
    while !*stop.borrow() {
        let sent = Instant::now();
        let _: String = redis::cmd("PING")
            .query_async(&mut connection)
            .await
            .expect("PING");
        samples.push(sent.elapsed());
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    samples
}

fn summary(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} pings",
        at(0.5),
        at(0.99),
        at(1.0),
        samples.len()
    )
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

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let idle = tokio::join!(ping_latencies(&server, stopped), async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let _ = stop.send(true);
    })
    .0;
    println!("PING idle: {}", summary(idle));

    let before = peak_rss_kib();
    let calls_before = command_calls(&server);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let listing = async {
        let mut listed = locks.list("");
        let mut count = 0u64;
        while let Some(lock) = listed.next().await {
            lock.expect("a lock");
            count += 1;
        }
        let _ = stop.send(true);
        (count, started.elapsed())
    };
    let (busy, (count, took)) = tokio::join!(ping_latencies(&server, stopped), listing);
    let calls: BTreeMap<String, u64> = command_calls(&server)
        .into_iter()
        .map(|(name, calls)| {
            let delta = calls - calls_before.get(&name).copied().unwrap_or(0);
            (name, delta)
        })
        .filter(|(name, delta)| *delta > 0 && name != "ping" && name != "info")
        .collect();
    println!(
        "listed {count} locks in {took:?} ({:.0} locks/s); peak RSS {} KiB before listing, {} KiB after",
        count as f64 / took.as_secs_f64(),
        before,
        peak_rss_kib()
    );
    let scripts: u64 = calls
        .iter()
        .filter(|(name, _)| name.starts_with("eval"))
        .map(|(_, calls)| calls)
        .sum();
    println!("Redis calls while listing: {calls:?}; script calls {scripts}");
    println!("PING while listing: {}", summary(busy));
    assert_eq!(count, keys);
}
