//! The uncontended cycle with each system in a process of its own, as users run them:
//! `cargo bench -p lockmacro-bench --bench cycle`.
//!
//! One `redis-server` for the run; each system (redis-rs alone sending `SET NX PX` + the
//! compare-and-delete `EVALSHA` through one multiplexed connection, and lockmacro's `run_locked`)
//! runs as a child process of this binary, for W1 (one task) and W2 (64 tasks, a key each),
//! interleaved A B A B … over 5 repetitions. It prints cycles/s and the child's CPU per cycle
//! (`getrusage`, whole process), ours ÷ redis-rs alone paired by repetition, median and range.
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

#[allow(dead_code)]
#[path = "../lock_bench/floor.rs"]
mod floor;
#[allow(dead_code)]
#[path = "../lock_bench/measure.rs"]
mod measure;

use std::future::Future;
use std::process::Command;
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockOptions};
use redis::aio::MultiplexedConnection;
use testkit::{RedisCluster, RedisServer};

use floor::{ClusterFloor, Floor, RedlockFloor};
use measure::{median, micros, process_cpu};

const CHILD: &str = "--cycle-child";
const RESULT: &str = "cycle-result ";
/// Repetitions unless `CYCLE_REPS` says how many.
const REPS: usize = 5;
const RUN: Duration = Duration::from_secs(2);
const OPTIONS: LockOptions = LockOptions::new()
    .ttl(Duration::from_secs(3))
    .max_renewals(3);
const SYSTEMS: [&str; 2] = ["redis-rs", "lockmacro"];
/// The same on a Redis Cluster of [`MASTERS`], its floor first.
const CLUSTER_SYSTEMS: [&str; 2] = ["redis-rs-cluster", "lockmacro-cluster"];
const MASTERS: usize = 3;
/// The same on a Redlock of [`MASTERS`] independent servers, its floor first.
const REDLOCK_SYSTEMS: [&str; 2] = ["redis-rs-redlock", "lockmacro-redlock"];
/// The lock's response timeout (`LockClientBuilder`'s default), and the cluster floor's with
/// [`FLOOR_TIMEOUT`].
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
const FLOOR_TIMEOUT: &str = "CYCLE_FLOOR_TIMEOUT";
/// Cycles per task instead of a timed run (no warm-up), for counting instructions per cycle.
const COUNT: &str = "CYCLE_COUNT";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(at) = args.iter().position(|arg| arg == CHILD) {
        let (system, url, tasks) = (&args[at + 1], &args[at + 2], args[at + 3].parse().unwrap());
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (cps, cpu) = match system.as_str() {
            "redis-rs" | "lockmacro" => runtime.block_on(child(system, url, tasks)),
            "redis-rs-redlock" | "lockmacro-redlock" => {
                runtime.block_on(redlock_child(system, url, tasks))
            }
            _ => runtime.block_on(cluster_child(system, url, tasks)),
        };
        println!("{RESULT}{cps} {cpu}");
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
    println!(
        "| workload | system | cycles/s | client CPU per cycle | cycles/s ÷ its floor | CPU per cycle ÷ its floor |\n|---|---|---:|---:|---:|---:|"
    );
    for (workload, tasks, deployment) in workloads {
        let (systems, url) = match deployment {
            Deployment::Server => (SYSTEMS, server.url()),
            Deployment::Cluster => (CLUSTER_SYSTEMS, seeds.clone()),
            Deployment::Redlock => (REDLOCK_SYSTEMS, masters.clone()),
        };
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); systems.len()];
        for rep in 0..reps {
            for (i, system) in systems.iter().enumerate() {
                let exe = std::env::current_exe().expect("this binary");
                let mut command = match (&perf, rep) {
                    (Some(dir), 0) => {
                        let mut perf = Command::new("perf");
                        perf.args(["record", "-g", "-q", "-o"])
                            .arg(format!("{dir}/{system}-{tasks}.data"))
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
                    .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(&output.stderr)));
                let mut figures = line.split(' ').map(|f| f.parse::<f64>().unwrap());
                runs[i].push((figures.next().unwrap(), figures.next().unwrap()));
            }
        }
        let spread = |values: &[f64]| {
            let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            format!("{:.2} ({lo:.2}–{hi:.2})", median(values.iter().copied()))
        };
        for (i, system) in systems.iter().enumerate() {
            let cps: Vec<f64> = runs[i].iter().map(|r| r.0).collect();
            let cpu: Vec<f64> = runs[i].iter().map(|r| r.1).collect();
            let ratio = |f: fn(&(f64, f64)) -> f64| -> Vec<f64> {
                runs[i]
                    .iter()
                    .zip(&runs[0])
                    .map(|(o, b)| f(o) / f(b))
                    .collect()
            };
            println!(
                "| {workload} | {system} | {:.0} | {} µs | {}× | {}× |",
                median(cps.iter().copied()),
                spread(&cpu),
                spread(&ratio(|r| r.0)),
                spread(&ratio(|r| r.1)),
            );
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

/// One system's lock cycle, as each of a child's tasks runs it on a key of its own.
trait Cycle: Clone + Send + 'static {
    fn cycle(&mut self, key: &str) -> impl Future<Output = ()> + Send;
}

impl<C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static> Cycle for Floor<C> {
    fn cycle(&mut self, key: &str) -> impl Future<Output = ()> + Send {
        Floor::cycle(self, key)
    }
}

impl Cycle for RedlockFloor {
    fn cycle(&mut self, key: &str) -> impl Future<Output = ()> + Send {
        RedlockFloor::cycle(self, key)
    }
}

/// lockmacro's `run_locked` with an empty body.
#[derive(Clone)]
struct RunLocked(LockClient);

impl Cycle for RunLocked {
    async fn cycle(&mut self, key: &str) {
        self.0
            .run_locked(key, OPTIONS, async {})
            .await
            .expect("run_locked");
    }
}

/// Runs `system` (`redis-rs` or `lockmacro`) on one Redis: see [`drive`].
async fn child(system: &str, url: &str, tasks: usize) -> (f64, f64) {
    let client = redis::Client::open(url).expect("url");
    let connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let floor = Floor::new(connection).await;
    let locks = LockClient::connect(url).await.expect("LockClient");
    drive_either(system, locks, floor, tasks).await
}

/// Runs `system` (`redis-rs-cluster` or `lockmacro-cluster`) on the cluster seeded by `urls`
/// (joined by commas): see [`drive`]. Each process opens both systems' connections, as [`child`]
/// does, so that the two differ only in the cycle.
async fn cluster_child(system: &str, urls: &str, tasks: usize) -> (f64, f64) {
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
    let locks = LockClient::cluster_builder(urls)
        .response_timeout(RESPONSE_TIMEOUT)
        .build()
        .await
        .expect("cluster LockClient");
    drive_either(system, locks, floor, tasks).await
}

/// Runs `system` (`redis-rs-redlock` or `lockmacro-redlock`) on the Redlock of the masters at
/// `urls` (joined by commas): see [`drive`]. Each process opens both systems' connections, as
/// [`child`] does.
async fn redlock_child(system: &str, urls: &str, tasks: usize) -> (f64, f64) {
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
    drive_either(system, locks, floor, tasks).await
}

/// Drives `locks` when `system` is one of lockmacro's (`lockmacro…`), else its `floor`: each
/// child opens both, so that the two systems differ only in the cycle.
async fn drive_either(
    system: &str,
    locks: LockClient,
    floor: impl Cycle,
    tasks: usize,
) -> (f64, f64) {
    match system.starts_with("lockmacro") {
        true => drive(RunLocked(locks), tasks).await,
        false => drive(floor, tasks).await,
    }
}

/// Runs `system` with `tasks` tasks for a warm-up, then [`RUN`]: cycles/s and CPU µs per cycle.
/// With [`COUNT`], a fixed number of cycles per task and no warm-up, and no figures.
async fn drive(system: impl Cycle, tasks: usize) -> (f64, f64) {
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
                        system.cycle(&key).await;
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
        return (0.0, 0.0);
    }
    run(RUN / 5, None).await;
    let (cpu_before, started) = (process_cpu(), Instant::now());
    let cycles = run(RUN, None).await;
    let cpu = process_cpu() - cpu_before;
    (
        cycles as f64 / started.elapsed().as_secs_f64(),
        micros(cpu) / cycles.max(1) as f64,
    )
}
