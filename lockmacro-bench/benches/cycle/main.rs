//! The uncontended cycle with each system in a process of its own, as users run them:
//! `cargo bench -p lockmacro-bench --bench cycle`.
//!
//! One `redis-server` for the run; each system (redis-rs alone sending `SET NX PX` + the
//! compare-and-delete `EVALSHA` through one multiplexed connection, and lockmacro's `run_locked`)
//! runs as a child process of this binary, for W1 (one task) and W2 (64 tasks, a key each),
//! interleaved A B A B … over 5 repetitions. It prints cycles/s and the child's CPU per cycle
//! (`getrusage`, whole process), ours ÷ redis-rs alone paired by repetition, median and range.
//!
//! `… --bench cycle -- W2` runs one workload; `CYCLE_REPS=n` sets the repetitions (5).
//! `CYCLE_PERF=dir` records each child's first repetition with `perf record -g` into
//! `dir/{system}-{tasks}.data`, for profiling the two side by side. `CYCLE_COUNT=n` makes a child
//! run `n` cycles per task and stop, so that `valgrind --tool=callgrind` counts the instructions
//! of a cycle: the difference between two counts over the difference of their cycles.

#[allow(dead_code)]
#[path = "../lock_bench/floor.rs"]
mod floor;
#[allow(dead_code)]
#[path = "../lock_bench/measure.rs"]
mod measure;

use std::process::Command;
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockOptions};
use testkit::RedisServer;

use floor::Floor;
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
        let (cps, cpu) = runtime.block_on(child(system, url, tasks));
        println!("{RESULT}{cps} {cpu}");
        return;
    }
    let reps =
        std::env::var("CYCLE_REPS").map_or(REPS, |reps| reps.parse().expect("CYCLE_REPS: a count"));
    let workloads: Vec<(&str, usize)> = [("W1", 1usize), ("W2", 64)]
        .into_iter()
        .filter(|(name, _)| {
            // `cargo bench` passes `--bench`; the rest names workloads.
            let mut asked = args.iter().filter(|arg| !arg.starts_with("--")).peekable();
            asked.peek().is_none() || asked.any(|arg| arg == name)
        })
        .collect();
    let server = RedisServer::start();
    let perf = std::env::var("CYCLE_PERF").ok();
    println!(
        "| workload | system | cycles/s | client CPU per cycle | cycles/s ÷ redis-rs alone | CPU per cycle ÷ redis-rs alone |\n|---|---|---:|---:|---:|---:|"
    );
    for (workload, tasks) in workloads {
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new(); SYSTEMS.len()];
        for rep in 0..reps {
            for (i, system) in SYSTEMS.iter().enumerate() {
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
                    .arg(server.url())
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
        for (i, system) in SYSTEMS.iter().enumerate() {
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

/// Runs `system` with `tasks` tasks for a warm-up, then [`RUN`]: cycles/s and CPU µs per cycle.
async fn child(system: &str, url: &str, tasks: usize) -> (f64, f64) {
    let client = redis::Client::open(url).expect("url");
    let connection = client
        .get_multiplexed_async_connection()
        .await
        .expect("connection");
    let floor = Floor::new(connection).await;
    let locks = LockClient::connect(url).await.expect("LockClient");
    let lockmacro = system == "lockmacro";
    let run = |duration: Duration, count: Option<u64>| {
        let (floor, locks) = (floor.clone(), locks.clone());
        async move {
            let deadline = Instant::now() + duration;
            let mut handles = Vec::new();
            for task in 0..tasks {
                let (mut floor, locks) = (floor.clone(), locks.clone());
                handles.push(tokio::spawn(async move {
                    let key = format!("cycle:{}:{task}", std::process::id());
                    let mut cycles = 0u64;
                    while count.map_or(Instant::now() < deadline, |count| cycles < count) {
                        if lockmacro {
                            locks
                                .run_locked(key.as_str(), OPTIONS, async {})
                                .await
                                .expect("run_locked");
                        } else {
                            floor.cycle(&key).await;
                        }
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
