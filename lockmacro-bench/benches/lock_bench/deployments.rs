//! The workloads on other deployments:
//! - W1, W2 and W4 on a Redis Cluster (3 masters on loopback), against a raw floor on the same
//!   cluster: redis-rs's own cluster connection doing `SET NX PX` + the compare-and-delete
//!   `EVALSHA`, routed by key, with nothing around it;
//! - W1 and W4 on a 3-master Redlock, against the same workloads on one Redis in the same run.

use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockContext, LockOptions};
use redis::cluster_async::ClusterConnection;
use testkit::{RedisCluster, RedisServer};
use tokio::task::JoinSet;

use crate::measure::{REPS, median, process_cpu};
use crate::report::Report;

const RUN: Duration = Duration::from_millis(700);
const OPTIONS: LockOptions = LockOptions::new()
    .ttl(Duration::from_secs(3))
    .max_renewals(3);
const COMPARE_AND_DELETE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

#[derive(Clone, Copy, PartialEq, Eq)]
enum System {
    Floor,
    Lockmacro,
}

/// Cycles per second of `tasks` tasks, each on its own key, for [`RUN`].
async fn cycles_per_s(
    floor: &ClusterConnection,
    locks: &LockClient,
    system: System,
    tasks: usize,
) -> f64 {
    let deadline = Instant::now() + RUN;
    let started = Instant::now();
    let mut running = JoinSet::new();
    for task in 0..tasks {
        let (mut floor, locks) = (floor.clone(), locks.clone());
        running.spawn(async move {
            let key = format!("cluster-bench:{task}");
            let mut cycles = 0u64;
            while Instant::now() < deadline {
                match system {
                    System::Floor => {
                        let token = format!("{task:016x}{cycles:016x}");
                        let taken: Option<String> = redis::cmd("SET")
                            .arg(&key)
                            .arg(&token)
                            .arg("NX")
                            .arg("PX")
                            .arg(3000)
                            .query_async(&mut floor)
                            .await
                            .expect("SET NX PX");
                        assert!(taken.is_some());
                        let _: i64 = redis::Script::new(COMPARE_AND_DELETE)
                            .key(&key)
                            .arg(&token)
                            .invoke_async(&mut floor)
                            .await
                            .expect("compare-and-delete");
                    }
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
    cycles as f64 / started.elapsed().as_secs_f64()
}

/// W1 (1 task) and W2 (64 tasks) on the cluster, interleaved with the floor.
pub async fn uncontended(report: &mut Report) {
    let cluster = RedisCluster::start(3, 0);
    let floor = redis::cluster::ClusterClient::new(cluster.seed_urls())
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection");
    let locks = LockClient::cluster_builder(cluster.seed_urls())
        .build()
        .await
        .expect("LockClient");
    for (workload, tasks) in [("W1 cluster", 1), ("W2 cluster", 64)] {
        for system in [System::Floor, System::Lockmacro] {
            cycles_per_s(&floor, &locks, system, tasks).await;
        }
        let mut ratios = Vec::new();
        let mut ours = Vec::new();
        let mut floors = Vec::new();
        for _ in 0..REPS {
            let floor_cps = cycles_per_s(&floor, &locks, System::Floor, tasks).await;
            let our_cps = cycles_per_s(&floor, &locks, System::Lockmacro, tasks).await;
            ratios.push(our_cps / floor_cps);
            ours.push(our_cps);
            floors.push(floor_cps);
        }
        report.add(
            workload,
            "raw cluster floor",
            "cycles/s",
            median(floors),
            "/s",
            None,
        );
        report.add(
            workload,
            "lockmacro run_locked",
            "cycles/s",
            median(ours),
            "/s",
            None,
        );
        report.add(
            workload,
            "lockmacro run_locked",
            "cycles/s ÷ raw cluster floor",
            median(ratios),
            "×",
            None,
        );
    }
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

/// Lock cycles per second of one task on its own key through `locks`, for [`RUN`].
async fn single_task_cycles(locks: &LockClient) -> f64 {
    let deadline = Instant::now() + RUN;
    let started = Instant::now();
    let mut cycles = 0u64;
    while Instant::now() < deadline {
        locks
            .run_locked("redlock-bench:1", OPTIONS, async {})
            .await
            .expect("run_locked");
        cycles += 1;
    }
    cycles as f64 / started.elapsed().as_secs_f64()
}

/// W1 and W4 on a 3-master Redlock, each against one Redis in the same run.
pub async fn redlock(report: &mut Report) {
    let single = RedisServer::start();
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let one = LockClient::connect(&single.url())
        .await
        .expect("LockClient");
    let quorum = LockClient::redlock_builder(&urls)
        .build()
        .await
        .expect("Redlock client");
    single_task_cycles(&one).await;
    single_task_cycles(&quorum).await;
    let mut ratios = Vec::new();
    for _ in 0..REPS {
        let one_cps = single_task_cycles(&one).await;
        let quorum_cps = single_task_cycles(&quorum).await;
        ratios.push(quorum_cps / one_cps);
    }
    report.add(
        "W1 redlock",
        "lockmacro run_locked, 3 masters",
        "cycles/s ÷ one Redis",
        median(ratios),
        "×",
        None,
    );
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
