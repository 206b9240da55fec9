use lockmacro_runtime::{LockError, redis_lock};

const LOCK_TTL: f64 = 1.5;

#[redis_lock(prefix = "users", key = user_id, ttl = LOCK_TTL)]
async fn ttl_expression_wrong_type(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = ttl_expression_wrong_type;
}
