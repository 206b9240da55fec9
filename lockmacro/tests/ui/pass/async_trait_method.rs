//! A method of an `#[async_trait]` trait, `&self` and `&mut self`.
use async_trait::async_trait;
use lockmacro_runtime::{LockClient, LockError, redis_lock};

#[async_trait]
trait Jobs {
    async fn run(&self, job_id: u64) -> Result<u64, LockError>;
    async fn rename(&mut self, name: String) -> Result<(), LockError>;
}

struct Worker {
    name: String,
    locks: LockClient,
}

#[async_trait]
impl Jobs for Worker {
    #[redis_lock(prefix = "job", key = job_id, client = self.locks, ttl = 5)]
    async fn run(&self, job_id: u64) -> Result<u64, LockError> {
        if job_id == 0 {
            return Ok(0);
        }
        Ok(job_id + self.name.len() as u64)
    }

    #[redis_lock(prefix = "rename", key = self.name)]
    async fn rename(&mut self, name: String) -> Result<(), LockError> {
        self.name = name;
        Ok(())
    }
}

fn assert_send<T: Send>(_: T) {}

fn check(worker: &mut Worker) {
    assert_send(worker.run(1));
    assert_send(worker.rename(String::new()));
}

fn main() {
    let _ = check;
}
