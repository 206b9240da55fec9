//! Callers parked on held keys: what a parked caller costs (memory, requests while nothing
//! happens, subscriptions) and how soon the next holder runs once a key is released.
//!
//! One client holds `keys` keys (ttl 300 s: no renewal falls in the measured minute); `n`
//! callers of another client wait on them (caller `i` on key `i % keys`, `wait` 600 s). Once all
//! are parked, Redis's command counters are read over 3 s of nothing happening; then the holder
//! releases its keys one after another, and each caller, once holding, notes how long since the
//! previous holder of its key began releasing, and releases in turn (a key's later waiters are
//! handed it by the earlier ones while the holder goes on releasing the other keys).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockmacro_runtime::{Lease, LockClient, LockOptions};
use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use testkit::RedisServer;
use tokio::task::JoinSet;

use crate::measure::{CommandStats, heap_in_use, percentile, resident_bytes};
use crate::{grouped, number};

const HOLD: LockOptions = LockOptions::new()
    .ttl(Duration::from_secs(300))
    .unlimited_renewals();
const WAIT: LockOptions = LockOptions::new()
    .ttl(Duration::from_secs(30))
    .wait(Duration::from_secs(600));
const IDLE: Duration = Duration::from_secs(3);

pub async fn measure(n: usize, keys: usize) -> Value {
    let server = RedisServer::start();
    let mut stats = server.connection().await;
    let holder = LockClient::connect(&server.url()).await.expect("holder");
    let waiter = LockClient::connect(&server.url()).await.expect("waiter");
    waiter
        .run_locked("scale-wait:warm-up", WAIT, async {})
        .await
        .expect("warm-up");
    let key = |k: usize| format!("scale-wait:{k}");
    let mut takers = JoinSet::new();
    for first in 0..64.min(keys) {
        let holder = holder.clone();
        takers.spawn(async move {
            let mut held = Vec::new();
            for k in (first..keys).step_by(64) {
                held.push(holder.acquire(key(k), HOLD).await.expect("hold"));
            }
            held
        });
    }
    let mut held: Vec<Lease> = Vec::with_capacity(keys);
    while let Some(taken) = takers.join_next().await {
        held.extend(taken.expect("a holder"));
    }
    // When each key's holder began releasing (ns since `began`), and the handoffs seen (µs).
    let began = Instant::now();
    let released_at: Arc<Vec<AtomicU64>> = Arc::new((0..keys).map(|_| AtomicU64::new(0)).collect());
    let handoffs = Arc::new(Mutex::new(Vec::<f64>::with_capacity(n)));
    let errors = Arc::new(AtomicU64::new(0));
    let (heap_before, resident_before) = (heap_in_use(), resident_bytes());
    let parking = Instant::now();
    let mut callers = JoinSet::new();
    for i in 0..n {
        let (waiter, released_at, handoffs) =
            (waiter.clone(), released_at.clone(), handoffs.clone());
        let errors = errors.clone();
        let k = i % keys;
        callers.spawn(async move {
            // A caller whose attempt timed out (a hundred thousand arriving at once on one
            // connection) gets the error, as an application would: counted, not retried.
            let Ok(lease) = waiter.acquire(key(k), WAIT).await else {
                errors.fetch_add(1, Ordering::Relaxed);
                return;
            };
            let now = began.elapsed().as_nanos() as u64;
            let since = now.saturating_sub(released_at[k].swap(now, Ordering::AcqRel));
            handoffs.lock().unwrap().push(since as f64 / 1e3);
            lease.release().await.expect("release");
        });
    }
    // Parked: the callers counted as waiting and Redis's command count both unchanged for 1 s
    // (every caller counted, or the count settled below: both are figures), or a minute gone.
    let waiting = |waiter: &LockClient| {
        (0..keys.min(n))
            .map(|k| waiter.waiting(&key(k)))
            .sum::<usize>()
    };
    let mut last = (waiting(&waiter), total(&mut stats).await);
    let (mut settled, give_up) = (0, Instant::now() + Duration::from_secs(60));
    while settled < 4 && Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = (waiting(&waiter), total(&mut stats).await);
        settled = if now == last { settled + 1 } else { 0 };
        last = now;
    }
    let parked = last.0;
    let park_all = parking.elapsed();
    let heap_per_waiter = heap_in_use().saturating_sub(heap_before) as f64 / n as f64;
    let resident_per_waiter = resident_bytes().saturating_sub(resident_before) as f64 / n as f64;
    let idle_before = CommandStats::read(&mut stats).await;
    tokio::time::sleep(IDLE).await;
    let idle = CommandStats::read(&mut stats)
        .await
        .commands_since(&idle_before) as f64
        / IDLE.as_secs_f64();
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .query_async(&mut stats)
        .await
        .expect("PUBSUB CHANNELS");
    let patterns: u64 = redis::cmd("PUBSUB")
        .arg("NUMPAT")
        .query_async(&mut stats)
        .await
        .expect("PUBSUB NUMPAT");
    let clients: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query_async(&mut stats)
        .await
        .expect("CLIENT LIST");
    let subscribed_connections = clients
        .lines()
        .filter(|line| !line.contains(" sub=0 ") || !line.contains(" psub=0 "))
        .count();

    // The holder releases its keys one after another, so that each handoff is timed on its own
    // rather than behind a burst of thousands of releases at once.
    let draining = Instant::now();
    for lease in held {
        let k = lease
            .key()
            .rsplit(':')
            .next()
            .and_then(|k| k.parse::<usize>().ok());
        if let Some(k) = k {
            released_at[k].store(began.elapsed().as_nanos() as u64, Ordering::Release);
        }
        lease.release().await.expect("holder release");
    }
    // Every caller should run within a minute; one that does not is counted, not waited for.
    let mut ran = 0;
    let _ = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(done) = callers.join_next().await {
            done.expect("a caller");
            ran += 1;
        }
    })
    .await;
    callers.abort_all();
    let drain_all = draining.elapsed();
    let handoffs = handoffs.lock().unwrap().clone();
    json!({
        "waiters": n,
        "parked": parked,
        "never_ran": n - ran,
        "errors": errors.load(Ordering::Relaxed),
        "keys": keys,
        "resident_bytes_per_waiter": resident_per_waiter,
        "heap_bytes_per_waiter": heap_per_waiter,
        "idle_requests_per_s": idle,
        "subscribed_channels": channels.len(),
        "subscribed_patterns": patterns,
        "subscribed_connections": subscribed_connections,
        "handoff_p50_us": percentile(&handoffs, 0.5),
        "handoff_p99_us": percentile(&handoffs, 0.99),
        "park_all_s": park_all.as_secs_f64(),
        "drain_all_s": drain_all.as_secs_f64(),
    })
}

/// Every command Redis has run so far, the bench's own left out. A read that times out (Redis
/// busy with a hundred thousand callers' first attempts) is asked again.
async fn total(stats: &mut MultiplexedConnection) -> u64 {
    loop {
        let info: Result<String, _> = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(stats)
            .await;
        let Ok(info) = info else { continue };
        return info
            .lines()
            .filter_map(|line| {
                let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = fields.strip_prefix("calls=")?.split(',').next()?;
                (name != "info" && name != "ping").then(|| calls.parse::<u64>().ok())?
            })
            .sum();
    }
}

/// The curves as a markdown table.
pub fn table(rows: &[Value]) -> String {
    let mut out = String::from(
        "\n### Callers parked on held keys\n\n| waiters | keys | counted parked / errors / never ran | resident / heap per waiter | requests/s while idle | subscribed channels / patterns / connections | release → next holder running p50 / p99 | park all / drain all |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let f = |name| number(row, name);
        out += &format!(
            "| {} | {} | {} / {} / {} | {:.0} / {:.0} B | {:.1} | {} / {} / {} | {:.2} / {:.2} ms | {:.1} / {:.1} s |\n",
            grouped(f("waiters")),
            grouped(f("keys")),
            grouped(f("parked")),
            f("errors"),
            f("never_ran"),
            f("resident_bytes_per_waiter"),
            f("heap_bytes_per_waiter"),
            f("idle_requests_per_s"),
            f("subscribed_channels"),
            f("subscribed_patterns"),
            f("subscribed_connections"),
            f("handoff_p50_us") / 1e3,
            f("handoff_p99_us") / 1e3,
            f("park_all_s"),
            f("drain_all_s"),
        );
    }
    out
}
