use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "pool", key = id, permits = 0)]
async fn permits_zero(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = permits_zero;
}
