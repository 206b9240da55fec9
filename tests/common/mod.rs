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
