//! `ttl` and `wait` as expressions of type `Duration` or integer seconds, and `h` as a unit.

use std::time::Duration;

use lockmacro_runtime::{LockClient, LockError, redis_lock};

const LOCK_TTL: Duration = Duration::from_secs(10);
const WAIT_SECONDS: u64 = 5;

struct Settings {
    lock_ttl: Duration,
}

static CONFIG: Settings = Settings {
    lock_ttl: Duration::from_millis(1_500),
};

#[redis_lock(prefix = "const", key = id, ttl = LOCK_TTL, wait = WAIT_SECONDS)]
async fn from_consts(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[redis_lock(prefix = "static", key = id, ttl = CONFIG.lock_ttl, wait = Duration::from_millis(250))]
async fn from_a_static_field(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[redis_lock(prefix = "hours", key = id, ttl = "2h", wait = "1h")]
async fn in_hours(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

struct Service {
    locks: LockClient,
    wait: Duration,
    ttl_seconds: u32,
}

impl Service {
    #[redis_lock(prefix = "svc", key = id, client = self.locks, ttl = self.ttl_seconds, wait = self.wait)]
    async fn with_fields(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn main() {
    let _ = (
        from_consts,
        from_a_static_field,
        in_hours,
        Service::with_fields,
    );
}
