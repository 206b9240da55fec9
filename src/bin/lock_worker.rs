//! A lock client in a process of its own, for tests that need several processes or one to kill.
//!
//! `lock_worker count URL KEY TASKS INCREMENTS`: TASKS tasks each add 1 to the integer at
//! `KEY:counter` INCREMENTS times, non-atomically (GET, short sleep, SET) under the lock `KEY`
//! with `wait`; prints one line `interval START_NS END_NS` (CLOCK_MONOTONIC) per critical section.
//! A URL `redlock:URL1,URL2,URL3` takes the lock on a Redlock quorum of those masters (the counter
//! lives on the first).
//!
//! `lock_worker hold URL KEY TTL_MS`: takes `KEY` with unlimited renewals, prints `held`, and
//! holds it until killed.
//!
//! `lock_worker hold-graceful URL KEY TTL_MS`: as `hold`, but on SIGTERM it shuts its client down
//! (releasing the lock), prints `shut down`, and exits.
//!
//! `lock_worker turns DEPLOYMENT KEYS TASKS HOLD_US WAIT_MS TTL_MS START_NS RUN_MS`: callers
//! taking turns on one key (or on a comma-separated list at once) from `START_NS` on, each
//! printing a line per call ([`testkit::turns`]).
//!
//! `lock_worker ticker URL KEY TTL_MS`: runs a body under `run_locked` (unlimited renewals,
//! fencing on) that prints `fence F`, then forever writes through a fencing-checked storage
//! script and prints `tick N MONOTONIC_NS accepted|rejected` every 20 ms. When the call ends it
//! prints `outcome MONOTONIC_NS ok|lost|exhausted|busy|redis|other`, then, as a buggy holder that
//! ignores the outcome would, writes once more with its old fencing token and prints
//! `stale-write accepted|rejected`.

use std::time::Duration;

use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};
use redis::AsyncCommands;
use testkit::monotonic_ns;

#[tokio::main]
async fn main() {
    // `RUST_LOG=lockmacro_runtime=debug` shows what the lock does, on stderr.
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("count") => count(&args[2], &args[3], parse(&args[4]), parse(&args[5])).await,
        Some("hold") => hold(&args[2], &args[3], parse(&args[4])).await,
        Some("hold-graceful") => hold_graceful(&args[2], &args[3], parse(&args[4])).await,
        Some("ticker") => ticker(&args[2], &args[3], parse(&args[4])).await,
        Some("turns") => {
            testkit::turns::take_turns(testkit::turns::Plan::from_args(&args[2..])).await
        }
        _ => {
            eprintln!(
                "usage: lock_worker count URL KEY TASKS INCREMENTS | hold URL KEY TTL_MS | ticker URL KEY TTL_MS"
            );
            std::process::exit(2);
        }
    }
}

fn parse(arg: &str) -> u64 {
    arg.parse()
        .unwrap_or_else(|_| panic!("not a number: {arg}"))
}

async fn count(url: &str, key: &str, tasks: u64, increments: u64) {
    let (locks, url) = match url.strip_prefix("redlock:") {
        Some(masters) => {
            let masters: Vec<&str> = masters.split(',').collect();
            let locks = LockClient::redlock_builder(&masters).build().await;
            (locks.expect("connect"), masters[0])
        }
        None => (LockClient::connect(url).await.expect("connect"), url),
    };
    let redis = redis::Client::open(url).expect("url");
    let options = LockOptions::new()
        .ttl(Duration::from_secs(2))
        .wait(Duration::from_secs(60));
    let mut workers = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (locks, redis, key) = (locks.clone(), redis.clone(), key.to_owned());
        workers.spawn(async move {
            let mut conn = redis
                .get_multiplexed_async_connection()
                .await
                .expect("connect");
            let counter = format!("{key}:counter");
            let mut intervals = Vec::new();
            for step in 0..increments {
                // Taking the lock may fail for want of servers (a quorum's masters too slow to
                // answer on a loaded machine): the body has not run, so try again, as a user
                // would. Once taken, the increment must go through under the lease.
                let lease = loop {
                    match locks.acquire(key.clone(), options).await {
                        Ok(lease) => break lease,
                        Err(error @ (LockError::NoQuorum { .. } | LockError::Redis { .. })) => {
                            eprintln!("acquire failed, trying again: {error}");
                        }
                        Err(error) => panic!("acquire: {error}"),
                    }
                };
                let interval = lease
                    .run(async {
                        let start = monotonic_ns();
                        let n: Option<u64> = conn.get(&counter).await.expect("GET");
                        tokio::time::sleep(Duration::from_micros((task * 7 + step * 13) % 500))
                            .await;
                        let _: () = conn.set(&counter, n.unwrap_or(0) + 1).await.expect("SET");
                        (start, monotonic_ns())
                    })
                    .await
                    .expect("locked increment");
                if let Err(error) = lease.release().await {
                    eprintln!("release not confirmed (retried in the background): {error}");
                }
                intervals.push(interval);
            }
            intervals
        });
    }
    while let Some(intervals) = workers.join_next().await {
        for (start, end) in intervals.expect("task") {
            println!("interval {start} {end}");
        }
    }
}

async fn hold_graceful(url: &str, key: &str, ttl_ms: u64) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("a SIGTERM handler");
    let locks = LockClient::connect(url).await.expect("connect");
    let options = LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .unlimited_renewals();
    let work = tokio::spawn({
        let (locks, key) = (locks.clone(), key.to_owned());
        async move {
            locks
                .run_locked(key, options, async {
                    println!("held");
                    std::future::pending::<()>().await
                })
                .await
        }
    });
    terminate.recv().await;
    locks.shutdown().await.expect("releases confirmed");
    let outcome = work.await.expect("the work task");
    assert!(
        matches!(outcome, Err(LockError::ShutDown { .. })),
        "{outcome:?}"
    );
    println!("shut down");
}

async fn hold(url: &str, key: &str, ttl_ms: u64) {
    let locks = LockClient::connect(url).await.expect("connect");
    let options = LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .unlimited_renewals();
    let _lease = locks.acquire(key, options).await.expect("acquire");
    println!("held");
    std::future::pending::<()>().await;
}

/// The fencing-checked storage's verdict, as the worker prints it.
async fn fenced_write(
    conn: &mut redis::aio::MultiplexedConnection,
    data: &str,
    fence: u64,
    value: &str,
) -> &'static str {
    if testkit::fenced_write(conn, data, fence, value).await {
        "accepted"
    } else {
        "rejected"
    }
}

async fn ticker(url: &str, key: &str, ttl_ms: u64) {
    let locks = LockClient::builder(url)
        .scan_interval(Duration::from_millis(50))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .expect("connect");
    let mut conn = redis::Client::open(url)
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let data = format!("{key}:data");
    let options = LockOptions::new()
        .ttl(Duration::from_millis(ttl_ms))
        .unlimited_renewals()
        .fencing(true);
    let fence = std::sync::atomic::AtomicU64::new(0);
    let outcome = locks
        .run_locked(key, options, async {
            let mine = LockContext::current()
                .and_then(|lock| lock.fencing_token())
                .expect("fencing token");
            fence.store(mine, std::sync::atomic::Ordering::SeqCst);
            println!("fence {mine}");
            for n in 0u64.. {
                let written = fenced_write(&mut conn, &data, mine, &format!("tick {n}")).await;
                println!("tick {n} {} {written}", monotonic_ns());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    let outcome = match outcome {
        Ok(()) => "ok",
        Err(LockError::Lost { .. }) => "lost",
        Err(LockError::RenewalsExhausted { .. }) => "exhausted",
        Err(LockError::Busy { .. }) => "busy",
        Err(LockError::Redis { .. }) => "redis",
        Err(_) => "other",
    };
    println!("outcome {} {outcome}", monotonic_ns());
    let fence = fence.load(std::sync::atomic::Ordering::SeqCst);
    let stale = fenced_write(&mut conn, &data, fence, "stale").await;
    println!("stale-write {stale}");
}
