//! Real faults against real Redis: stalled servers, blackholed and slow links, lost replies,
//! killed and frozen holder processes, dropped futures, dead runtimes, evictions, load.
//!
//! Each test names the fault and the outcome DESIGN.md promises for it. Figures worth reporting
//! (how long after a stall the holder stopped, the gap to the next owner, memory per lease) are
//! printed with `eprintln!`, which nextest shows for failing tests and `--no-capture` always.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use common::{
    DropClock, Worker, assert_clean, connected_clients, eventually, fast_client, fenced_write, get,
    key_gone, monotonic_ns, opts, pttl, rss_kib, scan_keys,
};
use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};
use redis::AsyncCommands;
use testkit::{Fault, FaultProxy, RedisServer};
use tokio::sync::oneshot;

/// A client whose every wait is short, so faults surface as errors quickly.
async fn client_for(url: &str, scan_ms: u64, response_ms: u64) -> LockClient {
    LockClient::builder(url)
        .scan_interval(Duration::from_millis(scan_ms))
        .connect_timeout(Duration::from_millis(response_ms))
        .response_timeout(Duration::from_millis(response_ms))
        .build()
        .await
        .expect("client connects while the link is healthy")
}

/// Takes `key` with fail-fast attempts every 10 ms until it is ours; the first argument of the
/// answer is when the winning attempt was answered.
async fn acquire_when_free(
    locks: &LockClient,
    key: &str,
    options: LockOptions,
    within: Duration,
) -> (Instant, lockmacro_runtime::Lease) {
    let give_up = Instant::now() + within;
    loop {
        match locks.acquire(key, options).await {
            Ok(lease) => return (Instant::now(), lease),
            Err(LockError::Busy { .. } | LockError::Redis { .. }) if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(err) => panic!("`{key}` not acquired within {within:?}: {err:?}"),
        }
    }
}

/// Runs a holder on `key` whose work never ends on its own; answers once its lease has been
/// renewed at least once (so the deadline in force is a renewed one), with the receiver of the
/// instant its work is dropped and the call's handle.
async fn start_holder(
    locks: &LockClient,
    key: &str,
    options: LockOptions,
) -> (
    std::sync::mpsc::Receiver<Instant>,
    tokio::task::JoinHandle<Result<(), LockError>>,
) {
    let (clock, dropped) = DropClock::new();
    let (renewed_tx, renewed) = oneshot::channel();
    let holder = tokio::spawn({
        let (locks, key) = (locks.clone(), key.to_owned());
        async move {
            locks
                .run_locked(key, options, async move {
                    let _clock = clock;
                    let lock = LockContext::current().expect("inside locked work");
                    while lock.renewals() == 0 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    renewed_tx.send(()).expect("test waits");
                    std::future::pending::<()>().await
                })
                .await
        }
    });
    tokio::time::timeout(Duration::from_secs(3), renewed)
        .await
        .expect("holder renewed within 3 s")
        .expect("holder running");
    (dropped, holder)
}

/// The instant the holder's work was dropped, waited for without blocking the runtime.
async fn dropped_at(dropped: std::sync::mpsc::Receiver<Instant>, within: Duration) -> Instant {
    tokio::task::spawn_blocking(move || dropped.recv_timeout(within))
        .await
        .expect("blocking wait")
        .unwrap_or_else(|_| panic!("the holder's work was not dropped within {within:?}"))
}

// ---------------------------------------------------------------------------------------------
// Redis unreachable at acquire
// ---------------------------------------------------------------------------------------------

/// A partition that answers nothing (no reset, no refusal) must still end an acquire within the
/// configured timeouts, as a `Redis` error, and the body must never run: both for a client that
/// has no connection yet and for one whose connection goes silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_redis_at_acquire_is_a_redis_error_within_the_timeouts() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let timeouts = Duration::from_millis(300);
    let ran = AtomicBool::new(false);

    // No connection yet: the connect (and its handshake) hangs.
    proxy.set(Fault::Blackhole);
    let cold = LockClient::builder(&proxy.url())
        .connect_timeout(timeouts)
        .response_timeout(timeouts)
        .build_lazy()
        .unwrap();
    let started = Instant::now();
    let outcome = cold
        .run_locked("bh:cold", opts(5_000), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    let cold_took = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::Redis { ref key, .. }) if key.as_deref() == Some("bh:cold")),
        "{outcome:?}"
    );
    assert!(
        cold_took < 2 * timeouts + Duration::from_millis(200),
        "cold acquire took {cold_took:?}"
    );

    // A connection that worked, then went silent: the SET gets no answer.
    proxy.heal();
    let warm = client_for(&proxy.url(), 100, 300).await;
    proxy.set(Fault::Blackhole);
    let started = Instant::now();
    let outcome = warm
        .run_locked("bh:warm", opts(5_000), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    let warm_took = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::Redis { ref key, .. }) if key.as_deref() == Some("bh:warm")),
        "{outcome:?}"
    );
    assert!(
        warm_took < timeouts + Duration::from_millis(200),
        "warm acquire took {warm_took:?}"
    );
    assert!(
        !ran.load(Ordering::SeqCst),
        "the body never runs without the lock"
    );
    eprintln!(
        "blackhole at acquire: cold client failed after {cold_took:?}, warm after {warm_took:?}"
    );

    proxy.heal();
    assert_clean(&server, &warm, "bh:*").await;
    assert_eq!(cold.held_leases(), 0);
}

// ---------------------------------------------------------------------------------------------
// Redis stalls longer than the ttl under a running holder
// ---------------------------------------------------------------------------------------------

/// How a test stalls the server.
#[derive(Clone, Copy, Debug)]
enum Stall {
    /// `SIGSTOP`, then `SIGCONT` after the stall.
    Sigstop,
    /// `DEBUG SLEEP`: the server blocks in a command.
    DebugSleep,
}

/// The holder must stop at its local deadline although no reply came, return `Lost`, and the
/// owner that wins after the stall must start only after the stale holder's work was dropped.
async fn holder_outlived_by_a_stall(stall: Stall) {
    const TTL: Duration = Duration::from_millis(1_000);
    const STALL: Duration = Duration::from_millis(2_500);
    let server = Arc::new(RedisServer::start());
    let key = "stall:1";
    let holder_client = client_for(&server.url(), 50, 500).await;
    let contender = client_for(&server.url(), 50, 500).await;
    let (dropped, holder) = start_holder(
        &holder_client,
        key,
        LockOptions::new().ttl(TTL).unlimited_renewals(),
    )
    .await;

    let stall_began = Instant::now();
    let stalled = match stall {
        Stall::Sigstop => {
            server.pause();
            let server = server.clone();
            tokio::spawn(async move {
                tokio::time::sleep(STALL).await;
                server.resume();
            })
        }
        Stall::DebugSleep => {
            let server = server.clone();
            tokio::task::spawn_blocking(move || {
                let seconds = format!("{}", STALL.as_secs_f64());
                assert_eq!(
                    server.command(&["DEBUG", "SLEEP", &seconds]),
                    redis::Value::Okay
                );
            })
        }
    };

    let dropped_at = dropped_at(dropped, TTL + Duration::from_secs(2)).await;
    let stopped_after = dropped_at - stall_began;
    let outcome = tokio::time::timeout(Duration::from_secs(5), holder)
        .await
        .expect("the holder's call returns")
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { ref key }) if key == "stall:1"),
        "{stall:?}: {outcome:?}"
    );
    assert!(
        stopped_after <= TTL + Duration::from_millis(150),
        "{stall:?}: the holder's work must stop by its local deadline (≤ ttl after the stall began), stopped after {stopped_after:?}"
    );

    stalled.await.unwrap();
    let (won_at, lease) =
        acquire_when_free(&contender, key, opts(5_000), Duration::from_secs(3)).await;
    let gap = won_at.saturating_duration_since(dropped_at);
    assert!(
        won_at > dropped_at,
        "{stall:?}: the next owner started {:?} before the stale holder stopped",
        dropped_at - won_at
    );
    // What the stale holder queued during the stall (extensions, its release) has reached Redis
    // once its own client works again; none of it touched the new owner's key.
    eventually(
        Duration::from_secs(3),
        "stale holder's client works again",
        || async {
            holder_client
                .run_locked("stall:probe", opts(1_000), async {})
                .await
                .is_ok()
        },
    )
    .await;
    assert_eq!(
        get(&server, key).await.as_deref(),
        Some(lease.token()),
        "{stall:?}: the stale holder never deletes or extends the new owner's key"
    );
    eprintln!(
        "{stall:?} for {STALL:?} with ttl {TTL:?}: holder stopped {stopped_after:?} after the stall began; next owner started {gap:?} after that (overlap 0)"
    );
    lease.release().await.unwrap();
    assert_clean(&server, &holder_client, "stall:*").await;
    assert_eq!(contender.held_leases(), 0);
}

/// Redis frozen by `SIGSTOP` (a GC pause, a stalled VM) for longer than the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigstopped_redis_stops_the_holder_at_its_deadline_and_the_next_owner_never_overlaps() {
    holder_outlived_by_a_stall(Stall::Sigstop).await;
}

/// Redis busy in one command (`DEBUG SLEEP`) for longer than the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_sleep_stops_the_holder_at_its_deadline_and_the_next_owner_never_overlaps() {
    holder_outlived_by_a_stall(Stall::DebugSleep).await;
}

// ---------------------------------------------------------------------------------------------
// Network faults between client and Redis
// ---------------------------------------------------------------------------------------------

/// A partition under a running holder: the holder stops at its deadline with `Lost`; a contender
/// on the other side of the partition, polling all along, gets the key only after the holder's
/// work was dropped; after the heal the holder's client works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackhole_mid_hold_stops_the_holder_at_its_deadline_and_the_client_recovers_after_heal() {
    const TTL: Duration = Duration::from_millis(1_000);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let holder_client = client_for(&proxy.url(), 50, 300).await;
    let contender = client_for(&server.url(), 50, 300).await;
    let key = "part:1";
    let (dropped, holder) = start_holder(
        &holder_client,
        key,
        LockOptions::new().ttl(TTL).unlimited_renewals(),
    )
    .await;

    proxy.set(Fault::Blackhole);
    let partitioned_at = Instant::now();
    let contending = tokio::spawn({
        let contender = contender.clone();
        async move { acquire_when_free(&contender, key, opts(5_000), Duration::from_secs(4)).await }
    });
    let dropped_at = dropped_at(dropped, TTL + Duration::from_secs(2)).await;
    let stopped_after = dropped_at - partitioned_at;
    let outcome = tokio::time::timeout(Duration::from_secs(3), holder)
        .await
        .expect("the holder's call returns")
        .unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
    assert!(
        stopped_after <= TTL + Duration::from_millis(150),
        "stopped {stopped_after:?} after the partition began"
    );
    let (won_at, lease) = contending.await.unwrap();
    assert!(
        won_at > dropped_at,
        "the contender won {:?} before the partitioned holder stopped",
        dropped_at - won_at
    );
    let margin = won_at - dropped_at;

    proxy.heal();
    let healed_at = Instant::now();
    let recovered = eventually(
        Duration::from_secs(3),
        "holder's client recovers after heal",
        || async {
            holder_client
                .run_locked("part:after-heal", opts(1_000), async {})
                .await
                .is_ok()
        },
    )
    .await;
    eprintln!(
        "blackhole mid-hold, ttl {TTL:?}: holder stopped {stopped_after:?} after the partition; contender won {margin:?} later; client recovered {recovered:?} after heal (overlap 0)"
    );
    assert_eq!(get(&server, key).await.as_deref(), Some(lease.token()));
    lease.release().await.unwrap();
    // The healed client can take the contested key again, too.
    holder_client
        .run_locked(key, opts(1_000), async {})
        .await
        .expect("the healed client takes the key again");
    assert!(healed_at.elapsed() < Duration::from_secs(5));
    assert_clean(&server, &holder_client, "part:*").await;
}

/// A reply that arrives after the lease would have ended is worthless: the acquire fails, the
/// body never runs, our key (which did land) is removed, and retrying after the link recovers is
/// never answered "busy" by our own leftover key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_later_than_the_ttl_means_not_acquired_and_our_key_is_removed() {
    const TTL: Duration = Duration::from_millis(400);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = client_for(&proxy.url(), 50, 2_000).await;
    let key = "slow:1";

    proxy.set(Fault::Delay(Duration::from_millis(600)));
    let ran = AtomicBool::new(false);
    let started = Instant::now();
    let outcome = locks
        .run_locked(key, LockOptions::new().ttl(TTL), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    let failed_after = started.elapsed();
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "a reply later than the ttl must not count as acquired: {outcome:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the body never runs");
    assert!(
        failed_after < TTL + Duration::from_millis(100),
        "gave up after {failed_after:?}, later than the ttl"
    );

    // Our SET lands 600 ms after it was sent; watch the key on the server directly.
    let seen_ours = std::cell::Cell::new(false);
    let gone_after = eventually(Duration::from_secs(3), "our late key removed", || async {
        let there = get(&server, key).await.is_some();
        seen_ours.set(seen_ours.get() || there);
        seen_ours.get() && !there
    })
    .await;
    proxy.heal();
    // Retry on the healed link: our own leftover must never make us wait as if another held it.
    let (retried, busy) = retry_until_taken(&locks, key, Duration::from_secs(2)).await;
    eprintln!(
        "reply later than ttl: error after {failed_after:?}; our late key removed {gone_after:?} after that; retry succeeded {retried:?} after heal, busy answers: {busy}"
    );
    assert_eq!(busy, 0, "reported busy while only our own key was there");
    assert_clean(&server, &locks, "slow:*").await;
}

/// The acquire reached Redis but its reply was lost: the caller gets an error (never "held by
/// another"), our key is removed in the background long before its ttl would end, and after the
/// heal the same client takes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_whose_reply_was_lost_is_an_error_and_our_key_is_released_in_the_background() {
    const TTL: Duration = Duration::from_secs(10);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = client_for(&proxy.url(), 50, 300).await;
    // Open the watchdog's connection too (it sends background releases): one renewal.
    locks
        .run_locked("lost:warmup", opts(150), async {
            tokio::time::sleep(Duration::from_millis(200)).await;
        })
        .await
        .unwrap();
    let key = "lost:1";

    proxy.set(Fault::DropReplies);
    let ran = AtomicBool::new(false);
    let outcome = locks
        .run_locked(key, LockOptions::new().ttl(TTL), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    let failed_at = Instant::now();
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "a lost reply is a Redis error, never Busy: {outcome:?}"
    );
    assert!(!ran.load(Ordering::SeqCst), "the body never runs");
    let gone_after = key_gone(&server, key, Duration::from_secs(2)).await;
    assert!(
        pttl(&server, key).await == -2,
        "our key must not sit there for its ttl"
    );

    proxy.heal();
    let (retried, busy) = retry_until_taken(&locks, key, Duration::from_secs(3)).await;
    eprintln!(
        "lost acquire reply: our key removed {gone_after:?} after the error (ttl {TTL:?}), retry succeeded {retried:?} after heal, busy answers: {busy}"
    );
    assert_eq!(busy, 0, "reported busy while only our own key was there");
    assert!(failed_at.elapsed() < TTL);
    assert_clean(&server, &locks, "lost:*").await;
}

/// A reply lost for good on a connection that stays open (a middlebox swallowing it), on an
/// acquire whose budget is cut by a short ttl, must not leave the client's connection out of
/// step: afterwards, acquires of keys that another owner holds must all be `Busy`, never taken.
/// (A multiplexed connection pairs replies with requests in order; a request given up without
/// its reply leaves a slot that swallows the next reply, which then answers the wrong request.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_reply_never_makes_a_later_acquire_take_someone_elses_lock() {
    const TTL: Duration = Duration::from_millis(200);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    // The response timeout is longer than the ttl, so the acquire's own budget (ttl − drift)
    // is what gives up on the lost reply.
    let locks = client_for(&proxy.url(), 50, 1_000).await;
    let other = fast_client(&server).await;
    let mut held = Vec::new();
    for n in 0..10 {
        held.push(
            other
                .acquire(format!("desync:held:{n}"), opts(30_000))
                .await
                .unwrap(),
        );
    }

    proxy.set(Fault::DropReplies);
    let outcome = locks
        .acquire("desync:lost", LockOptions::new().ttl(TTL))
        .await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    proxy.heal();

    // Acquires of held and free keys, concurrently on the client's one connection.
    let mut calls = tokio::task::JoinSet::new();
    for n in 0..10 {
        for key in [format!("desync:held:{n}"), format!("desync:free:{n}")] {
            let locks = locks.clone();
            calls.spawn(async move {
                let outcome = locks
                    .acquire(key.clone(), LockOptions::new().ttl(TTL))
                    .await;
                (key, outcome)
            });
        }
    }
    let mut stolen = Vec::new();
    let mut free_taken = 0;
    while let Some(done) = calls.join_next().await {
        let (key, outcome) = done.unwrap();
        match outcome {
            Ok(lease) if key.starts_with("desync:held:") => {
                stolen.push(key);
                drop(lease);
            }
            Ok(lease) => {
                free_taken += 1;
                drop(lease);
            }
            Err(_) => {}
        }
    }
    for lease in held {
        let token = lease.token().to_owned();
        assert_eq!(
            get(&server, lease.key()).await.as_deref(),
            Some(token.as_str()),
            "the other owner's key was touched"
        );
        lease.release().await.unwrap();
    }
    eprintln!(
        "after a lost reply: {} held keys reported taken, {free_taken}/10 free keys taken",
        stolen.len()
    );
    assert!(
        stolen.is_empty(),
        "acquires reported keys held by another owner as taken: {stolen:?}"
    );
    eventually(
        Duration::from_secs(3),
        "client recovers after heal",
        || async {
            locks
                .run_locked("desync:after", opts(1_000), async {})
                .await
                .is_ok()
        },
    )
    .await;
    assert_clean(&server, &locks, "desync:*").await;
}

// ---------------------------------------------------------------------------------------------
// Holder processes that die or freeze
// ---------------------------------------------------------------------------------------------

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
        after <= Duration::from_millis(TTL_MS + 150),
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
                .and_then(|ns| ns.parse::<u128>().ok())
                .is_some_and(|ns| ns >= resumed_ns)
        })
        .collect();
    assert!(
        polled_after_resume.is_empty(),
        "the frozen holder's work ran again after SIGCONT: {polled_after_resume:?}"
    );
    assert!(outcome.ends_with(" lost"), "{outcome}");
    let outcome_ns: u128 = outcome.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert_eq!(
        worker.next_line(Duration::from_secs(3)).as_deref(),
        Some("stale-write rejected"),
        "storage must reject the stale holder's fencing token"
    );
    // And the same from here, with the stale token the worker had.
    assert!(!fenced_write(&server, &data, stale_fence, "stale").await);
    assert_eq!(get(&server, &data).await.as_deref(), Some("new owner"));
    assert_eq!(get(&server, key).await.as_deref(), Some(lease.token()));
    eprintln!(
        "frozen holder: stopped {} ms, returned Lost {} ms after SIGCONT without polling its work",
        (resumed_ns - stopped_ns) / 1_000_000,
        outcome_ns.saturating_sub(resumed_ns) / 1_000_000
    );
    lease.release().await.unwrap();
    assert_clean(&server, &locks, key).await;
}

// ---------------------------------------------------------------------------------------------
// Cancellation
// ---------------------------------------------------------------------------------------------

/// A waker that tells the test when the future asks to be polled again.
struct Wakeup(tokio::sync::Notify);

impl Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.0.notify_one();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify_one();
    }
}

/// Where in its life a `run_locked` future was when it was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum DroppedWhile {
    NotStarted,
    Acquiring,
    Working,
    Releasing,
}

/// `run_locked` dropped after 0, 1, 2, … polls, driven by hand, behind a link that delays every
/// packet 40 ms so acquire, extensions and release each spend time in flight. After every drop:
/// no lease is left in the client, and the key is gone or only expiring, never extended again
/// (its PTTL never rises once what was already on the wire has landed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_dropped_at_every_await_point_leaves_no_renewed_key() {
    const DELAY: Duration = Duration::from_millis(40);
    const TTL: Duration = Duration::from_millis(300);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    proxy.set(Fault::Delay(DELAY));
    let locks = client_for(&proxy.url(), 30, 1_000).await;
    let options = LockOptions::new().ttl(TTL).unlimited_renewals();
    let wakeup = Arc::new(Wakeup(tokio::sync::Notify::new()));
    let waker = Waker::from(wakeup.clone());
    let mut cx = Context::from_waker(&waker);
    let mut seen = std::collections::HashSet::new();

    for polls in 0.. {
        let key = format!("drop:{polls}");
        let started = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let work = {
            let (started, finished) = (started.clone(), finished.clone());
            async move {
                started.store(true, Ordering::SeqCst);
                for _ in 0..4 {
                    tokio::time::sleep(Duration::from_millis(120)).await;
                }
                finished.store(true, Ordering::SeqCst);
            }
        };
        let mut call = Box::pin(locks.run_locked(key.clone(), options, work));
        let mut completed = None;
        for _ in 0..polls {
            if let Poll::Ready(outcome) = call.as_mut().poll(&mut cx) {
                completed = Some(outcome);
                break;
            }
            tokio::time::timeout(Duration::from_secs(3), wakeup.0.notified())
                .await
                .expect("a pending run_locked asks to be polled again");
        }
        if let Some(outcome) = completed {
            outcome.expect("undisturbed, the call completes");
            assert!(seen.len() >= 4, "drop points covered: {seen:?}");
            break;
        }
        let state = match (
            polls,
            started.load(Ordering::SeqCst),
            finished.load(Ordering::SeqCst),
        ) {
            (0, _, _) => DroppedWhile::NotStarted,
            (_, false, _) => DroppedWhile::Acquiring,
            (_, true, false) => DroppedWhile::Working,
            (_, true, true) => DroppedWhile::Releasing,
        };
        seen.insert(state);
        drop(call);
        let dropped_at = Instant::now();
        assert_eq!(locks.held_leases(), 0, "after {polls} polls ({state:?})");

        // Watch the key for what was on the wire to land, then for a full ttl more.
        let settle = 2 * DELAY + Duration::from_millis(20);
        let mut samples = Vec::new();
        while dropped_at.elapsed() < settle + TTL + 2 * DELAY + Duration::from_millis(100) {
            samples.push((dropped_at.elapsed(), pttl(&server, &key).await));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let settled: Vec<i64> = samples
            .iter()
            .filter(|(at, _)| *at >= settle)
            .map(|(_, left)| *left)
            .collect();
        for pair in settled.windows(2) {
            let (before, after) = (pair[0], pair[1]);
            let rose = if before < 0 {
                after >= 0
            } else {
                after > before + 5
            };
            assert!(
                !rose,
                "{key} ({state:?}) was extended or re-created after the drop: {samples:?}"
            );
        }
        assert_eq!(
            settled.last(),
            Some(&-2),
            "{key} ({state:?}) outlived its ttl after the drop: {samples:?}"
        );
    }
    eprintln!("dropped run_locked while: {seen:?}");
    for state in [
        DroppedWhile::Acquiring,
        DroppedWhile::Working,
        DroppedWhile::Releasing,
    ] {
        assert!(seen.contains(&state), "never dropped while {state:?}");
    }
    assert_clean(&server, &locks, "drop:*").await;
}

/// The caller's whole runtime goes away while its task holds a lock (a `#[tokio::test]` ending,
/// a service shutting down): nothing panics, the key is released (by the client's own watchdog
/// thread, not the dead runtime), the runtime's connection closes, and the client keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_shut_down_while_holding_releases_the_key_without_panicking() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    // Open the watchdog's connection (it sends drop-time releases) before counting connections.
    drop(locks.acquire("rt:warmup", opts(30_000)).await.unwrap());
    key_gone(&server, "rt:warmup", Duration::from_secs(2)).await;
    let baseline = connected_clients(&server);
    let key = "rt:held";

    let shutdown = tokio::task::spawn_blocking({
        let locks = locks.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            let (started_tx, started) = std::sync::mpsc::channel();
            runtime.spawn(async move {
                locks
                    .run_locked(key, opts(30_000).unlimited_renewals(), async move {
                        started_tx.send(()).unwrap();
                        std::future::pending::<()>().await
                    })
                    .await
            });
            started
                .recv_timeout(Duration::from_secs(3))
                .expect("holding in the doomed runtime");
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(runtime)))
        }
    });
    shutdown
        .await
        .unwrap()
        .expect("dropping a runtime that holds a lock does not panic");
    // A 30 s lease: only a release, not expiry, clears it this soon.
    let released = key_gone(&server, key, Duration::from_secs(2)).await;
    assert_eq!(locks.held_leases(), 0);
    eventually(
        Duration::from_secs(3),
        "the dead runtime's connection closes",
        || async { connected_clients(&server) <= baseline },
    )
    .await;
    locks
        .run_locked(key, opts(1_000), async {})
        .await
        .expect("the client outlives the runtime");
    eprintln!("runtime shut down while holding: key released {released:?} later");
    assert_clean(&server, &locks, "rt:*").await;
}

// ---------------------------------------------------------------------------------------------
// Redis itself drops or forgets things
// ---------------------------------------------------------------------------------------------

/// Under `maxmemory-policy volatile-ttl` a lock key, having the nearest expiry, is the first
/// thing Redis evicts under memory pressure: the holder must learn that it lost the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_lock_key_is_reported_lost() {
    let server = RedisServer::start_with(&[
        "--maxmemory",
        "2mb",
        "--maxmemory-policy",
        "volatile-ttl",
        "--maxmemory-samples",
        "10",
    ]);
    let locks = client_for(&server.url(), 50, 500).await;
    let key = "evict:lock";
    let (dropped, holder) = start_holder(
        &locks,
        key,
        LockOptions::new()
            .ttl(Duration::from_millis(1_500))
            .unlimited_renewals(),
    )
    .await;

    let mut conn = server.connection().await;
    let filler = "x".repeat(16 * 1024);
    let mut written = 0;
    while get(&server, key).await.is_some() {
        assert!(written < 2_000, "the lock key was never evicted");
        let _: () = conn
            .set_ex(format!("evict:fill:{written}"), &filler, 3_600)
            .await
            .expect("filler write");
        written += 1;
    }
    let evicted_at = Instant::now();
    let dropped_at = dropped_at(dropped, Duration::from_secs(3)).await;
    let outcome = holder.await.unwrap();
    assert!(
        matches!(outcome, Err(LockError::Lost { ref key }) if key == "evict:lock"),
        "{outcome:?}"
    );
    let noticed = dropped_at.saturating_duration_since(evicted_at);
    assert!(
        noticed <= Duration::from_millis(1_500),
        "noticed the eviction {noticed:?} later"
    );
    eprintln!(
        "eviction: lock key evicted after {written} filler writes; work cancelled {noticed:?} later"
    );
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    assert_clean(&server, &locks, "evict:*").await;
}

/// `SCRIPT FLUSH` (or a failover to a replica without the scripts) mid-hold: the watchdog meets
/// `NOSCRIPT`, reloads, and renewals go on; release and a fenced acquire work after it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_hold_keeps_renewals_going() {
    let server = RedisServer::start();
    let locks = client_for(&server.url(), 50, 500).await;
    let (flushed_tx, flushed) = oneshot::channel::<()>();
    let (ready_tx, ready) = oneshot::channel::<u32>();
    let holder = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked("flush:1", opts(600).unlimited_renewals(), async move {
                    let lock = LockContext::current().unwrap();
                    while lock.renewals() < 2 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    ready_tx.send(lock.renewals()).unwrap();
                    flushed.await.unwrap();
                    let at_flush = lock.renewals();
                    // Three more renewals need ~600 ms; the lease itself is 600 ms.
                    tokio::time::sleep(Duration::from_millis(1_000)).await;
                    (at_flush, lock.renewals())
                })
                .await
        }
    });
    ready.await.unwrap();
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]), redis::Value::Okay);
    flushed_tx.send(()).unwrap();
    let (at_flush, at_end) = holder
        .await
        .unwrap()
        .expect("no lease lapses across SCRIPT FLUSH");
    assert!(
        at_end >= at_flush + 3,
        "renewals stalled after SCRIPT FLUSH: {at_flush} then {at_end}"
    );
    assert_eq!(
        get(&server, "flush:1").await,
        None,
        "released after the flush"
    );

    assert_eq!(server.command(&["SCRIPT", "FLUSH"]), redis::Value::Okay);
    let fence = locks
        .run_locked("flush:2", opts(600).fencing(true), async {
            LockContext::current().unwrap().fencing_token()
        })
        .await
        .expect("the acquire script is reloaded too");
    assert!(fence.is_some());
    eprintln!("SCRIPT FLUSH: renewals went from {at_flush} to {at_end} within 1 s after the flush");
    let _ = server.command(&["DEL", "lockmacro:fence:flush:2"]);
    assert_clean(&server, &locks, "flush:*").await;
}

// ---------------------------------------------------------------------------------------------
// Load
// ---------------------------------------------------------------------------------------------

/// 10 000 leases of 3 s held together for 20 s with unlimited renewals (about twenty renewals
/// each): none lapses, the client uses a handful of connections, and memory per lease is small.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_leases_for_twenty_seconds_none_lapses() {
    const LEASES: usize = 10_000;
    const HOLD: Duration = Duration::from_secs(20);
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.unwrap();
    // Warm up what every lease shares (the watchdog and its connection), so RSS counts leases.
    locks
        .run_locked("load:warmup", opts(300), async {
            tokio::time::sleep(Duration::from_millis(150)).await;
        })
        .await
        .unwrap();
    let baseline_clients = connected_clients(&server);
    let rss_before = rss_kib();

    let held = Arc::new(AtomicUsize::new(0));
    let renewals = Arc::new(AtomicU32::new(0));
    let release_at = tokio::time::Instant::now() + HOLD;
    let options = opts(3_000).unlimited_renewals();
    let mut holders = tokio::task::JoinSet::new();
    for n in 0..LEASES {
        let (locks, held, renewals) = (locks.clone(), held.clone(), renewals.clone());
        holders.spawn(async move {
            locks
                .run_locked(format!("load:{n}"), options, async move {
                    held.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep_until(release_at).await;
                    let lock = LockContext::current().unwrap();
                    renewals.fetch_add(lock.renewals(), Ordering::SeqCst);
                })
                .await
        });
    }
    let all_held = eventually(Duration::from_secs(10), "10 000 leases held", || async {
        held.load(Ordering::SeqCst) == LEASES
    })
    .await;
    let rss_held = rss_kib();
    assert_eq!(locks.held_leases(), LEASES);
    assert_eq!(scan_keys(&server, "load:*").await.len(), LEASES);
    let clients = connected_clients(&server);
    assert!(
        clients <= baseline_clients + 2,
        "{clients} connections for 10 000 leases (baseline {baseline_clients})"
    );

    let mut lapses = 0;
    while let Some(outcome) = holders.join_next().await {
        if outcome.unwrap().is_err() {
            lapses += 1;
        }
    }
    let per_lease = (rss_held.saturating_sub(rss_before)) as f64 / LEASES as f64;
    let mean_renewals = f64::from(renewals.load(Ordering::SeqCst)) / LEASES as f64;
    eprintln!(
        "10k leases: all held after {all_held:?}; {lapses} lapses; {mean_renewals:.1} renewals each; {clients} server connections (baseline {baseline_clients}); RSS {rss_before} -> {rss_held} KiB = {per_lease:.2} KiB per lease"
    );
    assert_eq!(lapses, 0, "leases lapsed under load");
    assert!(mean_renewals >= 15.0, "{mean_renewals}");
    assert!(per_lease < 16.0, "{per_lease:.2} KiB per lease");
    assert_clean(&server, &locks, "load:*").await;
}

/// Retries taking `key` until it works (within `within`); returns how long that took and how
/// many attempts were answered `Busy`.
async fn retry_until_taken(locks: &LockClient, key: &str, within: Duration) -> (Duration, u32) {
    let busy = std::cell::Cell::new(0);
    let took = eventually(within, "the client takes the key again", || async {
        match locks.run_locked(key, opts(1_000), async {}).await {
            Ok(()) => true,
            Err(LockError::Busy { .. }) => {
                busy.set(busy.get() + 1);
                false
            }
            Err(_) => false,
        }
    })
    .await;
    (took, busy.get())
}
