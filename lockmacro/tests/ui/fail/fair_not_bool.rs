use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "line", key = id, fair = "yes")]
async fn fair_not_bool(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = fair_not_bool;
}
