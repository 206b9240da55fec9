//! W3x: waiting across processes. 4 processes × 4 tasks take turns on one key (and on one pair
//! of keys, `run_locked_many`), each body holding the lock 1 ms, each call waiting up to 5 s with
//! the default 30 s ttl, on one Redis, a 3-master Cluster and a 3-master Redlock; beside them the
//! same 16 tasks in one process (W3's shape). Each process is a child of this binary
//! (`--w3x-child`, running `testkit::turns::take_turns`), all starting at one instant.
//!
//! Reported per shape, median and range over the repetitions: acquisitions/s; each process's
//! share of them (the most ÷ the fewest); the wait's p99 and maximum; the longest time the lock
//! stood free while a caller waited for it (from one body's end to the next one's start, so a
//! release's round trip and the next holder's wake-up are in it); and the calls that ended
//! `Busy` after the whole 5 s wait, with their `retry_after`. A process that keeps the key to
//! itself shows as a large share ratio and waits near the 5 s bound.

use std::time::Duration;

use testkit::turns::{Call, Plan, Summary, Target};
use testkit::{RedisCluster, RedisServer, monotonic_ns};

use crate::measure::median;
use crate::report::Report;

/// The first argument of a child process.
pub const CHILD: &str = "--w3x-child";

const RUN: Duration = Duration::from_secs(3);
const HOLD: Duration = Duration::from_millis(1);
const WAIT: Duration = Duration::from_secs(5);
const TTL: Duration = Duration::from_secs(30);
/// Time for every child to start and connect before the run begins.
const START: Duration = Duration::from_millis(1_500);
/// Repetitions unless `W3X_REPS` says how many.
const REPS: usize = 3;
/// (processes, tasks each): the shape across processes, and W3's in one process.
const SHAPES: [(usize, usize); 2] = [(4, 4), (1, 16)];

/// A child: takes its turns as its arguments say, printing one line per call.
pub fn child(args: &[String]) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(testkit::turns::take_turns(Plan::from_args(args)));
}

/// One run: `processes` children of `tasks` tasks each on `keys` of `target`.
async fn run(target: &Target, keys: &[&str], (processes, tasks): (usize, usize)) -> Summary {
    let start_ns = monotonic_ns() + START.as_nanos() as u64;
    let plan = Plan {
        target: target.clone(),
        keys: keys.iter().map(|key| (*key).to_owned()).collect(),
        tasks,
        hold: HOLD,
        wait: WAIT,
        ttl: TTL,
        start_ns,
        run: RUN,
    };
    let exe = std::env::current_exe().expect("this benchmark's path");
    let children: Vec<_> = (0..processes)
        .map(|_| {
            tokio::process::Command::new(&exe)
                .arg(CHILD)
                .args(plan.args())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a W3x child")
        })
        .collect();
    let mut calls: Vec<Vec<Call>> = Vec::new();
    for child in children {
        let output = child.wait_with_output().await.expect("a W3x child");
        assert!(output.status.success(), "a W3x child failed");
        let stdout = String::from_utf8(output.stdout).expect("utf-8");
        calls.push(testkit::turns::read_calls(&stdout));
    }
    let summary = Summary::of(&calls, start_ns + RUN.as_nanos() as u64);
    assert_eq!(
        summary.longest_overlap,
        Duration::ZERO,
        "two holders at once on {target:?}"
    );
    summary
}

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

/// W3x on one Redis, a Cluster and a Redlock, each started for it.
pub async fn across(report: &mut Report) {
    let reps = std::env::var("W3X_REPS").map_or(REPS, |reps| reps.parse().expect("W3X_REPS"));
    let server = RedisServer::start();
    let cluster = RedisCluster::start(3, 0);
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let targets = [
        ("one Redis", Target::Server(server.url())),
        ("Cluster", Target::Cluster(cluster.seed_urls())),
        (
            "Redlock",
            Target::Redlock(masters.iter().map(RedisServer::url).collect()),
        ),
    ];
    // A pair in one slot on a cluster: one script call takes both.
    let key_sets: [(&str, &[&str]); 2] = [
        ("one key", &["w3x:key"]),
        ("a key pair", &["w3x:{pair}:a", "w3x:{pair}:b"]),
    ];
    for (deployment, target) in &targets {
        for (what, keys) in key_sets {
            let mut runs: Vec<Vec<Summary>> = SHAPES.iter().map(|_| Vec::new()).collect();
            for _ in 0..reps {
                for (at, &shape) in SHAPES.iter().enumerate() {
                    runs[at].push(run(target, keys, shape).await);
                }
            }
            for (&(processes, tasks), runs) in SHAPES.iter().zip(&runs) {
                let system: &'static str = Box::leak(
                    format!("{deployment}, {what}, {processes} × {tasks} tasks").into_boxed_str(),
                );
                add(report, system, processes, runs);
            }
        }
    }
}

fn add(report: &mut Report, system: &'static str, processes: usize, runs: &[Summary]) {
    let per_run = |pick: &dyn Fn(&Summary) -> f64| runs.iter().map(pick).collect::<Vec<f64>>();
    let seconds = RUN.as_secs_f64();
    report.add_runs(
        "W3x",
        system,
        "acquisitions/s",
        &per_run(&|run| run.held() as f64 / seconds),
        "/s",
        None,
    );
    if processes > 1 {
        report.add_runs(
            "W3x",
            system,
            "process share, most ÷ fewest",
            &per_run(&Summary::share_ratio),
            "×",
            Some(("≤ 1.5×", |ratio| ratio <= 1.5)),
        );
    }
    report.add_runs(
        "W3x",
        system,
        "wait p99",
        &per_run(&|run| millis(run.wait_quantile(0.99))),
        "ms",
        None,
    );
    report.add_runs(
        "W3x",
        system,
        "wait max",
        &per_run(&|run| millis(run.wait_quantile(1.0))),
        "ms",
        None,
    );
    report.add_runs(
        "W3x",
        system,
        "longest free while waited",
        &per_run(&|run| millis(run.longest_free_while_waited)),
        "ms",
        Some(("≤ 300 ms", |ms| ms <= 300.0)),
    );
    let busy: usize = runs.iter().map(|run| run.busy.len()).sum();
    report.add(
        "W3x",
        system,
        "Busy after the whole wait, all runs",
        busy as f64,
        "",
        crate::report::Target::new("0", busy == 0),
    );
    let retry_after = runs
        .iter()
        .flat_map(|run| run.busy.iter().flatten().copied())
        .map(|ms| ms as f64);
    let retry_after: Vec<f64> = retry_after.collect();
    if !retry_after.is_empty() {
        report.add(
            "W3x",
            system,
            "Busy's retry_after, median",
            median(retry_after),
            "ms",
            None,
        );
    }
    let failed: usize = runs.iter().map(|run| run.failed).sum();
    if failed > 0 {
        report.add(
            "W3x",
            system,
            "other errors, all runs",
            failed as f64,
            "",
            None,
        );
    }
}
