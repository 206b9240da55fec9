//! The uncontended cycle with each system in a process of its own, as users run them:
//! `cargo bench -p lockmacro-bench --bench cycle`.
//!
//! One `redis-server` for the run; each system (redis-rs alone sending `SET NX PX` + the
//! compare-and-delete `EVALSHA` through one multiplexed connection, lockmacro's `run_locked`,
//! and lockmacro through `#[redis_lock]` as users write it: `lockmacro-attr`) runs as a child
//! process of this binary, for W1 (one task) and W2 (64 tasks, a key each), interleaved
//! A B C A B C … over 5 repetitions. It prints cycles/s, the child's CPU per cycle (`getrusage`,
//! whole process) and the Redis servers' CPU per cycle (`/proc`, every server of the
//! deployment), each ours ÷ redis-rs alone paired by repetition, median and range.
//!
//! `… --bench cycle -- W1c W2c` runs the same on a 3-master Redis Cluster instead: redis-rs's
//! cluster connection alone sending the lock's two commands there (`ClusterFloor`), against
//! `run_locked` on a `cluster_builder` client. The floor's connection has no timer by default, as
//! redis-rs's cluster connection comes; `CYCLE_FLOOR_TIMEOUT=1` gives it the lock's response
//! timeout, which redis-rs arms on each node's reply and on each request as a whole.
//!
//! `… --bench cycle -- W1r W2r` runs it on a 3-master Redlock: the two commands sent to the three
//! masters at once through redis-rs alone, a majority required at each step (`RedlockFloor`),
//! against `run_locked` on a `redlock_builder` client.
//!
//! `… --bench cycle -- W2` runs one workload; `CYCLE_REPS=n` sets the repetitions (5).
//! `CYCLE_PERF=dir` records each child's first repetition with `perf record -g` into
//! `dir/{system}-{tasks}.data`, for profiling the two side by side. `CYCLE_COUNT=n` makes a child
//! run `n` cycles per task and stop, so that `valgrind --tool=callgrind` counts the instructions
//! of a cycle: the difference between two counts over the difference of their cycles. A child is
//! `--cycle-child <system> <url> <tasks>`; a cluster child's `<url>` is its seed nodes' URLs
//! joined by commas, a Redlock child's its masters' URLs.
//!
//! `CYCLE_BEFORE=<path>` names an older build of this bench (its binary, e.g. a copy of
//! `target/release/deps/cycle-…` built at an older commit): each lockmacro system then runs
//! from it too, as `<system> (before)` right after the current one in every repetition, against
//! the same servers, and a second table gives now ÷ before for each, paired by repetition. The
//! older build must know the system (`--cycle-child` as above).

#[allow(dead_code)]
#[path = "../lock_bench/floor.rs"]
mod floor;
#[allow(dead_code)]
#[path = "../lock_bench/measure.rs"]
mod measure;

use std::future::Future;
use std::process::Command;
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockError, LockOptions, redis_lock};
use redis::aio::MultiplexedConnection;
use testkit::{RedisCluster, RedisServer};

use floor::{ClusterFloor, Floor, RedlockFloor};
use measure::{median, micros, process_cpu, process_cpu_of, server_pid};

const CHILD: &str = "--cycle-child";
const RESULT: &str = "cycle-result ";
/// Repetitions unless `CYCLE_REPS` says how many.
const REPS: usize = 5;
const RUN: Duration = Duration::from_secs(2);
const OPTIONS: LockOptions = LockOptions::new()
    .ttl(Duration::from_secs(3))
    .max_renewals(3);
/// The floor first; `-attr`: the same cycle through `#[redis_lock]` ([`attr_cycle`]).
const SYSTEMS: [&str; 3] = ["redis-rs", "lockmacro", "lockmacro-attr"];
/// The same on a Redis Cluster of [`MASTERS`], its floor first.
const CLUSTER_SYSTEMS: [&str; 3] = [
    "redis-rs-cluster",
    "lockmacro-cluster",
    "lockmacro-cluster-attr",
];
const MASTERS: usize = 3;
/// The same on a Redlock of [`MASTERS`] independent servers, its floor first.
const REDLOCK_SYSTEMS: [&str; 3] = [
    "redis-rs-redlock",
    "lockmacro-redlock",
    "lockmacro-redlock-attr",
];
/// The lock's response timeout (`LockClientBuilder`'s default), and the cluster floor's with
/// [`FLOOR_TIMEOUT`].
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
const FLOOR_TIMEOUT: &str = "CYCLE_FLOOR_TIMEOUT";
/// Cycles per task instead of a timed run (no warm-up), for counting instructions per cycle.
const COUNT: &str = "CYCLE_COUNT";
/// An older build of this bench whose lockmacro systems run beside the current ones.
const BEFORE: &str = "CYCLE_BEFORE";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|arg| arg == CHILD) {
        let (system, url, tasks) = (&args[at + 1], &args[at + 2], args[at + 3].parse().unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (cps, cpu, redis_cpu) = match system.as_str() {
            "redis-rs" | "lockmacro" | "lockmacro-attr" => {
                runtime.block_on(child(system, url, tasks))
            }
            "redis-rs-redlock" | "lockmacro-redlock" | "lockmacro-redlock-attr" => {
                runtime.block_on(redlock_child(system, url, tasks))
            }
            _ => runtime.block_on(cluster_child(system, url, tasks)),
        };
        println!("{RESULT}{cps} {cpu} {redis_cpu}");
        return;
    }
    let reps =
        std::env::var("CYCLE_REPS").map_or(REPS, |reps| reps.parse().expect("CYCLE_REPS: a count"));
    // `cargo bench` passes `--bench`; the rest names workloads. The cluster and Redlock ones
    // only by name.
    let asked: Vec<&String> = args.iter().filter(|arg| !arg.starts_with("--")).collect();
    let workloads: Vec<(&str, usize, Deployment)> = [
        ("W1", 1usize, Deployment::Server),
        ("W2", 64, Deployment::Server),
        ("W1c", 1, Deployment::Cluster),
        ("W2c", 64, Deployment::Cluster),
        ("W1r", 1, Deployment::Redlock),
        ("W2r", 64, Deployment::Redlock),
    ]
    .into_iter()
    .filter(|(name, _, deployment)| match asked.is_empty() {
        true => *deployment == Deployment::Server,
        false => asked.iter().any(|arg| arg == name),
    })
    .collect();
    let wanted = |wanted: Deployment| workloads.iter().any(|(_, _, on)| *on == wanted);
    let server = RedisServer::start();
    let cluster = wanted(Deployment::Cluster).then(|| RedisCluster::start(MASTERS, 0));
    let seeds = cluster
        .as_ref()
        .map(|cluster| cluster.seed_urls().join(","))
        .unwrap_or_default();
    let redlock: Vec<RedisServer> = match wanted(Deployment::Redlock) {
        true => (0..MASTERS).map(|_| RedisServer::start()).collect(),
        false => Vec::new(),
    };
    let masters = redlock
        .iter()
        .map(RedisServer::url)
        .collect::<Vec<_>>()
        .join(",");
    let perf = std::env::var("CYCLE_PERF").ok();
    let exe = std::env::current_exe().expect("this binary");
    let before = std::env::var_os(BEFORE).map(std::path::PathBuf::from);
    if let Some(before) = &before {
        assert!(
            before.is_file(),
            "{BEFORE}: no file at {}",
            before.display()
        );
    }
    // Now ÷ before, per workload and system: printed after the table.
    let mut versus: Vec<String> = Vec::new();
    println!(
        "| workload | system | cycles/s | client CPU per cycle | Redis CPU per cycle | cycles/s ÷ its floor | client CPU ÷ its floor | Redis CPU ÷ its floor |\n|---|---|---:|---:|---:|---:|---:|---:|"
    );
    for (workload, tasks, deployment) in workloads {
        let (systems, url) = match deployment {
            Deployment::Server => (SYSTEMS, server.url()),
            Deployment::Cluster => (CLUSTER_SYSTEMS, seeds.clone()),
            Deployment::Redlock => (REDLOCK_SYSTEMS, masters.clone()),
        };
        // What runs, in this order in every repetition: (row, binary, system, the row it is
        // the older build of). The floor first; with `CYCLE_BEFORE`, each lockmacro system's
        // older build right after it.
        let mut rows: Vec<(String, &std::path::Path, &str, Option<usize>)> = Vec::new();
        for (i, system) in systems.iter().enumerate() {
            rows.push((system.to_string(), &exe, system, None));
            if let Some(before) = before.as_deref().filter(|_| i > 0) {
                rows.push((
                    format!("{system} (before)"),
                    before,
                    system,
                    Some(rows.len() - 1),
                ));
            }
        }
        let mut runs: Vec<Vec<(f64, f64, f64)>> = vec![Vec::new(); rows.len()];
        for rep in 0..reps {
            for (i, (row, exe, system, _)) in rows.iter().enumerate() {
                let mut command = match (&perf, rep) {
                    (Some(dir), 0) => {
                        let mut perf = Command::new("perf");
                        let name = row.replace(" (before)", "-before");
                        perf.args(["record", "-g", "-q", "-o"])
                            .arg(format!("{dir}/{name}-{tasks}.data"))
                            .arg(exe);
                        perf
                    }
                    _ => Command::new(exe),
                };
                let output = command
                    .arg(CHILD)
                    .arg(system)
                    .arg(&url)
                    .arg(tasks.to_string())
                    .output()
                    .expect("a child");
                let stdout = String::from_utf8_lossy(&output.stdout);
                let line = stdout
                    .lines()
                    .find_map(|line| line.strip_prefix(RESULT))
                    .unwrap_or_else(|| {
                        panic!(
                            "{row} ({}) gave no result: {}",
                            exe.display(),
                            String::from_utf8_lossy(&output.stderr)
                        )
                    });
                let mut figures = line.split(' ').map(|f| f.parse::<f64>().unwrap());
                let mut figure = || figures.next().unwrap();
                runs[i].push((figure(), figure(), figure()));
            }
        }
        let spread = |values: &[f64]| {
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.2} ({lo:.2}–{hi:.2})", median(values.iter().copied()))
        };
        // Each repetition's figures of row `i` over row `of`'s.
        let paired = |i: usize, of: usize, f: fn(&(f64, f64, f64)) -> f64| -> Vec<f64> {
            runs[i]
                .iter()
                .zip(&runs[of])
                .map(|(o, b)| f(o) / f(b))
                .collect()
        };
        for (i, (system, _, _, before_of)) in rows.iter().enumerate() {
            let cps: Vec<f64> = runs[i].iter().map(|r| r.0).collect();
            let cpu: Vec<f64> = runs[i].iter().map(|r| r.1).collect();
            let redis_cpu: Vec<f64> = runs[i].iter().map(|r| r.2).collect();
            let ratio = |f: fn(&(f64, f64, f64)) -> f64| paired(i, 0, f);
            if let Some(now) = *before_of {
                versus.push(format!(
                    "| {workload} | {} | {}× | {}× | {}× |",
                    rows[now].0,
                    spread(&paired(now, i, |r| r.0)),
                    spread(&paired(now, i, |r| r.1)),
                    spread(&paired(now, i, |r| r.2)),
                ));
            }
            println!(
                "| {workload} | {system} | {:.0} | {} µs | {} µs | {}× | {}× | {}× |",
                median(cps.iter().copied()),
                spread(&cpu),
                spread(&redis_cpu),
                spread(&ratio(|r| r.0)),
                spread(&ratio(|r| r.1)),
                spread(&ratio(|r| r.2)),
            );
        }
    }
    if let Some(before) = &before {
        println!(
            "\nNow ÷ before ({}), paired by repetition: median (range)\n\n| workload | system | cycles/s | client CPU per cycle | Redis CPU per cycle |\n|---|---|---:|---:|---:|",
            before.display()
        );
        for line in &versus {
            println!("{line}");
        }
    }
    println!(
        "\n{reps} interleaved repetitions of {} s each, each system its own process; load average after: {}",
        RUN.as_secs(),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
}

/// What a workload runs on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Deployment {
    Server,
    Cluster,
    Redlock,
}

/// One system's lock cycle, as each of a child's tasks runs it on a key of its own: `key`,
/// which is `cycle:{task}`.
trait Cycle: Clone + Send + 'static {
    fn cycle(&mut self, task: usize, key: &str) -> impl Future<Output = ()> + Send;
}

impl<C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static> Cycle for Floor<C> {
    fn cycle(&mut self, _: usize, key: &str) -> impl Future<Output = ()> + Send {
        Floor::cycle(self, key)
    }
}

impl Cycle for RedlockFloor {
    fn cycle(&mut self, _: usize, key: &str) -> impl Future<Output = ()> + Send {
        RedlockFloor::cycle(self, key)
    }
}

/// lockmacro's `run_locked` with an empty body.
#[derive(Clone)]
struct RunLocked(LockClient);

impl Cycle for RunLocked {
    async fn cycle(&mut self, _: usize, key: &str) {
        self.0
            .run_locked(key, OPTIONS, async {})
            .await
            .expect("run_locked");
    }
}

/// The cycle through the attribute, as users write it: the key `cycle:{task}` rendered by the
/// attribute from the task's number, the options its arguments (the same as [`OPTIONS`]).
#[redis_lock(prefix = "cycle", key = task, ttl = 3, max_renewals = 3, client = locks)]
async fn attr_cycle(locks: &LockClient, task: usize) -> Result<(), LockError> {
    Ok(())
}

/// lockmacro through `#[redis_lock]` with an empty body.
#[derive(Clone)]
struct Attr(LockClient);

impl Cycle for Attr {
    async fn cycle(&mut self, task: usize, _: &str) {
        attr_cycle(&self.0, task).await.expect("#[redis_lock]");
    }
}

/// Runs `system` (`redis-rs` or `lockmacro`) on one Redis: see [`drive`].
async fn child(system: &str, url: &str, tasks: usize) -> (f64, f64, f64) {
    let client = redis::Client::open(url).expect("url");
    let connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let floor = Floor::new(connection).await;
    let locks = LockClient::connect(url).await.expect("LockClient");
    drive_either(system, locks, floor, tasks, &[url]).await
}

/// Runs `system` (`redis-rs-cluster` or `lockmacro-cluster`) on the cluster seeded by `urls`
/// (joined by commas): see [`drive`]. Each process opens both systems' connections, as [`child`]
/// does, so that the two differ only in the cycle.
async fn cluster_child(system: &str, urls: &str, tasks: usize) -> (f64, f64, f64) {
    let urls: Vec<&str> = urls.split(',').collect();
    let mut floor = redis::cluster::ClusterClient::builder(urls.clone());
    if std::env::var_os(FLOOR_TIMEOUT).is_some() {
        floor = floor.response_timeout(RESPONSE_TIMEOUT);
    }
    let connection = floor
        .build()
        .expect("cluster client")
        .get_async_connection()
        .await
        .expect("cluster connection");
    let floor = ClusterFloor::cluster(connection).await;
    let locks = LockClient::cluster_builder(urls.clone())
        .response_timeout(RESPONSE_TIMEOUT)
        .build()
        .await
        .expect("cluster LockClient");
    drive_either(system, locks, floor, tasks, &urls).await
}

/// Runs `system` (`redis-rs-redlock` or `lockmacro-redlock`) on the Redlock of the masters at
/// `urls` (joined by commas): see [`drive`]. Each process opens both systems' connections, as
/// [`child`] does.
async fn redlock_child(system: &str, urls: &str, tasks: usize) -> (f64, f64, f64) {
    let urls: Vec<&str> = urls.split(',').collect();
    let mut connections: Vec<MultiplexedConnection> = Vec::new();
    for url in &urls {
        let client = redis::Client::open(*url).expect("url");
        let connection = client.get_multiplexed_async_connection().await;
        connections.push(connection.expect("connection"));
    }
    let floor = RedlockFloor::new(connections).await;
    let locks = LockClient::redlock_builder(&urls)
        .build()
        .await
        .expect("Redlock LockClient");
    drive_either(system, locks, floor, tasks, &urls).await
}

/// Drives `locks` when `system` is one of lockmacro's (`lockmacro…`, through the attribute
/// when it ends in `-attr`), else its `floor`: each child opens both, so that the systems
/// differ only in the cycle. `servers` are the URLs of every server of the deployment, whose
/// CPU is counted.
async fn drive_either(
    system: &str,
    locks: LockClient,
    floor: impl Cycle,
    tasks: usize,
    servers: &[&str],
) -> (f64, f64, f64) {
    let mut pids = Vec::new();
    for url in servers {
        let client = redis::Client::open(*url).expect("url");
        let mut connection = client
            .get_multiplexed_async_connection()
            .await
            .expect("connection");
        pids.push(server_pid(&mut connection).await);
    }
    match (system.starts_with("lockmacro"), system.ends_with("-attr")) {
        (true, true) => drive(Attr(locks), tasks, &pids).await,
        (true, false) => drive(RunLocked(locks), tasks, &pids).await,
        _ => drive(floor, tasks, &pids).await,
    }
}

/// Runs `system` with `tasks` tasks for a warm-up, then [`RUN`]: cycles/s, CPU µs per cycle
/// of this process and of the servers `pids` together. With [`COUNT`], a fixed number of
/// cycles per task and no warm-up, and no figures.
async fn drive(system: impl Cycle, tasks: usize, pids: &[u32]) -> (f64, f64, f64) {
    let run = |duration: Duration, count: Option<u64>| {
        let system = system.clone();
        async move {
            let deadline = Instant::now() + duration;
            let mut handles = Vec::new();
            for task in 0..tasks {
                let mut system = system.clone();
                handles.push(tokio::spawn(async move {
                    // The same keys in every child (each releases its own before it exits), so
                    // that on a cluster they fall on the same masters in every run.
                    let key = format!("cycle:{task}");
                    let mut cycles = 0u64;
                    while count.map_or(Instant::now() < deadline, |count| cycles < count) {
                        system.cycle(task, &key).await;
                        cycles += 1;
                    }
                    cycles
                }));
            }
            let mut cycles = 0;
            for handle in handles {
                cycles += handle.await.expect("a task");
            }
            cycles
        }
    };
    if let Ok(cycles) = std::env::var(COUNT) {
        // A fixed number of cycles, no warm-up: instructions per cycle under callgrind.
        let cycles: u64 = cycles
            .parse()
            .expect("CYCLE_COUNT: a number of cycles per task");
        run(Duration::ZERO, Some(cycles)).await;
        return (0.0, 0.0, 0.0);
    }
    run(RUN / 5, None).await;
    let servers_cpu = || {
        pids.iter()
            .map(|&pid| process_cpu_of(pid))
            .sum::<Duration>()
    };
    let (cpu_before, redis_before, started) = (process_cpu(), servers_cpu(), Instant::now());
    let cycles = run(RUN, None).await;
    let cpu = process_cpu() - cpu_before;
    let redis_cpu = servers_cpu() - redis_before;
    let cycles = cycles.max(1) as f64;
    (
        cycles / started.elapsed().as_secs_f64(),
        micros(cpu) / cycles,
        micros(redis_cpu) / cycles,
    )
}
