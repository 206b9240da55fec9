//! W0 (the floors), W1 (one task, its own key) and W2 (64 tasks, a key each): lock cycles with
//! nothing inside and nobody in the way, so all that is measured is what a cycle costs.
//!
//! Beside throughput and latency, each run counts what a cycle costs both sides: this process's
//! CPU, the server's CPU (from `/proc`), and the commands Redis ran, those inside scripts
//! included (`INFO commandstats`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockError, LockOptions, redis_lock};
use redis::aio::MultiplexedConnection;
use rslock::LockManager;
use testkit::RedisServer;

use crate::floor::{Floor, PIPELINE_DEPTH, RawConnection};
use crate::measure::{
    CommandStats, Latencies, REPS, median, micros, process_cpu, process_cpu_of, server_pid,
};
use crate::report::Report;

/// How long each system runs per repetition.
const RUN: Duration = Duration::from_millis(700);
/// Tasks in W2 (and in the concurrent floors).
const TASKS: usize = 64;
/// Options of the programmatic path, the same as the macro's arguments below.
const OPTIONS: LockOptions = LockOptions::new()
    .ttl(Duration::from_secs(3))
    .max_renewals(3);

/// A lock cycle through the attribute: the product as users write it.
#[redis_lock(prefix = "macro", key = id, ttl = 3, max_renewals = 3, client = locks)]
async fn macro_cycle(locks: &LockClient, id: usize) -> Result<(), LockError> {
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum System {
    /// RESP by hand on a connection per task: the floor every ratio is taken against.
    Raw,
    /// The same two commands through one shared redis-rs multiplexed connection.
    RedisRs,
    /// redis-rs, [`PIPELINE_DEPTH`] cycles per round trip: one connection's throughput ceiling.
    Pipelined,
    Macro,
    Api,
    Rslock,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            Self::Raw => "raw RESP, a connection per task",
            Self::RedisRs => "redis-rs 1.8 alone, one shared connection",
            Self::Pipelined => "redis-rs pipelined ×16",
            Self::Macro => "lockmacro #[redis_lock]",
            Self::Api => "lockmacro run_locked",
            Self::Rslock => "rslock 0.10",
        }
    }

    fn is_ours(self) -> bool {
        matches!(self, Self::Macro | Self::Api)
    }
}

/// What the compared systems share in one workload: one server, and one client of each kind.
struct Clients {
    raw: Vec<Arc<tokio::sync::Mutex<RawConnection>>>,
    floor: Floor,
    locks: LockClient,
    rslock: LockManager,
    /// For reading the server's counters between runs.
    stats: MultiplexedConnection,
    server_pid: u32,
}

impl Clients {
    async fn connect(server: &RedisServer, tasks: usize) -> Self {
        let floor = Floor::new(server.connection().await).await;
        let mut raw = Vec::with_capacity(tasks);
        for _ in 0..tasks {
            let connection = RawConnection::connect(server.addr(), &floor.release_sha).await;
            raw.push(Arc::new(tokio::sync::Mutex::new(connection)));
        }
        let mut stats = server.connection().await;
        Self {
            raw,
            floor,
            locks: LockClient::connect(&server.url())
                .await
                .expect("LockClient"),
            rslock: LockManager::new(vec![server.url()]),
            server_pid: server_pid(&mut stats).await,
            stats,
        }
    }
}

/// One repetition of one system.
struct Run {
    cycles_per_s: f64,
    per_cycle: Latencies,
    client_cpu_us: f64,
    redis_cpu_us: f64,
    redis_commands: f64,
}

/// Runs `tasks` tasks, each cycling on its own key for `duration`.
async fn run(clients: &mut Clients, system: System, tasks: usize, duration: Duration) -> Run {
    let commands_before = CommandStats::read(&mut clients.stats).await;
    let redis_before = process_cpu_of(clients.server_pid);
    let client_before = process_cpu();
    let start = Instant::now();
    let deadline = start + duration;
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let raw = clients.raw[task].clone();
        let mut floor = clients.floor.clone();
        let locks = clients.locks.clone();
        let rslock = clients.rslock.clone();
        handles.push(tokio::spawn(async move {
            let mut raw = raw.lock().await;
            let key = format!("uncontended:{task}");
            let mut cycles = 0;
            let mut per_cycle = Latencies::default();
            while Instant::now() < deadline {
                let began = Instant::now();
                cycles += match system {
                    System::Raw => {
                        raw.cycle(&key).await;
                        1
                    }
                    System::RedisRs => {
                        floor.cycle(&key).await;
                        1
                    }
                    System::Pipelined => {
                        floor.pipelined_cycles(&key).await;
                        PIPELINE_DEPTH
                    }
                    System::Macro => {
                        macro_cycle(&locks, task).await.expect("macro cycle");
                        1
                    }
                    System::Api => {
                        locks
                            .run_locked(key.as_str(), OPTIONS, async {})
                            .await
                            .expect("run_locked cycle");
                        1
                    }
                    System::Rslock => {
                        let lock = rslock
                            .lock(key.as_str(), Duration::from_secs(3))
                            .await
                            .expect("rslock lock");
                        rslock.unlock(&lock).await;
                        1
                    }
                };
                per_cycle.record(began.elapsed());
            }
            (cycles, per_cycle)
        }));
    }
    let mut cycles = 0;
    let mut per_cycle = Latencies::default();
    for handle in handles {
        let (done, latencies) = handle.await.expect("cycling task");
        cycles += done;
        per_cycle.extend(latencies);
    }
    let elapsed = start.elapsed();
    let client_cpu = process_cpu() - client_before;
    let redis_cpu = process_cpu_of(clients.server_pid) - redis_before;
    let commands = CommandStats::read(&mut clients.stats)
        .await
        .commands_since(&commands_before);
    let per = |total: f64| total / cycles.max(1) as f64;
    Run {
        cycles_per_s: cycles as f64 / elapsed.as_secs_f64(),
        per_cycle,
        client_cpu_us: per(micros(client_cpu)),
        redis_cpu_us: per(micros(redis_cpu)),
        // The two `INFO` reads are left out by `commands_since`.
        redis_commands: per(commands as f64),
    }
}

/// Runs each system once to warm up, then [`REPS`] times interleaved (A B C A B C …), each with
/// `tasks(system)` tasks; returns the runs of each system in the order of `systems`.
async fn interleaved(
    clients: &mut Clients,
    systems: &[System],
    tasks: impl Fn(System) -> usize,
) -> Vec<Vec<Run>> {
    for &system in systems {
        run(clients, system, tasks(system), RUN / 4).await;
    }
    let mut runs: Vec<Vec<Run>> = systems.iter().map(|_| Vec::new()).collect();
    for _ in 0..REPS {
        for (i, &system) in systems.iter().enumerate() {
            runs[i].push(run(clients, system, tasks(system), RUN).await);
        }
    }
    runs
}

/// `numerator / denominator` of each repetition's cycles/s, paired by repetition, so a slow
/// moment of the machine weighs on both sides of the ratio.
fn paired_ratios(numerator: &[Run], denominator: &[Run]) -> Vec<f64> {
    numerator
        .iter()
        .zip(denominator)
        .map(|(n, d)| n.cycles_per_s / d.cycles_per_s)
        .collect()
}

/// What each run cost: cycles/s, and per cycle the CPU of both sides and Redis's commands.
fn add_costs(report: &mut Report, workload: &'static str, system: System, runs: &[Run]) {
    let name = system.name();
    let figure = |f: fn(&Run) -> f64| runs.iter().map(f).collect::<Vec<_>>();
    report.add_runs(
        workload,
        name,
        "cycles/s",
        &figure(|r| r.cycles_per_s),
        "/s",
        None,
    );
    if workload != "W2" {
        let p50 = median(runs.iter().map(|r| r.per_cycle.p50()));
        report.add(workload, name, "cycle p50", p50, "µs", None);
        let p99 = median(runs.iter().map(|r| r.per_cycle.p99()));
        report.add(workload, name, "cycle p99", p99, "µs", None);
    }
    let client_cpu = figure(|r| r.client_cpu_us);
    report.add_runs(
        workload,
        name,
        "client CPU per cycle",
        &client_cpu,
        "µs",
        None,
    );
    let redis_cpu = figure(|r| r.redis_cpu_us);
    report.add_runs(
        workload,
        name,
        "Redis CPU per cycle",
        &redis_cpu,
        "µs",
        None,
    );
    let commands = figure(|r| r.redis_commands);
    report.add_runs(
        workload,
        name,
        "Redis commands per cycle (incl. in scripts)",
        &commands,
        "",
        None,
    );
}

/// W0 sequential and W1: one task on its own key, on a server of its own.
pub async fn single_task(report: &mut Report) {
    let server = RedisServer::start();
    let mut clients = Clients::connect(&server, 1).await;
    let systems = [
        System::Raw,
        System::RedisRs,
        System::Macro,
        System::Api,
        System::Rslock,
    ];
    let runs = interleaved(&mut clients, &systems, |_| 1).await;
    let (raw, redis_rs, rslock) = (&runs[0], &runs[1], &runs[4]);
    for (&system, runs) in systems.iter().zip(&runs) {
        let workload = if system == System::Raw { "W0" } else { "W1" };
        add_costs(report, workload, system, runs);
        if system == System::Raw {
            continue;
        }
        let name = system.name();
        // Time per cycle relative to the raw floor's: the inverse of the throughput ratio.
        let slowdown = paired_ratios(raw, runs);
        report.add_runs(
            "W1",
            name,
            "time per cycle ÷ raw floor",
            &slowdown,
            "×",
            None,
        );
        if system.is_ours() {
            let vs_redis_rs = paired_ratios(runs, redis_rs);
            report.add_runs(
                "W1",
                name,
                "cycles/s ÷ redis-rs alone",
                &vs_redis_rs,
                "×",
                Some(("≥ 1×", |r| r >= 1.0)),
            );
            let vs_rslock = paired_ratios(runs, rslock);
            report.add_runs(
                "W1",
                name,
                "cycles/s ÷ rslock",
                &vs_rslock,
                "×",
                Some(("> 1×", |r| r > 1.0)),
            );
        }
    }
}

/// W0 concurrent and pipelined, and W2: 64 tasks, a key each, on a server of its own.
pub async fn many_tasks(report: &mut Report) {
    let server = RedisServer::start();
    let mut clients = Clients::connect(&server, TASKS).await;
    let systems = [
        System::Raw,
        System::RedisRs,
        System::Pipelined,
        System::Macro,
        System::Api,
        System::Rslock,
    ];
    // The pipelined floor is one task sending batches; the others are 64 tasks.
    let tasks = |system| {
        if system == System::Pipelined {
            1
        } else {
            TASKS
        }
    };
    let runs = interleaved(&mut clients, &systems, tasks).await;
    let (raw, redis_rs, rslock) = (&runs[0], &runs[1], &runs[5]);
    for (&system, runs) in systems.iter().zip(&runs) {
        let workload = match system {
            System::Raw | System::Pipelined => "W0",
            _ => "W2",
        };
        add_costs(report, workload, system, runs);
        if system == System::Raw {
            continue;
        }
        let name = system.name();
        let share = paired_ratios(runs, raw);
        report.add_runs(
            workload,
            name,
            "cycles/s ÷ 64-connection raw floor",
            &share,
            "×",
            None,
        );
        if system.is_ours() {
            let vs_redis_rs = paired_ratios(runs, redis_rs);
            report.add_runs(
                "W2",
                name,
                "cycles/s ÷ redis-rs alone",
                &vs_redis_rs,
                "×",
                Some(("≥ 1×", |r| r >= 1.0)),
            );
            let vs_rslock = paired_ratios(runs, rslock);
            report.add_runs(
                "W2",
                name,
                "cycles/s ÷ rslock",
                &vs_rslock,
                "×",
                Some(("≥ 1.1×", |r| r >= 1.1)),
            );
        }
    }
}
