//! What inspection costs Redis: `list` runs a script only for keys that may be locks, never for
//! the unrelated keys it scans past (strings, hashes, lists of the application), on one Redis
//! and across a cluster's masters.

mod common;

use std::time::Duration;

use common::{command_calls, fast_client, opts};
use lockmacro_runtime::{LockClient, LockInfo};
use testkit::{RedisCluster, RedisServer};

/// Takes `exclusive` exclusive locks and `read` read locks under `locks:`, and returns the
/// leases (held until dropped).
async fn take_locks(
    locks: &LockClient,
    exclusive: usize,
    read: usize,
) -> Vec<lockmacro_runtime::Lease> {
    let mut held = Vec::new();
    for i in 0..exclusive {
        held.push(
            locks
                .acquire(format!("locks:{i}"), opts(60_000))
                .await
                .unwrap(),
        );
    }
    for i in 0..read {
        let key = format!("locks:read:{i}");
        held.push(locks.acquire(key, opts(60_000).read()).await.unwrap());
    }
    held
}

/// The application's own keys, each written with `write` (a command on the server that owns
/// it): plain strings (one the size of a small file), hashes, lists, and a string that looks
/// like a token but never expires (a look decides it is no lock).
fn unrelated(write: impl Fn(&str, &[&str])) -> usize {
    let mut written = 0;
    for i in 0..150 {
        write(&format!("app:user:{i}"), &["SET", "", "alice"]);
        written += 1;
    }
    write("app:blob", &["SET", "", &"x".repeat(100_000)]);
    for i in 0..30 {
        write(&format!("app:profile:{i}"), &["HSET", "", "name", "bob"]);
        write(&format!("app:queue:{i}"), &["RPUSH", "", "job"]);
        written += 2;
    }
    write("app:token-like", &["SET", "", &format!("{:032x}", 42u128)]);
    written + 2
}

/// `command` with the key in its second place.
fn with_key<'a>(command: &[&'a str], key: &'a str) -> Vec<&'a str> {
    let mut args = command.to_vec();
    args[1] = key;
    args
}

async fn listed(locks: &LockClient) -> Vec<LockInfo> {
    locks.list("").try_collect().await.unwrap()
}

/// Regression: every scanned key got the inspect script (2.2 M script calls for 5 listings of
/// 400 000 keys); now only the locks and the one token-like string do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_one_redis_runs_scripts_only_for_keys_that_may_be_locks() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let _held = take_locks(&locks, 40, 10).await;
    let others = unrelated(|key, command| {
        server.command(&with_key(command, key));
    });
    let scripts_before = command_calls(&server, "evalsha");
    let found = listed(&locks).await;
    let scripts = command_calls(&server, "evalsha") - scripts_before;
    assert_eq!(found.len(), 50, "every lock, and nothing else");
    assert_eq!(
        scripts,
        51,
        "a look per lock, and one for the token-like string; none for the other {} keys",
        others - 1
    );
}

/// The same across a cluster: each master's keys are sorted out on that master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listing_a_cluster_runs_scripts_only_for_keys_that_may_be_locks() {
    let cluster = RedisCluster::start(3, 0);
    let locks = LockClient::cluster_builder(cluster.seed_urls())
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let _held = take_locks(&locks, 40, 10).await;
    unrelated(|key, command| {
        cluster.master_of(key).command(&with_key(command, key));
    });
    let scripts = || -> u64 {
        cluster
            .masters()
            .iter()
            .map(|master| command_calls(master, "evalsha"))
            .sum()
    };
    let scripts_before = scripts();
    let found = listed(&locks).await;
    assert_eq!(found.len(), 50, "every lock, and nothing else");
    assert_eq!(scripts() - scripts_before, 51);
}
