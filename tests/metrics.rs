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

/// [`opts`] labelled `label` for the metrics: a programmatic key's label is `(none)` without it.
fn labelled(label: &'static str, ttl_ms: u64) -> LockOptions {
    opts(ttl_ms).label(label)
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
            labelled("described", 300).max_renewals(1),
            std::future::pending::<()>(),
        )
        .await
        .expect_err("work that never ends runs out of renewals");
    locks
        .run_locked(
            "described:2",
            labelled("described", 1000).wait(Duration::from_secs(1)),
            async {},
        )
        .await
        .unwrap();
    let held = locks
        .acquire("described:3", labelled("described", 5000))
        .await
        .unwrap();
    let waited = locks
        .run_locked(
            "described:3",
            labelled("described", 1000).wait(Duration::from_millis(50)),
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
        .run_locked("okcall:1", labelled("okcall", 1000), async {
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
            labelled("waits", 1000).wait(Duration::from_secs(1)),
            async {},
        )
        .await
        .unwrap();
    assert_eq!(
        recorded.samples("lockmacro_wait_seconds", &prefix),
        vec![0.0]
    );

    let held = locks
        .acquire("waits:1", labelled("waits", 5000))
        .await
        .unwrap();
    let busy = locks
        .run_locked("waits:1", labelled("waits", 1000), async {})
        .await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    let busy = [("prefix", "waits"), ("outcome", "busy")];
    assert_eq!(recorded.counter("lockmacro_acquisitions_total", &busy), 1);

    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let options = labelled("waits", 1000).wait(Duration::from_secs(10));
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
async fn key_lists_record_their_waits_as_one_key_does() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let prefix = [("prefix", "listwaits")];
    let options = labelled("listwaits", 1000).wait(Duration::from_secs(10));

    // Free keys taken at once with `wait` set: a wait of zero, not the call's time.
    locks
        .run_locked_many(["listwaits:a", "listwaits:b"], options, async {})
        .await
        .unwrap();
    assert_eq!(
        recorded.samples("lockmacro_wait_seconds", &prefix),
        vec![0.0]
    );

    let held = locks
        .acquire("listwaits:b", labelled("listwaits", 5000))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move { (locks.run_locked_many(["listwaits:a", "listwaits:b"], options, async {})).await }
    });
    gauge_reaches("lockmacro_waiters", &prefix, 1.0).await;
    tokio::time::sleep(Duration::from_millis(50)).await; // a wait long enough to measure
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
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
        .run_locked("unreachable:1", labelled("unreachable", 1000), async {})
        .await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    let error = [("prefix", "unreachable"), ("outcome", "error")];
    assert_eq!(recorded.counter("lockmacro_acquisitions_total", &error), 1);
}

/// A waiting call whose Redis is away looks again until its wait runs out, each look counted
/// with its reason; it still counts once, as an error, when the wait ends with Redis gone.
#[tokio::test]
async fn looks_made_again_through_an_outage_are_counted_by_reason() {
    let recorded = recorded();
    let mut server = RedisServer::start();
    let locks = fast_client(&server).await;
    server.kill();
    let outcome = locks
        .run_locked(
            "outage:1",
            labelled("outage", 1000).wait(Duration::from_millis(300)),
            async {},
        )
        .await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    let again = [("prefix", "outage"), ("reason", "unreachable")];
    assert!(
        recorded.counter("lockmacro_looks_again_total", &again) >= 2,
        "a 300 ms wait looks again every 25-50 ms at first"
    );
    let error = [("prefix", "outage"), ("outcome", "error")];
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
            labelled("renewed", 300).max_renewals(2),
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
    let lease = locks
        .acquire("taken:1", labelled("taken", 1000))
        .await
        .unwrap();
    let mut raw = server.connection().await;
    let _: () = raw.set("taken:1", "someone else").await.unwrap();
    let outcome = lease.run(std::future::pending::<()>()).await;
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
    // Every loss ends its hold as `lost`. The renewal that finds it counts a `lost` renewal;
    // the client's release subscription, when it opens after the key was taken, may find it
    // first (it looks at every lease's key), and a look is not a renewal: under a CPU hog it
    // opened late and did, once.
    let ended = [("prefix", "taken"), ("end", "lost")];
    assert_eq!(recorded.samples("lockmacro_held_seconds", &ended).len(), 1);
    let lost = [("prefix", "taken"), ("result", "lost")];
    assert!(recorded.counter("lockmacro_renewals_total", &lost) <= 1);
    let failed = [("prefix", "taken"), ("result", "failed")];
    assert_eq!(recorded.counter("lockmacro_renewals_total", &failed), 0);
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
    let lease = locks
        .acquire("frozen:1", labelled("frozen", 3000))
        .await
        .unwrap();
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
                .run_locked("dropped:1", labelled("dropped", 5000), async {
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

/// A programmatic key is labelled as its options say (`LockOptions::label`), else `(none)`:
/// never a part of the key. Regression: its first `:` segment was the label, so
/// `tenant0:order:3` made one series per tenant.
#[tokio::test]
async fn a_programmatic_key_is_labelled_as_its_options_say_never_by_a_part_of_it() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    for tenant in 0..3 {
        let key = format!("tenant{tenant}:order:3");
        let options = LockOptions::new().label("orders");
        locks
            .run_locked(key.as_str(), options, async {})
            .await
            .unwrap();
        locks
            .run_locked(key.as_str(), LockOptions::new(), async {})
            .await
            .unwrap();
    }
    let acquired = [("prefix", "orders"), ("outcome", "acquired")];
    assert_eq!(
        recorded.counter("lockmacro_acquisitions_total", &acquired),
        3
    );
    let unlabelled = [("prefix", "(none)"), ("outcome", "acquired")];
    assert!(recorded.counter("lockmacro_acquisitions_total", &unlabelled) >= 3);
    let seen = recorded.update();
    let by_key: Vec<_> = seen
        .counters
        .keys()
        .chain(seen.samples.keys())
        .chain(seen.gauges.keys())
        .filter(|series| series.contains("tenant"))
        .collect();
    assert!(by_key.is_empty(), "{by_key:?}");
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

/// Failed calls are counted per operation (`lockmacro_redis_errors_total{op}`); on Redlock, a
/// call no majority answered is counted in `lockmacro_redlock_no_quorum_total{op}`, and an
/// attempt that took some masters while others were busy in `lockmacro_redlock_splits_total`.
#[tokio::test]
async fn redis_errors_no_quorum_and_redlock_splits_are_counted() {
    let recorded = recorded();
    let acquire = [("op", "acquire")];
    let errors_before = recorded.counter("lockmacro_redis_errors_total", &acquire);
    let mut server = RedisServer::start();
    let locks = fast_client(&server).await;
    server.kill();
    let outcome = locks
        .run_locked("errors:1", labelled("errors", 1000), async {})
        .await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    assert!(recorded.counter("lockmacro_redis_errors_total", &acquire) > errors_before);

    // Redlock over 3 masters: one down, one holding another owner's token, one free. The
    // attempt takes the free one, finds one busy: a split, no majority either way, and so
    // `Busy` with a short retry; with a second master down no majority answers: `NoQuorum`.
    let mut masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let quorum = LockClient::redlock_builder(&urls)
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let stray = format!("{:032x}", 7u128);
    masters[0].command(&["SET", "split:1", &stray, "PX", "60000"]);
    masters[2].kill();
    let (splits, no_quorum) = (
        recorded.counter("lockmacro_redlock_splits_total", &[]),
        recorded.counter("lockmacro_redlock_no_quorum_total", &acquire),
    );
    let outcome = quorum
        .run_locked("split:1", labelled("split", 1000), async {})
        .await;
    assert!(
        matches!(outcome, Err(LockError::Busy { .. })),
        "{outcome:?}"
    );
    assert!(recorded.counter("lockmacro_redlock_splits_total", &[]) > splits);
    masters[1].kill();
    let outcome = quorum
        .run_locked("split:1", labelled("split", 1000), async {})
        .await;
    assert!(
        matches!(outcome, Err(LockError::NoQuorum { .. })),
        "{outcome:?}"
    );
    assert!(recorded.counter("lockmacro_redlock_no_quorum_total", &acquire) > no_quorum);
    let seen = recorded.update();
    for name in [
        "lockmacro_redis_errors_total",
        "lockmacro_redlock_no_quorum_total",
        "lockmacro_redlock_splits_total",
    ] {
        assert_eq!(
            seen.units.get(name),
            Some(&Some(Unit::Count)),
            "unit of {name}"
        );
        assert_eq!(
            seen.described.get(name),
            Some(&true),
            "description of {name}"
        );
    }
}

/// `lockmacro_redis_seconds` covers every call to the deployment: a waiter's attempts
/// (`acquire`), its subscription to releases (`subscribe`), and a release that hands the lock
/// to a waiter of the same client (`hand_over`), as well as background releases (`release`).
#[tokio::test]
async fn redis_time_covers_hand_overs_waiters_and_background_releases() {
    let recorded = recorded();
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let count = |op: &str| {
        recorded
            .samples("lockmacro_redis_seconds", &[("op", op)])
            .len()
    };
    let (acquires, subscribes, hand_overs, releases) = (
        count("acquire"),
        count("subscribe"),
        count("hand_over"),
        count("release"),
    );
    let held = locks
        .acquire("handed:1", labelled("handed", 5000))
        .await
        .unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let options = labelled("handed", 5000).wait(Duration::from_secs(10));
            locks.run_locked("handed:1", options, async {}).await
        }
    });
    eventually(Duration::from_secs(5), "the waiter parks", || async {
        locks.waiting("handed:1") == 1
    })
    .await;
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    assert!(
        count("acquire") >= acquires + 2,
        "the holder's and the waiter's attempts"
    );
    assert!(count("subscribe") > subscribes, "the waiter's subscription");
    assert!(count("hand_over") > hand_overs, "the hand-over");

    let dropped = locks
        .acquire("handed:2", labelled("handed", 5000))
        .await
        .unwrap();
    let before = count("release");
    drop(dropped);
    key_gone(&server, "handed:2", Duration::from_secs(5)).await;
    sample_count_reaches("lockmacro_redis_seconds", &[("op", "release")], before + 1).await;
    assert!(count("release") > releases);
}
