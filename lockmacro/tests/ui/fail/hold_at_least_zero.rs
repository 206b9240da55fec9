use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "jobs", hold_at_least = 0)]
async fn hold_zero() -> Result<(), LockError> {
    Ok(())
}

#[redis_lock(prefix = "jobs", hold_at_least = "0m")]
async fn hold_zero_minutes() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = (hold_zero, hold_zero_minutes);
}
