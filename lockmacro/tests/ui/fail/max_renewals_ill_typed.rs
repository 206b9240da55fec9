use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, max_renewals = "3")]
async fn renewals_as_string(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

#[redis_lock(prefix = "users", key = user_id, max_renewals = -1)]
async fn renewals_negative(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

#[redis_lock(prefix = "users", key = user_id, max_renewals = forever)]
async fn renewals_forever(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = (renewals_as_string, renewals_negative, renewals_forever);
}
