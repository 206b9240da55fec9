use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "sync", key = id)]
fn not_async(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = not_async(1);
}
