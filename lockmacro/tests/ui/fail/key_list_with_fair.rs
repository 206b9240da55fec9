use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "accounts", key = [from, to], fair = true)]
async fn key_list_with_fair(from: u64, to: u64) -> Result<u64, LockError> {
    Ok(from + to)
}

fn main() {
    let _ = key_list_with_fair;
}
