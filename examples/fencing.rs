//! Fencing tokens: a storage that remembers the highest token it has seen rejects a stale
//! holder's late write — Kleppmann's answer to a holder paused past its lease.
//!
//! `REDIS_URL=redis://127.0.0.1:6379 cargo run --example fencing`

use std::time::Duration;

use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};

/// The "storage": accepts a write only with a fencing token at least as high as any seen.
/// KEYS[1] = the document, KEYS[2] = highest token seen; ARGV[1] = token, ARGV[2] = value.
const FENCED_WRITE: &str = r"
local seen = tonumber(redis.call('GET', KEYS[2]) or '0')
if tonumber(ARGV[1]) < seen then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1])
redis.call('SET', KEYS[1], ARGV[2])
return 1
";

async fn write(redis: &redis::Client, token: u64, value: &str) -> redis::RedisResult<bool> {
    let mut conn = redis.get_multiplexed_async_connection().await?;
    let accepted: i64 = redis::Script::new(FENCED_WRITE)
        .key("fencing-demo:document")
        .key("fencing-demo:highest-token")
        .arg(token)
        .arg(value)
        .invoke_async(&mut conn)
        .await?;
    Ok(accepted == 1)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let locks = LockClient::connect(&url).await?;
    let redis = redis::Client::open(url.as_str())?;
    let options = LockOptions::new()
        .ttl(Duration::from_millis(500))
        .max_renewals(0)
        .fencing(true);

    // A takes the lock, then stalls (a GC pause, a stopped VM) past its lease.
    let a = locks.acquire("fencing-demo:lock", options).await?;
    let a_token = a.fencing_token().expect("fencing is on");
    println!("A holds the lock with fencing token {a_token}, then stalls");
    tokio::time::sleep(Duration::from_millis(700)).await;

    // B takes the lapsed lock and writes with its newer token.
    let b_token = locks
        .run_locked("fencing-demo:lock", options, async {
            let token = LockContext::current()
                .expect("locked")
                .fencing_token()
                .expect("fenced");
            let accepted = write(&redis, token, "written by B").await?;
            println!("B holds the lock with fencing token {token}; its write accepted: {accepted}");
            Ok::<_, redis::RedisError>(token)
        })
        .await??;

    // A wakes up and writes as if it still held the lock: the storage rejects it.
    let accepted = write(&redis, a_token, "written by stale A").await?;
    println!("A (token {a_token} < {b_token}) writes late; accepted: {accepted}");
    assert!(!accepted, "a stale holder's write must be rejected");
    match a.release().await {
        Ok(()) => println!("A's release leaves B's key alone (compare-and-delete)"),
        Err(LockError::Redis { source, .. }) => println!("A's release failed: {source}"),
        Err(other) => println!("A's release: {other}"),
    }
    Ok(())
}
