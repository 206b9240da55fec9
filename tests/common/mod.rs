//! Helpers shared by the behaviour tests.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockOptions};
use redis::AsyncCommands;
use testkit::RedisServer;

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

// ---- Fault, load and abuse helpers (tests/faults.rs, tests/abuse.rs, tests/tls_acl.rs) ----

/// `CLOCK_MONOTONIC` in nanoseconds: the one clock the test and its worker processes share, so
/// intervals recorded in different processes can be compared for overlap.
pub fn monotonic_ns() -> u128 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u128 * 1_000_000_000 + now.tv_nsec as u128
}

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
    let channel = format!("lockmacro:released:{key}");
    eventually(Duration::from_secs(5), "a waiter subscribed", || async {
        let mut conn = server.connection().await;
        let (_, listeners): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut conn)
            .await
            .expect("PUBSUB NUMSUB");
        listeners > 0
    })
    .await;
}
