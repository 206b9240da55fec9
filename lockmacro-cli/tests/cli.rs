//! The built `lockmacro` binary against real redis-server processes, with locks taken by the
//! library.

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};
use testkit::{RedisCluster, RedisServer};

fn lockmacro(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lockmacro"))
        .args(args)
        .env("REDIS_URL", url)
        .stdin(Stdio::null())
        .output()
        .expect("run lockmacro")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

async fn client(server: &RedisServer) -> LockClient {
    LockClient::builder(&server.url())
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap()
}

/// Waits until a client subscribes to `key`'s release announcements (a waiter found it busy).
async fn waiter_subscribed(server: &RedisServer, key: &str) {
    let channel = format!("lockmacro:released:{key}");
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

fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(ttl_ms))
}

#[tokio::test]
async fn list_shows_held_locks_but_not_internal_keys_and_escapes_glob_characters() {
    let server = RedisServer::start();
    let locks = client(&server).await;
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

    let listed = lockmacro(&server.url(), &["list", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&listed)).unwrap();
    let keys: Vec<&str> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["key"].as_str().unwrap())
        .collect();
    assert_eq!(
        keys,
        ["ord*rs:3", "ordXrs:4", "orders:1", "orders:2"],
        "no internal keys"
    );
    for row in rows.as_array().unwrap() {
        let ttl = row["ttl_ms"].as_i64().unwrap();
        assert!(ttl > 20_000 && ttl <= 30_000, "{row}");
    }

    // `*` in the prefix is a character, not a glob.
    let listed = lockmacro(&server.url(), &["list", "--prefix", "ord*rs", "--json"]);
    let rows: serde_json::Value = serde_json::from_str(&stdout(&listed)).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 1, "{rows}");
    assert_eq!(rows[0]["key"], "ord*rs:3");

    let table = lockmacro(&server.url(), &["list", "--prefix", "orders"]);
    assert!(stdout(&table).contains("orders:2"), "{}", stdout(&table));
    assert!(stdout(&table).contains("shared"), "{}", stdout(&table));

    let empty = lockmacro(&server.url(), &["list", "--prefix", "nothing", "--json"]);
    assert!(empty.status.success());
    assert_eq!(stdout(&empty).trim(), "[]");
}

#[tokio::test]
async fn list_walks_a_hundred_thousand_keys() {
    let server = RedisServer::start();
    server.command(&[
        "EVAL",
        "for i = 1, 100000 do redis.call('SET', 'bulk:' .. i, 'token' .. i, 'PX', 600000) end \
         for i = 1, 1000 do redis.call('SET', 'other:' .. i, 'x') end return 1",
        "0",
    ]);
    let listed = lockmacro(&server.url(), &["list", "--prefix", "bulk", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&listed)).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), 100_000);
}

#[tokio::test]
async fn inspect_masks_the_token_and_shows_time_left_fencing_and_waiters() {
    let server = RedisServer::start();
    let locks = client(&server).await;
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

    let shown = lockmacro(&server.url(), &["inspect", "reports:7"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = stdout(&shown);
    assert!(text.contains(&format!("{}…", &held.token()[..4])), "{text}");
    assert!(
        !text.contains(&held.token()[..5]),
        "more than 4 characters of the token: {text}"
    );
    assert!(text.contains("exclusive"), "{text}");
    assert!(text.contains("time left:"), "{text}");
    assert!(text.contains(&format!("fencing:    {fence}")), "{text}");
    assert!(text.contains("waiters:    1"), "{text}");

    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    let free = lockmacro(&server.url(), &["inspect", "reports:7"]);
    assert!(stdout(&free).contains("not held"), "{}", stdout(&free));
}

#[tokio::test]
async fn forced_release_wakes_the_waiter_and_the_holder_learns_it_lost() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let held = locks.acquire("jobs:1", opts(30_000)).await.unwrap();

    let refused = lockmacro(&server.url(), &["release", "jobs:1"]);
    assert!(!refused.status.success());
    assert!(stderr(&refused).contains("--force"), "{}", stderr(&refused));
    assert_eq!(stderr(&refused).trim().lines().count(), 1);

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
    let released = lockmacro(&server.url(), &["release", "jobs:1", "--force", "--yes"]);
    assert!(released.status.success(), "{}", stderr(&released));
    let waited = waiter.await.unwrap().unwrap();
    assert!(
        waited < Duration::from_secs(10),
        "woken by the announcement, not the 30 s lease: {waited:?}"
    );

    let outcome = held.run(std::future::pending::<()>()).await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_key_that_is_not_a_lock_bad_urls_and_unreachable_servers_are_one_line_errors() {
    let server = RedisServer::start();
    server.command(&["RPUSH", "queue:1", "a"]);
    let inspected = lockmacro(&server.url(), &["inspect", "queue:1"]);
    assert!(!inspected.status.success());
    assert!(
        stderr(&inspected).contains("is not a lock"),
        "{}",
        stderr(&inspected)
    );
    let released = lockmacro(&server.url(), &["release", "queue:1", "--force", "--yes"]);
    assert!(!released.status.success());
    assert!(
        stderr(&released).contains("is not a lock"),
        "{}",
        stderr(&released)
    );
    assert_eq!(server.command(&["LLEN", "queue:1"]), redis::Value::Int(1));

    let bad = lockmacro("http://:hunter2@nowhere", &["list"]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("invalid URL"), "{}", stderr(&bad));
    assert!(!stderr(&bad).contains("hunter2"), "{}", stderr(&bad));
    assert_eq!(stderr(&bad).trim().lines().count(), 1);

    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let down = lockmacro(&format!("redis://127.0.0.1:{port}"), &["list"]);
    assert!(!down.status.success());
    assert!(
        stderr(&down).contains(&format!("127.0.0.1:{port}")),
        "{}",
        stderr(&down)
    );
    assert_eq!(stderr(&down).trim().lines().count(), 1);

    // `--url` after the subcommand too.
    let after = Command::new(env!("CARGO_BIN_EXE_lockmacro"))
        .args(["list", "--url", &server.url(), "--json"])
        .output()
        .unwrap();
    assert!(after.status.success(), "{}", stderr(&after));
}

#[tokio::test]
async fn watch_prints_acquired_renewed_and_released() {
    let server = RedisServer::start();
    let locks = client(&server).await;
    let mut watching = Command::new(env!("CARGO_BIN_EXE_lockmacro"))
        .args(["watch", "watched:1", "--interval-ms", "20"])
        .env("REDIS_URL", server.url())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines_tx, lines) = mpsc::channel();
    let out = watching.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let next = |what: &str| loop {
        let line = lines
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("no `{what}` line"));
        if line.contains(what) {
            return line;
        }
    };
    next("watching");
    locks
        .run_locked("watched:1", opts(600), async {
            let token = LockContext::current().unwrap().token().to_owned();
            let acquired = next("acquired");
            assert!(acquired.contains(&token[..4]), "{acquired}");
            next("renewed");
        })
        .await
        .unwrap();
    next("released");
    watching.kill().unwrap();
    watching.wait().unwrap();
}

#[tokio::test]
async fn a_cluster_is_listed_and_inspected_across_every_master() {
    let cluster = RedisCluster::start(3, 0);
    let seeds: Vec<String> = cluster.masters().iter().map(|node| node.url()).collect();
    let locks = LockClient::cluster_builder(&seeds).build().await.unwrap();
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
    let listed = lockmacro(&seeds[0], &["--cluster", "list", "--json"]);
    assert!(listed.status.success(), "{}", stderr(&listed));
    let rows: serde_json::Value = serde_json::from_str(&stdout(&listed)).unwrap();
    assert_eq!(rows.as_array().unwrap().len(), keys.len(), "{rows}");

    let shown = lockmacro(&seeds[0], &["--cluster", "inspect", "spread:5"]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let fence = held[5].fencing_token().unwrap();
    assert!(
        stdout(&shown).contains(&format!("fencing:    {fence}")),
        "{}",
        stdout(&shown)
    );

    let released = lockmacro(
        &seeds[0],
        &["--cluster", "release", "spread:5", "--force", "--yes"],
    );
    assert!(released.status.success(), "{}", stderr(&released));
    let outcome = held.remove(5).run(std::future::pending::<()>()).await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
}
