use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "pool", key = id, mode = read, permits = 3)]
async fn mode_with_permits(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = mode_with_permits;
}
