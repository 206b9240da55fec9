use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(key = user_id, ttl = 3)]
async fn missing_prefix(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

#[redis_lock]
async fn no_arguments() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = (missing_prefix, no_arguments);
}
