use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "reports", key = "")]
async fn key_empty_string() -> Result<(), LockError> {
    Ok(())
}

fn main() {
    let _ = key_empty_string;
}
