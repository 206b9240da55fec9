//! One client of the safety campaign (`scripts/safety.sh`), in a process of its own so the
//! nemesis can pause it (`SIGSTOP`) as Kleppmann's paused holder.
//!
//! `safety_worker WORKER DEPLOYMENT RESOURCE_URL fenced|unfenced waiting|fail-fast KEY...`
//!
//! Until its stdin closes, it loops over the KEYs, each time taking the lock `safety:KEY` with
//! `#[redis_lock]` (ttl 1 s, 3 renewals, `fencing = true` when fenced; `wait = 10s` when waiting,
//! no `wait` when fail-fast: the two callers the contract treats apart) and doing a
//! read-modify-write (10 ms between read and write; 400 ms every 10th call, so leases are
//! renewed) of a counter at `res:KEY` on RESOURCE_URL, a Redis the nemesis never touches: a plain
//! GET/SET unfenced, the fencing-checked read and write of
//! [`testkit::fenced_read`]/[`testkit::fenced_write`] fenced. It prints `begin WORKER KEY` when
//! a body starts and one `call` line per call (see `testkit::safety::Call`).
//!
//! From its environment: `SAFETY_REPLICA_ACKS=N` builds the client with `replica_acks(N)`;
//! `SAFETY_TASKS=N` runs N such loops at once on the one client (default 1); `SAFETY_WORK_MS=N`
//! makes every call work N ms between read and write (no long calls);
//! `RUST_LOG=lockmacro_runtime=info` shows what the lock does (its looks made again), on stderr.
//!
//! DEPLOYMENT is a `redis://` or `redis+sentinel://` URL, `cluster:URL,URL,...` (seed nodes) or
//! `redlock:URL,URL,URL` (the masters).

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use lockmacro_runtime::{LockClient, LockContext, LockError, redis_lock};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use testkit::safety::{
    Call, Caller, Outcome, WAITING_WAIT, begin_line, fenced_value, monotonic_ns, parse_fenced_value,
};

/// Between the read and the write: the window in which a paused or late holder meets another.
const WORK: Duration = Duration::from_millis(10);
/// Every [`LONG_EVERY`]th call works this long instead: past a third of the ttl, so its lease
/// is renewed, and long enough that a fault often lands while it holds the lock.
const LONG_WORK: Duration = Duration::from_millis(400);
const LONG_EVERY: u64 = 10;
/// A worker whose runner never closes its stdin still stops: no campaign runs this long.
const MAX_RUN: Duration = Duration::from_secs(20 * 60);

/// What every call loop of this worker does.
struct Setup {
    worker: u32,
    fenced: bool,
    caller: Caller,
    keys: Vec<String>,
    /// `SAFETY_WORK_MS`: every call's work, instead of [`WORK`] and [`LONG_WORK`].
    work: Option<Duration>,
    locks: LockClient,
    resource: MultiplexedConnection,
    /// Numbers calls across the loops: a call is (worker, seq).
    seq: AtomicU64,
    stop: Arc<AtomicBool>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    let [_, worker, deployment, resource, fencing, caller, keys @ ..] = args.as_slice() else {
        eprintln!(
            "usage: safety_worker WORKER DEPLOYMENT RESOURCE_URL fenced|unfenced waiting|fail-fast KEY..."
        );
        std::process::exit(2);
    };
    let number = |name: &str| {
        std::env::var(name).ok().map(|value| {
            value
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{name} is a number"))
        })
    };
    let setup = Arc::new(Setup {
        worker: worker.parse().expect("WORKER is a number"),
        fenced: fencing == "fenced",
        caller: Caller::parse(caller).expect("waiting or fail-fast"),
        keys: keys.to_vec(),
        work: number("SAFETY_WORK_MS").map(Duration::from_millis),
        locks: client(deployment).await,
        resource: redis::Client::open(resource.as_str())
            .expect("RESOURCE_URL")
            .get_multiplexed_async_connection()
            .await
            .expect("the resource Redis answers"),
        seq: AtomicU64::new(0),
        stop: stop_when_stdin_closes(),
    });
    let mut loops = tokio::task::JoinSet::new();
    for _ in 0..number("SAFETY_TASKS").unwrap_or(1) {
        loops.spawn(call_loop(setup.clone()));
    }
    while let Some(done) = loops.join_next().await {
        done.expect("a call loop");
    }
}

/// Calls one after another until the runner says stop.
async fn call_loop(setup: Arc<Setup>) {
    let worker = setup.worker;
    let give_up = tokio::time::Instant::now() + MAX_RUN;
    while !setup.stop.load(Ordering::SeqCst) && tokio::time::Instant::now() < give_up {
        let seq = setup.seq.fetch_add(1, Ordering::SeqCst) + 1;
        let key = &setup.keys[(seq as usize + worker as usize) % setup.keys.len()];
        let trace = Trace::default();
        let step = Step {
            worker,
            seq,
            data: format!("res:{key}"),
            conn: setup.resource.clone(),
            // Staggered, so the workers' long calls do not all fall together.
            work: setup.work.unwrap_or(
                if (seq + u64::from(worker) * 3).is_multiple_of(LONG_EVERY) {
                    LONG_WORK
                } else {
                    WORK
                },
            ),
            trace: &trace,
        };
        let called = monotonic_ns();
        let locks = &setup.locks;
        let result = match (setup.fenced, setup.caller) {
            (true, Caller::Waiting) => fenced_waiting(locks, key, step).await,
            (true, Caller::FailFast) => fenced_fail_fast(locks, key, step).await,
            (false, Caller::Waiting) => waiting(locks, key, step).await,
            (false, Caller::FailFast) => fail_fast(locks, key, step).await,
        };
        let call = trace.call(worker, setup.caller, seq, key, called, result);
        println!("{call}");
        // Spread the workers out; back off while the deployment fails, as a client would.
        let pause = match call.outcome {
            Outcome::Applied | Outcome::Rejected | Outcome::Busy => {
                5 + (seq * 7 + u64::from(worker) * 3) % 10
            }
            _ => 50,
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

async fn client(deployment: &str) -> LockClient {
    let builder = if let Some(seeds) = deployment.strip_prefix("cluster:") {
        LockClient::cluster_builder(seeds.split(','))
    } else if let Some(masters) = deployment.strip_prefix("redlock:") {
        LockClient::redlock_builder(masters.split(','))
    } else {
        LockClient::builder(deployment)
    };
    // The runner's `--replica-acks N`: 0 is the baseline without replica acknowledgement.
    let builder = match std::env::var("SAFETY_REPLICA_ACKS") {
        Ok(acks) => builder.replica_acks(acks.parse().expect("SAFETY_REPLICA_ACKS is a number")),
        Err(_) => builder,
    };
    // Timeouts well under the 1 s ttl, so a dead node costs a call, not the campaign's pace.
    builder
        .scan_interval(Duration::from_millis(250))
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_or_else(|err| panic!("cannot build a client for {deployment}: {err}"))
}

/// The runner stops a worker by closing its stdin, so a worker outlives no runner.
fn stop_when_stdin_closes() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        flag.store(true, Ordering::SeqCst);
    });
    stop
}

// The same call four ways: a lock's options are fixed per function, and the contract differs
// with and without `wait` (and fencing), so each kind of caller has its own.

#[redis_lock(prefix = "safety", key = key, client = locks, ttl = "1s", max_renewals = 3, wait = WAITING_WAIT, fencing = true)]
async fn fenced_waiting(locks: &LockClient, key: &str, step: Step<'_>) -> Result<bool, LockError> {
    Ok(step.run(key, Some(fencing_token())).await)
}

#[redis_lock(prefix = "safety", key = key, client = locks, ttl = "1s", max_renewals = 3, fencing = true)]
async fn fenced_fail_fast(
    locks: &LockClient,
    key: &str,
    step: Step<'_>,
) -> Result<bool, LockError> {
    Ok(step.run(key, Some(fencing_token())).await)
}

#[redis_lock(prefix = "safety", key = key, client = locks, ttl = "1s", max_renewals = 3, wait = WAITING_WAIT)]
async fn waiting(locks: &LockClient, key: &str, step: Step<'_>) -> Result<bool, LockError> {
    Ok(step.run(key, None).await)
}

#[redis_lock(prefix = "safety", key = key, client = locks, ttl = "1s", max_renewals = 3)]
async fn fail_fast(locks: &LockClient, key: &str, step: Step<'_>) -> Result<bool, LockError> {
    Ok(step.run(key, None).await)
}

fn fencing_token() -> u64 {
    LockContext::current()
        .and_then(|lock| lock.fencing_token())
        .expect("a fenced lock hands out a token")
}

/// One read-modify-write of the counter.
struct Step<'a> {
    worker: u32,
    seq: u64,
    data: String,
    conn: MultiplexedConnection,
    work: Duration,
    trace: &'a Trace,
}

impl Step<'_> {
    /// Adds one to the counter; `false` when the fenced storage rejected the read or the write.
    async fn run(mut self, key: &str, fence: Option<u64>) -> bool {
        self.trace.started(fence);
        println!("{}", begin_line(self.worker, key));
        let _stopped = StopOnDrop(self.trace);
        let read = match fence {
            Some(fence) => match testkit::fenced_read(&mut self.conn, &self.data, fence).await {
                None => return false,
                Some(value) => parse_fenced_value(&value).map_or(0, |(counter, _)| counter),
            },
            None => {
                let value: Option<u64> = self.conn.get(&self.data).await.expect("GET");
                value.unwrap_or(0)
            }
        };
        self.trace.read.store(read, Ordering::SeqCst);
        tokio::time::sleep(self.work).await;
        match fence {
            Some(fence) => {
                let value = fenced_value(read + 1, self.worker, self.seq);
                testkit::fenced_write(&mut self.conn, &self.data, fence, &value).await
            }
            None => {
                let () = self.conn.set(&self.data, read + 1).await.expect("SET");
                true
            }
        }
    }
}

/// What the body of one call did, written from inside it (the body may be cancelled at any
/// `.await`, so it cannot report by returning).
struct Trace {
    start: AtomicU64,
    stop: AtomicU64,
    fence: AtomicU64,
    read: AtomicU64,
}

const UNSET: u64 = u64::MAX;

impl Default for Trace {
    fn default() -> Self {
        Self {
            start: AtomicU64::new(UNSET),
            stop: AtomicU64::new(UNSET),
            fence: AtomicU64::new(UNSET),
            read: AtomicU64::new(UNSET),
        }
    }
}

impl Trace {
    fn started(&self, fence: Option<u64>) {
        self.start.store(monotonic_ns(), Ordering::SeqCst);
        self.fence.store(fence.unwrap_or(UNSET), Ordering::SeqCst);
    }

    fn call(
        &self,
        worker: u32,
        caller: Caller,
        seq: u64,
        key: &str,
        called: u64,
        result: Result<bool, LockError>,
    ) -> Call {
        let set = |value: &AtomicU64| Some(value.load(Ordering::SeqCst)).filter(|v| *v != UNSET);
        let outcome = match result {
            Ok(true) => Outcome::Applied,
            Ok(false) => Outcome::Rejected,
            Err(LockError::Busy { .. }) => Outcome::Busy,
            Err(LockError::Lost { .. }) => Outcome::Lost,
            Err(LockError::RenewalsExhausted { .. }) => Outcome::Exhausted,
            Err(LockError::Redis { .. }) => Outcome::Redis,
            Err(LockError::NoQuorum { .. }) => Outcome::NoQuorum,
            Err(_) => Outcome::Other,
        };
        Call {
            worker,
            caller,
            seq,
            key: format!("safety:{key}"),
            fence: set(&self.fence),
            called,
            body: set(&self.start).zip(set(&self.stop)),
            returned: monotonic_ns(),
            read: set(&self.read),
            outcome,
        }
    }
}

/// Marks the end of a body, whether it finished or was cancelled at an `.await`.
struct StopOnDrop<'a>(&'a Trace);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop.store(monotonic_ns(), Ordering::SeqCst);
    }
}
