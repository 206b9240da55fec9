//! Methods: `self`, `&self` and `&mut self`, the client as a field or an argument, and a
//! trait's method.
use std::sync::Arc;

use lockmacro_runtime::{LockClient, LockError, redis_lock};

/// A tenant's accounts, locked by tenant.
pub struct Accounts {
    tenant: String,
    locks: LockClient,
    shared_locks: Arc<LockClient>,
    balance: u64,
}

impl Accounts {
    /// The client is a field.
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

    /// The client is an argument.
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

/// A trait whose method returns a `Send` future, implemented by a locked `async fn`.
pub trait Ledger {
    /// Posts `amount`.
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
