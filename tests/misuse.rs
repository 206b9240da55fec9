//! Reachable misuse: waiting forever, a tokio runtime built without timers, no runtime at all.

mod common;

use std::future::Future;
use std::time::Duration;

use common::{fast_client, opts};
use lockmacro_runtime::{LockClient, LockError};
use testkit::RedisServer;

/// `wait(Duration::MAX)`, the usual "wait forever", waits: no overflow adding it to now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_forever_waits_for_the_release() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let holder = locks.acquire("forever:1", opts(30_000)).await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked("forever:1", opts(5_000).wait(Duration::MAX), async { 7 })
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder.release().await.unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter takes the lock once it is released")
        .expect("no panic");
    assert_eq!(outcome.unwrap(), 7);
}

/// A runtime built without the time driver: tokio's own panic, which names the builder call to
/// add, as documented under `# Panics`. The library does not probe for it (that would mean
/// silencing the application's panic hook), and returns no error of its own.
#[test]
fn a_runtime_without_timers_panics_with_tokios_message_naming_enable_time() {
    let server = RedisServer::start();
    let url = server.url();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let panic = std::thread::spawn(move || {
        runtime.block_on(async {
            let locks = LockClient::builder(&url).build_lazy().unwrap();
            locks.run_locked("no-timers:1", opts(5_000), async {}).await
        })
    })
    .join()
    .expect_err("tokio panics at the first timer");
    let message = panic
        .downcast_ref::<&str>()
        .map(|message| message.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_default();
    assert!(message.contains("enable_time"), "{message}");
}

/// Outside any tokio runtime, a locked call is an error that says what it needs, not a panic.
#[test]
fn outside_a_tokio_runtime_is_a_config_error() {
    let locks = LockClient::builder("redis://127.0.0.1:1")
        .build_lazy()
        .unwrap();
    // Polled once, by hand: no runtime may be around.
    let call = std::pin::pin!(locks.run_locked("no-runtime:1", opts(5_000), async {}));
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    let std::task::Poll::Ready(outcome) = call.poll(&mut context) else {
        panic!("the call should fail at once, before any I/O");
    };
    match outcome {
        Err(LockError::Config { message }) => assert!(message.contains("tokio"), "{message}"),
        other => panic!("expected a Config error, got {other:?}"),
    }
}

/// A `hold_at_least` given as an expression that turns out zero when called is refused with
/// `InvalidOptions`, as a zero `ttl` is, before any I/O, and the body never runs.
#[tokio::test]
async fn a_zero_hold_at_least_given_at_run_time_is_refused_before_any_io() {
    struct Job {
        locks: LockClient,
        hold: Duration,
    }
    impl Job {
        #[lockmacro_runtime::redis_lock(prefix = "zero", client = self.locks, hold_at_least = self.hold)]
        async fn run(&self, ran: &std::sync::atomic::AtomicBool) -> Result<(), LockError> {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }
    let job = Job {
        locks: LockClient::builder("redis://127.0.0.1:1")
            .build_lazy()
            .unwrap(),
        hold: Duration::ZERO,
    };
    let ran = std::sync::atomic::AtomicBool::new(false);
    match job.run(&ran).await {
        Err(LockError::InvalidOptions { message }) => {
            assert!(message.contains("`hold_at_least` is zero"), "{message}");
        }
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the body never ran"
    );
}

/// A `ttl` given as an expression that turns out zero when called is refused with
/// `InvalidOptions` before any I/O (nothing listens on port 1) and the body never runs.
#[tokio::test]
async fn a_zero_ttl_given_at_run_time_is_refused_before_any_io() {
    struct Service {
        locks: LockClient,
        ttl: Duration,
    }
    impl Service {
        #[lockmacro_runtime::redis_lock(prefix = "zero", key = id, client = self.locks, ttl = self.ttl)]
        async fn work(
            &self,
            id: u32,
            ran: &std::sync::atomic::AtomicBool,
        ) -> Result<u32, LockError> {
            ran.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(id)
        }
    }
    let service = Service {
        locks: LockClient::builder("redis://127.0.0.1:1")
            .build_lazy()
            .unwrap(),
        ttl: Duration::ZERO,
    };
    let ran = std::sync::atomic::AtomicBool::new(false);
    match service.work(7, &ran).await {
        Err(LockError::InvalidOptions { message }) => assert!(message.contains("ttl"), "{message}"),
        other => panic!("expected InvalidOptions, got {other:?}"),
    }
    assert!(
        !ran.load(std::sync::atomic::Ordering::SeqCst),
        "the body never ran"
    );
}

/// Programmatic options are refused as the attribute refuses them, with `InvalidOptions`,
/// before any I/O (nothing listens on port 1), for every entry point. Regression: a zero ttl
/// was raised to 1 ms and ended in `Lost`, `Duration::MAX` reached Redis as a raw error, a ttl
/// under the drift margin ended in `Lost` with the work never run, and a zero `wait` or
/// `hold_at_least` was taken silently (the attribute refuses both).
#[tokio::test]
async fn programmatic_options_are_refused_as_the_attribute_refuses_them() {
    use lockmacro_runtime::{LockOptions, MAX_TTL, MIN_TTL};
    let locks = LockClient::builder("redis://127.0.0.1:1")
        .build_lazy()
        .unwrap();
    let base = LockOptions::new();
    let refused = [
        (base.ttl(Duration::ZERO), "`ttl` is zero"),
        (base.ttl(Duration::from_millis(2)), "drift margin"),
        (base.ttl(Duration::MAX), "longer than a lease may be"),
        (base.ttl(MAX_TTL + Duration::from_secs(1)), "longer"),
        (base.wait(Duration::ZERO), "leave `wait` out"),
        (
            base.hold_at_least(Duration::ZERO),
            "`hold_at_least` is zero",
        ),
        (base.hold_at_least(Duration::MAX), "`hold_at_least`"),
        (base.permits(0), "`permits`"),
    ];
    for (options, says) in refused {
        let ran = std::sync::atomic::AtomicBool::new(false);
        let outcomes = [
            locks
                .run_locked("refused:1", options, async {
                    ran.store(true, std::sync::atomic::Ordering::SeqCst)
                })
                .await
                .map(drop),
            locks.acquire("refused:1", options).await.map(drop),
            locks
                .acquire_many(["refused:1", "refused:2"], options)
                .await
                .map(drop),
        ];
        for outcome in outcomes {
            match outcome {
                Err(LockError::InvalidOptions { message }) => {
                    assert!(message.contains(says), "{options:?}: {message}");
                }
                other => panic!("{options:?}: expected InvalidOptions, got {other:?}"),
            }
        }
        assert!(
            !ran.load(std::sync::atomic::Ordering::SeqCst),
            "{options:?}"
        );
    }
    // The bounds themselves are taken (refused here only because nothing listens).
    for options in [base.ttl(MIN_TTL), base.ttl(MAX_TTL).hold_at_least(MAX_TTL)] {
        let outcome = locks.acquire("bounds:1", options).await;
        assert!(
            matches!(outcome, Err(LockError::Redis { .. })),
            "{options:?}: {outcome:?}"
        );
    }
}

/// Refused options are refused inside a lock already held too: a nested call does not skip
/// the check by re-entering.
#[tokio::test]
async fn refused_options_are_refused_when_reentering() {
    let locks = LockClient::in_memory();
    let nested = locks
        .run_locked("nested:1", opts(5_000), async {
            locks
                .run_locked("nested:1", opts(5_000).wait(Duration::ZERO), async {})
                .await
        })
        .await
        .unwrap();
    assert!(
        matches!(nested, Err(LockError::InvalidOptions { .. })),
        "{nested:?}"
    );
}
