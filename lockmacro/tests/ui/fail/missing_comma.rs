use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users" key = user_id)]
async fn missing_comma(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = missing_comma;
}
