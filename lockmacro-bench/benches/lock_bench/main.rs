//! The lockmacro benchmark (issue 6): `cargo bench -p lockmacro-bench --bench lock_bench`.
//!
//! Absolute times drift from run to run on a shared machine, so every goal is a ratio measured
//! in one run: each workload starts its own `redis-server` on a free loopback port, warms up,
//! and interleaves the systems it compares (A B A B …) over several repetitions; the figures are
//! the medians. It prints a markdown table, and writes `docs/bench/results.json` and the W3
//! pictures `docs/bench/handoff.svg` and `docs/bench/wait.svg`.
//!
//! | workload | what | where |
//! |---|---|---|
//! | W0 | the floors: `SET NX PX` + compare-and-delete `EVALSHA`, by hand-written RESP on a connection per task (raw), and through one shared redis-rs connection (redis-rs alone) | [`floor`] |
//! | W1 | one task, its own key: the macro, `run_locked`, rslock, vs both floors; client and Redis CPU and Redis commands per cycle | [`uncontended`] |
//! | W2 | 64 tasks, a key each: total throughput vs both floors and the pipelined one | [`uncontended`] |
//! | W3 | 16 tasks, one key, waiting: throughput, fairness, handoff latency | [`contended`] |
//! | W3x | 4 processes × 4 tasks on one key and on a key pair, beside 1 × 16, on one Redis, a Cluster and Redlock: each process's share, waits, the longest free while waited, `Busy` | [`across`] |
//! | W4 | 10 000 leases renewed for 20 s: requests, CPU, memory, lapses | [`renewal`] |
//! | W5 | 16 readers and 1 writer on one key: reads/s, the writer's wait, fairness | [`kinds`] |
//! | W1c, W2c, W4c | W1, W2 and W4 on a 3-master Redis Cluster; W1 and W2 against redis-rs's cluster connection alone sending the same commands | [`deployments`] |
//! | W1r, W2r, W4r | W1 and W2 on a 3-master Redlock against redis-rs alone sending the same commands to the three masters at once (majority required); W4 against one Redis in the same run | [`deployments`] |
//! | W6 | one task, a lock over 1, 2, 8 and 64 keys: time and round trips per cycle against the 1-key lock | [`several_keys`] |
//!
//! `cargo bench -p lockmacro-bench --bench lock_bench -- W3 W4` runs only the workloads named (W0 runs with W1 and
//! W2, W2c with W1c, W2r and W4r with W1r), e.g. under a profiler; it prints the table but leaves `docs/bench/` alone, which holds
//! only whole runs.

mod across;
mod contended;
mod deployments;
mod floor;
mod kinds;
mod measure;
mod relay;
mod renewal;
mod report;
mod several_keys;
mod uncontended;

use std::path::Path;
use std::time::Instant;

use report::Report;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(across::CHILD) {
        return across::child(&args[1..]);
    }
    let began = Instant::now();
    let mut report = Report::default();
    describe_machine(&mut report);
    // cargo passes `--bench` to a harness-less bench; anything else names workloads to run.
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|arg| !arg.starts_with("--"))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        for (name, workload) in [
            ("W1", Workload::SingleTask),
            ("W2", Workload::ManyTasks),
            ("W3", Workload::Contended),
            ("W3x", Workload::Across),
            ("W4", Workload::Renewal),
            ("W5", Workload::ReadersAndAWriter),
            ("W1c", Workload::ClusterUncontended),
            ("W4c", Workload::ClusterRenewal),
            ("W1r", Workload::Redlock),
            ("W6", Workload::SeveralKeys),
        ] {
            if !wanted.is_empty() && !wanted.iter().any(|w| w.eq_ignore_ascii_case(name)) {
                continue;
            }
            let started = Instant::now();
            workload.run(&mut report).await;
            eprintln!("{name} done in {:.1} s", started.elapsed().as_secs_f64());
        }
    });
    report.note(format!(
        "Medians of {} interleaved repetitions; whole run {:.0} s; load average after: {}.",
        measure::REPS,
        began.elapsed().as_secs_f64(),
        load_average()
    ));
    report.note(
        "Redis commands count every command Redis ran, those scripts run inside it included \
         (INFO commandstats). CPU per cycle is this process's and the redis-server \
         process's, from /proc.",
    );
    print!("{}", report.markdown());
    if !wanted.is_empty() {
        return;
    }
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/bench");
    match report.write(&out) {
        Ok(paths) => {
            let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            eprintln!("wrote {}", paths.join(", "));
        }
        Err(err) => {
            eprintln!("cannot write the results under {}: {err}", out.display());
            std::process::exit(1);
        }
    }
}

/// The workloads, in the order they run.
#[derive(Clone, Copy)]
enum Workload {
    SingleTask,
    ManyTasks,
    Contended,
    Across,
    Renewal,
    ReadersAndAWriter,
    ClusterUncontended,
    ClusterRenewal,
    Redlock,
    SeveralKeys,
}

impl Workload {
    async fn run(self, report: &mut Report) {
        match self {
            Self::SingleTask => uncontended::single_task(report).await,
            Self::ManyTasks => uncontended::many_tasks(report).await,
            Self::Contended => contended::contended(report).await,
            Self::Across => across::across(report).await,
            Self::Renewal => renewal::renewal(report).await,
            Self::ReadersAndAWriter => kinds::readers_and_a_writer(report).await,
            Self::ClusterUncontended => deployments::uncontended(report).await,
            Self::ClusterRenewal => deployments::renewal(report).await,
            Self::Redlock => deployments::redlock(report).await,
            Self::SeveralKeys => several_keys::several_keys(report).await,
        }
    }
}

/// The machine the figures come from: CPU model and count, Redis version, load before the run.
fn describe_machine(report: &mut Report) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name")?.split_once(':'))
        .map_or("unknown CPU".to_owned(), |(_, model)| {
            model.trim().to_owned()
        });
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let redis = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_else(|_| "redis-server not found".into());
    report
        .machine
        .push(("cpu", format!("{model}, {cores} cores")));
    report.machine.push(("redis", redis));
    report.machine.push(("load average before", load_average()));
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}
