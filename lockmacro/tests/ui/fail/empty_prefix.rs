use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "", key = user_id)]
async fn empty_prefix(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = empty_prefix;
}
