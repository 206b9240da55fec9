//! Generated code triggers no lint in a crate that denies them.
#![deny(warnings, unused_qualifications, unused_results, unused_import_braces)]
#![deny(rust_2018_idioms, unreachable_pub, missing_docs)]

use core::result::Result::Err;
use std::convert::From;

use lockmacro_runtime::{LockClient, LockError, LockOptions, redis_lock};

/// An error of the application.
#[derive(Debug)]
pub struct AppError;

impl From<LockError> for AppError {
    fn from(_: LockError) -> Self {
        AppError
    }
}

/// Locked with every argument.
#[redis_lock(
    prefix = "hygiene",
    key = id,
    ttl = "3s",
    wait = 1,
    max_renewals = 2,
    fencing = true,
    client = locks
)]
pub async fn locked(id: u64, locks: &LockClient) -> Result<u64, AppError> {
    let _options = LockOptions::new();
    if id == 0 {
        return Err(AppError);
    }
    Ok(id)
}

/// Returns the lock's own error.
#[redis_lock(prefix = "hygiene-plain")]
pub async fn plain() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = (locked, plain);
}
