//! Fencing tokens: strictly increasing per key across holders, and across a lost counter.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{fast_client, opts};
use lockmacro_runtime::LockContext;
use testkit::RedisServer;

#[tokio::test]
async fn fencing_tokens_strictly_increase_across_competing_tasks() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let options = opts(5_000).fencing(true).wait(Duration::from_secs(30));
    let last = Arc::new(Mutex::new(0u64));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (locks, last) = (locks.clone(), last.clone());
        tasks.spawn(async move {
            for _ in 0..63 {
                locks
                    .run_locked("fenced:1", options, async {
                        let fence = LockContext::current().unwrap().fencing_token().unwrap();
                        let mut last = last.lock().unwrap();
                        assert!(fence > *last, "fencing token {fence} after {}", *last);
                        *last = fence;
                    })
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }
}

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
