//! W6: locks over several keys at once (`key = [...]`, `run_locked_many`) on one Redis. One task
//! cycles acquire + release of a lock over 1, 2, 8 and 64 keys, the sizes interleaved
//! (1 2 8 64 1 2 8 64 …) over the repetitions; each size's time per cycle is a ratio against the
//! 1-key lock (`run_locked`) of the same repetition. Round trips per cycle are counted through a
//! relay in front of the same server (a separate client, so the relay's own latency stays out of
//! the times), and Redis commands per cycle (scripts' inner commands included) from
//! `INFO commandstats`.

use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockOptions};
use testkit::RedisServer;

use crate::measure::{CommandStats, REPS, median};
use crate::relay::RoundTripRelay;
use crate::report::Report;

const SIZES: [usize; 4] = [1, 2, 8, 64];
const RUN: Duration = Duration::from_millis(600);
/// Cycles counted through the relay, per size.
const COUNTED: u64 = 200;
const OPTIONS: LockOptions = LockOptions::new()
    .ttl(Duration::from_secs(3))
    .max_renewals(3);

fn keys(size: usize) -> Vec<String> {
    (0..size).map(|i| format!("several:{size}:{i}")).collect()
}

/// One acquire + release of the lock over `keys` (one key: `run_locked`, the 1-key lock).
async fn cycle(locks: &LockClient, keys: &[String]) {
    match keys {
        [key] => locks.run_locked(key.as_str(), OPTIONS, async {}).await,
        keys => locks.run_locked_many(keys, OPTIONS, async {}).await,
    }
    .expect("a free lock");
}

/// Microseconds per cycle over [`RUN`].
async fn time_per_cycle(locks: &LockClient, keys: &[String]) -> f64 {
    let started = Instant::now();
    let mut cycles = 0u64;
    while started.elapsed() < RUN {
        cycle(locks, keys).await;
        cycles += 1;
    }
    started.elapsed().as_secs_f64() * 1e6 / cycles as f64
}

pub async fn several_keys(report: &mut Report) {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url())
        .build()
        .await
        .expect("LockClient");
    let mut connection = server.connection().await;
    let sets: Vec<Vec<String>> = SIZES.iter().map(|&size| keys(size)).collect();
    // Warm-up: connections, scripts, allocator.
    for keys in &sets {
        time_per_cycle(&locks, keys).await;
    }
    let mut micros = vec![Vec::new(); SIZES.len()];
    for _ in 0..REPS {
        for (at, keys) in sets.iter().enumerate() {
            micros[at].push(time_per_cycle(&locks, keys).await);
        }
    }
    // Round trips and Redis commands per cycle, through the relay.
    let relay = RoundTripRelay::start(server.addr()).await;
    let counted = LockClient::builder(&relay.url())
        .build()
        .await
        .expect("LockClient through the relay");
    let mut round_trips = Vec::new();
    let mut commands = Vec::new();
    for keys in &sets {
        cycle(&counted, keys).await;
        let (trips, stats) = (
            relay.round_trips(),
            CommandStats::read(&mut connection).await,
        );
        for _ in 0..COUNTED {
            cycle(&counted, keys).await;
        }
        let after = CommandStats::read(&mut connection).await;
        round_trips.push((relay.round_trips() - trips) as f64 / COUNTED as f64);
        commands.push(after.commands_since(&stats) as f64 / COUNTED as f64);
    }
    const NAMES: [&str; 4] = ["1 key", "2 keys", "8 keys", "64 keys"];
    for (at, name) in NAMES.iter().enumerate() {
        let ratios: Vec<f64> = micros[at]
            .iter()
            .zip(&micros[0])
            .map(|(ours, one)| ours / one)
            .collect();
        report.add_runs(
            "W6: one task, a lock over N keys, acquire+release",
            name,
            "time per cycle ÷ 1-key lock",
            &ratios,
            "×",
            None,
        );
        report.add(
            "W6",
            name,
            "time per cycle",
            median(micros[at].iter().copied()),
            "µs",
            None,
        );
        report.add(
            "W6",
            name,
            "round trips per cycle ÷ 1-key lock",
            round_trips[at] / round_trips[0],
            "×",
            None,
        );
        report.add(
            "W6",
            name,
            "round trips per cycle",
            round_trips[at],
            "",
            None,
        );
        report.add(
            "W6",
            name,
            "Redis commands per cycle (scripts' inner ones included)",
            commands[at],
            "",
            None,
        );
    }
}
