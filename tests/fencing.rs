//! Fencing tokens keep increasing across a lost counter (strict increase across holders: the conformance suite).

mod common;

use std::time::Duration;

use common::{fast_client, opts};
use lockmacro_runtime::{LockContext, protocol};
use testkit::RedisServer;

#[tokio::test]
async fn fencing_tokens_keep_increasing_after_redis_loses_the_counter() {
    let mut server = RedisServer::start();
    let locks = fast_client(&server).await;
    let options = opts(5_000).fencing(true);
    let fence = || async {
        locks
            .run_locked("fenced:2", options, async {
                LockContext::current().unwrap().fencing_token().unwrap()
            })
            .await
    };
    let before = fence().await.unwrap();
    server.restart(); // no persistence: the counter is gone
    common::eventually(Duration::from_secs(5), "lock after restart", || async {
        fence().await.is_ok()
    })
    .await;
    let restarted = fence().await.unwrap();
    assert!(restarted > before, "{restarted} after {before}");
}

/// A fencing counter expires (a day after its last use) instead of living forever, and a token
/// handed out after it expired is still above every earlier one.
#[tokio::test]
async fn fencing_counters_expire_and_tokens_keep_increasing_across_an_expired_one() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let options = opts(5_000).fencing(true);
    let fence = || async {
        locks
            .run_locked("fenced:3", options, async {
                LockContext::current().unwrap().fencing_token().unwrap()
            })
            .await
            .unwrap()
    };
    let first = fence().await;
    let counter = &protocol::Names::default().fencing_counter("fenced:3");
    let life = match server.command(&["PTTL", counter]) {
        redis::Value::Int(ms) => ms,
        other => panic!("PTTL {counter}: {other:?}"),
    };
    let day_ms = 24 * 60 * 60 * 1000;
    assert!(
        life > day_ms - 60_000 && life <= day_ms,
        "counter life {life} ms"
    );

    // Let it expire now, as a day of disuse would.
    server.command(&["PEXPIRE", counter, "1"]);
    common::eventually(Duration::from_secs(5), "the counter expired", || async {
        server.command(&["EXISTS", counter]) == redis::Value::Int(0)
    })
    .await;
    let after = fence().await;
    assert!(after > first, "{after} after {first}");
}
