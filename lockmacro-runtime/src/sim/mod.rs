//! Deterministic simulation (feature `sim`, for the project's own simulator): worlds drawn from
//! one seed ([`crate::world`]: the seams' source of chance) in which simulated processes lock
//! over a simulated network ([`net`]), to the in-memory store or to a simulated Redis ([`redis`]).
//!
//! Not covered: the branch `tokio::select!` polls first is drawn from tokio's own thread RNG,
//! which only `--cfg tokio_unstable` (`Builder::rng_seed`) can seed.

use std::sync::Arc;

use crate::store::Store;
use crate::store::memory::{MemoryHooks, MemoryStore};

pub(crate) mod net;
pub mod redis;

pub use crate::world::{Stream, draw, run, sometimes, stream, take_coverage};

/// What a simulated client runs over ([`LockClient::simulated`](crate::LockClient::simulated)):
/// an in-memory store itself, a [`net::Link`] of the simulated network to one, or the real Redis
/// store over a simulated Redis ([`redis::transport::RedisLink`]).
pub struct Backing {
    pub(crate) store: Arc<dyn Store>,
    /// The in-memory store, for the client's test hooks.
    pub(crate) memory: Option<MemoryStore>,
}

impl From<&MemoryHooks> for Backing {
    fn from(hooks: &MemoryHooks) -> Self {
        Self {
            store: Arc::new(hooks.store.clone()),
            memory: Some(hooks.store.clone()),
        }
    }
}

impl From<&net::Link> for Backing {
    fn from(link: &net::Link) -> Self {
        Self {
            store: link.store(),
            memory: Some(link.memory()),
        }
    }
}
