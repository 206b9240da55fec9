use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, crate = "lockmacro_runtim")]
async fn crate_names_nothing(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = crate_names_nothing;
}
