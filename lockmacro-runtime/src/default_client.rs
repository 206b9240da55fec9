//! The process-wide client used when `#[redis_lock]` names none.

use std::sync::RwLock;

use crate::{LockClient, LockError};

static DEFAULT: RwLock<Option<LockClient>> = RwLock::new(None);

/// Sets the client that `#[redis_lock]` uses when no `client = ...` is given.
///
/// Without it, the first such call builds one from `REDIS_URL`, else `redis://127.0.0.1:6379`.
/// The client is runtime-independent: it serves any number of tokio runtimes, one after another
/// or at once.
pub fn set_default_client(client: LockClient) {
    *DEFAULT.write().unwrap_or_else(|e| e.into_inner()) = Some(client);
}

/// The default client, built on first use.
///
/// # Errors
/// [`LockError::Config`] when `REDIS_URL` is malformed.
pub fn default_client() -> Result<LockClient, LockError> {
    if let Some(client) = &*DEFAULT.read().unwrap_or_else(|e| e.into_inner()) {
        return Ok(client.clone());
    }
    let mut slot = DEFAULT.write().unwrap_or_else(|e| e.into_inner());
    if let Some(client) = &*slot {
        return Ok(client.clone());
    }
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let client = LockClient::builder(&url).build_lazy()?;
    *slot = Some(client.clone());
    Ok(client)
}
