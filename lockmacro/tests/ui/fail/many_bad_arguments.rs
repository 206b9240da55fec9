use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(
    prefix = "",
    key = usr,
    ttl = 0,
    max_renewals = "3",
    tll = 3,
    wait = "2d",
    fencing = 1,
    ttl = 5
)]
fn many_bad_arguments(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = many_bad_arguments;
}
