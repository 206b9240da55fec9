//! The metrics (feature `metrics`): a debugging recorder installed for the whole process (the
//! watchdog records from its own thread) sees each metric move as DESIGN.md says, labelled by
//! prefix and never by key.
#![cfg(feature = "metrics")]

mod common;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use common::{eventually, fast_client, get, key_gone, opts};
use lockmacro_runtime::{LockClient, LockError, LockOptions, redis_lock};
use metrics::Unit;
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redis::AsyncCommands;
use testkit::RedisServer;

/// What the recorder has seen so far. Each snapshot drains the recorder (counters and gauges
/// back to zero, histograms emptied), so the totals are kept here; the library only ever
/// increments its gauges, so their changes add up too.
struct Recorded {
    snapshotter: Snapshotter,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    counters: HashMap<String, u64>,
    gauges: HashMap<String, f64>,
    samples: HashMap<String, Vec<f64>>,
    units: HashMap<String, Option<Unit>>,
    described: HashMap<String, bool>,
}

/// The process's recorder, installed by the first test that asks for it.
fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in this test binary");
        Recorded {
            snapshotter,
            seen: Mutex::default(),
        }
    })
}

/// `name{label=value,…}` with labels sorted.
fn series(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

impl Recorded {
    fn update(&self) -> std::sync::MutexGuard<'_, Seen> {
        let mut seen = self.seen.lock().unwrap();
        for (key, unit, description, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let pairs: Vec<(&str, &str)> = labels
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let name = series(key.name(), &pairs);
            seen.units.insert(key.name().to_owned(), unit);
            seen.described
                .insert(key.name().to_owned(), description.is_some());
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => {
                    *seen.counters.entry(name).or_default() += n;
                }
                (MetricKind::Gauge, DebugValue::Gauge(g)) => {
                    *seen.gauges.entry(name).or_default() += g.into_inner();
                }
                (MetricKind::Histogram, DebugValue::Histogram(values)) => seen
                    .samples
                    .entry(name)
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
                other => panic!("unexpected metric value {other:?}"),
            }
        }
        seen
    }

    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        let seen = self.update();
        seen.counters
            .get(&series(name, labels))
            .copied()
            .unwrap_or(0)
    }

    fn gauge(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let seen = self.update();
        seen.gauges
            .get(&series(name, labels))
            .copied()
            .unwrap_or(0.0)
    }

    fn samples(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        let seen = self.update();
        seen.samples
            .get(&series(name, labels))
            .cloned()
            .unwrap_or_default()
    }
}

/// Waits until the counter reaches `at_least` (the watchdog records on its own thread).
async fn counter_reaches(name: &str, labels: &[(&str, &str)], at_least: u64) {
    let what = format!("{} ≥ {at_least}", series(name, labels));
    eventually(Duration::from_secs(10), &what, || async {
        recorded().counter(name, labels) >= at_least
    })
    .await;
}

async fn gauge_reaches(name: &str, labels: &[(&str, &str)], value: f64) {
    let what = format!("{} = {value}", series(name, labels));
    eventually(Duration::from_secs(10), &what, || async {
        recorded().gauge(name, labels) == value
    })
    .await;
}

async fn sample_count_reaches(name: &str, labels: &[(&str, &str)], count: usize) {
    let what = format!("{} has {count} samples", series(name, labels));
    eventually(Duration::from_secs(10), &what, || async {
        recorded().samples(name, labels).len() >= count
    })
    .await;
}

#[tokio::test]
async fn every_metric_is_described_with_its_unit() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    // A call of each sort makes every metric exist.
    locks
        .run_locked(
            "described:1",
            opts(300).max_renewals(1),
            std::future::pending::<()>(),
        )
        .await
        .expect_err("work that never ends runs out of renewals");
    locks
        .run_locked(
            "described:2",
            opts(1000).wait(Duration::from_secs(1)),
            async {},
        )
        .await
        .unwrap();
    let held = locks.acquire("described:3", opts(5000)).await.unwrap();
    let waited = locks
        .run_locked(
            "described:3",
            opts(1000).wait(Duration::from_millis(50)),
            async {},
        )
        .await;
    assert!(matches!(waited, Err(LockError::Busy { .. })), "{waited:?}");
    held.release().await.unwrap();
    sample_count_reaches("lockmacro_redis_seconds", &[("op", "extend")], 1).await;
    let seen = recorded.update();
    for (name, unit) in [
        ("lockmacro_acquisitions_total", Unit::Count),
        ("lockmacro_wait_seconds", Unit::Seconds),
        ("lockmacro_held_seconds", Unit::Seconds),
        ("lockmacro_renewals_total", Unit::Count),
        ("lockmacro_releases_total", Unit::Count),
        ("lockmacro_redis_seconds", Unit::Seconds),
        ("lockmacro_leases", Unit::Count),
        ("lockmacro_waiters", Unit::Count),
    ] {
        assert_eq!(seen.units.get(name), Some(&Some(unit)), "unit of {name}");
        assert_eq!(
            seen.described.get(name),
            Some(&true),
            "description of {name}"
        );
    }
    // Labels are bounded: the prefix, never the key.
    let keys_in_labels: Vec<&String> = seen
        .counters
        .keys()
        .chain(seen.gauges.keys())
        .chain(seen.samples.keys())
        .filter(|series| series.contains("described:"))
        .collect();
    assert!(keys_in_labels.is_empty(), "{keys_in_labels:?}");
}

#[tokio::test]
async fn a_call_counts_once_holds_a_lease_and_ends_ok() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let prefix = [("prefix", "okcall")];
    locks
        .run_locked("okcall:1", opts(1000), async {
            assert_eq!(recorded.gauge("lockmacro_leases", &prefix), 1.0);
        })
        .await
        .unwrap();
    let acquired = [("prefix", "okcall"), ("outcome", "acquired")];
    assert_eq!(
        recorded.counter("lockmacro_acquisitions_total", &acquired),
        1
    );
    assert_eq!(recorded.gauge("lockmacro_leases", &prefix), 0.0);
    let ended = [("prefix", "okcall"), ("end", "ok")];
    assert_eq!(recorded.samples("lockmacro_held_seconds", &ended).len(), 1);
    let confirmed = [("prefix", "okcall"), ("result", "confirmed")];
    assert_eq!(recorded.counter("lockmacro_releases_total", &confirmed), 1);
    assert!(
        !recorded
            .samples("lockmacro_redis_seconds", &[("op", "acquire")])
            .is_empty()
    );
    assert!(
        !recorded
            .samples("lockmacro_redis_seconds", &[("op", "release")])
            .is_empty()
    );
    // No `wait` asked: no wait recorded.
    assert!(
        recorded
            .samples("lockmacro_wait_seconds", &prefix)
            .is_empty()
    );
}

#[tokio::test]
async fn busy_calls_and_waits_are_counted_and_timed() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let prefix = [("prefix", "waits")];

    // Taken at once with `wait` set: a wait of zero.
    locks
        .run_locked(
            "waits:free",
            opts(1000).wait(Duration::from_secs(1)),
            async {},
        )
        .await
        .unwrap();
    assert_eq!(
        recorded.samples("lockmacro_wait_seconds", &prefix),
        vec![0.0]
    );

    let held = locks.acquire("waits:1", opts(5000)).await.unwrap();
    let busy = locks.run_locked("waits:1", opts(1000), async {}).await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    let busy = [("prefix", "waits"), ("outcome", "busy")];
    assert_eq!(recorded.counter("lockmacro_acquisitions_total", &busy), 1);

    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let options = opts(1000).wait(Duration::from_secs(10));
            locks.run_locked("waits:1", options, async {}).await
        }
    });
    gauge_reaches("lockmacro_waiters", &prefix, 1.0).await;
    tokio::time::sleep(Duration::from_millis(50)).await; // a wait long enough to measure
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    assert_eq!(recorded.gauge("lockmacro_waiters", &prefix), 0.0);
    let waits = recorded.samples("lockmacro_wait_seconds", &prefix);
    assert_eq!(waits.len(), 2, "{waits:?}");
    assert!(
        waits[1] >= 0.05,
        "the waiter waited at least 50 ms: {waits:?}"
    );
}

#[tokio::test]
async fn an_unreachable_redis_counts_as_an_error() {
    let recorded = recorded();
    let mut server = RedisServer::start();
    let locks = fast_client(&server).await;
    server.kill();
    let outcome = locks
        .run_locked("unreachable:1", opts(1000), async {})
        .await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    let error = [("prefix", "unreachable"), ("outcome", "error")];
    assert_eq!(recorded.counter("lockmacro_acquisitions_total", &error), 1);
}

#[tokio::test]
async fn renewals_are_counted_until_they_run_out() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let outcome = locks
        .run_locked(
            "renewed:1",
            opts(300).max_renewals(2),
            std::future::pending::<()>(),
        )
        .await;
    assert!(
        matches!(outcome, Err(LockError::RenewalsExhausted { .. })),
        "{outcome:?}"
    );
    let ok = [("prefix", "renewed"), ("result", "ok")];
    assert_eq!(recorded.counter("lockmacro_renewals_total", &ok), 2);
    let exhausted = [("prefix", "renewed"), ("end", "exhausted")];
    assert_eq!(
        recorded.samples("lockmacro_held_seconds", &exhausted).len(),
        1
    );
    assert!(
        !recorded
            .samples("lockmacro_redis_seconds", &[("op", "extend")])
            .is_empty()
    );
}

#[tokio::test]
async fn a_lease_taken_away_counts_as_lost() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let lease = locks.acquire("taken:1", opts(1000)).await.unwrap();
    let mut raw = server.connection().await;
    let _: () = raw.set("taken:1", "someone else").await.unwrap();
    let outcome = lease.run(std::future::pending::<()>()).await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
    let lost = [("prefix", "taken"), ("result", "lost")];
    assert_eq!(recorded.counter("lockmacro_renewals_total", &lost), 1);
    let ended = [("prefix", "taken"), ("end", "lost")];
    assert_eq!(recorded.samples("lockmacro_held_seconds", &ended).len(), 1);
    drop(lease);
    assert_eq!(
        get(&server, "taken:1").await.as_deref(),
        Some("someone else")
    );
}

#[tokio::test]
async fn failed_renewals_are_counted_while_redis_is_frozen() {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url())
        .scan_interval(Duration::from_millis(100))
        .response_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap();
    let lease = locks.acquire("frozen:1", opts(3000)).await.unwrap();
    server.pause();
    let failed = [("prefix", "frozen"), ("result", "failed")];
    counter_reaches("lockmacro_renewals_total", &failed, 1).await;
    server.resume();
    let ok = [("prefix", "frozen"), ("result", "ok")];
    counter_reaches("lockmacro_renewals_total", &ok, 1).await;
    lease.release().await.unwrap();
}

#[tokio::test]
async fn dropped_work_ends_cancelled_and_is_released_in_the_background() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let work = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked("dropped:1", opts(5000), async {
                    started_tx.send(()).unwrap();
                    std::future::pending::<()>().await;
                })
                .await
        }
    });
    started_rx.await.unwrap();
    work.abort();
    let _ = work.await;
    key_gone(&server, "dropped:1", Duration::from_secs(5)).await;
    let ended = [("prefix", "dropped"), ("end", "cancelled")];
    assert_eq!(recorded.samples("lockmacro_held_seconds", &ended).len(), 1);
    let background = [("prefix", "dropped"), ("result", "background")];
    assert_eq!(recorded.counter("lockmacro_releases_total", &background), 1);
    gauge_reaches("lockmacro_leases", &[("prefix", "dropped")], 0.0).await;
}

struct Reports {
    locks: LockClient,
}

/// A service's own error type, as users write them.
#[derive(Debug)]
enum ReportError {
    Lock(#[allow(dead_code)] LockError),
    Empty,
}

impl From<LockError> for ReportError {
    fn from(error: LockError) -> Self {
        Self::Lock(error)
    }
}

impl Reports {
    #[redis_lock(prefix = "reports", key = day, ttl = 5, client = self.locks)]
    async fn build(&self, day: u32, fail: bool) -> Result<u32, ReportError> {
        if fail {
            return Err(ReportError::Empty);
        }
        Ok(day)
    }

    #[redis_lock(prefix = "panics", key = day, ttl = 5, client = self.locks)]
    async fn panic(&self, day: u32) -> Result<(), LockError> {
        panic!("work for day {day} panicked");
    }
}

#[tokio::test]
async fn the_attribute_labels_by_its_prefix_and_judges_errors_and_panics() {
    let recorded = recorded();
    let server = RedisServer::start();
    let reports = std::sync::Arc::new(Reports {
        locks: fast_client(&server).await,
    });
    assert_eq!(reports.build(7, false).await.unwrap(), 7);
    assert!(matches!(
        reports.build(7, true).await,
        Err(ReportError::Empty)
    ));
    let ok = [("prefix", "reports"), ("end", "ok")];
    let err = [("prefix", "reports"), ("end", "err")];
    assert_eq!(recorded.samples("lockmacro_held_seconds", &ok).len(), 1);
    assert_eq!(recorded.samples("lockmacro_held_seconds", &err).len(), 1);
    let acquired = [("prefix", "reports"), ("outcome", "acquired")];
    assert_eq!(
        recorded.counter("lockmacro_acquisitions_total", &acquired),
        2
    );

    let panicked = tokio::spawn({
        let reports = reports.clone();
        async move { reports.panic(1).await }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let ended = [("prefix", "panics"), ("end", "panic")];
    assert_eq!(recorded.samples("lockmacro_held_seconds", &ended).len(), 1);
}

#[tokio::test]
async fn a_programmatic_key_is_labelled_by_its_part_before_the_first_colon() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    locks
        .run_locked("orders:eu:42", LockOptions::new(), async {})
        .await
        .unwrap();
    let acquired = [("prefix", "orders"), ("outcome", "acquired")];
    assert_eq!(
        recorded.counter("lockmacro_acquisitions_total", &acquired),
        1
    );
}

/// A programmatic key without `:` is no label of its own (one series per key would be
/// unbounded): it is counted under the fixed prefix `(none)`.
#[tokio::test]
async fn a_programmatic_key_without_a_colon_is_labelled_none_not_by_key() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    for day in ["nightly-report-2026-11-24", "nightly-report-2026-11-25"] {
        locks.run_locked(day, opts(1000), async {}).await.unwrap();
    }
    let acquired = [("prefix", "(none)"), ("outcome", "acquired")];
    assert!(recorded.counter("lockmacro_acquisitions_total", &acquired) >= 2);
    let seen = recorded.update();
    let by_key: Vec<_> = seen
        .counters
        .keys()
        .filter(|series| series.contains("nightly-report"))
        .collect();
    assert!(by_key.is_empty(), "{by_key:?}");
}
