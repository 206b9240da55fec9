//! `#[redis_lock]` expansions under the workspace's own lints and clippy: the generated code
//! must not make a strict user crate warn. Nothing here talks to Redis.
#![deny(warnings, unused_qualifications, clippy::all, clippy::pedantic)]

use std::sync::Arc;

use lockmacro_runtime::{LockClient, LockError, redis_lock};

#[derive(Debug)]
enum AppError {
    Lock,
    Invalid,
}

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        Self::Lock
    }
}

struct Service {
    tenant: String,
    locks: Arc<LockClient>,
}

impl Service {
    #[redis_lock(prefix = "service", key = self.tenant, client = self.locks, ttl = "500ms", wait = 2, fencing = true)]
    async fn locked(&self, amount: u64) -> Result<u64, AppError> {
        if amount == 0 {
            return Err(AppError::Invalid);
        }
        Ok(amount + self.tenant.len() as u64)
    }
}

#[redis_lock(prefix = "job", max_renewals = unlimited)]
async fn job() -> Result<(), LockError> {
    Ok(())
}

#[redis_lock(prefix = "pair", key = format!("{a}:{b}"), max_renewals = 0)]
async fn pair(a: u32, b: String) -> Result<String, AppError> {
    let parsed: u32 = b.parse().map_err(|_| AppError::Invalid)?;
    Ok(format!("{}", a + parsed))
}

fn assert_send<T: Send>(_: &T) {}

#[test]
fn locked_futures_are_send() {
    let job = job();
    assert_send(&job);
    let pair = pair(1, "2".to_owned());
    assert_send(&pair);
    let check = |service: &Service| assert_send(&service.locked(1));
    let _ = check;
    let _ = AppError::Lock;
}
