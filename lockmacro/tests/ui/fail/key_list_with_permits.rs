use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "accounts", key = [from, to], permits = 2)]
async fn key_list_with_permits(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = key_list_with_permits;
}
