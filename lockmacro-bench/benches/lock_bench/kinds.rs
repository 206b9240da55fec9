//! W5: sixteen readers and one writer on one key, as a cache read often and rebuilt now and then.
//! Measures reads per second, the writer's wait (p50, p99: is it starved?), and how evenly the
//! readers are served.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockOptions};
use testkit::RedisServer;
use tokio::task::JoinSet;

use crate::measure::{Latencies, REPS, median};
use crate::report::Report;

const READERS: usize = 16;
const RUN: Duration = Duration::from_secs(2);

/// One run: reads per second, the writer's waits, and reads per reader.
async fn run(locks: &LockClient) -> (f64, Latencies, Vec<u64>) {
    let key = "w5:entry";
    let stop = Instant::now() + RUN;
    let writing = Arc::new(AtomicBool::new(false));
    let mut readers = JoinSet::new();
    for _ in 0..READERS {
        let (locks, writing) = (locks.clone(), writing.clone());
        readers.spawn(async move {
            let read = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .read()
                .wait(Duration::from_secs(10));
            let mut reads = 0u64;
            while Instant::now() < stop {
                locks
                    .run_locked(key, read, async {
                        assert!(!writing.load(Ordering::SeqCst), "a reader met the writer");
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    })
                    .await
                    .expect("a read");
                reads += 1;
            }
            reads
        });
    }
    let writer = {
        let (locks, writing) = (locks.clone(), writing.clone());
        tokio::spawn(async move {
            let write = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .write()
                .wait(Duration::from_secs(10));
            let mut waits = Latencies::default();
            while Instant::now() < stop {
                let asked = Instant::now();
                locks
                    .run_locked(key, write, async {
                        waits.record(asked.elapsed());
                        writing.store(true, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        writing.store(false, Ordering::SeqCst);
                    })
                    .await
                    .expect("a write");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            waits
        })
    };
    let started = Instant::now();
    let mut per_reader = Vec::new();
    while let Some(reads) = readers.join_next().await {
        per_reader.push(reads.expect("a reader"));
    }
    let waits = writer.await.expect("the writer");
    let reads_per_s = per_reader.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64();
    (reads_per_s, waits, per_reader)
}

pub async fn readers_and_a_writer(report: &mut Report) {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url())
        .await
        .expect("LockClient");
    run(&locks).await;
    let (mut reads, mut p50, mut p99, mut spread) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..REPS.min(3) {
        let (reads_per_s, waits, per_reader) = run(&locks).await;
        reads.push(reads_per_s);
        p50.push(waits.p50() / 1_000.0);
        p99.push(waits.p99() / 1_000.0);
        let most = per_reader.iter().copied().max().unwrap_or(0) as f64;
        let least = per_reader.iter().copied().min().unwrap_or(0).max(1) as f64;
        spread.push(most / least);
    }
    let system = "lockmacro, 16 readers + 1 writer";
    report.add("W5", system, "reads/s", median(reads), "/s", None);
    report.add("W5", system, "writer wait p50", median(p50), "ms", None);
    report.add("W5", system, "writer wait p99", median(p99), "ms", None);
    report.add(
        "W5",
        system,
        "reads per reader, max ÷ min",
        median(spread),
        "×",
        None,
    );
}
