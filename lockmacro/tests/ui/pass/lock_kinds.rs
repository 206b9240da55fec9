//! `mode = read`, `mode = write`, `permits = N` and `fair = true`, on their own and with `wait`.

use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "cache", key = name, mode = read)]
async fn read_entry(name: &str) -> Result<usize, LockError> {
    Ok(name.len())
}

#[redis_lock(prefix = "cache", key = name, mode = write, wait = "2s")]
async fn rebuild_entry(name: &str) -> Result<(), LockError> {
    let _ = name;
    Ok(())
}

#[redis_lock(prefix = "pool", key = region, permits = 3, wait = "1s")]
async fn use_a_connection(region: u32) -> Result<u32, LockError> {
    Ok(region)
}

#[redis_lock(prefix = "queue", key = id, fair = true, wait = "5s")]
async fn in_turn(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[redis_lock(prefix = "queue", key = id, fair = true)]
async fn fair_without_wait(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

fn main() {
    let _ = (
        read_entry,
        rebuild_entry,
        use_a_connection,
        in_turn,
        fair_without_wait,
    );
}
