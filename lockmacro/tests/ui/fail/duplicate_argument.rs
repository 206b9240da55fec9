use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, ttl = 3, ttl = 5)]
async fn duplicate_argument(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = duplicate_argument;
}
