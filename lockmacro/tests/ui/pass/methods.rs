use std::sync::Arc;

use lockmacro_runtime::{LockClient, LockError, redis_lock};

pub struct Accounts {
    tenant: String,
    locks: LockClient,
    shared_locks: Arc<LockClient>,
    balance: u64,
}

impl Accounts {
    #[redis_lock(prefix = "balance", key = self.tenant, client = self.locks)]
    pub async fn balance(&self) -> Result<u64, LockError> {
        Ok(self.balance)
    }

    /// Docs and attributes stay on the method.
    #[redis_lock(prefix = "deposit", key = self.tenant, client = self.shared_locks)]
    #[inline]
    pub async fn deposit(&mut self, amount: u64) -> Result<u64, LockError> {
        self.balance += amount;
        Ok(self.balance)
    }

    #[redis_lock(prefix = "rename", key = self.tenant, client = locks)]
    pub async fn rename(&mut self, locks: &LockClient, tenant: String) -> Result<(), LockError> {
        self.tenant = tenant;
        Ok(())
    }

    /// The body moves `self` although the key borrowed from it.
    #[redis_lock(prefix = "close", key = self.tenant)]
    pub async fn close(self) -> Result<String, LockError> {
        Ok(self.tenant)
    }
}

pub trait Ledger {
    fn post(&self, amount: u64) -> impl std::future::Future<Output = Result<(), LockError>> + Send;
}

impl Ledger for Accounts {
    #[redis_lock(prefix = "post", key = self.tenant, client = self.locks)]
    async fn post(&self, amount: u64) -> Result<(), LockError> {
        let _ = amount;
        Ok(())
    }
}

fn main() {
    let _ = (
        Accounts::balance,
        Accounts::deposit,
        Accounts::rename,
        Accounts::close,
    );
}
