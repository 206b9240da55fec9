use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, ttl = "5 s")]
async fn ttl_unit_spaced(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = ttl_unit_spaced;
}
