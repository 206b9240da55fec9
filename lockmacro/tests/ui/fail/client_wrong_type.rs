use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id, client = url)]
async fn client_wrong_type(user_id: u64, url: &str) -> Result<u64, LockError> {
    let _ = url;
    Ok(user_id)
}

fn main() {
    let _ = client_wrong_type;
}
