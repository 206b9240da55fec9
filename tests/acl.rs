//! ACL users confined to their key space.

mod common;

use std::time::Duration;

use common::{assert_clean, lock_round_trip, opts};
use lockmacro_runtime::{LockClient, LockError, protocol};
use testkit::RedisServer;

/// A password-protected ACL user allowed only the keys and channels `locks:*`, with the client's
/// namespace moved inside them (`locks:lm`, so fencing counters and release channels are
/// `locks:lm:…`), and only the commands the library sends, works on `locks:*` over every path; a
/// key outside is refused with the server's `NOPERM`, as a `Redis` error, never as `Busy`.
///
/// The grant below is the complete list the library needs (found by running this test):
/// connection set-up (`PING`, `AUTH`/`HELLO`, `SELECT` for a db; redis-rs also sends
/// `CLIENT SETINFO` on Redis ≥ 7.2 and ignores its refusal), `SET` and `EVALSHA`/`EVAL`/
/// `SCRIPT LOAD` for the scripts, which call `GET`, `MGET` (a release reads the lock's value and
/// its watch mark at once), `SET`, `APPEND` (a waiter marks a held key
/// so that its release is announced), `DEL`, `TYPE`, `PEXPIRE`, `PTTL`, `TIME`, `PUBLISH` and
/// `PUBSUB NUMSUB` (a hand-over to a waiter of the same client; without it, releases announce
/// instead), the hash commands of shared locks, the list commands of fair queues and the
/// sorted-set commands of waiting writers; and `SUBSCRIBE`/`UNSUBSCRIBE` for waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_user_confined_to_locks_works_there_and_gets_noperm_elsewhere() {
    let server = RedisServer::start();
    let granted = server.command(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">locker-pw",
        "resetkeys",
        "~locks:*",
        "resetchannels",
        "&locks:*",
        "-@all",
        "+ping",
        "+hello",
        "+auth",
        "+select",
        "+set",
        "+get",
        "+mget",
        "+del",
        "+pexpire",
        "+pttl",
        "+publish",
        "+subscribe",
        "+unsubscribe",
        "+evalsha",
        "+eval",
        "+script|load",
        "+time",
        "+type",
        "+hget",
        "+hset",
        "+hdel",
        "+hexists",
        "+hgetall",
        "+hlen",
        "+lindex",
        "+lpop",
        "+rpush",
        "+lrem",
        "+zadd",
        "+zrem",
        "+zremrangebyscore",
        "+zcard",
    ]);
    assert_eq!(granted, redis::Value::Okay);
    let url = format!("redis://locker:locker-pw@127.0.0.1:{}", server.port());
    let locks = LockClient::builder(&url)
        .scan_interval(Duration::from_millis(50))
        .namespace("locks:lm")
        .build()
        .await
        .expect("the confined user connects");
    lock_round_trip(&locks, &server, "locks:lm", "locks:acl").await;
    locks
        .run_locked("locks:plain", opts(1_000), async {})
        .await
        .unwrap();

    for options in [
        opts(1_000),
        opts(1_000).fencing(true),
        opts(1_000).wait(Duration::from_millis(200)),
    ] {
        let outcome = locks.run_locked("other:1", options, async {}).await;
        match outcome {
            Err(ref err @ LockError::Redis { ref key, .. }) => {
                assert_eq!(key.as_deref(), Some("other:1"));
                let shown = format!("{err} {:?}", std::error::Error::source(err));
                assert!(
                    shown.to_uppercase().contains("NOPERM"),
                    "{options:?}: {shown}"
                );
            }
            other => panic!("{options:?}: expected a NOPERM Redis error, got {other:?}"),
        }
    }
    assert_eq!(common::get(&server, "other:1").await, None);
    // The fencing counter outlives its locks, by design.
    server.command(&[
        "DEL",
        &protocol::Names::new("locks:lm").fencing_counter("locks:acl"),
    ]);
    assert_clean(&server, &locks, "locks:*").await;
}
