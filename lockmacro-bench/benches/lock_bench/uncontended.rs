//! W0 (the floor), W1 (one task, its own key) and W2 (64 tasks, a key each): lock cycles with
//! nothing inside and nobody in the way, so all that is measured is what a cycle costs.

use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockError, LockOptions, redis_lock};
use rslock::LockManager;
use testkit::RedisServer;

use crate::floor::{Floor, PIPELINE_DEPTH};
use crate::measure::{Latencies, REPS, median};
use crate::report::{Report, Target};

/// How long each system runs per repetition.
const RUN: Duration = Duration::from_millis(700);
/// Tasks in W2 (and in the concurrent floor).
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
    FloorSequential,
    FloorPipelined,
    Macro,
    Api,
    Rslock,
}

impl System {
    fn name(self, tasks: usize) -> &'static str {
        match (self, tasks) {
            (Self::FloorSequential, 1) => "W0 floor, sequential",
            (Self::FloorSequential, _) => "W0 floor, 64 tasks",
            (Self::FloorPipelined, _) => "W0 floor, pipelined ×16",
            (Self::Macro, _) => "lockmacro #[redis_lock]",
            (Self::Api, _) => "lockmacro run_locked",
            (Self::Rslock, _) => "rslock 0.10",
        }
    }
}

/// What the compared systems share in one workload: one server, and one client of each kind.
struct Clients {
    floor: Floor,
    locks: LockClient,
    rslock: LockManager,
}

impl Clients {
    async fn connect(server: &RedisServer) -> Self {
        Self {
            floor: Floor::new(server.connection().await).await,
            locks: LockClient::connect(&server.url())
                .await
                .expect("LockClient"),
            rslock: LockManager::new(vec![server.url()]),
        }
    }
}

/// One repetition of one system.
struct Run {
    cycles_per_s: f64,
    per_cycle: Latencies,
}

/// Runs `tasks` tasks, each cycling on its own key for `duration`.
async fn run(clients: &Clients, system: System, tasks: usize, duration: Duration) -> Run {
    let start = Instant::now();
    let deadline = start + duration;
    let mut handles = Vec::with_capacity(tasks);
    for task in 0..tasks {
        let mut floor = clients.floor.clone();
        let locks = clients.locks.clone();
        let rslock = clients.rslock.clone();
        handles.push(tokio::spawn(async move {
            let key = format!("uncontended:{task}");
            let mut cycles = 0;
            let mut per_cycle = Latencies::default();
            while Instant::now() < deadline {
                let began = Instant::now();
                cycles += match system {
                    System::FloorSequential => {
                        floor.cycle(&key).await;
                        1
                    }
                    System::FloorPipelined => {
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
    Run {
        cycles_per_s: cycles as f64 / start.elapsed().as_secs_f64(),
        per_cycle,
    }
}

/// Runs each system once to warm up, then [`REPS`] times interleaved (A B C A B C …), each with
/// `tasks(system)` tasks; returns the runs of each system in the order of `systems`.
async fn interleaved(
    clients: &Clients,
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

/// The median over repetitions of `numerator / denominator`, paired by repetition, so a slow
/// moment of the machine weighs on both sides of the ratio.
fn paired_ratio(numerator: &[Run], denominator: &[Run]) -> f64 {
    median(
        numerator
            .iter()
            .zip(denominator)
            .map(|(n, d)| n.cycles_per_s / d.cycles_per_s),
    )
}

/// W0 sequential and W1: one task on its own key, on a server of its own.
pub async fn single_task(report: &mut Report) {
    let server = RedisServer::start();
    let clients = Clients::connect(&server).await;
    let systems = [
        System::FloorSequential,
        System::Macro,
        System::Api,
        System::Rslock,
    ];
    let runs = interleaved(&clients, &systems, |_| 1).await;
    let floor = &runs[0];
    let rslock = &runs[3];
    for (&system, runs) in systems.iter().zip(&runs) {
        let workload = if system == System::FloorSequential {
            "W0"
        } else {
            "W1"
        };
        let name = system.name(1);
        let cps = median(runs.iter().map(|r| r.cycles_per_s));
        report.add(workload, name, "cycles/s", cps, "/s", None);
        let p50 = median(runs.iter().map(|r| r.per_cycle.p50()));
        report.add(workload, name, "cycle p50", p50, "µs", None);
        let p99 = median(runs.iter().map(|r| r.per_cycle.p99()));
        report.add(workload, name, "cycle p99", p99, "µs", None);
        if system == System::FloorSequential {
            continue;
        }
        // Time per cycle relative to the floor's: the inverse of the throughput ratio.
        let slowdown = paired_ratio(floor, runs);
        let ours = system != System::Rslock;
        let target = ours
            .then(|| Target::new("≤ 1.15×", slowdown <= 1.15))
            .flatten();
        report.add(
            "W1",
            name,
            "time per cycle ÷ W0 sequential",
            slowdown,
            "×",
            target,
        );
        if ours {
            let ahead = paired_ratio(runs, rslock);
            report.add(
                "W1",
                name,
                "cycles/s ÷ rslock",
                ahead,
                "×",
                Target::new("> 1×", ahead > 1.0),
            );
        }
    }
}

/// W0 concurrent and pipelined, and W2: 64 tasks, a key each, on a server of its own.
pub async fn many_tasks(report: &mut Report) {
    let server = RedisServer::start();
    let clients = Clients::connect(&server).await;
    let systems = [
        System::FloorSequential,
        System::FloorPipelined,
        System::Macro,
        System::Api,
        System::Rslock,
    ];
    // The pipelined floor is one task sending batches; the others are 64 tasks.
    let tasks = |system| {
        if system == System::FloorPipelined {
            1
        } else {
            TASKS
        }
    };
    let runs = interleaved(&clients, &systems, tasks).await;
    let pipelined = &runs[1];
    let rslock = &runs[4];
    for (&system, runs) in systems.iter().zip(&runs) {
        let workload = match system {
            System::FloorSequential | System::FloorPipelined => "W0",
            _ => "W2",
        };
        let name = system.name(TASKS);
        let cps = median(runs.iter().map(|r| r.cycles_per_s));
        report.add(workload, name, "total cycles/s", cps, "/s", None);
        if workload == "W0" {
            continue;
        }
        let share = paired_ratio(runs, pipelined);
        let ours = system != System::Rslock;
        let target = ours.then(|| Target::new("≥ 0.8×", share >= 0.8)).flatten();
        report.add("W2", name, "cycles/s ÷ pipelined floor", share, "×", target);
        if ours {
            let ahead = paired_ratio(runs, rslock);
            report.add(
                "W2",
                name,
                "cycles/s ÷ rslock",
                ahead,
                "×",
                Target::new("> 1×", ahead > 1.0),
            );
        }
    }
}
