//! W3: 16 tasks take turns on one key, waiting for it, with almost nothing to do while holding
//! it. Besides throughput this measures fairness: a releasing task that re-takes the lock at
//! once makes many acquisitions but few owner changes, while the others starve.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockError, redis_lock};
use rslock::LockManager;
use testkit::RedisServer;

use crate::measure::{CommandStats, REPS, median, micros, percentile, ping_rtt};
use crate::report::{Goal, Report, Series, Target};

const TASKS: usize = 16;
/// How long each system runs per repetition.
const RUN: Duration = Duration::from_secs(3);
const RSLOCK_KEY: &str = "contended-rslock";

/// One turn through the attribute, waiting up to 10 s for the key `contended`.
#[redis_lock(prefix = "contended", ttl = 3, max_renewals = 3, wait = "10s", client = locks)]
async fn macro_turn(
    locks: &LockClient,
    turns: &Turns,
    task: usize,
    asked: Instant,
) -> Result<(), LockError> {
    turns.hold(task, asked);
    Ok(())
}

#[derive(Clone, Copy)]
enum System {
    Macro,
    Rslock,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            Self::Macro => "lockmacro #[redis_lock], wait 10 s",
            Self::Rslock => "rslock 0.10 acquire (retry loop)",
        }
    }
}

/// One holder's turn, as the holder saw it.
struct Turn {
    task: usize,
    entered: Instant,
    /// From asking for the lock to holding it.
    waited: Duration,
    /// From the previous holder's end to this one's start, when the owner changed.
    handoff: Option<Duration>,
}

/// The log of turns, written only by whoever holds the lock (so its mutex is never contended).
#[derive(Default)]
struct Turns(Mutex<TurnLog>);

#[derive(Default)]
struct TurnLog {
    turns: Vec<Turn>,
    last_owner: Option<usize>,
    /// The instant the last holder's body ended: just before its release began.
    last_end: Option<Instant>,
}

impl Turns {
    /// The whole body of a turn: note the start, and the end just before returning.
    fn hold(&self, task: usize, asked: Instant) {
        let entered = Instant::now();
        let mut log = self.0.lock().expect("turn log");
        let handoff = match (log.last_owner, log.last_end) {
            (Some(previous), Some(end)) if previous != task => Some(entered - end),
            _ => None,
        };
        log.turns.push(Turn {
            task,
            entered,
            waited: entered - asked,
            handoff,
        });
        log.last_owner = Some(task);
        log.last_end = Some(Instant::now());
    }
}

/// One repetition of one system.
struct Run {
    acquisitions_per_s: f64,
    owner_changes_per_s: f64,
    per_task_min: f64,
    per_task_max: f64,
    wait_p50: f64,
    wait_p99: f64,
    /// Each wait ÷ the run's FIFO ideal ([`TASKS`] ÷ acquisitions/s): with strict turns and
    /// every task always asking, each wait is about one ideal.
    waits_in_ideals: Vec<f64>,
    handoffs_in_rtts: Vec<f64>,
    handoff_p50: f64,
    rtt: Duration,
    commands_per_acquisition: f64,
}

async fn run(
    server: &RedisServer,
    locks: &LockClient,
    rslock: &LockManager,
    system: System,
) -> Run {
    let mut stats_connection = server.connection().await;
    let rtt = ping_rtt(&mut stats_connection).await;
    let before = CommandStats::read(&mut stats_connection).await;
    let turns = Arc::new(Turns::default());
    let start = Instant::now();
    let deadline = start + RUN;
    let mut tasks = Vec::with_capacity(TASKS);
    for task in 0..TASKS {
        let (locks, rslock, turns) = (locks.clone(), rslock.clone(), turns.clone());
        tasks.push(tokio::spawn(async move {
            while Instant::now() < deadline {
                let asked = Instant::now();
                match system {
                    System::Macro => macro_turn(&locks, &turns, task, asked)
                        .await
                        .expect("a turn within 10 s"),
                    System::Rslock => {
                        let guard = rslock
                            .acquire(RSLOCK_KEY, Duration::from_secs(3))
                            .await
                            .expect("rslock acquire");
                        turns.hold(task, asked);
                        guard.release().await;
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await.expect("contending task");
    }
    let after = CommandStats::read(&mut stats_connection).await;
    let log = std::mem::take(&mut *turns.0.lock().expect("turn log"));
    let commands = after.commands_since(&before);
    summarise(&log.turns, deadline, RUN, rtt, commands)
}

fn summarise(
    turns: &[Turn],
    deadline: Instant,
    window: Duration,
    rtt: Duration,
    commands: u64,
) -> Run {
    // Rates count turns begun inside the window; commands are over every turn, the drain too.
    let inside: Vec<&Turn> = turns.iter().filter(|t| t.entered < deadline).collect();
    let seconds = window.as_secs_f64();
    let mut per_task = [0u32; TASKS];
    for turn in &inside {
        per_task[turn.task] += 1;
    }
    let handoffs: Vec<f64> = inside
        .iter()
        .filter_map(|t| t.handoff)
        .map(micros)
        .collect();
    let waits: Vec<f64> = inside.iter().map(|t| micros(t.waited)).collect();
    let rtt_us = micros(rtt);
    let acquisitions_per_s = inside.len() as f64 / seconds;
    let fifo_ideal_us = TASKS as f64 / acquisitions_per_s * 1e6;
    Run {
        acquisitions_per_s,
        owner_changes_per_s: handoffs.len() as f64 / seconds,
        per_task_min: f64::from(per_task.iter().copied().min().unwrap_or(0)),
        per_task_max: f64::from(per_task.iter().copied().max().unwrap_or(0)),
        wait_p50: percentile(&waits, 0.5),
        wait_p99: percentile(&waits, 0.99),
        waits_in_ideals: waits.iter().map(|w| w / fifo_ideal_us).collect(),
        handoff_p50: percentile(&handoffs, 0.5),
        handoffs_in_rtts: handoffs.iter().map(|h| h / rtt_us).collect(),
        rtt,
        commands_per_acquisition: commands as f64 / turns.len().max(1) as f64,
    }
}

/// W3 on a server of its own: lockmacro and rslock interleaved, [`REPS`] times each.
pub async fn contended(report: &mut Report) {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url())
        .await
        .expect("LockClient");
    let rslock = LockManager::new(vec![server.url()]);
    let systems = [System::Macro, System::Rslock];
    let mut runs: Vec<Vec<Run>> = systems.iter().map(|_| Vec::new()).collect();
    for _ in 0..REPS {
        for (i, &system) in systems.iter().enumerate() {
            runs[i].push(run(&server, &locks, &rslock, system).await);
        }
    }
    let owner_changes = |runs: &[Run]| median(runs.iter().map(|r| r.owner_changes_per_s));
    let rslock_changes = owner_changes(&runs[1]);
    for (&system, runs) in systems.iter().zip(&runs) {
        let ours = matches!(system, System::Macro);
        let goal = |goal: &str, met: bool| ours.then(|| Target::new(goal, met)).flatten();
        let figure = |pick: fn(&Run) -> f64| median(runs.iter().map(pick));
        let name = system.name();
        let acquisitions = figure(|r| r.acquisitions_per_s);
        let changes = owner_changes(runs);
        report.add("W3", name, "acquisitions/s", acquisitions, "/s", None);
        report.add("W3", name, "owner changes/s", changes, "/s", None);
        let per_run = |pick: fn(&Run) -> f64| runs.iter().map(pick).collect::<Vec<_>>();
        let changing = per_run(|r| r.owner_changes_per_s / r.acquisitions_per_s);
        let goal_of = |goal: Goal| ours.then_some(goal);
        report.add_runs(
            "W3",
            name,
            "owner changes ÷ acquisitions",
            &changing,
            "",
            goal_of(("≥ 0.9", |v| v >= 0.9)),
        );
        let (least, most) = (figure(|r| r.per_task_min), figure(|r| r.per_task_max));
        report.add("W3", name, "acquisitions per task, min", least, "", None);
        report.add("W3", name, "acquisitions per task, max", most, "", None);
        let fairness = per_run(|r| r.per_task_max / r.per_task_min);
        report.add_runs("W3", name, "per-task max ÷ min", &fairness, "×", None);
        let worst = fairness.iter().copied().fold(0.0, f64::max);
        report.add(
            "W3",
            name,
            "per-task max ÷ min, worst run",
            worst,
            "×",
            goal("≤ 1.3× in every run", worst <= 1.3),
        );
        report.add(
            "W3",
            name,
            "acquire wait p50",
            figure(|r| r.wait_p50),
            "µs",
            None,
        );
        report.add(
            "W3",
            name,
            "acquire wait p99",
            figure(|r| r.wait_p99),
            "µs",
            None,
        );
        let tail = per_run(|r| percentile(&r.waits_in_ideals, 0.99));
        report.add_runs(
            "W3",
            name,
            "acquire wait p99 ÷ FIFO ideal (16 ÷ acquisitions/s)",
            &tail,
            "×",
            goal_of(("≤ 3×", |v| v <= 3.0)),
        );
        report.add(
            "W3",
            name,
            "PING round trip",
            figure(|r| micros(r.rtt)),
            "µs",
            None,
        );
        report.add(
            "W3",
            name,
            "handoff p50",
            figure(|r| r.handoff_p50),
            "µs",
            None,
        );
        let in_rtts = figure(|r| percentile(&r.handoffs_in_rtts, 0.5));
        let met = in_rtts <= 3.0;
        report.add(
            "W3",
            name,
            "handoff p50 in round trips",
            in_rtts,
            "RTT",
            goal("≤ 3", met),
        );
        let p99 = figure(|r| percentile(&r.handoffs_in_rtts, 0.99));
        report.add("W3", name, "handoff p99 in round trips", p99, "RTT", None);
        report.add_runs(
            "W3",
            name,
            "Redis commands per acquisition (incl. in scripts)",
            &per_run(|r| r.commands_per_acquisition),
            "",
            goal_of(("≤ 4", |v| v <= 4.0)),
        );
        if ours {
            let ahead = changes / rslock_changes;
            report.add(
                "W3",
                name,
                "owner changes/s ÷ rslock",
                ahead,
                "×",
                goal("> 1×", ahead > 1.0),
            );
        }
        let pooled = |pick: fn(&Run) -> &Vec<f64>| runs.iter().flat_map(pick).copied().collect();
        report.handoffs.push(Series {
            system: name,
            values: pooled(|r| &r.handoffs_in_rtts),
        });
        report.waits.push(Series {
            system: name,
            values: pooled(|r| &r.waits_in_ideals),
        });
    }
}
