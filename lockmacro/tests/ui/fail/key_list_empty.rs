use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "accounts", key = [])]
async fn key_list_empty(amount: u64) -> Result<u64, LockError> {
    Ok(amount)
}

fn main() {
    let _ = key_list_empty;
}
