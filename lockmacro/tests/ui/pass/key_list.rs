//! `key = [...]`: several keys at once, each an expression as `key` takes, with `wait`, on a
//! method, and a list of one.

use lockmacro_runtime::{LockContext, LockError, redis_lock};

/// An account, locked by id.
pub struct Account {
    /// Its id.
    pub id: u64,
}

#[redis_lock(prefix = "accounts", key = [from.id, to.id], wait = "2s", mode = write)]
async fn transfer(from: &Account, to: &Account, amount: u64) -> Result<usize, LockError> {
    let _ = amount;
    Ok(LockContext::current().map_or(0, |lock| lock.keys().len()))
}

#[redis_lock(prefix = "batch", key = [first, format!("{second}-x"), third.as_str()])]
async fn batch(first: u32, second: &str, third: String) -> Result<(), LockError> {
    let _ = (first, second, third);
    Ok(())
}

#[redis_lock(prefix = "one", key = [id])]
async fn list_of_one(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

struct Ledger;

impl Ledger {
    #[redis_lock(prefix = "ledger", key = [self_id, other], ttl = "5s")]
    async fn settle(&self, self_id: u64, other: u64) -> Result<u64, LockError> {
        Ok(self_id + other)
    }
}

fn main() {
    let _ = (transfer, batch, list_of_one, Ledger::settle);
}
