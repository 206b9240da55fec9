//! Helpers shared by the behaviour tests.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockmacro_runtime::{Lease, LockClient, LockContext, LockError, LockOptions, protocol};
use redis::AsyncCommands;
use testkit::RedisServer;
use tokio::sync::oneshot;
use tracing_subscriber::fmt::MakeWriter;

/// A client with a fast scan, so renewal tests take a fraction of a second per lease.
pub async fn fast_client(server: &RedisServer) -> LockClient {
    LockClient::builder(&server.url())
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .expect("connect to the test redis-server")
}

pub fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(ttl_ms))
}

/// The value under `key`, read with a raw connection.
pub async fn get(server: &RedisServer, key: &str) -> Option<String> {
    let mut conn = server.connection().await;
    conn.get(key).await.expect("GET")
}

/// The token of the lock under `key` (its value's first field, marks left out), read with a
/// raw connection: what `LockContext::token` of its holder says.
pub async fn holder(server: &RedisServer, key: &str) -> Option<String> {
    get(server, key)
        .await
        .map(|value| protocol::holder_token(&value).to_owned())
        // A free key a watch follows holds the watch's mark alone: no holder.
        .filter(|token| !token.is_empty())
}

/// Waits until `check` holds, for events the library does not announce (a background release):
/// polls every 10 ms and fails the test after `within`.
pub async fn eventually<F, Fut>(within: Duration, what: &str, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        assert!(start.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until `key` is gone from Redis.
pub async fn key_gone(server: &RedisServer, key: &str, within: Duration) -> Duration {
    eventually(within, &format!("key `{key}` released"), || async {
        get(server, key).await.is_none()
    })
    .await
}

// ---- Fault, load and abuse helpers (tests/fault_*.rs, tests/soak.rs, tests/abuse.rs, tests/tls_acl.rs) ----

/// Sends the instant it is dropped: put it inside locked work to learn when the work was dropped.
pub struct DropClock(Option<std::sync::mpsc::Sender<Instant>>);

impl DropClock {
    /// The clock and the receiver that hears its drop.
    pub fn new() -> (Self, std::sync::mpsc::Receiver<Instant>) {
        let (tx, rx) = std::sync::mpsc::channel();
        (Self(Some(tx)), rx)
    }
}

impl Drop for DropClock {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(Instant::now());
        }
    }
}

/// Every key matching `pattern`, read with `SCAN` on a raw connection.
pub async fn scan_keys(server: &RedisServer, pattern: &str) -> Vec<String> {
    let mut conn = server.connection().await;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(1_000)
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        keys.extend(batch);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// The remaining lease of `key` in ms, as Redis sees it (`-2` when the key is gone).
pub async fn pttl(server: &RedisServer, key: &str) -> i64 {
    let mut conn = server.connection().await;
    conn.pttl(key).await.expect("PTTL")
}

/// How many client connections the server has open, not counting the one asking.
pub fn connected_clients(server: &RedisServer) -> usize {
    match server.command(&["CLIENT", "LIST"]) {
        redis::Value::BulkString(list) => String::from_utf8_lossy(&list).lines().count() - 1,
        redis::Value::VerbatimString { text, .. } => text.lines().count() - 1,
        other => panic!("CLIENT LIST answered {other:?}"),
    }
}

/// After a test: the client keeps no lease alive and Redis holds no key matching `pattern`
/// (releases run in the background, hence the bounded wait).
pub async fn assert_clean(server: &RedisServer, locks: &LockClient, pattern: &str) {
    eventually(Duration::from_secs(3), "no lease left", || async {
        locks.held_leases() == 0
    })
    .await;
    let give_up = Instant::now() + Duration::from_secs(3);
    loop {
        let left = scan_keys(server, pattern).await;
        if left.is_empty() {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "keys matching `{pattern}` left after 3 s: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The resident set size of this process in KiB (Linux `/proc/self/status`).
pub fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .expect("/proc/self/status")
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// Writes `value` to `data` through the fencing-checked storage; `true` when accepted.
pub async fn fenced_write(server: &RedisServer, data: &str, fence: u64, value: &str) -> bool {
    testkit::fenced_write(&mut server.connection().await, data, fence, value).await
}

/// A `lock_worker` child process whose stdout lines are read on a thread as they come, each
/// with the monotonic time it was read.
pub struct Worker {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Worker {
    /// Starts `lock_worker` with `args`.
    pub fn spawn(args: &[&str]) -> Self {
        use std::io::BufRead;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_lock_worker"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn lock_worker");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    /// The next line, waiting at most `within`; `None` once stdout closed.
    pub fn next_line(&self, within: Duration) -> Option<String> {
        match self.lines.recv_timeout(within) {
            Ok(line) => Some(line),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => None,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("lock_worker printed nothing within {within:?}")
            }
        }
    }

    /// Lines until one starts with `prefix` (returned), failing after `within`.
    pub fn line_starting(&self, prefix: &str, within: Duration) -> (Vec<String>, String) {
        let deadline = Instant::now() + within;
        let mut before = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self
                .next_line(left)
                .unwrap_or_else(|| panic!("lock_worker exited before `{prefix}`: {before:?}"));
            if line.starts_with(prefix) {
                return (before, line);
            }
            before.push(line);
        }
    }

    /// Sends `signal` to the worker.
    pub fn signal(&self, signal: libc::c_int) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("pid fits");
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our unreaped child.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal lock_worker");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until some client listens for releases of `key`: a waiter has found it busy and
/// subscribed, so from now on it sleeps on the announcement.
pub async fn waiter_subscribed(server: &RedisServer, key: &str) {
    waiter_subscribed_in(server, "lockmacro", key).await;
}

/// [`waiter_subscribed`] for a client whose namespace is `namespace`.
pub async fn waiter_subscribed_in(server: &RedisServer, namespace: &str, key: &str) {
    eventually(Duration::from_secs(5), "a waiter subscribed", || async {
        listeners_in(server, namespace, key).await > 0
    })
    .await;
}

/// How many connections listen for releases of `key` under `namespace`.
pub async fn listeners_in(server: &RedisServer, namespace: &str, key: &str) -> u64 {
    let channel = protocol::Names::new(namespace).release_channel(key);
    let mut conn = server.connection().await;
    let (_, listeners): (String, u64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channel)
        .query_async(&mut conn)
        .await
        .expect("PUBSUB NUMSUB");
    listeners
}

/// A client whose every wait is short, so faults surface as errors quickly.
pub async fn client_for(url: &str, scan_ms: u64, response_ms: u64) -> LockClient {
    LockClient::builder(url)
        .scan_interval(Duration::from_millis(scan_ms))
        .connect_timeout(Duration::from_millis(response_ms))
        .response_timeout(Duration::from_millis(response_ms))
        .build()
        .await
        .expect("client connects while the link is healthy")
}

/// Takes `key` with fail-fast attempts every 10 ms until it is ours; the first argument of the
/// answer is when the winning attempt was answered.
pub async fn acquire_when_free(
    locks: &LockClient,
    key: &str,
    options: LockOptions,
    within: Duration,
) -> (Instant, Lease) {
    let give_up = Instant::now() + within;
    loop {
        match locks.acquire(key, options).await {
            Ok(lease) => return (Instant::now(), lease),
            Err(LockError::Busy { .. } | LockError::Redis { .. }) if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(err) => panic!("`{key}` not acquired within {within:?}: {err:?}"),
        }
    }
}

/// Runs a holder on `key` whose work never ends on its own; answers once its lease has been
/// renewed at least once (so the deadline in force is a renewed one), with the receiver of the
/// instant its work is dropped and the call's handle.
pub async fn start_holder(
    locks: &LockClient,
    key: &str,
    options: LockOptions,
) -> (
    std::sync::mpsc::Receiver<Instant>,
    tokio::task::JoinHandle<Result<(), LockError>>,
) {
    let (clock, dropped) = DropClock::new();
    let (renewed_tx, renewed) = oneshot::channel();
    let holder = tokio::spawn({
        let (locks, key) = (locks.clone(), key.to_owned());
        async move {
            locks
                .run_locked(key, options, async move {
                    let _clock = clock;
                    let lock = LockContext::current().expect("inside locked work");
                    while lock.renewals() == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    renewed_tx.send(()).expect("test waits");
                    std::future::pending::<()>().await
                })
                .await
        }
    });
    tokio::time::timeout(Duration::from_secs(3), renewed)
        .await
        .expect("holder renewed within 3 s")
        .expect("holder running");
    (dropped, holder)
}

/// The instant the holder's work was dropped, waited for without blocking the runtime.
pub async fn dropped_at(dropped: std::sync::mpsc::Receiver<Instant>, within: Duration) -> Instant {
    tokio::task::spawn_blocking(move || dropped.recv_timeout(within))
        .await
        .expect("blocking wait")
        .unwrap_or_else(|_| panic!("the holder's work was not dropped within {within:?}"))
}

/// Retries taking `key` until it works (within `within`); returns how long that took and how
/// many attempts were answered `Busy`.
pub async fn retry_until_taken(locks: &LockClient, key: &str, within: Duration) -> (Duration, u32) {
    let busy = std::cell::Cell::new(0);
    let took = eventually(within, "the client takes the key again", || async {
        match locks.run_locked(key, opts(1_000), async {}).await {
            Ok(()) => true,
            Err(LockError::Busy { .. }) => {
                busy.set(busy.get() + 1);
                false
            }
            Err(_) => false,
        }
    })
    .await;
    (took, busy.get())
}

/// CPU time this process has used so far (user + system), from `getrusage`.
pub fn cpu_time() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes a complete `rusage` into the pointer it is given.
    let usage = unsafe {
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()), 0);
        usage.assume_init()
    };
    let of = |time: libc::timeval| {
        Duration::from_secs(time.tv_sec as u64) + Duration::from_micros(time.tv_usec as u64)
    };
    of(usage.ru_utime) + of(usage.ru_stime)
}

/// How many connections the server has accepted since it started (`INFO stats`).
pub fn connections_received(server: &RedisServer) -> u64 {
    info_field(server, "stats", "total_connections_received")
}

/// How many times the server ran `command` (`INFO commandstats`, e.g. `evalsha`, `script|load`).
pub fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let calls = format!("cmdstat_{command}:calls=");
    info(server, "commandstats")
        .lines()
        .find_map(|line| line.strip_prefix(&calls))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

fn info_field(server: &RedisServer, section: &str, field: &str) -> u64 {
    info(server, section)
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{field}` in INFO {section}"))
}

/// One section of `INFO`, as text.
fn info(server: &RedisServer, section: &str) -> String {
    match server.command(&["INFO", section]) {
        redis::Value::BulkString(info) => String::from_utf8_lossy(&info).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO {section} answered {other:?}"),
    }
}

/// Takes, renews, waits for and releases a lock over the client, checking Redis directly.
pub async fn lock_round_trip(locks: &LockClient, server: &RedisServer, namespace: &str, key: &str) {
    let renewals = locks
        // A 600 ms lease renewed over 1.4 s: a 150 ms one was lost once, unconfirmed, beside a
        // CPU hog (its renewals came too late), which tells nothing of TLS.
        .run_locked(key, opts(600).unlimited_renewals().fencing(true), async {
            let lock = LockContext::current().unwrap();
            assert_eq!(
                holder(server, key).await.as_deref(),
                Some(lock.token()),
                "the lock is in Redis"
            );
            tokio::time::sleep(Duration::from_millis(1_400)).await;
            lock.renewals()
        })
        .await
        .expect("lock over TLS");
    assert!(renewals >= 2, "{renewals}");
    // A waiter woken by the release announcement (the pub/sub connection uses TLS too).
    let held = locks.acquire(key, opts(30_000)).await.unwrap();
    let waiter = tokio::spawn({
        let (locks, key) = (locks.clone(), key.to_owned());
        async move {
            locks
                .run_locked(key, opts(1_000).wait(Duration::from_secs(5)), async {})
                .await
        }
    });
    waiter_subscribed_in(server, namespace, key).await;
    held.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), waiter)
        .await
        .expect("woken by the release, not the 30 s lease")
        .unwrap()
        .unwrap();
}

/// Log output kept in memory: what a test reads to see what was logged, or awaits to learn that
/// something happened.
#[derive(Clone, Default)]
pub struct Log(Arc<LogInner>);

#[derive(Default)]
pub struct LogInner {
    text: Mutex<Vec<u8>>,
    written: tokio::sync::Notify,
}

impl Log {
    /// Captures the events of this thread (a current-thread runtime's) up to `level`, until the
    /// guard drops.
    pub fn capture(level: tracing::Level) -> (Self, tracing::subscriber::DefaultGuard) {
        let log = Self::default();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_ansi(false)
            .with_writer(log.clone())
            .finish();
        (log, tracing::subscriber::set_default(subscriber))
    }

    /// Captures every event of this process at every level, from every thread (a client's own
    /// watchdog thread included), from the first call on. One per test binary: events of tests
    /// running beside it in the same process land here too, so look for ones that name a key.
    pub fn everywhere() -> Self {
        static LOG: std::sync::OnceLock<Log> = std::sync::OnceLock::new();
        LOG.get_or_init(|| {
            let log = Self::default();
            tracing_subscriber::fmt()
                .with_max_level(tracing::Level::TRACE)
                .with_ansi(false)
                .with_writer(log.clone())
                .try_init()
                .expect("no other global subscriber in this test binary");
            log
        })
        .clone()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.text.lock().unwrap()).into_owned()
    }

    pub fn count(&self, needle: &str) -> usize {
        self.text().matches(needle).count()
    }

    /// Waits (at most 5 s) until `needle` has been logged, woken by each write.
    pub async fn seen(&self, needle: &str) {
        self.seen_within(needle, Duration::from_secs(5)).await;
    }

    /// [`seen`](Self::seen), waiting at most `within`.
    pub async fn seen_within(&self, needle: &str, within: Duration) {
        let logged = async {
            loop {
                let written = self.0.written.notified();
                if self.count(needle) > 0 {
                    return;
                }
                written.await;
            }
        };
        tokio::time::timeout(within, logged)
            .await
            .unwrap_or_else(|_| {
                let text = self.text();
                let lines: Vec<&str> = text.lines().collect();
                let last = lines[lines.len().saturating_sub(40)..].join("\n");
                panic!("not logged within {within:?}: {needle}\nthe last lines logged:\n{last}")
            });
    }
}

impl Write for Log {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.text.lock().unwrap().extend_from_slice(bytes);
        self.0.written.notify_waiters();
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Log {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Runs `test` on generated values of `strategy`, each told its case's number (from 1): `cases`
/// of them, or `PROPTEST_CASES` from the environment when set (a deeper run by hand). A failure
/// is shrunk at most `shrink` times (each step runs a case against real servers), not persisted,
/// and panics naming `what`. Returns how many cases ran.
pub fn run_generated<S: proptest::strategy::Strategy>(
    what: &str,
    cases: u32,
    shrink: u32,
    strategy: &S,
    test: impl Fn(u64, S::Value) -> Result<(), proptest::test_runner::TestCaseError>,
) -> u64 {
    use proptest::test_runner::{Config, TestRunner};
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(cases);
    let mut runner = TestRunner::new(Config {
        cases,
        max_shrink_iters: shrink,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u64);
    let outcome = runner.run(strategy, |value| {
        case.set(case.get() + 1);
        test(case.get(), value)
    });
    if let Err(failure) = outcome {
        panic!("{what}: {failure} (after {} generated cases)", case.get());
    }
    case.get()
}

/// Three `lock_worker count` processes against `url`, sixteen tasks each taking the lock ten
/// times and incrementing `jepsen:counter` non-atomically inside it. Asserts that each exited
/// cleanly, every critical section came back and none overlapped another; the counter is the
/// caller's to check (it lives where `url` keeps its keys).
pub fn count_in_three_processes(url: &str) {
    let workers: Vec<_> = (0..3)
        .map(|_| {
            std::process::Command::new(env!("CARGO_BIN_EXE_lock_worker"))
                .args(["count", url, "jepsen", "16", "10"])
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut intervals = Vec::new();
    for worker in workers {
        let output = worker.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "worker failed: {:?}",
            output.status
        );
        for line in String::from_utf8(output.stdout).unwrap().lines() {
            let mut fields = line
                .split_whitespace()
                .skip(1)
                .map(|n| n.parse::<u128>().unwrap());
            intervals.push((fields.next().unwrap(), fields.next().unwrap()));
        }
    }
    assert_eq!(intervals.len(), 3 * 16 * 10);
    intervals.sort();
    let longest_overlap = intervals
        .windows(2)
        .map(|pair| pair[0].1.saturating_sub(pair[1].0))
        .max()
        .unwrap();
    assert_eq!(
        longest_overlap, 0,
        "critical sections overlapped by {longest_overlap} ns"
    );
}

/// `processes` `lock_worker turns` processes of `tasks` tasks each, taking turns on `keys` of
/// `target` for `run` (each body holding the lock 1 ms, each call waiting up to 10 s), all
/// starting at one instant: what their calls say ([`testkit::turns::Summary`]). Asserts that each
/// exited cleanly and that no two calls held the lock at once.
pub fn take_turns_in_processes(
    target: &testkit::turns::Target,
    keys: &[&str],
    processes: usize,
    tasks: usize,
    run: Duration,
) -> testkit::turns::Summary {
    use testkit::turns::{Plan, Summary, read_calls};
    let start_ns = testkit::monotonic_ns() + 2_000_000_000;
    let plan = Plan {
        target: target.clone(),
        keys: keys.iter().map(|key| (*key).to_owned()).collect(),
        tasks,
        hold: Duration::from_millis(1),
        wait: Duration::from_secs(10),
        ttl: Duration::from_secs(30),
        start_ns,
        run,
    };
    let workers: Vec<_> = (0..processes)
        .map(|_| {
            std::process::Command::new(env!("CARGO_BIN_EXE_lock_worker"))
                .arg("turns")
                .args(plan.args())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn lock_worker")
        })
        .collect();
    let calls: Vec<_> = workers
        .into_iter()
        .map(|worker| {
            let output = worker.wait_with_output().expect("lock_worker");
            assert!(
                output.status.success(),
                "worker failed: {:?}",
                output.status
            );
            read_calls(&String::from_utf8(output.stdout).expect("utf-8"))
        })
        .collect();
    let summary = Summary::of(&calls, start_ns + run.as_nanos() as u64);
    assert_eq!(
        summary.longest_overlap,
        Duration::ZERO,
        "two holders at once"
    );
    summary
}
