use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, ttl = 500ms)]
async fn ttl_unit_outside_string(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = ttl_unit_outside_string;
}
