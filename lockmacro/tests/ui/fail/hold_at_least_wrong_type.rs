use lockmacro_runtime::{LockError, redis_lock};

const HOLD: f64 = 1.5;

#[redis_lock(prefix = "jobs", hold_at_least = HOLD)]
async fn nightly() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = nightly;
}
