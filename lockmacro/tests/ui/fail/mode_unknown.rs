use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "shelf", key = id, mode = banana)]
async fn mode_unknown(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = mode_unknown;
}
