//! Read-write locks under load against a real Redis: writers incrementing a counter
//! non-atomically never lose an update, readers never meet a writer, and readers really do hold
//! the key together.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::fast_client;
use lockmacro_runtime::LockOptions;
use redis::AsyncCommands;
use testkit::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_never_lose_an_update_and_readers_overlap_but_never_meet_a_writer() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let writers_inside = Arc::new(AtomicUsize::new(0));
    let readers_inside = Arc::new(AtomicUsize::new(0));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let write = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .write()
        .wait(Duration::from_secs(30));
    let read = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .read()
        .wait(Duration::from_secs(30));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (locks, writers_inside, mut conn) = (
            locks.clone(),
            writers_inside.clone(),
            server.connection().await,
        );
        tasks.spawn(async move {
            for _ in 0..15 {
                locks
                    .run_locked("ledger", write, async {
                        assert_eq!(
                            writers_inside.fetch_add(1, Ordering::SeqCst),
                            0,
                            "two writers at once"
                        );
                        let n: Option<u64> = conn.get("ledger:count").await.unwrap();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        let () = conn.set("ledger:count", n.unwrap_or(0) + 1).await.unwrap();
                        writers_inside.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                    .expect("a write");
            }
        });
    }
    for _ in 0..6 {
        let (locks, writers_inside, readers_inside, most_readers) = (
            locks.clone(),
            writers_inside.clone(),
            readers_inside.clone(),
            most_readers.clone(),
        );
        tasks.spawn(async move {
            for _ in 0..15 {
                locks
                    .run_locked("ledger", read, async {
                        let now = readers_inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most_readers.fetch_max(now, Ordering::SeqCst);
                        assert_eq!(
                            writers_inside.load(Ordering::SeqCst),
                            0,
                            "a reader met a writer"
                        );
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        readers_inside.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                    .expect("a read");
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.unwrap();
    }
    let count: u64 = server.connection().await.get("ledger:count").await.unwrap();
    assert_eq!(count, 90, "lost updates mean two writers at once");
    let most = most_readers.load(Ordering::SeqCst);
    eprintln!("at most {most} readers inside at once");
    assert!(most >= 2, "readers never overlapped");
}

/// A writer asking while a stream of readers comes and goes is woken by the last reader's
/// release, even when that release goes by while the writer is asking Redis (not parked): it
/// never sleeps the readers' remaining lease (5 s here) instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_never_left_sleeping_through_the_last_readers_release() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let stop = tokio::time::Instant::now() + Duration::from_secs(2);
    let mut readers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let locks = locks.clone();
        readers.spawn(async move {
            let options = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .read()
                .wait(Duration::from_secs(10));
            while tokio::time::Instant::now() < stop {
                locks
                    .run_locked("kinds:stream", options, async {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    })
                    .await
                    .unwrap();
            }
        });
    }
    let options = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .wait(Duration::from_secs(10));
    let mut longest = Duration::ZERO;
    let mut writes = 0;
    while tokio::time::Instant::now() < stop {
        let asked = tokio::time::Instant::now();
        locks
            .run_locked("kinds:stream", options, async {
                longest = longest.max(asked.elapsed());
                tokio::time::sleep(Duration::from_millis(2)).await;
            })
            .await
            .unwrap();
        writes += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    while let Some(reader) = readers.join_next().await {
        reader.unwrap();
    }
    assert!(writes >= 5, "{writes} writes");
    assert!(
        longest < Duration::from_millis(2_500),
        "a writer waited {longest:?}: it slept through a release"
    );
}
