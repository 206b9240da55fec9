//! The locked function's future is `Send`, as a task spawned on a multi-threaded runtime needs.
use std::sync::Arc;

use lockmacro_runtime::{LockClient, LockError, redis_lock};

fn assert_send<T: Send>(_: T) {}

#[redis_lock(prefix = "send", key = id)]
async fn free(id: u64) -> Result<u64, LockError> {
    async {}.await;
    Ok(id)
}

struct Service {
    locks: Arc<LockClient>,
    name: String,
}

impl Service {
    #[redis_lock(prefix = "send-method", key = self.name, client = self.locks, wait = "1s")]
    async fn method(&self, text: String) -> Result<usize, LockError> {
        async {}.await;
        Ok(text.len() + self.name.len())
    }
}

fn check(service: &Service) {
    assert_send(service.method(String::new()));
}

fn main() {
    assert_send(free(1));
    let _ = check;
}
