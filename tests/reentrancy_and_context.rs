//! Nested locked calls on different keys take both; `LockContext` describes the lease (same-key reentrancy and other owners: the conformance suite).

mod common;

use std::time::Duration;

use common::{fast_client, get, opts};
use lockmacro_runtime::LockContext;
use testkit::RedisServer;

#[tokio::test]
async fn nested_calls_on_different_keys_take_both() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    locks
        .run_locked("account:a", opts(5_000), async {
            locks
                .run_locked("account:b", opts(5_000), async {
                    assert!(get(&server, "account:a").await.is_some());
                    assert!(get(&server, "account:b").await.is_some());
                    assert_eq!(LockContext::current().unwrap().key(), "account:b");
                })
                .await
                .unwrap();
            assert_eq!(
                get(&server, "account:b").await,
                None,
                "inner key released at its end"
            );
            assert!(
                get(&server, "account:a").await.is_some(),
                "outer key still held"
            );
        })
        .await
        .unwrap();
    assert_eq!(get(&server, "account:a").await, None);
}

#[tokio::test]
async fn lock_context_describes_the_lease_inside_and_is_absent_outside() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    assert!(LockContext::current().is_none());
    let kind = locks
        .run_locked("account:4", opts(600).read(), async {
            LockContext::current().unwrap().kind()
        })
        .await
        .unwrap();
    assert_eq!(kind, lockmacro_runtime::LockKind::Read);
    locks
        .run_locked("account:3", opts(600).max_renewals(5), async {
            let context = LockContext::current().unwrap();
            assert_eq!(context.key(), "account:3");
            assert_eq!(
                common::holder(&server, "account:3").await.as_deref(),
                Some(context.token())
            );
            assert_eq!(context.fencing_token(), None, "fencing is off by default");
            assert_eq!(context.kind(), lockmacro_runtime::LockKind::Exclusive);
            assert!(context.time_left() <= Duration::from_millis(600));
            assert_eq!(context.renewals(), 0);
            tokio::time::sleep(Duration::from_millis(450)).await;
            assert!(context.renewals() >= 1, "renewed once a third through");
        })
        .await
        .unwrap();
}
