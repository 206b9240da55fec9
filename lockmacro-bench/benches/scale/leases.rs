//! Leases held by one client: how memory, the watchdog's CPU and round trips, and how late
//! renewals come grow with the number of leases.
//!
//! One client takes `n` leases (ttl 30 s, renewed without limit, the default 2 s scan) through a
//! relay that counts round trips, holds them all for 25 s after the last is taken, then releases
//! them. A sampler watches up to 1 000 of them every 20 ms: each renewal's lateness is how long
//! past its third a lease was when its renewal was confirmed: the time since its last confirmed
//! send (its validity, the ttl less the drift margin of 1 % + 2 ms, less its least time left
//! seen before the renewal), less a third of the ttl.
//!
//! `SCALE_HOLD_S` holds them that many seconds instead of 25 (a longer hold: does any lease
//! lapse?); `SCALE_TTL_S` gives them that ttl instead of 30 s. For taking them all and for
//! releasing them all, it also prints what Redis and this process did meanwhile (CPU, and calls
//! and time of each command in Redis), which tells where the time of a phase went.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use lockmacro_runtime::{Lease, LockClient, LockOptions};
use serde_json::{Value, json};
use testkit::RedisServer;
use tokio::task::JoinSet;

use crate::measure::{
    CommandStats, heap_in_use, percentile, process_cpu, resident_bytes, server_pid, thread_cpu,
    threads_named,
};
use crate::relay::RoundTripRelay;
use crate::work::Work;
use crate::{grouped, number};

/// The client's scan period (the default): one tick.
const SCAN: Duration = Duration::from_secs(2);
/// Tasks taking (and releasing) the leases.
const TAKERS: usize = 64;
/// Leases the sampler watches at most.
const SAMPLED: usize = 1_000;
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// The watchdog thread's name as `/proc` shows it: `lockmacro-watchdog` cut to 15 bytes.
const WATCHDOG_COMM: &str = "lockmacro-watch";

pub async fn measure(n: usize, quick: bool) -> Value {
    let (ttl, hold) = if quick {
        (Duration::from_secs(6), Duration::from_secs(5))
    } else {
        (Duration::from_secs(30), Duration::from_secs(25))
    };
    let seconds = |name: &str| -> Option<Duration> {
        let value = std::env::var(name).ok()?;
        Some(Duration::from_secs_f64(value.parse().expect(name)))
    };
    let ttl = seconds("SCALE_TTL_S").unwrap_or(ttl);
    let hold = seconds("SCALE_HOLD_S").unwrap_or(hold);
    let server = RedisServer::start();
    let mut stats = server.connection().await;
    let server_pid = server_pid(&mut stats).await;
    let relay = RoundTripRelay::start(server.addr()).await;
    let watchdogs_before = threads_named(WATCHDOG_COMM);
    let locks = LockClient::builder(&relay.url())
        .scan_interval(SCAN)
        .build()
        .await
        .expect("LockClient");
    let watchdog = threads_named(WATCHDOG_COMM)
        .into_iter()
        .find(|tid| !watchdogs_before.contains(tid))
        .expect("the new client's watchdog thread");
    let options = LockOptions::new().ttl(ttl).unlimited_renewals();
    // A cycle first, so that the connection and scripts exist before memory is measured.
    locks
        .run_locked("scale-lease:warm-up", options, async {})
        .await
        .expect("warm-up");
    // When each lease was taken (ms since `began`), allocated before memory is measured.
    let taken_at: Arc<Vec<AtomicU32>> = Arc::new((0..n).map(|_| AtomicU32::new(0)).collect());
    let (heap_before, resident_before) = (heap_in_use(), resident_bytes());
    let take_work = Work::read(&mut stats, server_pid).await;
    let began = Instant::now();
    let mut takers = JoinSet::new();
    for taker in 0..TAKERS {
        let (locks, taken_at) = (locks.clone(), taken_at.clone());
        takers.spawn(async move {
            let (mut held, mut failed) = (Vec::with_capacity(n / TAKERS + 1), 0usize);
            for i in (taker..n).step_by(TAKERS) {
                // An acquire that fails (timed out behind a renewal batch, say) is counted and
                // tried again: its key is released by the client if the `SET` landed.
                let lease = loop {
                    match locks.acquire(format!("scale-lease:{i}"), options).await {
                        Ok(lease) => break lease,
                        Err(_) => failed += 1,
                    }
                };
                let at = began.elapsed().as_millis() as u32;
                taken_at[i].store(at, Ordering::Relaxed);
                held.push((i, lease));
            }
            (held, failed)
        });
    }
    let mut leases: Vec<(usize, Lease)> = Vec::with_capacity(n);
    let mut acquire_failures = 0;
    while let Some(taken) = takers.join_next().await {
        let (held, failed) = taken.expect("a taker");
        leases.extend(held);
        acquire_failures += failed;
    }
    let take_all = began.elapsed();
    let take_work = Work::read(&mut stats, server_pid).await.since(&take_work);
    let heap_per_lease = heap_in_use().saturating_sub(heap_before) as f64 / n as f64;
    let resident_per_lease = resident_bytes().saturating_sub(resident_before) as f64 / n as f64;

    // Hold them all: the watchdog's CPU, round trips and scripts, and renewals' lateness.
    let leases = Arc::new(leases);
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample(leases.clone(), stop.clone(), ttl));
    let (watchdog_before, cpu_before) = (thread_cpu(watchdog), process_cpu());
    let (trips_before, commands_before) =
        (relay.round_trips(), CommandStats::read(&mut stats).await);
    let hold_began = Instant::now();
    tokio::time::sleep(hold).await;
    let held_for = hold_began.elapsed().as_secs_f64();
    let watchdog_share = (thread_cpu(watchdog) - watchdog_before).as_secs_f64() / held_for;
    let process_share = (process_cpu() - cpu_before).as_secs_f64() / held_for;
    let commands = CommandStats::read(&mut stats).await;
    let scripts = commands.since(&commands_before, "evalsha");
    let trips = relay.round_trips() - trips_before;
    stop.store(true, Ordering::Release);
    let lateness = sampler.await.expect("the sampler");
    let ticks = held_for / SCAN.as_secs_f64();

    // Lapses: leases found lost, and keys gone from Redis while they were held.
    let lost = leases.iter().filter(|(_, lease)| lease.is_lost()).count();
    let past_deadline = leases
        .iter()
        .filter(|(_, lease)| lease.time_left().is_zero())
        .count();
    let keys: u64 = redis::cmd("DBSIZE")
        .query_async(&mut stats)
        .await
        .expect("DBSIZE");
    let missing = (n as u64).saturating_sub(keys);
    // Renewals done against those due: one every third of the ttl plus a scan at most.
    let release_began = began.elapsed();
    let every = (ttl / 3 + SCAN).as_secs_f64();
    let (mut renewals, mut due) = (0u64, 0u64);
    for (i, lease) in leases.iter() {
        renewals += u64::from(lease.renewals());
        let taken = Duration::from_millis(u64::from(taken_at[*i].load(Ordering::Relaxed)));
        due += ((release_began - taken).as_secs_f64() / every) as u64;
    }

    let leases = Arc::try_unwrap(leases).unwrap_or_else(|_| panic!("the sampler has ended"));
    let release_work = Work::read(&mut stats, server_pid).await;
    let released = Instant::now();
    let mut per_releaser: Vec<Vec<Lease>> = (0..TAKERS).map(|_| Vec::new()).collect();
    for (i, (_, lease)) in leases.into_iter().enumerate() {
        per_releaser[i % TAKERS].push(lease);
    }
    let mut releasers = JoinSet::new();
    for leases in per_releaser {
        releasers.spawn(async move {
            let (mut failed, mut lost) = (0usize, 0usize);
            for lease in leases {
                // Lost, or past its local deadline, while the others were released.
                lost += usize::from(lease.is_lost() || lease.time_left().is_zero());
                failed += usize::from(lease.release().await.is_err());
            }
            (failed, lost)
        });
    }
    let (mut release_failures, mut lost_before_release) = (0, 0);
    while let Some(done) = releasers.join_next().await {
        let (failed, lost) = done.expect("a releaser");
        release_failures += failed;
        lost_before_release += lost;
    }
    let release_all = released.elapsed();
    let release_work = Work::read(&mut stats, server_pid)
        .await
        .since(&release_work);
    json!({
        "leases": n,
        "ttl_s": ttl.as_secs_f64(),
        "hold_s": held_for,
        "resident_bytes_per_lease": resident_per_lease,
        "heap_bytes_per_lease": heap_per_lease,
        "watchdog_cpu_percent": watchdog_share * 100.0,
        "process_cpu_percent": process_share * 100.0,
        "round_trips_per_tick": trips as f64 / ticks,
        "extend_scripts_per_tick": scripts as f64 / ticks,
        "renewal_lateness_p50_ms": percentile(&lateness, 0.5),
        "renewal_lateness_p99_ms": percentile(&lateness, 0.99),
        "renewal_lateness_max_ms": percentile(&lateness, 1.0),
        "renewals_per_lease": renewals as f64 / n as f64,
        "renewals_due_per_lease": due as f64 / n as f64,
        "lost": lost,
        "past_deadline": past_deadline,
        "keys_missing": missing,
        "release_failures": release_failures,
        "lost_before_release": lost_before_release,
        "acquire_failures": acquire_failures,
        "take_all_s": take_all.as_secs_f64(),
        "release_all_s": release_all.as_secs_f64(),
        "take_work": take_work,
        "release_work": release_work,
    })
}

/// Watches up to [`SAMPLED`] leases until `stop`: the lateness of each renewal seen, in ms.
async fn sample(
    leases: Arc<Vec<(usize, Lease)>>,
    stop: Arc<AtomicBool>,
    ttl: Duration,
) -> Vec<f64> {
    let stride = (leases.len() / SAMPLED).max(1);
    let watched: Vec<&Lease> = leases.iter().step_by(stride).map(|(_, l)| l).collect();
    let mut seen: Vec<(u32, Duration)> = watched
        .iter()
        .map(|l| (l.renewals(), l.time_left()))
        .collect();
    let mut lateness = Vec::new();
    let third = ttl.as_secs_f64() * 1e3 / 3.0;
    // The lease's validity: its ttl less the drift margin (`LeaseState`'s deadline).
    let validity = ttl - ttl / 100 - Duration::from_millis(2);
    while !stop.load(Ordering::Acquire) {
        tokio::time::sleep(SAMPLE_EVERY).await;
        for (lease, (renewals, least_left)) in watched.iter().zip(&mut seen) {
            let (now_renewals, left) = (lease.renewals(), lease.time_left());
            if now_renewals > *renewals {
                let since = validity.saturating_sub(*least_left).as_secs_f64() * 1e3;
                lateness.push((since - third).max(0.0));
                *renewals = now_renewals;
                *least_left = left;
            } else {
                *least_left = (*least_left).min(left);
            }
        }
    }
    lateness
}

/// The curve as a markdown table.
pub fn table(rows: &[Value]) -> String {
    let mut out = String::from(
        "\n### Leases held by one client\n\n| leases | resident / heap per lease | watchdog CPU (process) | round trips / extend scripts per tick | renewal lateness p50 / p99 / max | renewals done / due per lease | lapses: lost / past local deadline / keys missing | take all (failed acquires) | release all |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let f = |name| number(row, name);
        out += &format!(
            "| {} | {:.0} / {:.0} B | {:.2} % ({:.1} %) | {:.1} / {:.1} | {:.0} / {:.0} / {:.0} ms | {:.2} / {:.2} | {} / {} / {} | {:.2} s ({}) | {:.2} s |\n",
            grouped(f("leases")),
            f("resident_bytes_per_lease"),
            f("heap_bytes_per_lease"),
            f("watchdog_cpu_percent"),
            f("process_cpu_percent"),
            f("round_trips_per_tick"),
            f("extend_scripts_per_tick"),
            f("renewal_lateness_p50_ms"),
            f("renewal_lateness_p99_ms"),
            f("renewal_lateness_max_ms"),
            f("renewals_per_lease"),
            f("renewals_due_per_lease"),
            f("lost"),
            f("past_deadline"),
            f("keys_missing"),
            f("take_all_s"),
            f("acquire_failures"),
            f("release_all_s"),
        );
    }
    out
}
