//! Metrics through the `metrics` facade (feature `metrics`); without the feature every function
//! here is empty and compiled away.
//!
//! Labels are bounded: `prefix` is the attribute's prefix, or for a programmatic key the label
//! set with [`LockOptions::label`](crate::LockOptions::label), else `(none)`: never the key nor a
//! part of it. Durations are in seconds.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `lockmacro_acquisitions_total` | counter | `prefix`, `outcome` = `acquired`, `busy`, `error` |
//! | `lockmacro_wait_seconds` | histogram | `prefix` (calls with `wait`; zero when taken at once) |
//! | `lockmacro_held_seconds` | histogram | `prefix`, `end` = `ok`, `err`, `cancelled`, `lost`, `exhausted`, `panic` |
//! | `lockmacro_renewals_total` | counter | `prefix`, `result` = `ok`, `lost`, `failed` |
//! | `lockmacro_releases_total` | counter | `prefix`, `result` = `confirmed`, `background`, `failed` |
//! | `lockmacro_redis_seconds` | histogram | `op` = `acquire` (every attempt, a waiter's too), `extend`, `release` (the caller's, the background's, the shutdown's; each attempt), `hand_over`, `subscribe` (a waiter's subscription to releases) |
//! | `lockmacro_redis_errors_total` | counter | `op` as above: calls that failed (no answer, an error reply, no majority) |
//! | `lockmacro_redlock_no_quorum_total` | counter | `op`: Redlock calls that no majority of the masters answered alike |
//! | `lockmacro_redlock_splits_total` | counter | Redlock attempts that took some masters but not a majority while others found the key busy |
//! | `lockmacro_leases` | gauge | `prefix` |
//! | `lockmacro_waiters` | gauge | `prefix` |

#[cfg(feature = "metrics")]
use std::sync::Arc;

/// The `prefix` label of a lock: cheap to clone, and nothing at all without the feature (every
/// lock call builds one).
#[derive(Debug, Clone)]
pub(crate) struct Prefix(#[cfg(feature = "metrics")] Arc<str>);

/// The `prefix` label of a programmatic key taken without [`LockOptions::label`](crate::LockOptions::label).
#[cfg(feature = "metrics")]
pub(crate) const NO_PREFIX: &str = "(none)";

impl Prefix {
    /// The attribute's prefix or the label set on the options, else [`NO_PREFIX`]: never a
    /// part of the key (`tenant0:order:3` would label by tenant, an unbounded series count).
    pub(crate) fn of(given: Option<&'static str>) -> Self {
        #[cfg(feature = "metrics")]
        return Self(Arc::from(given.unwrap_or(NO_PREFIX)));
        #[cfg(not(feature = "metrics"))]
        {
            let _ = given;
            Self()
        }
    }
}

/// How a call to the deployment ended, for `lockmacro_redis_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) enum Failure {
    /// No answer, or an error reply.
    Redis,
    /// Redlock: no majority of the masters answered alike.
    NoQuorum,
}

/// What a call to the deployment answered: its failure, if it failed.
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) trait Answer {
    fn failure(&self) -> Option<Failure>;
}

/// How a lease's work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Ok,
    Err,
    Cancelled,
    Lost,
    Exhausted,
    Panic,
}

impl End {
    #[cfg_attr(not(feature = "metrics"), allow(dead_code))]
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Err => "err",
            Self::Cancelled => "cancelled",
            Self::Lost => "lost",
            Self::Exhausted => "exhausted",
            Self::Panic => "panic",
        }
    }
}

#[cfg(feature = "metrics")]
mod recorded {
    use std::sync::Once;
    use std::time::Duration;

    use metrics::{
        Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram,
    };

    use super::{End, Failure, Prefix};

    /// Describes every metric, once per process.
    pub(crate) fn describe() {
        static DESCRIBED: Once = Once::new();
        DESCRIBED.call_once(|| {
            describe_counter!(
                "lockmacro_acquisitions_total",
                Unit::Count,
                "Locked calls by how taking the lock went: acquired, busy, error (once per call)."
            );
            describe_histogram!(
                "lockmacro_wait_seconds",
                Unit::Seconds,
                "How long calls with `wait` waited for the lock (zero when taken at once)."
            );
            describe_histogram!(
                "lockmacro_held_seconds",
                Unit::Seconds,
                "How long work held its lock, by how it ended: ok, err, cancelled, lost, exhausted, panic."
            );
            describe_counter!(
                "lockmacro_renewals_total",
                Unit::Count,
                "Lease extensions by result: ok, lost, failed (retried until the lease's deadline)."
            );
            describe_counter!(
                "lockmacro_releases_total",
                Unit::Count,
                "Releases: confirmed by the caller, handed to the background, or given up (failed)."
            );
            describe_histogram!(
                "lockmacro_redis_seconds",
                Unit::Seconds,
                "Time of the calls to the deployment, by operation: acquire, extend, release, hand_over, subscribe."
            );
            describe_counter!(
                "lockmacro_redis_errors_total",
                Unit::Count,
                "Calls to the deployment that failed (no answer, an error reply, no majority), by operation."
            );
            describe_counter!(
                "lockmacro_redlock_no_quorum_total",
                Unit::Count,
                "Redlock calls that no majority of the masters answered alike, by operation."
            );
            describe_counter!(
                "lockmacro_redlock_splits_total",
                Unit::Count,
                "Redlock attempts that took some masters but not a majority while others found the key busy."
            );
            describe_counter!(
                "lockmacro_looks_again_total",
                Unit::Count,
                "Looks of waiting calls made again after the deployment failed one, by reason: unreachable, failover, unacknowledged, no_quorum."
            );
            describe_gauge!("lockmacro_leases", Unit::Count, "Leases held right now.");
            describe_gauge!("lockmacro_waiters", Unit::Count, "Calls waiting for a lock right now.");
        });
    }

    pub(crate) fn acquisition(prefix: &Prefix, outcome: &'static str) {
        counter!("lockmacro_acquisitions_total", "prefix" => prefix.0.clone(), "outcome" => outcome)
            .increment(1);
    }

    pub(crate) fn waited(prefix: &Prefix, waited: Duration) {
        histogram!("lockmacro_wait_seconds", "prefix" => prefix.0.clone()).record(waited);
    }

    /// `acquired_at` in the clock's nanos: the time is read only when metrics are recorded.
    pub(crate) fn held(prefix: &Prefix, acquired_at: u64, end: End) {
        let held = crate::clock::now().saturating_sub(acquired_at);
        histogram!("lockmacro_held_seconds", "prefix" => prefix.0.clone(), "end" => end.label())
            .record(Duration::from_nanos(held));
    }

    pub(crate) fn renewal(prefix: &Prefix, result: &'static str) {
        counter!("lockmacro_renewals_total", "prefix" => prefix.0.clone(), "result" => result)
            .increment(1);
    }

    pub(crate) fn release(prefix: &Prefix, result: &'static str) {
        counter!("lockmacro_releases_total", "prefix" => prefix.0.clone(), "result" => result)
            .increment(1);
    }

    pub(crate) fn redis_call(op: &'static str, took: Duration, failure: Option<Failure>) {
        histogram!("lockmacro_redis_seconds", "op" => op).record(took);
        if let Some(failure) = failure {
            counter!("lockmacro_redis_errors_total", "op" => op).increment(1);
            if failure == Failure::NoQuorum {
                counter!("lockmacro_redlock_no_quorum_total", "op" => op).increment(1);
            }
        }
    }

    /// A waiting call looks again after the deployment failed its look, for `reason`.
    pub(crate) fn looked_again(prefix: &Prefix, reason: &'static str) {
        counter!("lockmacro_looks_again_total", "prefix" => prefix.0.clone(), "reason" => reason)
            .increment(1);
    }

    /// A Redlock attempt split the masters: some taken, not a majority, others busy.
    pub(crate) fn redlock_split() {
        counter!("lockmacro_redlock_splits_total").increment(1);
    }

    pub(crate) fn leases(prefix: &Prefix, change: f64) {
        gauge!("lockmacro_leases", "prefix" => prefix.0.clone()).increment(change);
    }

    pub(crate) fn waiters(prefix: &Prefix, change: f64) {
        gauge!("lockmacro_waiters", "prefix" => prefix.0.clone()).increment(change);
    }
}

#[cfg(not(feature = "metrics"))]
#[allow(clippy::missing_const_for_fn)]
mod recorded {
    use std::time::Duration;

    use super::{End, Prefix};

    pub(crate) fn describe() {}
    pub(crate) fn acquisition(_: &Prefix, _: &'static str) {}
    pub(crate) fn waited(_: &Prefix, _: Duration) {}
    pub(crate) fn held(_: &Prefix, _: u64, _: End) {}
    pub(crate) fn renewal(_: &Prefix, _: &'static str) {}
    pub(crate) fn release(_: &Prefix, _: &'static str) {}
    pub(crate) fn leases(_: &Prefix, _: f64) {}
    pub(crate) fn waiters(_: &Prefix, _: f64) {}
    pub(crate) fn redlock_split() {}
    pub(crate) fn looked_again(_: &Prefix, _: &'static str) {}
}

pub(crate) use recorded::*;

/// Times `call` as one `lockmacro_redis_seconds` sample of `op`, and counts it in
/// `lockmacro_redis_errors_total` when it failed.
#[cfg(feature = "metrics")]
pub(crate) async fn timed<T: Answer>(op: &'static str, call: impl Future<Output = T>) -> T {
    let started = tokio::time::Instant::now();
    let answer = call.await;
    redis_call(op, started.elapsed(), answer.failure());
    answer
}

/// Without the `metrics` feature, `call` itself: no future wrapped around every request.
#[cfg(not(feature = "metrics"))]
pub(crate) fn timed<F: Future>(_op: &'static str, call: F) -> F {
    call
}
