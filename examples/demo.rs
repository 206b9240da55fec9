//! The seed scenario, replayed: a 10 s job under a 3 s lease that may be renewed 3 times.
//!
//! Run with `scripts/demo.sh` (starts a throwaway Redis if none answers), or
//! `REDIS_URL=redis://127.0.0.1:6379 cargo run --example demo`. It prints a timeline: acquired,
//! each renewal with its count, a second concurrent call rejected as busy, the first call
//! cancelled once its renewals run out, and the key gone afterwards.

use std::time::{Duration, Instant};

use lockmacro_runtime::{LockError, redis_lock};
use redis::AsyncCommands;
use tracing_subscriber::fmt::time::Uptime;

#[derive(Debug)]
struct Book {
    title: String,
}

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// The seed's `testRedisLock`: sleeps 10 s while holding `Business1:<user_id>`.
#[redis_lock(prefix = "Business1", key = user_id, ttl = 3, max_renewals = 3)]
async fn test_redis_lock(user_id: u64, started: Instant) -> Result<Book, AppError> {
    say(
        started,
        &format!("user {user_id}: working for 10 s under the lock"),
    );
    tokio::time::sleep(Duration::from_secs(10)).await;
    say(
        started,
        "user {user_id}: finished (never printed: the lease runs out first)",
    );
    Ok(Book {
        title: "never returned".into(),
    })
}

fn say(started: Instant, line: &str) {
    println!("[{:>6.3}s] {line}", started.elapsed().as_secs_f64());
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "lockmacro_runtime=debug".into()),
        )
        .with_timer(Uptime::default())
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .with_target(false)
        .init();
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let started = Instant::now();
    say(
        started,
        &format!("redis at {url}; lock key Business1:1024, ttl 3 s, max_renewals 3"),
    );

    let first = tokio::spawn(test_redis_lock(1024, started));
    tokio::time::sleep(Duration::from_millis(500)).await;

    say(
        started,
        "second call for user 1024 while the first holds the lock:",
    );
    match test_redis_lock(1024, started).await {
        Err(AppError::Lock(LockError::Busy { key, .. })) => {
            say(started, &format!("second call rejected: `{key}` is busy"));
        }
        other => say(started, &format!("second call: unexpected {other:?}")),
    }

    match first.await? {
        Err(AppError::Lock(err @ LockError::RenewalsExhausted { .. })) => {
            say(started, &format!("first call cancelled: {err}"));
        }
        Ok(book) => say(
            started,
            &format!("first call finished with {book:?}: {}", book.title),
        ),
        Err(err) => say(started, &format!("first call failed: {err}")),
    }

    let mut redis = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let left: Option<String> = redis.get("Business1:1024").await?;
    match left {
        None => say(started, "key Business1:1024 is gone: released"),
        Some(token) => say(started, &format!("key Business1:1024 still holds {token}!")),
    }
    Ok(())
}
