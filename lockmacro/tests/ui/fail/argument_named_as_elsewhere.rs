use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, timeout = "5s")]
async fn argument_named_as_elsewhere(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = argument_named_as_elsewhere;
}
