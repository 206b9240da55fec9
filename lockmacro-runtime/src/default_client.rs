//! The process-wide client used when `#[redis_lock]` names none.

use std::sync::RwLock;

use once_cell::sync::OnceCell;

use crate::{LockClient, LockError};

/// The client given to [`set_default_client`], which wins over the one built from the
/// environment.
static SET: RwLock<Option<LockClient>> = RwLock::new(None);

/// The client built on first use from `REDIS_URL`, once per process.
static FROM_ENV: OnceCell<LockClient> = OnceCell::new();

/// Sets the client that `#[redis_lock]` uses when no `client = ...` is given.
///
/// Without it, the first such call builds one from `REDIS_URL`, else `redis://127.0.0.1:6379`.
/// The client is runtime-independent: it serves any number of tokio runtimes, one after another
/// or at once.
pub fn set_default_client(client: LockClient) {
    *SET.write().unwrap_or_else(|e| e.into_inner()) = Some(client);
}

/// The default client, built on first use.
///
/// # Errors
/// [`LockError::Config`] when `REDIS_URL` is malformed.
pub fn default_client() -> Result<LockClient, LockError> {
    if let Some(client) = &*SET.read().unwrap_or_else(|e| e.into_inner()) {
        return Ok(client.clone());
    }
    FROM_ENV
        .get_or_try_init(|| {
            let url =
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
            LockClient::builder(&url).build_lazy()
        })
        .cloned()
}
