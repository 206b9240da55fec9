use lockmacro_runtime::{LockClient, LockError, redis_lock};

trait Billing {
    fn charge(&self, id: u64) -> Result<u64, LockError>;
}

struct Service {
    locks: LockClient,
}

impl Billing for Service {
    #[redis_lock(prefix = "billing", key = id, client = self.locks)]
    fn charge(&self, id: u64) -> Result<u64, LockError> {
        Ok(id)
    }
}

fn main() {}
