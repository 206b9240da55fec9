//! `LockClient::list` over every lock under one prefix: how its time and memory grow with the
//! number of keys.
//!
//! The keys are written straight into Redis (`SET key token PX`, pipelined), as a lock leaves
//! them; the client then lists them all, and the figures are the time to the stream's end and
//! the process's peak resident memory while listing (`VmHWM`, reset first), less the memory
//! before; and what Redis did meanwhile (its CPU, and its time per listed lock in the `SCAN`s and
//! in the look at each key), which tells whether a bend in the curve is the client's or Redis's.

use std::time::{Duration, Instant};

use lockmacro_runtime::LockClient;
use serde_json::{Value, json};
use testkit::RedisServer;

use crate::measure::{heap_in_use, resident_bytes, server_pid};
use crate::work::Work;
use crate::{grouped, number};

const PREFIX: &str = "scale-list";
const WRITE_BATCH: usize = 10_000;

pub async fn measure(n: usize) -> Value {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    for first in (0..n).step_by(WRITE_BATCH) {
        let mut pipe = redis::pipe();
        for i in first..(first + WRITE_BATCH).min(n) {
            pipe.cmd("SET")
                .arg(format!("{PREFIX}:{i}"))
                .arg(format!("{:032x}", i as u128 * 0x9e37_79b9))
                .arg("PX")
                .arg(600_000)
                .ignore();
        }
        let () = pipe.query_async(&mut connection).await.expect("SET keys");
    }
    let locks = LockClient::connect(&server.url())
        .await
        .expect("LockClient");
    // A first page, so that the connection and scripts exist before memory is measured.
    let _ = locks.list(PREFIX).next().await;
    let redis_pid = server_pid(&mut connection).await;
    reset_peak_resident();
    let (resident_before, heap_before) = (resident_bytes(), heap_in_use());
    let work = Work::read(&mut connection, redis_pid).await;
    let started = Instant::now();
    let mut listed = locks.list(PREFIX);
    let (mut found, mut heap_peak) = (0usize, 0u64);
    let mut first = None;
    while let Some(lock) = listed.next().await {
        let lock = lock.expect("a listed lock");
        assert!(lock.time_left() > Duration::ZERO);
        first.get_or_insert_with(|| started.elapsed());
        found += 1;
        if found.is_multiple_of(1_000) {
            heap_peak = heap_peak.max(heap_in_use());
        }
    }
    let took = started.elapsed();
    let work = Work::read(&mut connection, redis_pid).await.since(&work);
    assert_eq!(found, n, "every key listed");
    let redis_us_per_lock = |command: &str| {
        work["commands"][command]["redis_s"].as_f64().unwrap_or(0.0) * 1e6 / n as f64
    };
    json!({
        "keys": n,
        "list_s": took.as_secs_f64(),
        "first_lock_ms": first.unwrap_or_default().as_secs_f64() * 1e3,
        "locks_per_s": n as f64 / took.as_secs_f64(),
        "peak_resident_bytes": peak_resident().saturating_sub(resident_before),
        "peak_heap_bytes": heap_peak.saturating_sub(heap_before),
        "redis_us_per_lock_look": redis_us_per_lock("evalsha"),
        "redis_us_per_lock_scan": redis_us_per_lock("scan"),
        "list_work": work,
    })
}

/// Resets `VmHWM`, the peak resident memory, to the current resident memory.
fn reset_peak_resident() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// `VmHWM` of `/proc/self/status`, in bytes.
fn peak_resident() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The curve as a markdown table.
pub fn table(rows: &[Value]) -> String {
    let mut out = String::from(
        "\n### `LockClient::list` over one prefix\n\n| keys | time to list all (first lock) | locks/s | peak resident / heap above before | Redis per lock: look / `SCAN` | Redis / client CPU while listing |\n|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let f = |name| number(row, name);
        out += &format!(
            "| {} | {:.2} s ({:.1} ms) | {} | {:.1} / {:.1} MiB | {:.1} / {:.2} µs | {:.0} / {:.0} % |\n",
            grouped(f("keys")),
            f("list_s"),
            f("first_lock_ms"),
            grouped(f("locks_per_s")),
            f("peak_resident_bytes") / 1048576.0,
            f("peak_heap_bytes") / 1048576.0,
            f("redis_us_per_lock_look"),
            f("redis_us_per_lock_scan"),
            row["list_work"]["redis_cpu_percent"]
                .as_f64()
                .unwrap_or(0.0),
            row["list_work"]["client_cpu_percent"]
                .as_f64()
                .unwrap_or(0.0),
        );
    }
    out
}
