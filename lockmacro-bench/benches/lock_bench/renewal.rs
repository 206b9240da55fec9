//! W4: 10 000 leases of 3 s held through one client for 20 s, so the watchdog must extend every
//! one of them again and again. Measures what keeping them alive costs: Redis requests and round
//! trips per 2 s tick (the scan period), the watchdog thread's CPU, memory per lease (heap in
//! use, and the RSS delta beside it), and lapses (there must be none).

use std::time::{Duration, Instant};

use lockmacro_runtime::{Lease, LockClient, LockOptions};
use redis::aio::MultiplexedConnection;
use testkit::RedisServer;
use tokio::task::JoinSet;

use crate::measure::{
    CommandStats, heap_in_use, process_cpu, resident_bytes, thread_cpu, threads_named,
};
use crate::relay::RoundTripRelay;
use crate::report::{Report, Target};

const LEASES: usize = 10_000;
/// The spec's 20 s: ten ticks of the default 2 s scan period.
const HOLD: Duration = Duration::from_secs(20);
const OPTIONS: LockOptions = LockOptions::new()
    .ttl(Duration::from_secs(3))
    .unlimited_renewals();
/// The client's scan period (the default): one "tick".
const SCAN_INTERVAL: Duration = Duration::from_secs(2);
/// How often every lease is checked for a lapse.
const LAPSE_CHECK: Duration = Duration::from_millis(500);
/// Leases taken at once while setting up.
const ACQUIRE_CONCURRENCY: usize = 500;
/// The watchdog thread's name as `/proc` shows it: `lockmacro-watchdog` cut to 15 bytes.
const WATCHDOG_COMM: &str = "lockmacro-watch";

/// What one holding period showed.
#[derive(Default)]
struct Hold {
    /// Leases ever found lost, past their local deadline, or with their key missing.
    lapsed: usize,
    missing_keys_max: u64,
}

pub async fn renewal(report: &mut Report) {
    let server = RedisServer::start();
    let mut connection = server.connection().await;
    let watchdogs_before = threads_named(WATCHDOG_COMM);
    // The client talks through a relay that counts its round trips.
    let relay = RoundTripRelay::start(server.addr()).await;
    let locks = LockClient::builder(&relay.url())
        .scan_interval(SCAN_INTERVAL)
        .build()
        .await
        .expect("LockClient");
    let watchdog = threads_named(WATCHDOG_COMM)
        .into_iter()
        .find(|tid| !watchdogs_before.contains(tid))
        .expect("the new client's watchdog thread");
    // One cycle first, so the connection and scripts exist before memory is measured.
    locks
        .run_locked("renewal:warm-up", OPTIONS, async {})
        .await
        .expect("warm-up cycle");

    let (heap_before, resident_before) = (heap_in_use(), resident_bytes());
    let leases = acquire_all(&locks).await;
    let (heap_held, resident_held) = (heap_in_use(), resident_bytes());

    let watchdog_cpu = thread_cpu(watchdog);
    let cpu = process_cpu();
    let stats = CommandStats::read(&mut connection).await;
    let round_trips = relay.round_trips();
    let started = Instant::now();
    let hold = hold(&mut connection, &leases).await;
    let held_for = started.elapsed().as_secs_f64();
    let round_trips = relay.round_trips() - round_trips;
    let evalsha = CommandStats::read(&mut connection)
        .await
        .since(&stats, "evalsha");
    let watchdog_share = (thread_cpu(watchdog) - watchdog_cpu).as_secs_f64() / held_for;
    let process_share = (process_cpu() - cpu).as_secs_f64() / held_for;
    let renewals: u64 = leases.iter().map(|l| u64::from(l.renewals())).sum();

    let mut releases = JoinSet::new();
    for lease in leases {
        releases.spawn(lease.release());
    }
    let failed = releases
        .join_all()
        .await
        .iter()
        .filter(|r| r.is_err())
        .count();

    let w = "W4";
    let s = "lockmacro, 10 000 leases × 3 s, 20 s";
    let ticks = held_for / SCAN_INTERVAL.as_secs_f64();
    let renewed = renewals as f64 / ticks;
    report.add(w, s, "lease extensions per 2 s tick", renewed, "", None);
    let requests = evalsha as f64 / ticks;
    report.add(
        w,
        s,
        "Redis requests (EVALSHA) per tick",
        requests,
        "",
        None,
    );
    report.add(
        w,
        s,
        "round trips per tick",
        round_trips as f64 / ticks,
        "",
        None,
    );
    let per_thousand = round_trips as f64 / ticks / (LEASES as f64 / 1000.0);
    let met = per_thousand <= 1.0;
    report.add(
        w,
        s,
        "round trips per 1 000 leases per tick",
        per_thousand,
        "",
        Target::new("≤ 1", met),
    );
    let percent = watchdog_share * 100.0;
    report.add(
        w,
        s,
        "watchdog thread CPU",
        percent,
        "% of a core",
        Target::new("< 2 %", percent < 2.0),
    );
    report.add(
        w,
        s,
        "whole process CPU (with the bench's polling)",
        process_share * 100.0,
        "% of a core",
        None,
    );
    let per_lease = heap_held.saturating_sub(heap_before) as f64 / LEASES as f64;
    report.add(
        w,
        s,
        "memory per lease (heap in use)",
        per_lease,
        "B",
        Target::new("< 1 KiB", per_lease < 1024.0),
    );
    let resident = resident_held.saturating_sub(resident_before) as f64 / LEASES as f64;
    report.add(w, s, "memory per lease (RSS delta)", resident, "B", None);
    let lapses = hold.lapsed as f64;
    report.add(
        w,
        s,
        "lapses",
        lapses,
        "",
        Target::new("= 0", hold.lapsed == 0),
    );
    report.add(
        w,
        s,
        "keys missing at a check, max",
        hold.missing_keys_max as f64,
        "",
        None,
    );
    report.add(w, s, "releases not confirmed", failed as f64, "", None);
}

/// Takes the [`LEASES`] leases, [`ACQUIRE_CONCURRENCY`] at a time.
async fn acquire_all(locks: &LockClient) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(LEASES);
    for chunk in (0..LEASES).collect::<Vec<_>>().chunks(ACQUIRE_CONCURRENCY) {
        let mut taking = JoinSet::new();
        for &i in chunk {
            let locks = locks.clone();
            taking.spawn(async move { locks.acquire(format!("renewal:{i}"), OPTIONS).await });
        }
        for lease in taking.join_all().await {
            leases.push(lease.expect("an uncontended lease"));
        }
    }
    leases
}

/// Holds for [`HOLD`], checking every lease for a lapse every [`LAPSE_CHECK`].
async fn hold(connection: &mut MultiplexedConnection, leases: &[Lease]) -> Hold {
    let mut result = Hold::default();
    let mut lapsed = vec![false; leases.len()];
    let started = Instant::now();
    let mut check = tokio::time::interval(LAPSE_CHECK);
    while started.elapsed() < HOLD {
        check.tick().await;
        for (lease, lapsed) in leases.iter().zip(&mut lapsed) {
            *lapsed |= lease.is_lost() || lease.time_left().is_zero();
        }
        let keys: u64 = redis::cmd("DBSIZE")
            .query_async(connection)
            .await
            .expect("DBSIZE");
        let missing = (leases.len() as u64).saturating_sub(keys);
        result.missing_keys_max = result.missing_keys_max.max(missing);
    }
    result.lapsed = lapsed.iter().filter(|&&l| l).count();
    result
}
