use lockmacro_runtime::{LockError, redis_lock};

const PREFIX: &str = "users";

#[redis_lock(prefix = PREFIX, key = user_id)]
async fn prefix_not_literal(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

fn main() {
    let _ = (prefix_not_literal, PREFIX);
}
