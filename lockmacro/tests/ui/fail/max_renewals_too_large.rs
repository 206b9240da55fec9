use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, max_renewals = 5000000000)]
async fn max_renewals_too_large(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = max_renewals_too_large;
}
