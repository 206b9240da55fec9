//! Holder processes that die or freeze: the next owner takes over no earlier than the lease
//! and soon after it; a frozen holder is not polled again and its stale fenced write is refused.
//!
//! Figures worth reporting are printed with `eprintln!`, which nextest shows for failing tests
//! and `--no-capture` always.

mod common;

use std::time::{Duration, Instant};

use common::{
    Worker, acquire_when_free, assert_clean, client_for, fast_client, fenced_write, get, key_gone,
    opts, pttl,
};
use testkit::{RedisServer, monotonic_ns};

/// A killed holder announces nothing: its key must stay ours-to-nobody until Redis expires it
/// (no earlier than the PTTL it had at the kill), and another process gets it within ttl plus
/// a small bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_is_replaced_no_earlier_than_its_lease_and_within_ttl_plus_bound() {
    const TTL_MS: u64 = 1_000;
    let server = RedisServer::start();
    let key = "proc:killed";
    let mut worker = Worker::spawn(&["hold", &server.url(), key, &TTL_MS.to_string()]);
    assert_eq!(
        worker.next_line(Duration::from_secs(5)).as_deref(),
        Some("held")
    );
    let locks = client_for(&server.url(), 50, 500).await;
    // Let at least one renewal happen, so the kill lands mid-lease.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let killed_at = Instant::now();
    worker.child.kill().unwrap();
    worker.child.wait().unwrap();
    let asked_at = Instant::now();
    let left_ms = pttl(&server, key).await;
    assert!(
        left_ms > 0,
        "the dead holder's key is still there: {left_ms}"
    );
    let expires_no_earlier_than = asked_at + Duration::from_millis(left_ms as u64);

    let (won_at, lease) = acquire_when_free(&locks, key, opts(5_000), Duration::from_secs(3)).await;
    assert!(
        won_at >= expires_no_earlier_than,
        "took the key {:?} before the dead holder's lease ended",
        expires_no_earlier_than - won_at
    );
    let after = won_at - killed_at;
    assert!(
        after <= Duration::from_millis(TTL_MS + 1_000),
        "took over {after:?} after the kill"
    );
    eprintln!("killed holder: key had {left_ms} ms left; taken over {after:?} after the kill");
    lease.release().await.unwrap();
    assert_clean(&server, &locks, "proc:*").await;
}

/// A holder process frozen past its ttl (Kleppmann's paused client): after `SIGCONT` its work is
/// never polled again and the call returns `Lost`; the new owner's fenced write stands, and the
/// stale holder's write with its old fencing token is rejected by the storage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstopped_holder_process_is_not_polled_after_resume_and_its_stale_write_is_rejected() {
    let server = RedisServer::start();
    let key = "proc:frozen";
    let data = format!("{key}:data");
    let worker = Worker::spawn(&["ticker", &server.url(), key, "600"]);
    let (_, fence_line) = worker.line_starting("fence ", Duration::from_secs(5));
    let stale_fence: u64 = fence_line["fence ".len()..].parse().unwrap();
    let (_, first_tick) = worker.line_starting("tick ", Duration::from_secs(2));
    assert!(first_tick.ends_with("accepted"), "{first_tick}");

    worker.signal(libc::SIGSTOP);
    let stopped_ns = monotonic_ns();
    // Frozen, it cannot renew: the key expires with its lease.
    key_gone(&server, key, Duration::from_secs(2)).await;
    let locks = fast_client(&server).await;
    let lease = locks
        .acquire(key, opts(5_000).fencing(true))
        .await
        .expect("the lapsed lock is free");
    let fence = lease.fencing_token().unwrap();
    assert!(fence > stale_fence, "{fence} after {stale_fence}");
    assert!(fenced_write(&server, &data, fence, "new owner").await);

    let resumed_ns = monotonic_ns();
    worker.signal(libc::SIGCONT);
    let (after_stop, outcome) = worker.line_starting("outcome ", Duration::from_secs(5));
    let polled_after_resume: Vec<&String> = after_stop
        .iter()
        .filter(|line| {
            line.split_whitespace()
                .nth(2)
                .and_then(|ns| ns.parse::<u64>().ok())
                .is_some_and(|ns| ns >= resumed_ns)
        })
        .collect();
    assert!(
        polled_after_resume.is_empty(),
        "the frozen holder's work ran again after SIGCONT: {polled_after_resume:?}"
    );
    assert!(outcome.ends_with(" lost"), "{outcome}");
    let outcome_ns: u64 = outcome.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(
        worker.next_line(Duration::from_secs(3)).as_deref(),
        Some("stale-write rejected"),
        "storage must reject the stale holder's fencing token"
    );
    // And the same from here, with the stale token the worker had.
    assert!(!fenced_write(&server, &data, stale_fence, "stale").await);
    assert_eq!(get(&server, &data).await.as_deref(), Some("new owner"));
    assert_eq!(
        common::holder(&server, key).await.as_deref(),
        Some(lease.token())
    );
    eprintln!(
        "frozen holder: stopped {} ms, returned Lost {} ms after SIGCONT without polling its work",
        (resumed_ns - stopped_ns) / 1_000_000,
        outcome_ns.saturating_sub(resumed_ns) / 1_000_000
    );
    lease.release().await.unwrap();
    assert_clean(&server, &locks, key).await;
}
