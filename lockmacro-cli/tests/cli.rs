//! The built `lockmacro` binary against real redis-server processes of every deployment (one
//! Redis, Sentinel, Cluster, Redlock, TLS with a private root), with locks taken by the library.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};
use testkit::{RedisCluster, RedisSentinel, RedisServer, TlsCertificates, tls_server};

fn lockmacro(urls: &[String], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_lockmacro"));
    for url in urls {
        command.arg("--url").arg(url);
    }
    command
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .output()
        .expect("run lockmacro")
}

fn one(url: impl Into<String>) -> Vec<String> {
    vec![url.into()]
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Exit 1 (not held) with one line on stderr that contains `what`.
fn assert_fails_with(output: &Output, what: &str) {
    assert_exits(output, 1, what);
}

/// Exit `status` with one line on stderr that contains `what`.
fn assert_exits(output: &Output, status: i32, what: &str) {
    assert_eq!(output.status.code(), Some(status), "{}", stderr(output));
    assert!(stderr(output).contains(what), "{}", stderr(output));
    assert_eq!(
        stderr(output).trim().lines().count(),
        1,
        "{}",
        stderr(output)
    );
}

fn json(output: &Output) -> serde_json::Value {
    assert!(output.status.success(), "{}", stderr(output));
    serde_json::from_str(&stdout(output)).unwrap_or_else(|e| panic!("{e}: {}", stdout(output)))
}

fn listed_keys(output: &Output) -> Vec<String> {
    let mut keys: Vec<String> = json(output)
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["key"].as_str().unwrap().to_owned())
        .collect();
    keys.sort();
    keys
}

async fn built(builder: lockmacro_runtime::LockClientBuilder) -> LockClient {
    builder
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap()
}

fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(ttl_ms))
}

/// Waits until a client subscribes to `key`'s release announcements on `server`.
async fn waiter_subscribed(server: &RedisServer, key: &str) {
    let channel = lockmacro_runtime::protocol::Names::default().release_channel(key);
    for _ in 0..1000 {
        if let redis::Value::Array(reply) = server.command(&["PUBSUB", "NUMSUB", &channel])
            && reply.get(1) == Some(&redis::Value::Int(1))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("nobody subscribed to {channel}");
}

/// A running `lockmacro watch`, its stdout and stderr lines on channels.
struct Watching {
    child: Child,
    lines: mpsc::Receiver<String>,
    notices: mpsc::Receiver<String>,
}

impl Watching {
    /// `lockmacro watch KEY --json`, once its banner says the watch has begun.
    fn start(urls: &[String], options: &[&str], key: &str) -> Self {
        Self::start_printing(urls, options, &[key, "--json"])
    }

    /// `lockmacro watch` with `args`, once its banner says the watch has begun.
    fn start_printing(urls: &[String], options: &[&str], args: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lockmacro"));
        for url in urls {
            command.arg("--url").arg(url);
        }
        let mut child = command
            .args(options)
            .arg("watch")
            .args(args)
            .env_remove("REDIS_URL")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = lines_of(child.stdout.take().unwrap());
        let notices = lines_of(child.stderr.take().unwrap());
        let banner = notices
            .recv_timeout(Duration::from_secs(10))
            .expect("a banner within 10 s");
        assert!(banner.contains("watching"), "{banner}");
        Self {
            child,
            lines,
            notices,
        }
    }

    /// The next line on stdout.
    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a line within 10 s")
    }

    /// The next line on stdout, read as JSON.
    fn next_json(&self) -> serde_json::Value {
        let line = self.next_line();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// The next event: `acquired` with its hint, or `released`.
    fn next(&self) -> (String, Option<String>) {
        let line = self.next_json();
        (
            line["event"].as_str().unwrap().to_owned(),
            line["token_hint"].as_str().map(str::to_owned),
        )
    }

    fn nothing_for(&self, quiet: Duration) {
        if let Ok(line) = self.lines.recv_timeout(quiet) {
            panic!("unexpected event {line}");
        }
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Each line `from` prints, on a channel.
fn lines_of(from: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (lines_tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    lines
}

fn acquired(token: &str) -> (String, Option<String>) {
    ("acquired".to_owned(), Some(token[..4].to_owned()))
}

fn freed() -> (String, Option<String>) {
    ("released".to_owned(), None)
}

/// Regression: any string key was shown as an exclusive lock (a plain `hello`, the library's
/// own fencing counter); `*` in a prefix was a glob.
#[tokio::test]
async fn list_shows_locks_only_never_plain_keys_or_internal_names() {
    let server = RedisServer::start();
    let url = one(server.url());
    let locks = built(LockClient::builder(&server.url())).await;
    let _a = locks
        .acquire("orders:1", opts(30_000).fencing(true))
        .await
        .unwrap();
    let _b = locks
        .acquire("orders:2", opts(30_000).read())
        .await
        .unwrap();
    let _c = locks.acquire("ord*rs:3", opts(30_000)).await.unwrap();
    let _d = locks.acquire("ordXrs:4", opts(30_000)).await.unwrap();
    server.command(&["SET", "orders:plain", "hello", "PX", "60000"]);
    server.command(&["HSET", "orders:hash", "field", "1"]);

    let keys = listed_keys(&lockmacro(&url, &["list", "--json"]));
    assert_eq!(keys, ["ord*rs:3", "ordXrs:4", "orders:1", "orders:2"]);
    for row in json(&lockmacro(&url, &["list", "--json"]))
        .as_array()
        .unwrap()
    {
        let ttl = row["ttl_ms"].as_u64().unwrap();
        assert!(ttl > 20_000 && ttl <= 30_000, "{row}");
    }
    let keys = listed_keys(&lockmacro(&url, &["list", "--prefix", "ord*rs", "--json"]));
    assert_eq!(keys, ["ord*rs:3"]);

    let table = lockmacro(&url, &["list", "--prefix", "orders"]);
    assert!(stdout(&table).contains("orders:2"), "{}", stdout(&table));
    assert!(stdout(&table).contains("read"), "{}", stdout(&table));
    assert!(!stdout(&table).contains("plain"), "{}", stdout(&table));

    let empty = lockmacro(&url, &["list", "--prefix", "nothing", "--json"]);
    assert!(empty.status.success());
    assert_eq!(stdout(&empty).trim(), "[]");
    let empty = lockmacro(&url, &["list", "--prefix", "nothing"]);
    assert!(empty.status.success());

    let plain = lockmacro(&url, &["inspect", "orders:plain"]);
    assert_fails_with(&plain, "not held");
    let counter = lockmacro_runtime::protocol::Names::default().fencing_counter("orders:1");
    let fence = lockmacro(&url, &["inspect", &counter]);
    assert_fails_with(&fence, "not held");
}

#[tokio::test]
async fn list_walks_a_hundred_thousand_keys() {
    let server = RedisServer::start();
    server.command(&[
        "EVAL",
        "for i = 1, 100000 do redis.call('SET', 'bulk:' .. i, string.format('%032x', i), 'PX', 600000) end \
         for i = 1, 1000 do redis.call('SET', 'other:' .. i, 'x') end return 1",
        "0",
    ]);
    let listed = lockmacro(&one(server.url()), &["list", "--prefix", "bulk", "--json"]);
    assert_eq!(json(&listed).as_array().unwrap().len(), 100_000);
}

#[tokio::test]
async fn inspect_masks_the_token_and_shows_time_left_fencing_and_waiters() {
    let server = RedisServer::start();
    let url = one(server.url());
    let locks = built(LockClient::builder(&server.url()).app_name("report-builder")).await;
    let held = locks
        .acquire("reports:7", opts(30_000).fencing(true))
        .await
        .unwrap();
    let fence = held.fencing_token().unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked(
                    "reports:7",
                    opts(1000).wait(Duration::from_secs(20)),
                    async {},
                )
                .await
        }
    });
    waiter_subscribed(&server, "reports:7").await;
    // The waiter is counted from its first look once subscribed.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while locks.inspect("reports:7").await.unwrap().unwrap().waiters() != 1 {
        assert!(std::time::Instant::now() < deadline, "the waiter counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let shown = lockmacro(&url, &["inspect", "reports:7"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(text.contains(&format!("{}…", &held.token()[..4])), "{text}");
    assert!(
        !text.contains(&held.token()[..5]),
        "more than 4 characters: {text}"
    );
    assert!(text.contains("exclusive"), "{text}");
    assert!(text.contains("time left:"), "{text}");
    assert!(text.contains(&format!("fencing:    {fence}")), "{text}");
    assert!(text.contains("waiters:    1"), "{text}");
    let who = format!("report-builder (pid {}) on ", std::process::id());
    assert!(text.contains(&who), "who holds it: {text}");
    assert!(text.contains("acquired:   "), "since when: {text}");

    let object = json(&lockmacro(&url, &["inspect", "reports:7", "--json"]));
    assert_eq!(object["key"], "reports:7");
    assert_eq!(object["kind"], "exclusive");
    assert_eq!(object["fencing_token"], fence);
    assert_eq!(object["waiters"], 1);
    assert_eq!(object["holders"][0]["token_hint"], &held.token()[..4]);
    assert_eq!(object["holders"][0]["app"], "report-builder");
    assert_eq!(object["holders"][0]["pid"], std::process::id());
    assert!(object["holders"][0]["host"].is_string(), "{object}");
    assert!(object["holders"][0]["acquired_at_ms"].is_u64(), "{object}");

    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    // Regression: a free key was exit 0; scripts could not tell held from free.
    assert_fails_with(&lockmacro(&url, &["inspect", "reports:7"]), "not held");
}

/// Regression: releasing a key nobody holds was exit 0.
#[tokio::test]
async fn forced_release_wakes_the_waiter_and_the_holder_learns_it_lost() {
    let server = RedisServer::start();
    let url = one(server.url());
    let locks = built(LockClient::builder(&server.url())).await;
    let held = locks
        .acquire("jobs:1", opts(3_000).unlimited_renewals())
        .await
        .unwrap();

    assert_exits(&lockmacro(&url, &["release", "jobs:1"]), 2, "--force");

    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let started = tokio::time::Instant::now();
            locks
                .run_locked("jobs:1", opts(1000).wait(Duration::from_secs(60)), async {})
                .await
                .map(|()| started.elapsed())
        }
    });
    waiter_subscribed(&server, "jobs:1").await;
    let released = lockmacro(&url, &["release", "jobs:1", "--force", "--yes"]);
    assert!(released.status.success(), "{}", stderr(&released));
    let waited = waiter.await.unwrap().unwrap();
    assert!(
        waited < Duration::from_secs(10),
        "woken by the announcement: {waited:?}"
    );
    let outcome = held.run(std::future::pending::<()>()).await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );

    assert_fails_with(
        &lockmacro(&url, &["release", "jobs:1", "--force", "--yes"]),
        "not held",
    );
    server.command(&["RPUSH", "queue:1", "a"]);
    assert_fails_with(
        &lockmacro(&url, &["release", "queue:1", "--force", "--yes"]),
        "not held",
    );
    assert_eq!(server.command(&["LLEN", "queue:1"]), redis::Value::Int(1));
}

#[tokio::test]
async fn bad_urls_unreachable_servers_and_tls_on_a_plain_port_are_one_line_errors() {
    // Regression (issue 51): each said only "cannot use `<malformed url>`: Redis URL did not
    // parse - InvalidClientConfig". Now the URL (password redacted), what is wrong, what to write.
    for (url, said) in [
        (
            "127.0.0.1:6501",
            "cannot use `127.0.0.1:6501`: missing scheme: write redis://127.0.0.1:6501",
        ),
        (
            "http://:hunter2@nowhere",
            "cannot use `http://:***@nowhere`: unknown scheme `http://`: write redis://",
        ),
        (
            "redis://:hunter2@127.0.0.1:65536",
            "cannot use `redis://:***@127.0.0.1:65536`: invalid port number",
        ),
    ] {
        let bad = lockmacro(&one(url), &["list"]);
        assert_exits(&bad, 2, said);
        assert!(!stderr(&bad).contains("hunter2"), "{}", stderr(&bad));
    }

    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let down = lockmacro(&one(format!("redis://127.0.0.1:{port}")), &["list"]);
    assert_exits(&down, 3, &format!("127.0.0.1:{port}"));

    // Regression: `rediss://` against a plaintext port said only `timed out`.
    let server = RedisServer::start();
    let plain = lockmacro(
        &one(format!("rediss://127.0.0.1:{}/#insecure", server.port())),
        &["list"],
    );
    assert_exits(&plain, 3, "TLS");

    // `--url` after the subcommand, and `REDIS_URL`, too.
    let after = Command::new(env!("CARGO_BIN_EXE_lockmacro"))
        .args(["list", "--url", &server.url(), "--json"])
        .env_remove("REDIS_URL")
        .output()
        .unwrap();
    assert!(after.status.success(), "{}", stderr(&after));
    let from_env = Command::new(env!("CARGO_BIN_EXE_lockmacro"))
        .args(["list", "--json"])
        .env("REDIS_URL", server.url())
        .output()
        .unwrap();
    assert!(from_env.status.success(), "{}", stderr(&from_env));
}

/// Regression: `watch` printed a false "released … acquired" pair when a waiter arrived (it
/// compared raw values, and waiters mark the key), and missed a hold between two polls (now
/// releases are heard as they are announced, and each holder's token is compared).
#[tokio::test]
async fn watch_ignores_waiters_and_reports_each_holder_in_turn() {
    let server = RedisServer::start();
    let url = one(server.url());
    let locks = built(LockClient::builder(&server.url())).await;
    let others = built(LockClient::builder(&server.url())).await;
    let watching = Watching::start(&url, &[], "watched:1");

    let first = locks.acquire("watched:1", opts(30_000)).await.unwrap();
    assert_eq!(watching.next(), acquired(first.token()));
    let (second_tx, second) = tokio::sync::oneshot::channel();
    let (seen_tx, seen) = tokio::sync::oneshot::channel::<()>();
    let waiter = tokio::spawn(async move {
        others
            .run_locked(
                "watched:1",
                opts(30_000).wait(Duration::from_secs(20)),
                async move {
                    let token = LockContext::current().unwrap().token().to_owned();
                    second_tx.send(token).unwrap();
                    let _ = seen.await;
                },
            )
            .await
    });
    waiter_subscribed(&server, "watched:1").await;
    watching.nothing_for(Duration::from_millis(600));
    first.release().await.unwrap();
    assert_eq!(watching.next(), freed());
    let second = second.await.unwrap();
    assert_eq!(watching.next(), acquired(&second), "the next holder");
    seen_tx.send(()).unwrap();
    waiter.await.unwrap().unwrap();
    assert_eq!(watching.next(), freed());

    let forced = locks.acquire("watched:1", opts(30_000)).await.unwrap();
    assert_eq!(watching.next(), acquired(forced.token()));
    let released_now = lockmacro(&url, &["release", "watched:1", "--force", "--yes"]);
    assert!(released_now.status.success(), "{}", stderr(&released_now));
    assert_eq!(watching.next(), freed());
}

/// Regression: on a cluster node without `--cluster`, `list` said `no locks held` while a lock
/// was held on another master, and `inspect` printed a raw `MOVED` pipeline failure.
#[tokio::test]
async fn a_cluster_is_listed_across_every_master_and_a_node_alone_gets_a_hint() {
    let cluster = RedisCluster::start(3, 0);
    let seeds: Vec<String> = cluster.masters().iter().map(|node| node.url()).collect();
    let locks = built(LockClient::cluster_builder(&seeds)).await;
    let keys: Vec<String> = (0..12).map(|i| format!("spread:{i}")).collect();
    let mut held = Vec::new();
    for key in &keys {
        held.push(
            locks
                .acquire(key.as_str(), opts(30_000).fencing(true))
                .await
                .unwrap(),
        );
    }
    let seed = one(seeds[0].clone());
    let listed = listed_keys(&lockmacro(&seed, &["--cluster", "list", "--json"]));
    let mut expected = keys.clone();
    expected.sort();
    assert_eq!(listed, expected);

    let shown = lockmacro(&seed, &["--cluster", "inspect", "spread:5"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let fence = held[5].fencing_token().unwrap();
    assert!(
        stdout(&shown).contains(&format!("fencing:    {fence}")),
        "{}",
        stdout(&shown)
    );

    for command in [
        &["list"][..],
        &["inspect", "spread:5"],
        &["inspect", "spread:6"],
    ] {
        let alone = lockmacro(&seed, command);
        assert_exits(&alone, 2, "Redis Cluster node");
        assert!(stderr(&alone).contains("`--cluster`"), "{}", stderr(&alone));
    }

    let watching = Watching::start(&seed, &["--cluster"], "spread:5");
    assert_eq!(watching.next(), acquired(held[5].token()));
    let released = lockmacro(
        &seed,
        &["--cluster", "release", "spread:5", "--force", "--yes"],
    );
    assert!(released.status.success(), "{}", stderr(&released));
    assert_eq!(watching.next(), freed());
    let outcome = held.remove(5).run(std::future::pending::<()>()).await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
}

/// Regression: with three Redlock `--url`s each lock was listed three times, and `inspect`
/// showed the first master that held the key rather than the quorum's view.
#[tokio::test]
async fn a_redlock_quorum_lists_each_lock_once_as_the_majority_sees_it() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let locks = built(LockClient::redlock_builder(&urls)).await;
    let _a = locks.acquire("quorum:1", opts(30_000)).await.unwrap();
    let _b = locks.acquire("quorum:2", opts(30_000)).await.unwrap();
    // Held by another token on one master only: no lock in the quorum's view.
    let stray = format!("{:032x}", 7u128);
    servers[0].command(&["SET", "quorum:3", &stray, "PX", "60000"]);

    let listed = listed_keys(&lockmacro(&urls, &["list", "--json"]));
    assert_eq!(listed, ["quorum:1", "quorum:2"]);
    assert_fails_with(&lockmacro(&urls, &["inspect", "quorum:3"]), "not held");
    let object = json(&lockmacro(&urls, &["inspect", "quorum:1", "--json"]));
    assert_eq!(object["holders"][0]["token_hint"], &_a.token()[..4]);

    let released = lockmacro(&urls, &["release", "quorum:1", "--force", "--yes"]);
    assert!(released.status.success(), "{}", stderr(&released));
    for server in &servers {
        assert_eq!(
            server.command(&["EXISTS", "quorum:1"]),
            redis::Value::Int(0)
        );
    }
}

/// Regression: Sentinel was looked up by hand (port 6379 by default, no master-role check);
/// now the runtime's own Sentinel client is used.
#[tokio::test]
async fn a_sentinel_url_reaches_the_master() {
    let sentinel = RedisSentinel::start();
    let url = one(sentinel.url());
    let locks = built(LockClient::builder(&sentinel.url())).await;
    let held = locks.acquire("guarded:1", opts(30_000)).await.unwrap();
    let listed = listed_keys(&lockmacro(&url, &["list", "--json"]));
    assert_eq!(listed, ["guarded:1"]);
    let object = json(&lockmacro(&url, &["inspect", "guarded:1", "--json"]));
    assert_eq!(object["holders"][0]["token_hint"], &held.token()[..4]);
    let released = lockmacro(&url, &["release", "guarded:1", "--force", "--yes"]);
    assert!(released.status.success(), "{}", stderr(&released));
    assert_fails_with(&lockmacro(&url, &["inspect", "guarded:1"]), "not held");
}

/// `rediss://` with a private root (`--tls-root`): verified, not skipped.
#[tokio::test]
async fn tls_with_a_private_root() {
    let certificates = TlsCertificates::make("IP:127.0.0.1");
    let (server, tls_port) = tls_server(&certificates);
    let locks = built(LockClient::builder(&server.url())).await;
    let held = locks.acquire("secure:1", opts(30_000)).await.unwrap();
    let url = one(format!("rediss://127.0.0.1:{tls_port}"));

    let untrusted = lockmacro(&url, &["inspect", "secure:1"]);
    assert_eq!(untrusted.status.code(), Some(3), "{}", stderr(&untrusted));
    let ca = certificates.path("ca.crt");
    let trusted = lockmacro(&url, &["--tls-root", &ca, "inspect", "secure:1", "--json"]);
    assert_eq!(
        json(&trusted)["holders"][0]["token_hint"],
        &held.token()[..4]
    );
}

/// Exit status 0 held, 1 not held, 2 usage, 3 Redis unreachable or unreadable, so a script can
/// tell free from broken (regression: free and unreachable were both 1); `--json` always prints
/// a value (regression: `inspect --json` of a free key printed nothing); `--help` says so.
#[tokio::test]
async fn exit_status_tells_held_free_usage_and_broken_apart() {
    let mut server = RedisServer::start();
    let url = one(server.url());
    let locks = built(LockClient::builder(&server.url())).await;
    let held = locks.acquire("status:1", opts(30_000)).await.unwrap();

    assert_eq!(
        lockmacro(&url, &["inspect", "status:1"]).status.code(),
        Some(0)
    );
    let free = lockmacro(&url, &["inspect", "status:2", "--json"]);
    assert_eq!(free.status.code(), Some(1), "{}", stderr(&free));
    assert_eq!(stdout(&free).trim(), "null");
    assert_exits(
        &lockmacro(&url, &["release", "status:2", "--force", "--yes"]),
        1,
        "not held",
    );
    assert_eq!(
        lockmacro(&url, &["release", "status:2"]).status.code(),
        Some(2),
        "no --force: usage"
    );
    let usage = lockmacro(&url, &["inspect"]);
    assert_eq!(usage.status.code(), Some(2), "clap's usage error");
    let list = lockmacro(&url, &["list", "--json"]);
    assert_eq!(list.status.code(), Some(0));
    assert_eq!(json(&list).as_array().unwrap().len(), 1);

    let help = lockmacro(&url, &["--help"]);
    for line in [
        "0  done",
        "1  not held",
        "2  usage",
        "3  error reaching or reading Redis",
    ] {
        assert!(stdout(&help).contains(line), "{}", stdout(&help));
    }

    drop(held);
    server.kill();
    for command in [
        &["inspect", "status:1"][..],
        &["inspect", "status:1", "--json"],
        &["list", "--json"],
        &["release", "status:1", "--force", "--yes"],
    ] {
        let broken = lockmacro(&url, command);
        assert_exits(&broken, 3, &format!("127.0.0.1:{}", server.port()));
        assert_ne!(
            stdout(&broken).trim(),
            "null",
            "{command:?}: an error is never `null`"
        );
    }
}

/// `health` over a Redlock quorum with one master down: every master with its answer, ready
/// (exit 0) while a majority answers, not ready (exit 1) without, 3 when none answers.
#[tokio::test]
async fn health_shows_every_redlock_master_and_is_ready_while_a_majority_answers() {
    let mut servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    servers[2].kill();
    let shown = lockmacro(&urls, &["health"]);
    eprintln!("{}", stdout(&shown));
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(
        text.starts_with("redlock: ready, 2 of 3 masters answer (2 needed)"),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "127.0.0.1:{}  master  no answer: cannot reach",
            servers[2].port()
        )),
        "{text}"
    );
    let object = json(&lockmacro(&urls, &["health", "--json"]));
    assert_eq!(object["ready"], true);
    assert_eq!(object["nodes"][2]["answers"], false);
    assert!(
        object["nodes"][0]["latency_ms"].as_f64().is_some(),
        "{object}"
    );

    servers[1].kill();
    assert_exits(&lockmacro(&urls, &["health"]), 1, "not ready");
    servers[0].kill();
    assert_exits(&lockmacro(&urls, &["health"]), 3, "no server answers");
}

/// `inspect` of a held lock on each deployment, as an operator sees it (printed for the record).
#[tokio::test]
async fn inspect_of_a_held_lock_on_each_deployment_names_its_holder() {
    let server = RedisServer::start();
    let sentinel = RedisSentinel::start();
    let cluster = RedisCluster::start(3, 0);
    let quorum: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let quorum_urls: Vec<String> = quorum.iter().map(RedisServer::url).collect();
    let deployments: Vec<(&str, LockClient, Vec<String>, Vec<&str>)> = vec![
        (
            "one Redis",
            built(LockClient::builder(&server.url())).await,
            one(server.url()),
            vec![],
        ),
        (
            "Sentinel",
            built(LockClient::builder(&sentinel.url())).await,
            one(sentinel.url()),
            vec![],
        ),
        (
            "Cluster",
            built(LockClient::cluster_builder(cluster.seed_urls())).await,
            one(cluster.seed_urls()[0].clone()),
            vec!["--cluster"],
        ),
        (
            "Redlock",
            built(LockClient::redlock_builder(&quorum_urls)).await,
            quorum_urls.clone(),
            vec![],
        ),
    ];
    for (name, locks, urls, flags) in deployments {
        let held = locks.acquire("orders:42", opts(30_000)).await.unwrap();
        let mut args = flags.clone();
        args.extend(["inspect", "orders:42"]);
        let shown = lockmacro(&urls, &args);
        assert_eq!(shown.status.code(), Some(0), "{name}: {}", stderr(&shown));
        let text = stdout(&shown);
        eprintln!("{name}: lockmacro {}\n{text}", args.join(" "));
        assert!(
            text.contains(&format!("{}…", &held.token()[..4])),
            "{name}: {text}"
        );
        // Who holds it: this test process, on this host, since a moment ago.
        assert!(
            text.contains(&format!("(pid {}) on ", std::process::id()))
                && text.contains("acquired:"),
            "{name}: the holder's identity: {text}"
        );
        let mut args = flags.clone();
        args.extend(["health"]);
        let health = lockmacro(&urls, &args);
        assert_eq!(health.status.code(), Some(0), "{name}: {}", stdout(&health));
    }
}

/// Regression (issue 51): a key holding `ESC [2J ESC [31m` went raw to the terminal through
/// `list`, `inspect`, `watch` and `release`, clearing the screen and recolouring it. Human output
/// shows control characters as escapes; JSON keeps the key exact.
#[tokio::test]
async fn keys_with_control_characters_are_shown_escaped_never_sent_to_the_terminal() {
    let server = RedisServer::start();
    let url = one(server.url());
    let locks = built(LockClient::builder(&server.url())).await;
    let key = "evil\u{1b}[2J\u{1b}[31m\u{9b}0m\u{202e}:1";
    let shown = "evil\\x1b[2J\\x1b[31m\\u{9b}0m\\u{202e}:1";
    let raw = |output: &str| {
        output
            .chars()
            .any(|c| c.is_control() && c != '\n' || c == '\u{202e}')
    };
    let watching = Watching::start_printing(&url, &[], &[key]);
    let held = locks.acquire(key, opts(30_000)).await.unwrap();

    let watched = watching.next_line();
    assert!(
        watched.contains(&format!("{shown}  acquired by ")),
        "{watched}"
    );
    let outputs = [
        lockmacro(&url, &["list"]),
        lockmacro(&url, &["inspect", key]),
        lockmacro(&url, &["release", key, "--force", "--yes"]),
        lockmacro(&url, &["inspect", key]),
    ];
    for output in &outputs {
        assert!(!raw(&stdout(output)), "{:?}", stdout(output));
        assert!(!raw(&stderr(output)), "{:?}", stderr(output));
    }
    let [listed, inspected, released, free] = &outputs;
    assert!(stdout(listed).contains(shown), "{}", stdout(listed));
    assert!(
        stdout(inspected).contains(&format!("key:        {shown}\n")),
        "{}",
        stdout(inspected)
    );
    assert!(
        stdout(released).starts_with(&format!("{shown}: released")),
        "{}",
        stdout(released)
    );
    assert_fails_with(free, &format!("`{shown}` is not held"));
    let watched = watching.next_line();
    assert!(
        watched.ends_with(&format!("{shown}  released")),
        "{watched}"
    );
    assert!(!raw(&watched), "{watched:?}");
    for notice in watching.notices.try_iter() {
        assert!(!raw(&notice), "{notice:?}");
    }
    drop(held);

    // JSON keeps the key exact, in escapes a terminal shows as text.
    let _again = locks.acquire(key, opts(30_000)).await.unwrap();
    let listed = lockmacro(&url, &["list", "--json"]);
    assert!(!raw(&stdout(&listed)), "{:?}", stdout(&listed));
    assert_eq!(listed_keys(&listed), [key]);
    let object = json(&lockmacro(&url, &["inspect", key, "--json"]));
    assert_eq!(object["key"], key);
}

/// Regression (issue 51): `release` said its holder gets `Lost` "at its next renewal", `--help`
/// "within a third of its ttl"; the holder hears the forced release and its work is cancelled
/// at once. Measured with a 60 s ttl, whose first renewal is 20 s away.
#[tokio::test]
async fn a_forced_release_stops_its_holder_within_a_second_as_it_says() {
    let server = RedisServer::start();
    let url = one(server.url());
    let locks = built(LockClient::builder(&server.url())).await;
    let held = locks.acquire("long:1", opts(60_000)).await.unwrap();
    let holder = tokio::spawn(async move {
        let outcome = held.run(std::future::pending::<()>()).await;
        (outcome, std::time::Instant::now())
    });

    let started = std::time::Instant::now();
    let released = lockmacro(&url, &["release", "long:1", "--force", "--yes"]);
    let returned = std::time::Instant::now();
    assert_eq!(
        stdout(&released),
        "long:1: released; its holder gets `Lost` within a second\n",
        "{}",
        stderr(&released)
    );
    let (outcome, lost_at) = tokio::time::timeout(Duration::from_secs(10), holder)
        .await
        .expect("the holder stopped long before its first renewal")
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
    eprintln!(
        "release took {:?}; the holder was stopped {:?} after it returned",
        returned - started,
        lost_at.saturating_duration_since(returned)
    );
    // Generous for two loaded cores; its next renewal would have been 20 s away.
    assert!(
        lost_at - started < Duration::from_secs(5),
        "stopped after {:?}",
        lost_at - started
    );

    let help = lockmacro(&url, &["release", "--help"]);
    assert!(
        stdout(&help).contains("cancelled with `Lost` within a second, whatever its ttl"),
        "{}",
        stdout(&help)
    );
}

/// stdout read as the one JSON value `--json` promises, whatever the exit status.
fn json_value(output: &Output) -> serde_json::Value {
    let text = stdout(output);
    assert_eq!(text.trim_end().lines().count(), 1, "one line: {text}");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `{"error": {"kind", "message"}}` on stdout, one line on stderr, and the exit status.
fn assert_json_error(output: &Output, status: i32, kind: &str, what: &str) {
    assert_exits(output, status, what);
    let error = &json_value(output)["error"];
    assert_eq!(error["kind"], kind, "{}", stdout(output));
    assert!(
        error["message"].as_str().unwrap().contains(what),
        "{}",
        stdout(output)
    );
}

/// Regression (issue 51): with Redis down, `list --json` and `inspect --json` printed nothing
/// on stdout, and `release` had no `--json`. Every command takes `--json` and prints one JSON
/// value in every case: its answer, or `{"error": {"kind", "message"}}`, with the same exit
/// status as without it.
#[tokio::test]
async fn json_is_one_value_for_every_command_and_every_outcome() {
    let mut server = RedisServer::start();
    let url = one(server.url());
    let locks = built(LockClient::builder(&server.url())).await;
    let _held = locks.acquire("json:1", opts(30_000)).await.unwrap();
    let _other = locks.acquire("json:2", opts(30_000)).await.unwrap();

    let list = lockmacro(&url, &["list", "--json"]);
    assert_eq!(json_value(&list).as_array().unwrap().len(), 2);
    let shown = lockmacro(&url, &["--json", "inspect", "json:1"]);
    assert_eq!(json_value(&shown)["key"], "json:1");
    let free = lockmacro(&url, &["inspect", "json:9", "--json"]);
    assert_eq!(free.status.code(), Some(1));
    assert_eq!(json_value(&free), serde_json::Value::Null);
    let released = lockmacro(&url, &["release", "json:2", "--force", "--yes", "--json"]);
    assert!(released.status.success(), "{}", stderr(&released));
    assert_eq!(
        json_value(&released),
        serde_json::json!({"key": "json:2", "released": true})
    );
    let again = lockmacro(&url, &["release", "json:2", "--force", "--yes", "--json"]);
    assert_exits(&again, 1, "not held");
    assert_eq!(
        json_value(&again),
        serde_json::json!({"key": "json:2", "released": false})
    );
    let health = lockmacro(&url, &["health", "--json"]);
    assert_eq!(json_value(&health)["ready"], true, "{}", stdout(&health));

    // Usage errors: refused by lockmacro, by clap, a URL it cannot use.
    let unforced = lockmacro(&url, &["release", "json:1", "--json"]);
    assert_json_error(&unforced, 2, "usage", "without --force");
    let no_key = lockmacro(&url, &["inspect", "--json"]);
    assert_eq!(no_key.status.code(), Some(2), "{}", stderr(&no_key));
    assert_eq!(json_value(&no_key)["error"]["kind"], "usage");
    let bad_url = lockmacro(&one("http://nowhere"), &["list", "--json"]);
    assert_json_error(&bad_url, 2, "usage", "http://nowhere");

    // Redis down: every command says so in JSON, exit 3.
    server.kill();
    let port = format!("127.0.0.1:{}", server.port());
    for command in [
        &["list", "--json"][..],
        &["inspect", "json:1", "--json"],
        &["release", "json:1", "--force", "--yes", "--json"],
        &["watch", "json:1", "--json"],
    ] {
        let down = lockmacro(&url, command);
        assert_json_error(&down, 3, "unavailable", &port);
    }
    let health = lockmacro(&url, &["health", "--json"]);
    assert_exits(&health, 3, "no server answers");
    assert_eq!(json_value(&health)["ready"], false, "{}", stdout(&health));

    // A password refused is no outage: someone must act.
    let guarded = RedisServer::start();
    guarded.command(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let wrong = lockmacro(
        &one(format!("redis://:wrong@127.0.0.1:{}", guarded.port())),
        &["list", "--json"],
    );
    assert_json_error(&wrong, 3, "refused", "authentication");
    assert!(!stdout(&wrong).contains("wrong"), "{}", stdout(&wrong));
}

/// A listing cut short by Redis going away ends its array with the error, so stdout is still
/// one JSON value (the locks listed before it, then `{"error": …}`), and exits 3.
#[tokio::test]
async fn a_json_listing_cut_short_ends_its_array_with_the_error() {
    use std::io::Read;
    let mut server = RedisServer::start();
    // Locks as an older version wrote them (a bare token): enough for a listing of seconds.
    server.command(&[
        "EVAL",
        "for i = 1, 50000 do redis.call('SET', 'many:' .. i, string.format('%032x', i), 'PX', 600000) end return 1",
        "0",
    ]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockmacro"))
        .args(["--url", &server.url(), "list", "--json"])
        .env_remove("REDIS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut printed = vec![0u8; 1];
    out.read_exact(&mut printed).unwrap();
    server.kill();
    out.read_to_end(&mut printed).unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(3));
    let text = String::from_utf8(printed).unwrap();
    let listed: serde_json::Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: …{}", &text[text.len() - 300..]));
    let listed = listed.as_array().unwrap();
    let (last, locks) = listed.split_last().unwrap();
    eprintln!("{} locks listed before the error", locks.len());
    assert!(!locks.is_empty() && locks.len() < 50_000, "{}", locks.len());
    assert!(locks.iter().all(|lock| lock["key"].is_string()));
    assert_eq!(last["error"]["kind"], "unavailable", "{last}");
}

/// Regression (issue 51): `watch` ended (status 3) when Redis restarted. It says Redis went
/// away, follows the lock again once Redis answers, and reports what it then finds.
#[tokio::test]
async fn watch_follows_the_lock_again_after_redis_restarts() {
    let mut server = RedisServer::start();
    let url = one(server.url());
    let watching = Watching::start(&url, &[], "restarted:1");
    let locks = built(LockClient::builder(&server.url())).await;
    let first = locks.acquire("restarted:1", opts(30_000)).await.unwrap();
    assert_eq!(watching.next(), acquired(first.token()));

    server.kill();
    let lost = watching.next_json();
    assert_eq!(lost["event"], "disconnected", "{lost}");
    assert_eq!(lost["error"]["kind"], "unavailable", "{lost}");
    server.restart();
    let back = watching.next_json();
    assert_eq!(back["event"], "reconnected", "{back}");
    // Nothing was persisted: the restart lost the key, and the watch finds it free.
    assert_eq!(watching.next(), freed());
    drop(first);
    let locks = built(LockClient::builder(&server.url())).await;
    let second = locks.acquire("restarted:1", opts(30_000)).await.unwrap();
    assert_eq!(watching.next(), acquired(second.token()));

    let notices: Vec<String> = watching.notices.try_iter().collect();
    assert!(
        notices[0].contains("lost Redis while watching `restarted:1`"),
        "{notices:?}"
    );
    assert!(
        notices[1].contains("Redis answers again; following `restarted:1`"),
        "{notices:?}"
    );
}

/// What waiting cannot mend ends a watch: its password refused after a reconnect, it exits 3
/// with the refusal, as `{"error": …}` under `--json`.
#[tokio::test]
async fn watch_ends_when_redis_refuses_its_password() {
    let server = RedisServer::start();
    server.command(&["ACL", "SETUSER", "ops", "on", ">right", "~*", "&*", "+@all"]);
    let url = one(format!("redis://ops:right@127.0.0.1:{}", server.port()));
    let mut watching = Watching::start(&url, &[], "guarded:1");
    server.command(&["ACL", "SETUSER", "ops", "resetpass", ">changed"]);
    server.command(&["CLIENT", "KILL", "USER", "ops"]);

    let ended = loop {
        let line = watching.next_json();
        if line.get("event").is_none() {
            break line;
        }
        assert_eq!(line["event"], "disconnected", "{line}");
    };
    assert_eq!(ended["error"]["kind"], "refused", "{ended}");
    let message = ended["error"]["message"].as_str().unwrap();
    assert!(message.contains("authentication"), "{message}");
    assert!(!message.contains("right"), "{message}");
    assert_eq!(watching.child.wait().unwrap().code(), Some(3));
}

/// A port that answers every connection as a web server would.
fn http_server() -> u16 {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    // Ends with the test's process (nextest runs each test in its own).
    std::thread::spawn(move || {
        for mut connection in listener.incoming().map_while(Result::ok) {
            let _ = connection.read(&mut [0u8; 1024]);
            let _ = connection.write_all(
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    port
}

/// Regression (issue 51): `health` said "the server does not answer" of a server that refused
/// the password and of a port that speaks HTTP. It says they refuse, and why; a server that is
/// down still "does not answer".
#[tokio::test]
async fn health_tells_a_refusal_from_a_server_that_does_not_answer() {
    let guarded = RedisServer::start();
    guarded.command(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let port = guarded.port();
    let http = http_server();
    for (url, why) in [
        (format!("redis://127.0.0.1:{port}"), "requires a password"),
        (
            format!("redis://:wrong@127.0.0.1:{port}"),
            "authentication to",
        ),
        (format!("redis://127.0.0.1:{http}"), "does not speak RESP"),
    ] {
        let shown = lockmacro(&one(&url), &["health"]);
        let address = url
            .rsplit_once('@')
            .map_or(&url[8..], |(_, address)| address);
        assert_exits(&shown, 3, "refused: ");
        assert!(stderr(&shown).contains(address), "{}", stderr(&shown));
        assert!(stderr(&shown).contains(why), "{}", stderr(&shown));
        let text = stdout(&shown);
        eprintln!("lockmacro --url {url} health\n{text}{}", stderr(&shown));
        assert!(
            text.starts_with("redis: NOT READY, the server refuses the connection\n"),
            "{text}"
        );
        assert!(
            text.contains("  server  refused: ") && text.contains(why),
            "{text}"
        );
        assert!(
            !text.contains("does not answer") && !text.contains("no answer"),
            "{text}"
        );
        let object = json_value(&lockmacro(&one(&url), &["health", "--json"]));
        assert_eq!(object["verdict"], "the server refuses the connection");
        assert_eq!(object["nodes"][0]["refused"], true, "{object}");
    }

    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let shown = lockmacro(&one(format!("redis://127.0.0.1:{down}")), &["health"]);
    assert_exits(&shown, 3, "no server answers: the server does not answer");
    assert!(
        stdout(&shown).contains("  server  no answer: cannot reach"),
        "{}",
        stdout(&shown)
    );

    // One Redlock master refusing, two answering: ready, the refusal on its line.
    let masters: Vec<RedisServer> = (0..2).map(|_| RedisServer::start()).collect();
    let mut urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    urls.push(format!("redis://127.0.0.1:{port}"));
    let shown = lockmacro(&urls, &["health"]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(
        text.starts_with("redlock: ready, 2 of 3 masters answer"),
        "{text}"
    );
    assert!(
        text.contains(&format!("127.0.0.1:{port}  master  refused: ")),
        "{text}"
    );
}
