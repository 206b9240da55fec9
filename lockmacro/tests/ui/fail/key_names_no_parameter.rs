use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user)]
async fn key_names_no_parameter(user_id: u64, tenant: &str) -> Result<u64, LockError> {
    let _ = tenant;
    Ok(user_id)
}

fn main() {
    let _ = key_names_no_parameter;
}
