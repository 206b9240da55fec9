//! The safety campaign: workers lock and increment counters on each deployment while a nemesis
//! injects faults on a schedule; then the checker reads the history and holds it to the
//! promises of `testkit::safety::promises`.
//!
//! `safety [--quick] [--only single|sentinel|cluster|redlock3|redlock5] [--fault NAME]
//! [--replica-acks N] [--out FILE]`
//!
//! `--fault NAME` runs that fault alone (its name in `testkit::safety::Fault`, any case:
//! `--fault laggingfailover`), for looping one row., or `safety --failover-figure [--out FILE]`
//!
//! Each key set (fenced, unfenced) has waiting workers (`wait = 10s`) and a fail-fast one (no
//! `wait`), counted apart: a failover the deployment recovers from inside the wait must cost the
//! waiting calls nothing, while fail-fast calls fail by design.
//!
//! `--replica-acks N` builds the workers' clients with `replica_acks(N)` instead of the default
//! (1): `--replica-acks 0` is the baseline without replica acknowledgement, whose broken
//! promises are reported but do not fail the run.
//!
//! Prints one Markdown table (one row per deployment and fault) and exits non-zero when a
//! promise broke, a lock was left behind, or a deployment did no work at all. Each deployment's
//! history (every worker's lines, then the nemesis's phases) is kept under
//! `target/safety/<deployment>.history` for reading a finding back.
//!
//! `--failover-figure` runs no campaign but the figure of the design's "Failovers are waits": a
//! Sentinel of one master, one replica and one sentinel (down-after 1 s), two worker processes
//! of 4 tasks each on one key with `wait = 10s` and 5 ms bodies for 10 s, the master killed
//! with `SIGKILL` 1 s in; it prints the calls that got the lock, the errors and the longest
//! call.
//!
//! Run it through `scripts/safety.sh`, which builds it and its worker first.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use testkit::safety::{
    Broken, Call, Caller, Campaign, Deployment, Fault, Outcome, Phase, Row, WAITING_WAIT, broken,
    monotonic_ns, table_header, table_row,
};
use testkit::{Fault as NetFault, FaultProxy, RedisCluster, RedisSentinel, RedisServer};

/// The workers' lease (`ttl = "1s"` in `safety_worker`): every fault lasts longer.
const TTL: Duration = testkit::safety::promises::WORKER_TTL;
/// How long a fault that is held (a pause, a blackhole, servers down) lasts: past the ttl even
/// for a lease renewed just before it began.
const HOLD: Duration = Duration::from_secs(2);
/// How long after a heal the phase goes on, so that what the fault left behind (an overlap
/// after a restart, a waiter that sleeps too long) is counted against it.
const SETTLE: Duration = Duration::from_secs(2);
/// How long stopped workers get to finish their last call and release.
const WORKER_EXIT_BUDGET: Duration = Duration::from_secs(20);

/// The lock keys (after the `safety:` prefix) the fenced and the unfenced workers loop over.
const FENCED_KEYS: [&str; 2] = ["f0", "f1"];
const UNFENCED_KEYS: [&str; 2] = ["u0", "u1"];

/// One deployment's part of a campaign.
struct Plan {
    deployment: Deployment,
    faults: Vec<Fault>,
    rounds: usize,
    /// Worker processes per key set (fenced and unfenced) that wait for the lock.
    waiting: usize,
    /// Worker processes per key set that fail fast.
    fail_fast: usize,
}

impl Plan {
    /// Every worker process of the plan.
    fn roles(&self) -> Vec<Role> {
        let fenced_sets: &[bool] = if self.deployment.offers_fencing() {
            &[true, false]
        } else {
            // Redlock refuses fencing: as many workers, all unfenced.
            &[false, false]
        };
        let callers = [
            (Caller::Waiting, self.waiting),
            (Caller::FailFast, self.fail_fast),
        ];
        let mut roles = Vec::new();
        for fenced in fenced_sets {
            for (caller, count) in callers {
                roles.extend((0..count).map(|_| Role {
                    fenced: *fenced,
                    caller,
                    keys: if *fenced {
                        &FENCED_KEYS
                    } else {
                        &UNFENCED_KEYS
                    },
                }));
            }
        }
        roles
    }
}

fn plans(quick: bool) -> Vec<Plan> {
    use Fault::*;
    // The waiting workers keep keys contended (and measure the wake-up); one fail-fast worker
    // per key set is enough to count what a caller without `wait` sees.
    let (rounds, waiting) = if quick { (1, 1) } else { (3, 2) };
    let plan = |deployment, faults: &[Fault]| Plan {
        deployment,
        faults: faults.to_vec(),
        rounds,
        waiting,
        fail_fast: 1,
    };
    if quick {
        // The faults whose promises hold, and the paused holder that fencing answers.
        return vec![
            plan(
                Deployment::Single,
                &[None, KillRestart, StopServer, Blackhole, PausedHolder],
            ),
            plan(Deployment::Sentinel, &[StopServer, Failover, ReplicaResync]),
            plan(
                Deployment::Cluster,
                &[PlannedFailover, LaggingFailover, ReplicaResync],
            ),
            plan(
                Deployment::Redlock(3),
                &[MinorityRestart, MajorityDown, PausedHolder],
            ),
        ];
    }
    let redlock = [
        None,
        MinorityRestart,
        MinorityDown,
        MajorityDown,
        MajorityRestart,
        BareMajorityRestart,
        PausedHolder,
    ];
    vec![
        plan(
            Deployment::Single,
            &[
                None,
                KillRestart,
                StopServer,
                Delay,
                Blackhole,
                PausedHolder,
            ],
        ),
        plan(
            Deployment::Sentinel,
            &[
                None,
                StopServer,
                Failover,
                LaggingFailover,
                ReplicaResync,
                PausedHolder,
            ],
        ),
        plan(
            Deployment::Cluster,
            &[
                None,
                PlannedFailover,
                Failover,
                LaggingFailover,
                ReplicaResync,
                StopServer,
                PausedHolder,
            ],
        ),
        plan(Deployment::Redlock(3), &redlock),
        plan(Deployment::Redlock(5), &redlock),
    ]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|arg| arg == "--quick");
    let value_of = |flag: &str| {
        args.iter()
            .position(|arg| arg == flag)
            .and_then(|at| args.get(at + 1))
            .cloned()
    };
    let only = value_of("--only");
    let only_fault = value_of("--fault");
    let out = value_of("--out").map(PathBuf::from);
    let replica_acks = value_of("--replica-acks");
    let baseline = replica_acks.as_deref() == Some("0");
    let history_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/safety");
    std::fs::create_dir_all(&history_dir).expect("cannot create target/safety");
    if args.iter().any(|arg| arg == "--failover-figure") {
        let (report, held) = failover_figure(&history_dir).await;
        println!("{report}");
        if let Some(out) = out {
            std::fs::write(&out, &report)
                .unwrap_or_else(|err| panic!("cannot write {}: {err}", out.display()));
        }
        if !held {
            println!("BROKEN PROMISES: see the figure");
            std::process::exit(1);
        }
        return;
    }

    let began = Instant::now();
    let mut table = table_header();
    let mut summary = String::new();
    let mut failures: Vec<String> = Vec::new();
    let mut known: Vec<String> = Vec::new();
    for mut plan in plans(quick) {
        if only
            .as_deref()
            .is_some_and(|only| only != slug(plan.deployment))
        {
            continue;
        }
        if let Some(name) = &only_fault {
            plan.faults
                .retain(|fault| format!("{fault:?}").eq_ignore_ascii_case(name));
            if plan.faults.is_empty() {
                continue;
            }
        }
        let started = Instant::now();
        eprintln!("==> {}: {:?}", plan.deployment, plan.faults);
        let outcome = run(&plan, replica_acks.as_deref(), &history_dir).await;
        for (fault, row) in &outcome.rows {
            table.push_str(&table_row(plan.deployment, *fault, row));
            for found in broken(plan.deployment, *fault, row) {
                match found.known {
                    None if baseline => known.push(format!(
                        "{} (replica acknowledgement off: the baseline)",
                        describe(&found)
                    )),
                    None => failures.push(describe(&found)),
                    Some(defect) => known.push(format!("{} ({defect})", describe(&found))),
                }
            }
        }
        let completed: usize = outcome.rows.iter().map(|(_, row)| row.completed).sum();
        if completed == 0 {
            failures.push(format!("{}: no call completed at all", plan.deployment));
        }
        if outcome.left_behind > 0 {
            failures.push(format!(
                "{}: {} lock(s) left behind after every worker exited",
                plan.deployment, outcome.left_behind
            ));
        }
        let _ = writeln!(
            summary,
            "- {}: {} workers, {} calls, {completed} completed, {} lock(s) left behind, {:.0} s",
            plan.deployment,
            outcome.workers,
            outcome.calls,
            outcome.left_behind,
            started.elapsed().as_secs_f64()
        );
    }
    let report = format!(
        "{table}\n{summary}\nTotal: {:.0} s ({}{}).\n",
        began.elapsed().as_secs_f64(),
        if quick { "--quick" } else { "full run" },
        replica_acks
            .map(|acks| format!(", replica_acks({acks})"))
            .unwrap_or_default()
    );
    println!("{report}");
    if let Some(out) = out {
        std::fs::write(&out, &report)
            .unwrap_or_else(|err| panic!("cannot write {}: {err}", out.display()));
    }
    if !known.is_empty() {
        println!("KNOWN DEFECTS (promises broken, reported, not failing the run):");
        for defect in &known {
            println!("- {defect}");
        }
    }
    if failures.is_empty() {
        println!(
            "{}",
            if known.is_empty() {
                "Every promise held."
            } else {
                "Every other promise held."
            }
        );
    } else {
        println!("BROKEN PROMISES:");
        for failure in &failures {
            println!("- {failure}");
        }
        std::process::exit(1);
    }
}

fn describe(broken: &Broken) -> String {
    format!(
        "{} under {}: {}",
        broken.deployment, broken.fault, broken.what
    )
}

fn slug(deployment: Deployment) -> &'static str {
    match deployment {
        Deployment::Single => "single",
        Deployment::Sentinel => "sentinel",
        Deployment::Cluster => "cluster",
        Deployment::Redlock(3) => "redlock3",
        Deployment::Redlock(_) => "redlock5",
    }
}

/// What one deployment's campaign came to.
struct Campaigned {
    rows: Vec<(Fault, Row)>,
    workers: usize,
    calls: usize,
    left_behind: usize,
}

async fn run(plan: &Plan, replica_acks: Option<&str>, history_dir: &Path) -> Campaigned {
    let resource = RedisServer::start();
    let mut lab = Lab::start(plan.deployment).await;
    // The runner's `--replica-acks`, handed on to the workers' clients.
    let env: Vec<(&str, &str)> = replica_acks
        .map(|acks| ("SAFETY_REPLICA_ACKS", acks))
        .into_iter()
        .collect();
    let mut workers = Workers::spawn(&plan.roles(), &lab.url(), &resource.url(), &env);
    workers.wait_until_working();

    let mut phases = Vec::new();
    for round in 0..plan.rounds {
        for fault in &plan.faults {
            let start = monotonic_ns();
            let healed = lab.inject(*fault, round, &workers).await;
            // At least a second past the recovery grace, so the wake-up promise is measured
            // after every fault.
            let grace = testkit::safety::promises::recovery_grace(plan.deployment, *fault);
            tokio::time::sleep(SETTLE.max(grace + Duration::from_secs(1))).await;
            // A waiting call that began in this fault ends in this phase, not in the next
            // fault: its wait is longer than the settling time.
            workers.returned_since(healed).await;
            phases.push(Phase {
                fault: *fault,
                start,
                healed,
                end: monotonic_ns(),
            });
        }
    }

    let lines = workers.stop();
    let left_behind = lab.locks_left_behind();
    let calls: Vec<Call> = lines.iter().filter_map(|line| Call::parse(line)).collect();
    let mut applied = BTreeMap::new();
    if plan.deployment.offers_fencing() {
        let mut conn = resource.connection().await;
        for key in FENCED_KEYS {
            let writes = testkit::applied_writes(&mut conn, &format!("res:{key}")).await;
            applied.insert(format!("safety:{key}"), writes);
        }
    }
    save_history(
        history_dir,
        slug(plan.deployment),
        &lines,
        &phases,
        &applied,
    );
    let campaign = Campaign {
        deployment: plan.deployment,
        calls: &calls,
        applied: &applied,
        phases: &phases,
    };
    Campaigned {
        rows: campaign.rows(),
        workers: workers.count(),
        calls: calls.len(),
        left_behind,
    }
}

/// The lock key of [`failover_figure`]'s callers (after the `safety:` prefix).
const FIGURE_KEY: [&str; 1] = ["one"];
/// How long [`failover_figure`]'s callers run before the master is killed, and in all (as the
/// tests of `tests/failover.rs` that ride out the same fault in one process).
const FIGURE_BEFORE: Duration = Duration::from_secs(1);
const FIGURE_RUN: Duration = Duration::from_secs(10);

/// The design's two-process figure of "Failovers are waits", as the issue that asked for it
/// measured it before: a Sentinel of one master, one replica and one sentinel (down-after 1 s),
/// two worker processes of 4 tasks each on one key, `wait = 10s`, 5 ms bodies, the master
/// killed with `SIGKILL`. Returns the report, and whether no call failed and no holders
/// overlapped.
async fn failover_figure(history_dir: &Path) -> (String, bool) {
    let resource = RedisServer::start();
    let mut sentinel = RedisSentinel::start_with(1, Duration::from_secs(1));
    let caller = || Role {
        fenced: false,
        caller: Caller::Waiting,
        keys: &FIGURE_KEY,
    };
    let env = [("SAFETY_TASKS", "4"), ("SAFETY_WORK_MS", "5")];
    let mut workers = Workers::spawn(
        &[caller(), caller()],
        &sentinel.url(),
        &resource.url(),
        &env,
    );
    workers.wait_until_working();
    let began = Instant::now();
    tokio::time::sleep(FIGURE_BEFORE).await;
    let killed_at = monotonic_ns();
    let killed = sentinel.kill_master_now();
    sentinel.wait_for_failover(killed);
    let healed = monotonic_ns();
    let promoted = sentinel.master().port();
    sentinel.restart_as_replica(killed);
    tokio::time::sleep(FIGURE_RUN.saturating_sub(began.elapsed())).await;
    // One sentinel that pings as often as its down-after may call the promoted master down
    // too, and fail back: a second outage the callers rode out, which the figure must name.
    let failed_back = sentinel.master().port() != promoted;
    let lines = workers.stop();
    let calls: Vec<Call> = lines.iter().filter_map(|line| Call::parse(line)).collect();
    let phases = [
        Phase {
            fault: Fault::None,
            start: 0,
            healed: 0,
            end: killed_at,
        },
        Phase {
            fault: Fault::Failover,
            start: killed_at,
            healed,
            end: u64::MAX,
        },
    ];
    let applied = BTreeMap::new();
    save_history(history_dir, "failover-figure", &lines, &phases, &applied);
    let rows = Campaign {
        deployment: Deployment::Sentinel,
        calls: &calls,
        applied: &applied,
        phases: &phases,
    }
    .rows();
    let overlaps: usize = rows.iter().map(|(_, row)| row.overlaps_unfenced).sum();
    let lost_updates: usize = rows.iter().map(|(_, row)| row.lost_unfenced).sum();

    let held = calls.iter().filter(|call| call.held()).count();
    let mut errors: BTreeMap<String, usize> = BTreeMap::new();
    for call in calls.iter().filter(|call| call.outcome != Outcome::Applied) {
        *errors.entry(format!("{:?}", call.outcome)).or_default() += 1;
    }
    let error_count: usize = errors.values().sum();
    let errors_text = if errors.is_empty() {
        "0".to_owned()
    } else {
        let kinds: Vec<String> = errors
            .iter()
            .map(|(kind, n)| format!("{kind} {n}"))
            .collect();
        format!("{error_count} ({})", kinds.join(", "))
    };
    let longest_call = calls
        .iter()
        .map(|call| call.returned.saturating_sub(call.called))
        .max()
        .unwrap_or(0);
    let first = calls
        .iter()
        .map(|call| call.called)
        .min()
        .unwrap_or(killed_at);
    let last = calls
        .iter()
        .map(|call| call.returned)
        .max()
        .unwrap_or(killed_at);
    let seconds = |ns: u64| ns as f64 / 1e9;
    let mut report = String::new();
    let _ = writeln!(
        report,
        "| fault (2 processes x 4 tasks, one key, `wait = {}s`, 5 ms bodies) | calls with the lock \
         | errors | longest call | overlaps / lost updates |\n|---|---|---|---|---|",
        WAITING_WAIT.as_secs()
    );
    let _ = writeln!(
        report,
        "| Sentinel (1 master, 1 replica, 1 sentinel, down-after 1 s), master killed | {held} \
         | {errors_text} | {:.2} s | {overlaps} / {lost_updates} |",
        seconds(longest_call)
    );
    let _ = writeln!(
        report,
        "\n{} calls over {:.1} s; the master killed {:.1} s in, the new master serving {:.1} s \
         after the kill{}.",
        calls.len(),
        seconds(last.saturating_sub(first)),
        seconds(killed_at.saturating_sub(first)),
        seconds(healed - killed_at),
        if failed_back {
            "; the sentinel then called the new master down too and failed back to the \
             restarted one"
        } else {
            ""
        },
    );
    (report, error_count == 0 && overlaps + lost_updates == 0)
}

fn save_history(
    dir: &Path,
    name: &str,
    lines: &[String],
    phases: &[Phase],
    applied: &BTreeMap<String, Vec<(u64, String)>>,
) {
    let mut text = lines.join("\n");
    for phase in phases {
        let _ = write!(
            text,
            "\nphase {:?} {} {} {}",
            phase.fault, phase.start, phase.healed, phase.end
        );
    }
    for (key, writes) in applied {
        for (fence, value) in writes {
            let _ = write!(text, "\napplied {key} {fence} {value}");
        }
    }
    text.push('\n');
    let path = dir.join(format!("{name}.history"));
    std::fs::write(&path, text)
        .unwrap_or_else(|err| panic!("cannot write {}: {err}", path.display()));
}

/// A deployment under test, with what the nemesis needs to break it.
enum Lab {
    Single {
        server: RedisServer,
        /// Every worker reaches the server through it.
        proxy: FaultProxy,
    },
    Sentinel(RedisSentinel),
    Cluster(RedisCluster),
    Redlock(Vec<RedisServer>),
}

impl Lab {
    async fn start(deployment: Deployment) -> Self {
        match deployment {
            Deployment::Single => {
                let server = RedisServer::start();
                let proxy = FaultProxy::start(server.addr()).await;
                Lab::Single { server, proxy }
            }
            Deployment::Sentinel => Lab::Sentinel(RedisSentinel::start()),
            Deployment::Cluster => Lab::Cluster(RedisCluster::start(3, 1)),
            Deployment::Redlock(masters) => {
                Lab::Redlock((0..masters).map(|_| RedisServer::start()).collect())
            }
        }
    }

    /// The deployment as `safety_worker` takes it.
    fn url(&self) -> String {
        match self {
            Lab::Single { proxy, .. } => proxy.url(),
            Lab::Sentinel(sentinel) => sentinel.url(),
            Lab::Cluster(cluster) => format!("cluster:{}", cluster.seed_urls().join(",")),
            Lab::Redlock(servers) => {
                let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
                format!("redlock:{}", urls.join(","))
            }
        }
    }

    /// Injects `fault` and returns once it is healed, with the time it was healed: the server
    /// back, the traffic flowing, the holder resumed, or the new master serving (the old one
    /// may rejoin as a replica after that).
    async fn inject(&mut self, fault: Fault, round: usize, workers: &Workers) -> u64 {
        let mut healed = None;
        match (self, fault) {
            (_, Fault::None) => tokio::time::sleep(HOLD).await,
            (_, Fault::PausedHolder) => workers.pause_holders(HOLD + TTL / 2).await,
            (Lab::Single { server, .. }, Fault::KillRestart) => server.restart(),
            (Lab::Single { server, .. }, Fault::StopServer) => stopped(server, HOLD).await,
            (Lab::Single { proxy, .. }, Fault::Delay) => {
                proxy.set(NetFault::Delay(Duration::from_millis(200)));
                tokio::time::sleep(HOLD).await;
                proxy.heal();
            }
            (Lab::Single { proxy, .. }, Fault::Blackhole) => {
                proxy.set(NetFault::Blackhole);
                tokio::time::sleep(HOLD).await;
                proxy.heal();
            }
            // Shorter than the sentinels' down-after (2 s): the master stays master.
            (Lab::Sentinel(sentinel), Fault::StopServer) => {
                stopped(sentinel.master(), Duration::from_millis(1_500)).await;
            }
            (Lab::Sentinel(sentinel), Fault::Failover) => {
                let killed = sentinel.kill_master_now();
                sentinel.wait_for_failover(killed);
                healed = Some(monotonic_ns());
                sentinel.restart_as_replica(killed);
            }
            (Lab::Sentinel(sentinel), Fault::ReplicaResync) => {
                let syncs = full_syncs(sentinel.master());
                let lost = sentinel.kill_replica_now();
                tokio::time::sleep(HOLD).await;
                sentinel.restart_as_replica(lost);
                assert!(
                    full_syncs(sentinel.master()) > syncs,
                    "the replica synced in full"
                );
            }
            (Lab::Sentinel(sentinel), Fault::LaggingFailover) => {
                let cut = sentinel.replica().cut_off_from(sentinel.master());
                tokio::time::sleep(HOLD).await;
                sentinel.fail_over();
                drop(cut);
            }
            (Lab::Cluster(cluster), Fault::LaggingFailover) => {
                let key = cluster_key(round);
                let cut = cluster
                    .replica_of(&key)
                    .cut_off_from(cluster.master_of(&key));
                tokio::time::sleep(HOLD).await;
                cluster.take_over(&key);
                drop(cut);
            }
            (Lab::Cluster(cluster), Fault::ReplicaResync) => {
                let key = cluster_key(round);
                let syncs = full_syncs(cluster.master_of(&key));
                let lost = cluster.kill_replica_now(&key);
                tokio::time::sleep(HOLD).await;
                cluster.restart_node(lost);
                assert!(
                    full_syncs(cluster.master_of(&key)) > syncs,
                    "the replica synced in full"
                );
            }
            (Lab::Cluster(cluster), Fault::PlannedFailover) => {
                cluster.fail_over(&cluster_key(round));
            }
            (Lab::Cluster(cluster), Fault::Failover) => {
                let key = cluster_key(round);
                let killed = cluster.kill_master_now(&key);
                cluster.wait_for_failover(&key, killed);
                healed = Some(monotonic_ns());
                cluster.restart_node(killed);
            }
            // Past the node timeout (1 s): the cluster fails the frozen master over.
            (Lab::Cluster(cluster), Fault::StopServer) => {
                stopped(cluster.master_of(&cluster_key(round)), HOLD).await;
                cluster.wait_until_ready();
            }
            (Lab::Redlock(servers), Fault::MinorityRestart) => {
                for index in minority(servers.len(), round) {
                    servers[index].restart();
                }
            }
            (Lab::Redlock(servers), Fault::MajorityRestart) => {
                for index in majority(servers.len(), round) {
                    servers[index].restart();
                }
            }
            (Lab::Redlock(servers), Fault::BareMajorityRestart) => {
                // Leases taken while a minority is down are held on a bare majority; once it
                // is back (empty) and a renewal passed, a minority of that majority loses its
                // data.
                let first = minority(servers.len(), round);
                down(servers, &first).await;
                tokio::time::sleep(TTL).await;
                let n = servers.len();
                for index in minority(n, round + first.len()) {
                    servers[index].restart();
                }
            }
            (Lab::Redlock(servers), Fault::MinorityDown) => {
                let which = minority(servers.len(), round);
                down(servers, &which).await;
            }
            (Lab::Redlock(servers), Fault::MajorityDown) => {
                let which = majority(servers.len(), round);
                down(servers, &which).await;
            }
            (lab, fault) => panic!("no {fault} for {}", lab.url()),
        }
        healed.unwrap_or_else(monotonic_ns)
    }

    /// Lock keys still held once every worker has exited (each released its lock before it
    /// returned): on Redlock, keys held on a majority.
    fn locks_left_behind(&self) -> usize {
        let keys_on = |server: &RedisServer| -> Vec<String> {
            redis::from_redis_value(server.command(&["KEYS", "safety:*"])).expect("KEYS")
        };
        match self {
            Lab::Single { server, .. } => keys_on(server).len(),
            Lab::Sentinel(sentinel) => keys_on(sentinel.master()).len(),
            Lab::Cluster(cluster) => cluster
                .masters()
                .into_iter()
                .map(keys_on)
                .map(|k| k.len())
                .sum(),
            Lab::Redlock(servers) => {
                let mut held: BTreeMap<String, usize> = BTreeMap::new();
                for key in servers.iter().flat_map(keys_on) {
                    *held.entry(key).or_default() += 1;
                }
                held.values().filter(|on| **on > servers.len() / 2).count()
            }
        }
    }
}

/// The key whose master a cluster fault hits: a fenced key one round, an unfenced one the next.
fn cluster_key(round: usize) -> String {
    let keys = [FENCED_KEYS[0], UNFENCED_KEYS[0]];
    format!("safety:{}", keys[round % keys.len()])
}

/// The largest minority of `n` masters, a different one each round.
fn minority(n: usize, round: usize) -> Vec<usize> {
    (0..(n - 1) / 2).map(|i| (round + i) % n).collect()
}

/// The smallest majority of `n` masters, a different one each round.
fn majority(n: usize, round: usize) -> Vec<usize> {
    (0..n / 2 + 1).map(|i| (round + i) % n).collect()
}

/// How many full syncs `server` has served as a master (`sync_full` in `INFO stats`).
fn full_syncs(server: &RedisServer) -> u64 {
    let info: String = redis::from_redis_value(server.command(&["INFO", "stats"])).expect("INFO");
    info.lines()
        .find_map(|line| line.strip_prefix("sync_full:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("INFO stats has sync_full")
}

/// Freezes `server` for `how_long`.
async fn stopped(server: &RedisServer, how_long: Duration) {
    server.pause();
    tokio::time::sleep(how_long).await;
    server.resume();
}

/// Kills `which` masters for [`HOLD`], then restarts them empty.
async fn down(servers: &mut [RedisServer], which: &[usize]) {
    for index in which {
        servers[*index].kill();
    }
    tokio::time::sleep(HOLD).await;
    for index in which {
        servers[*index].restart();
    }
}

/// One worker process to start.
struct Role {
    fenced: bool,
    caller: Caller,
    /// The lock keys it loops over (after the `safety:` prefix).
    keys: &'static [&'static str],
}

/// The worker processes of one deployment, and what they printed.
struct Workers {
    procs: Vec<Worker>,
}

struct Worker {
    child: Child,
    fenced: bool,
    /// Closing it tells the worker to stop.
    stdin: Option<ChildStdin>,
    /// When its last line, a `begin`, was read (monotonic ns); 0 once the call has returned.
    begun_at: Arc<AtomicU64>,
    lines: Arc<Mutex<Vec<String>>>,
    reader: Option<JoinHandle<()>>,
}

impl Workers {
    /// Starts one `safety_worker` per role, with `env` in their environment.
    fn spawn(
        roles: &[Role],
        deployment_url: &str,
        resource_url: &str,
        env: &[(&str, &str)],
    ) -> Self {
        let binary = std::env::current_exe()
            .expect("the runner's path")
            .with_file_name("safety_worker");
        let mut procs = Vec::new();
        for role in roles {
            let id = procs.len().to_string();
            let mut child = Command::new(&binary)
                .envs(env.iter().copied())
                .args([
                    id.as_str(),
                    deployment_url,
                    resource_url,
                    if role.fenced { "fenced" } else { "unfenced" },
                    role.caller.name(),
                ])
                .args(role.keys)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap_or_else(|err| panic!("cannot start {}: {err}", binary.display()));
            let stdout = child.stdout.take().expect("piped");
            let (begun_at, lines) = (Arc::new(AtomicU64::new(0)), Arc::default());
            let reader = std::thread::spawn({
                let (begun_at, lines): (_, Arc<Mutex<Vec<String>>>) =
                    (begun_at.clone(), Arc::clone(&lines));
                move || {
                    for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                        let begun = if line.starts_with("begin ") {
                            monotonic_ns()
                        } else {
                            0
                        };
                        begun_at.store(begun, Ordering::SeqCst);
                        lines.lock().expect("lines").push(line);
                    }
                }
            });
            procs.push(Worker {
                stdin: child.stdin.take(),
                child,
                fenced: role.fenced,
                begun_at,
                lines,
                reader: Some(reader),
            });
        }
        Workers { procs }
    }

    fn count(&self) -> usize {
        self.procs.len()
    }

    /// Returns once every worker has completed a call, so the schedule starts on a campaign
    /// that runs.
    fn wait_until_working(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.procs.iter().all(|worker| {
            let lines = worker.lines.lock().expect("lines");
            lines.iter().any(|line| line.starts_with("call "))
        }) {
            assert!(
                Instant::now() < deadline,
                "the workers did not complete a call within 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Returns once every worker has returned from a call it began at or after `since`: no call
    /// begun before is still in flight. Gives up (saying so) after a waiting call's wait and
    /// more: a worker stuck longer is for the checker to find.
    async fn returned_since(&self, since: u64) {
        let deadline = Instant::now() + WAITING_WAIT + Duration::from_secs(5);
        let returned = |worker: &Worker| {
            let lines = worker.lines.lock().expect("lines");
            lines
                .iter()
                .rev()
                .find_map(|line| Call::parse(line))
                .is_some_and(|call| call.called >= since)
        };
        while !self.procs.iter().all(returned) {
            if Instant::now() >= deadline {
                eprintln!("a worker's call begun before the heal is still running; going on");
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Freezes one worker of each kind (fenced, unfenced) while it is inside its body, for
    /// `how_long`, then lets them go on: Kleppmann's paused holder. A body lasts 10 ms and
    /// more, so a `begin` read in the last [`FRESH_BEGIN`] means the worker is still in it (an
    /// older one may be a body that has ended and is releasing).
    async fn pause_holders(&self, how_long: Duration) {
        let mut paused = Vec::new();
        for fenced in [true, false] {
            if !self.procs.iter().any(|worker| worker.fenced == fenced) {
                continue;
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline {
                let holder = self.procs.iter().find(|worker| {
                    worker.fenced == fenced
                        && fresh(worker.begun_at.load(Ordering::SeqCst))
                        && !paused.contains(&worker.child.id())
                });
                if let Some(holder) = holder {
                    signal(&holder.child, libc::SIGSTOP);
                    paused.push(holder.child.id());
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        tokio::time::sleep(how_long).await;
        for worker in &self.procs {
            signal(&worker.child, libc::SIGCONT);
        }
    }

    /// Stops every worker (it finishes and releases its current call) and returns every line
    /// they printed.
    fn stop(&mut self) -> Vec<String> {
        for worker in &mut self.procs {
            signal(&worker.child, libc::SIGCONT);
            worker.stdin = None;
        }
        let deadline = Instant::now() + WORKER_EXIT_BUDGET;
        for worker in &mut self.procs {
            while matches!(worker.child.try_wait(), Ok(None)) {
                if Instant::now() >= deadline {
                    eprintln!("worker {} did not stop in time; killed", worker.child.id());
                    let _ = worker.child.kill();
                    let _ = worker.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if let Some(reader) = worker.reader.take() {
                let _ = reader.join();
            }
        }
        self.procs
            .iter()
            .flat_map(|worker| worker.lines.lock().expect("lines").clone())
            .collect()
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for worker in &mut self.procs {
            // Only a child not yet reaped: a reaped one's pid may belong to someone else now.
            if matches!(worker.child.try_wait(), Ok(None)) {
                signal(&worker.child, libc::SIGCONT);
                let _ = worker.child.kill();
                let _ = worker.child.wait();
            }
        }
    }
}

/// How recent a `begin` must be for its worker to count as inside its body.
const FRESH_BEGIN: Duration = Duration::from_millis(3);

fn fresh(begun_at: u64) -> bool {
    begun_at != 0 && monotonic_ns().saturating_sub(begun_at) < FRESH_BEGIN.as_nanos() as u64
}

fn signal(child: &Child, signal: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own child, not yet
        // reaped (reaping happens only in `stop` and `drop`, after the last signal).
        unsafe { libc::kill(pid, signal) };
    }
}
