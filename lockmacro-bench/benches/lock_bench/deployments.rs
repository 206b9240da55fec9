//! The workloads on other deployments, each against its own client floor:
//! - W1 and W2 on a Redis Cluster (3 masters on loopback), against redis-rs's own cluster
//!   connection sending `SET NX PX GET` (as the lock does there) + the compare-and-delete
//!   `EVALSHA`, routed by key, with nothing around it (4 Redis commands per cycle);
//! - W1 and W2 on a 3-master Redlock, against the same two commands sent to the three masters at
//!   once through redis-rs alone (one multiplexed connection each), a majority of replies
//!   required at each step (12 Redis commands per cycle);
//! - W4 on the cluster, and on Redlock against one Redis in the same run.
//!
//! Each figure is paired by repetition (floor, ours, floor, ours …): the ratios' median and range
//! over [`REPS`], and the client CPU per cycle of both (this process, `getrusage`).

use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockContext, LockOptions};
use testkit::{RedisCluster, RedisServer};
use tokio::task::JoinSet;

use crate::floor::{ClusterFloor, RedlockFloor};
use crate::measure::{REPS, micros, process_cpu};
use crate::report::Report;

const RUN: Duration = Duration::from_millis(700);
const OPTIONS: LockOptions = LockOptions::new()
    .ttl(Duration::from_secs(3))
    .max_renewals(3);

/// A deployment's client floor: the lock's two commands through redis-rs alone.
#[derive(Clone)]
enum DeploymentFloor {
    /// redis-rs's cluster connection, routed by key.
    Cluster(ClusterFloor),
    /// One multiplexed connection per master, each command sent to all of them at once.
    Redlock(RedlockFloor),
}

impl DeploymentFloor {
    /// One lock cycle on `key`: `SET NX PX`, then the compare-and-delete `EVALSHA`.
    async fn cycle(&mut self, key: &str) {
        match self {
            Self::Cluster(floor) => floor.cycle(key).await,
            Self::Redlock(floor) => floor.cycle(key).await,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum System {
    Floor,
    Lockmacro,
}

/// One repetition of one system.
struct Run {
    cycles_per_s: f64,
    client_cpu_us: f64,
}

/// `tasks` tasks, each on its own key, for `duration`.
async fn run(
    floor: &DeploymentFloor,
    locks: &LockClient,
    system: System,
    tasks: usize,
    duration: Duration,
) -> Run {
    let cpu_before = process_cpu();
    let started = Instant::now();
    let deadline = started + duration;
    let mut running = JoinSet::new();
    for task in 0..tasks {
        let (mut floor, locks) = (floor.clone(), locks.clone());
        running.spawn(async move {
            let key = format!("deployment-bench:{task}");
            let mut cycles = 0u64;
            while Instant::now() < deadline {
                match system {
                    System::Floor => floor.cycle(&key).await,
                    System::Lockmacro => locks
                        .run_locked(key.as_str(), OPTIONS, async {})
                        .await
                        .expect("run_locked"),
                }
                cycles += 1;
            }
            cycles
        });
    }
    let mut cycles = 0;
    while let Some(done) = running.join_next().await {
        cycles += done.expect("a cycling task");
    }
    let cpu = process_cpu() - cpu_before;
    Run {
        cycles_per_s: cycles as f64 / started.elapsed().as_secs_f64(),
        client_cpu_us: micros(cpu) / cycles.max(1) as f64,
    }
}

/// W1 (1 task) and W2 (64 tasks) on one deployment, interleaved with its floor: cycles/s of
/// both, ours ÷ the floor, and client CPU per cycle of both and ours ÷ the floor's.
async fn against_floor(
    report: &mut Report,
    workloads: [&'static str; 2],
    floor_name: &'static str,
    floor: &DeploymentFloor,
    locks: &LockClient,
) {
    const OURS: &str = "lockmacro run_locked";
    for (workload, tasks) in workloads.into_iter().zip([1, 64]) {
        for system in [System::Floor, System::Lockmacro] {
            run(floor, locks, system, tasks, RUN / 4).await;
        }
        let (mut floors, mut ours) = (Vec::new(), Vec::new());
        for _ in 0..REPS {
            floors.push(run(floor, locks, System::Floor, tasks, RUN).await);
            ours.push(run(floor, locks, System::Lockmacro, tasks, RUN).await);
        }
        let figure = |runs: &[Run], f: fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<_>>();
        let paired = |f: fn(&Run) -> f64| {
            ours.iter()
                .zip(&floors)
                .map(|(o, b)| f(o) / f(b))
                .collect::<Vec<_>>()
        };
        let cps = |r: &Run| r.cycles_per_s;
        let cpu = |r: &Run| r.client_cpu_us;
        report.add_runs(
            workload,
            floor_name,
            "cycles/s",
            &figure(&floors, cps),
            "/s",
            None,
        );
        report.add_runs(workload, OURS, "cycles/s", &figure(&ours, cps), "/s", None);
        report.add_runs(
            workload,
            OURS,
            "cycles/s ÷ its floor",
            &paired(cps),
            "×",
            Some(("≥ 1×", |r| r >= 1.0)),
        );
        let floor_cpu = figure(&floors, cpu);
        report.add_runs(
            workload,
            floor_name,
            "client CPU per cycle",
            &floor_cpu,
            "µs",
            None,
        );
        report.add_runs(
            workload,
            OURS,
            "client CPU per cycle",
            &figure(&ours, cpu),
            "µs",
            None,
        );
        report.add_runs(
            workload,
            OURS,
            "client CPU per cycle ÷ its floor",
            &paired(cpu),
            "×",
            None,
        );
    }
}

/// W1 and W2 on a 3-master cluster against redis-rs's cluster connection alone.
pub async fn uncontended(report: &mut Report) {
    let cluster = RedisCluster::start(3, 0);
    let connection = redis::cluster::ClusterClient::new(cluster.seed_urls())
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection");
    let floor = DeploymentFloor::Cluster(ClusterFloor::cluster(connection).await);
    let locks = LockClient::cluster_builder(cluster.seed_urls())
        .build()
        .await
        .expect("LockClient");
    against_floor(
        report,
        ["W1 cluster", "W2 cluster"],
        "redis-rs cluster connection alone",
        &floor,
        &locks,
    )
    .await;
}

/// W4 on the cluster: 3 000 leases of 900 ms renewed for 6 s: lapses, script calls per master per
/// tick, and the client's CPU.
pub async fn renewal(report: &mut Report) {
    const LEASES: usize = 3_000;
    const HOLD: Duration = Duration::from_secs(6);
    const SCAN: Duration = Duration::from_millis(300);
    let cluster = RedisCluster::start(3, 0);
    let locks = LockClient::cluster_builder(cluster.seed_urls())
        .scan_interval(SCAN)
        .build()
        .await
        .expect("LockClient");
    let options = LockOptions::new()
        .ttl(Duration::from_millis(900))
        .unlimited_renewals();
    let calls_before: u64 = cluster
        .masters()
        .iter()
        .map(|node| evalsha_calls(node))
        .sum();
    let cpu_before = process_cpu();
    let started = Instant::now();
    let mut holders = JoinSet::new();
    for n in 0..LEASES {
        let locks = locks.clone();
        holders.spawn(async move {
            locks
                .run_locked(format!("cluster-w4:{n}"), options, async {
                    tokio::time::sleep(HOLD).await;
                    LockContext::current().unwrap().renewals()
                })
                .await
        });
    }
    let (mut lapses, mut renewals) = (0usize, 0u64);
    while let Some(outcome) = holders.join_next().await {
        match outcome.expect("a holder") {
            Ok(count) => renewals += u64::from(count),
            Err(_) => lapses += 1,
        }
    }
    let took = started.elapsed();
    let cpu = process_cpu() - cpu_before;
    let calls: u64 = cluster
        .masters()
        .iter()
        .map(|node| evalsha_calls(node))
        .sum::<u64>()
        - calls_before;
    // Every lease is renewed about every third of its ttl: that is one tick for all of them.
    let ticks = renewals as f64 / LEASES as f64;
    report.add("W4 cluster", "lockmacro", "lapses", lapses as f64, "", None);
    report.add("W4 cluster", "lockmacro", "renewal ticks", ticks, "", None);
    report.add(
        "W4 cluster",
        "lockmacro",
        "script calls per master per tick (acquire/release included)",
        calls as f64 / 3.0 / ticks.max(1.0),
        "",
        None,
    );
    report.add(
        "W4 cluster",
        "lockmacro",
        "client CPU, % of a core",
        cpu.as_secs_f64() / took.as_secs_f64() * 100.0,
        "%",
        None,
    );
}

fn evalsha_calls(node: &testkit::RedisServer) -> u64 {
    let info: String =
        redis::from_redis_value(node.command(&["INFO", "commandstats"])).unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// W1 and W2 on a 3-master Redlock against its floor; W4 against one Redis in the same run.
pub async fn redlock(report: &mut Report) {
    let single = RedisServer::start();
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let mut connections = Vec::new();
    for master in &masters {
        connections.push(master.connection().await);
    }
    let floor = DeploymentFloor::Redlock(RedlockFloor::new(connections).await);
    let one = LockClient::connect(&single.url())
        .await
        .expect("LockClient");
    let quorum = LockClient::redlock_builder(&urls)
        .build()
        .await
        .expect("Redlock client");
    against_floor(
        report,
        ["W1 redlock", "W2 redlock"],
        "redis-rs alone to 3 masters at once",
        &floor,
        &quorum,
    )
    .await;
    let (one_lapses, one_cpu) = hold_many(&one, "one").await;
    let (quorum_lapses, quorum_cpu) = hold_many(&quorum, "quorum").await;
    report.add(
        "W4 redlock",
        "lockmacro, 3 masters",
        "lapses",
        quorum_lapses as f64,
        "",
        None,
    );
    report.add(
        "W4 redlock",
        "lockmacro, one Redis",
        "lapses",
        one_lapses as f64,
        "",
        None,
    );
    report.add(
        "W4 redlock",
        "lockmacro, 3 masters",
        "client CPU ÷ one Redis",
        quorum_cpu / one_cpu.max(f64::EPSILON),
        "×",
        None,
    );
}

/// 3 000 leases of 900 ms renewed for 6 s through `locks`: lapses and the client's CPU seconds.
async fn hold_many(locks: &LockClient, prefix: &str) -> (usize, f64) {
    let options = LockOptions::new()
        .ttl(Duration::from_millis(900))
        .unlimited_renewals();
    let cpu_before = process_cpu();
    let mut holders = JoinSet::new();
    for n in 0..3_000 {
        let locks = locks.clone();
        let key = format!("redlock-w4:{prefix}:{n}");
        holders.spawn(async move {
            locks
                .run_locked(key, options, tokio::time::sleep(Duration::from_secs(6)))
                .await
        });
    }
    let mut lapses = 0;
    while let Some(outcome) = holders.join_next().await {
        lapses += usize::from(outcome.expect("a holder").is_err());
    }
    (lapses, (process_cpu() - cpu_before).as_secs_f64())
}
