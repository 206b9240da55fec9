use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, ttl: 3)]
async fn missing_equals(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = missing_equals;
}
