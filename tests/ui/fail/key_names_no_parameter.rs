use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = usr_id)]
async fn key_names_no_parameter(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = key_names_no_parameter;
}
