// An unused locked function is reported as an unused plain function is.
#![deny(dead_code)]

use lockmacro_runtime::{LockError, redis_lock};

#[redis_lock(prefix = "users", key = user_id)]
async fn never_called(user_id: u64) -> Result<u64, LockError> {
    Ok(user_id)
}

struct Service;

impl Service {
    #[redis_lock(prefix = "users", key = user_id)]
    async fn never_called_either(&self, user_id: u64) -> Result<u64, LockError> {
        Ok(user_id)
    }
}

fn main() {
    let _ = Service;
}
