//! Fencing tokens keep increasing across a lost counter (strict increase across holders: the conformance suite).

mod common;

use std::time::Duration;

use common::{fast_client, opts};
use lockmacro_runtime::LockContext;
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
