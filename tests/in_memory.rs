//! The in-memory deployment (`LockClient::in_memory`, feature `test-util`) as users' tests use
//! it: a service method under `#[redis_lock]` tested under paused time, independent stores, and
//! the hooks that provoke the rare paths.

use std::time::Duration;

use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions, redis_lock};

/// A service as users write one: its locks come from a field, so a test hands it an in-memory
/// client.
struct Reports {
    locks: LockClient,
}

impl Reports {
    /// Rebuilds a report under a 30 s lease renewed at most three times.
    #[redis_lock(prefix = "reports", key = day, ttl = 30, max_renewals = 3, client = self.locks)]
    async fn rebuild(&self, day: u32) -> Result<u32, LockError> {
        // Takes longer than four leases of 30 s: cancelled when the renewals run out.
        tokio::time::sleep(Duration::from_secs(600)).await;
        Ok(day)
    }
}

/// The README's example: a 30 s lease renewed exactly three times, then `RenewalsExhausted`,
/// in paused time, so the whole test takes milliseconds of real time.
#[tokio::test(start_paused = true)]
async fn a_service_method_runs_out_of_renewals_in_no_real_time() {
    let real = std::time::Instant::now();
    let reports = Reports {
        locks: LockClient::in_memory(),
    };
    let started = tokio::time::Instant::now();
    let outcome = reports.rebuild(7).await;
    assert!(
        matches!(outcome, Err(LockError::RenewalsExhausted { renewals: 3, ref key }) if key == "reports:7"),
        "{outcome:?}"
    );
    // Each renewal is sent a third into its lease: the last lease ends 3 × 10 s + 30 s − drift in.
    let lasted = started.elapsed();
    assert!(
        lasted >= Duration::from_secs(59) && lasted <= Duration::from_secs(70),
        "{lasted:?}"
    );
    let hooks = reports.locks.memory_hooks().unwrap();
    assert_eq!(hooks.holder("reports:7"), None, "released before returning");
    let real = real.elapsed();
    eprintln!("a minute of leases in {real:?} of real time");
    assert!(real < Duration::from_secs(5), "{real:?}");
}

/// Clones share one store; two `in_memory()` clients are two stores, as two servers would be.
#[tokio::test(start_paused = true)]
async fn clones_share_a_store_and_two_in_memory_clients_do_not() {
    let locks = LockClient::in_memory();
    let clone = locks.clone();
    let other = LockClient::in_memory();
    let held = locks.acquire("shared:1", LockOptions::new()).await.unwrap();
    let busy = clone
        .run_locked("shared:1", LockOptions::new(), async {})
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    other
        .run_locked("shared:1", LockOptions::new(), async {})
        .await
        .expect("another store knows nothing of it");
    held.release().await.unwrap();
}

/// `expire` frees a key at once: a waiter takes it (going by the holder's remaining lease, as an
/// expiry announces nothing), and the old holder learns `Lost` at its next renewal.
#[tokio::test(start_paused = true)]
async fn an_expired_key_goes_to_the_waiter_and_its_holder_is_told() {
    let locks = LockClient::in_memory();
    let hooks = locks.memory_hooks().unwrap();
    let holder = locks
        .acquire(
            "expiring:1",
            LockOptions::new().ttl(Duration::from_secs(30)),
        )
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let options = LockOptions::new().wait(Duration::from_secs(120));
            locks
                .run_locked("expiring:1", options, async { tokio::time::Instant::now() })
                .await
        }
    });
    while hooks.listeners("expiring:1") == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    hooks.expire("expiring:1");
    let expired_at = tokio::time::Instant::now();
    let taken_at = waiter.await.unwrap().unwrap();
    // The waiter sleeps the holder's remaining lease (≤ 30 s), jittered by up to 5 %.
    assert!(
        taken_at - expired_at <= Duration::from_secs(30).mul_f64(1.05) + Duration::from_millis(10),
        "{:?}",
        taken_at - expired_at
    );
    let outcome = holder.run(std::future::pending::<()>()).await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
}

/// `take_over` hands the key to another owner: the holder is told `Lost` at its next renewal,
/// and its release leaves the other owner's key alone.
#[tokio::test(start_paused = true)]
async fn a_key_taken_over_is_lost_and_left_to_its_new_owner() {
    let locks = LockClient::in_memory();
    let hooks = locks.memory_hooks().unwrap();
    let other = std::sync::Mutex::new(None);
    let outcome = locks
        .run_locked("taken:1", LockOptions::new().unlimited_renewals(), async {
            *other.lock().unwrap() = Some(hooks.take_over("taken:1", Duration::from_secs(300)));
            tokio::time::sleep(Duration::from_secs(3_600)).await;
        })
        .await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
    let other = other
        .lock()
        .unwrap()
        .clone()
        .expect("the other owner's token");
    assert_eq!(
        hooks.holder("taken:1"),
        Some(other),
        "left to its new owner"
    );
}

/// `fail_next` makes the store fail as an unreachable Redis would: an acquire is a `Redis` error
/// and the work never runs; a failed renewal is retried before the lease's deadline.
#[tokio::test(start_paused = true)]
async fn injected_failures_fail_acquires_and_renewals_are_retried() {
    let locks = LockClient::in_memory();
    let hooks = locks.memory_hooks().unwrap();
    hooks.fail_next(1);
    let ran = std::sync::atomic::AtomicBool::new(false);
    let outcome = locks
        .run_locked("failing:1", LockOptions::new(), async {
            ran.store(true, std::sync::atomic::Ordering::SeqCst)
        })
        .await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    let renewals = locks
        .run_locked(
            "failing:2",
            LockOptions::new().unlimited_renewals(),
            async {
                // The first renewal (10 s in) fails twice; the watchdog retries before the deadline.
                tokio::time::sleep(Duration::from_secs(9)).await;
                hooks.fail_next(2);
                tokio::time::sleep(Duration::from_secs(60)).await;
                LockContext::current().unwrap().renewals()
            },
        )
        .await
        .expect("the lease survives two failed renewals");
    assert!(renewals >= 5, "{renewals}");
}

/// An in-memory default client serves one runtime after another (one per `#[tokio::test]`):
/// its watchdog starts again on each.
#[test]
fn an_in_memory_default_client_serves_runtimes_in_turn() {
    lockmacro_runtime::set_default_client(LockClient::in_memory());
    #[redis_lock(prefix = "rounds", key = round, ttl = "300ms", max_renewals = unlimited)]
    async fn round(round: u32) -> Result<u32, LockError> {
        tokio::time::sleep(Duration::from_secs(2)).await;
        Ok(LockContext::current().unwrap().renewals())
    }
    for n in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let renewals = runtime.block_on(round(n)).unwrap();
        assert!(renewals >= 5, "round {n}: {renewals}");
    }
}

/// A job under `hold_at_least = "5m"`, as a scheduled job's test writes it: under paused time
/// the five minutes pass at once, to the millisecond. The job ends at once; the key is kept
/// (busy for another instance) until five minutes after it was taken, then free.
#[tokio::test(start_paused = true)]
async fn a_five_minute_hold_passes_in_no_real_time() {
    struct Job {
        locks: LockClient,
    }
    impl Job {
        #[redis_lock(prefix = "jobs", key = "report", hold_at_least = "5m", client = self.locks)]
        async fn run(&self) -> Result<String, LockError> {
            Ok(LockContext::current().unwrap().token().to_owned())
        }
    }
    let real = std::time::Instant::now();
    let job = Job {
        locks: LockClient::in_memory(),
    };
    let hooks = job.locks.memory_hooks().unwrap();
    let started = tokio::time::Instant::now();
    let token = job.run().await.unwrap();
    assert_eq!(
        hooks.holder("jobs:report"),
        Some(token),
        "kept after the job"
    );
    assert!(matches!(job.run().await, Err(LockError::Busy { .. })));
    tokio::time::sleep_until(started + Duration::from_secs(300) - Duration::from_millis(1)).await;
    assert!(
        hooks.holder("jobs:report").is_some(),
        "kept for five minutes"
    );
    tokio::time::sleep_until(started + Duration::from_secs(300)).await;
    assert_eq!(
        hooks.holder("jobs:report"),
        None,
        "free when the hold is over"
    );
    job.run().await.expect("the next period runs");
    assert!(
        real.elapsed() < Duration::from_secs(5),
        "{:?}",
        real.elapsed()
    );
}
