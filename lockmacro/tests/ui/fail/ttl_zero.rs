use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, ttl = 0)]
async fn ttl_zero(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

#[redis_lock(prefix = "users", key = user_id, ttl = "0ms")]
async fn ttl_zero_millis(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = (ttl_zero, ttl_zero_millis);
}
