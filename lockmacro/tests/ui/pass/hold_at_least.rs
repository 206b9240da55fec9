//! `hold_at_least` in the forms of `ttl`: integer seconds, a string with a unit, or an
//! expression of type `Duration` or integer seconds.

use std::time::Duration;

use lockmacro_runtime::{LockClient, LockError, redis_lock};

const HOLD: Duration = Duration::from_secs(300);

#[redis_lock(prefix = "report", hold_at_least = 30)]
async fn in_seconds() -> Result<(), LockError> {
    Ok(())
}

#[redis_lock(prefix = "report", key = day, hold_at_least = "5m", ttl = "30s", wait = "1s")]
async fn in_minutes(day: u32) -> Result<u32, LockError> {
    Ok(day)
}

#[redis_lock(prefix = "report", hold_at_least = HOLD, mode = read)]
async fn from_a_const() -> Result<(), LockError> {
    Ok(())
}

struct Job {
    locks: LockClient,
    hold_seconds: u64,
}

impl Job {
    #[redis_lock(prefix = "job", client = self.locks, hold_at_least = self.hold_seconds, permits = 2)]
    async fn run(&self) -> Result<(), LockError> {
        Ok(())
    }
}

fn main() {
    let _ = (in_seconds, in_minutes, from_a_const, Job::run);
}
