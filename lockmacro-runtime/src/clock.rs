//! Time for the lease engine: one monotonic clock read as nanoseconds (so lease times fit in
//! atomics), the drift margin taken off every lease, and jittered backoff for retries.
//!
//! The clock is tokio's: the same as `std::time::Instant` in a normal build, and under
//! `#[tokio::test(start_paused = true)]` the test's paused clock, which the in-memory deployment
//! follows.

use std::time::Duration;

use once_cell::sync::Lazy;
use tokio::time::Instant;

/// Every lease time is kept as nanoseconds since this instant.
static EPOCH: Lazy<Instant> = Lazy::new(Instant::now);

/// The instant lease times count from: the process's, or a simulated world's start (so that
/// each world's times are its own, whatever ran before it in the process).
fn epoch() -> Instant {
    #[cfg(feature = "sim")]
    if let Some(epoch) = crate::world::epoch() {
        return epoch;
    }
    *EPOCH
}

/// Now, as nanoseconds since the engine's epoch.
pub(crate) fn now() -> u64 {
    nanos_at(Instant::now())
}

pub(crate) fn nanos_at(at: Instant) -> u64 {
    nanos(at.saturating_duration_since(epoch()))
}

pub(crate) fn instant_at(nanos: u64) -> Instant {
    // Saturates instead of overflowing: "never" is a few centuries away, not a panic.
    epoch()
        .checked_add(Duration::from_nanos(nanos))
        .unwrap_or_else(far_future)
}

/// The wall clock, µs since the Unix epoch (0 before it): the server's clock of the in-memory
/// deployment. In a simulation, simulated time from a fixed start.
pub(crate) fn epoch_micros() -> u64 {
    #[cfg(feature = "sim")]
    if let Some(micros) = crate::world::epoch_micros() {
        return micros;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
        })
}

/// The wall clock as one client reads it: when its leases were taken as their values say, and
/// when its waiters began waiting as their reservations say. A simulated client's may be off by
/// its own skew, as a host's clock is.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Wall {
    skew_ms: i64,
}

impl Wall {
    /// A clock `skew_ms` ahead of the world's (behind when negative).
    #[cfg(feature = "sim")]
    pub(crate) fn skewed(skew_ms: i64) -> Self {
        Self { skew_ms }
    }

    /// Now, in ms since the Unix epoch.
    pub(crate) fn millis(self) -> u64 {
        (epoch_micros() / 1000).saturating_add_signed(self.skew_ms)
    }
}

/// `from + wait`, saturating: `Duration::MAX` means "wait forever", not an overflow.
pub(crate) fn after(from: Instant, wait: Duration) -> Instant {
    from.checked_add(wait).unwrap_or_else(far_future)
}

/// A point no wait reaches (about 30 years on), kept well inside what every platform can add.
fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(60 * 60 * 24 * 365 * 30)
}

pub(crate) fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Safety margin taken off every lease for clock drift between us and Redis (as Redlock).
pub(crate) fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// A random fraction in `[0, 1)`, for spreading retries; not for secrets. In a simulation,
/// drawn from its seed.
pub(crate) fn random_unit() -> f64 {
    #[cfg(feature = "sim")]
    if let Some(unit) = crate::world::unit() {
        return unit;
    }
    rand::random::<f64>()
}

/// `duration` scaled by a random factor in `[1 - spread, 1 + spread)`.
pub(crate) fn jittered(duration: Duration, spread: f64) -> Duration {
    duration.mul_f64(1.0 - spread + 2.0 * spread * random_unit())
}

/// The pause after `failures` failures in a row: `base`, `2 × base`, … up to `cap`, each ±25 %.
pub(crate) fn backoff(base: Duration, cap: Duration, failures: u32) -> Duration {
    jittered(base.saturating_mul(1u32 << failures.min(16)).min(cap), 0.25)
}

/// Exponential backoff with jitter: `base`, `2 × base`, … up to `cap`, each ±25 %.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
    failures: u32,
}

impl Backoff {
    pub(crate) const fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            failures: 0,
        }
    }

    /// The pause before the next attempt, after one more failure.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let delay = backoff(self.base, self.cap, self.failures);
        self.failures = self.failures.saturating_add(1);
        delay
    }

    pub(crate) fn reset(&mut self) {
        self.failures = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_cap_with_jitter() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let delays: Vec<Duration> = (0..8).map(|_| backoff.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(75) && delays[0] < Duration::from_millis(125));
        assert!(delays[1] >= Duration::from_millis(150) && delays[1] < Duration::from_millis(250));
        for delay in &delays[4..] {
            assert!(*delay >= Duration::from_millis(750) && *delay < Duration::from_millis(1250));
        }
        backoff.reset();
        assert!(backoff.next_delay() < Duration::from_millis(125));
    }

    #[test]
    fn waiting_forever_saturates() {
        let now = Instant::now();
        assert!(after(now, Duration::MAX) > now + Duration::from_secs(3600));
        assert!(instant_at(u64::MAX) > now);
    }
}
