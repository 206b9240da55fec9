use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock("users", key = user_id)]
async fn not_an_argument_name(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = not_an_argument_name;
}
