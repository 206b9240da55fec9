//! What the current task holds: [`LockContext`] for the work, and reentrancy for nested calls.
//!
//! Held leases live in a task-local chain, so a nested locked call on the same key through the
//! same client (same task) re-enters, while a spawned task, which starts with an empty chain, is
//! another owner.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::options::LockKind;
use crate::state::LeaseState;

tokio::task_local! {
    static HELD: Held;
}

/// The leases the current task holds, innermost first.
#[derive(Clone)]
struct Held {
    lease: Arc<LeaseState>,
    outer: Option<Arc<Held>>,
}

impl Held {
    fn iter(&self) -> impl Iterator<Item = &LeaseState> {
        std::iter::successors(Some(self), |held| held.outer.as_deref()).map(|held| &*held.lease)
    }
}

/// Runs `work` with `lease` added to the task's held leases.
pub(crate) fn scope<F: Future>(lease: Arc<LeaseState>, work: F) -> impl Future<Output = F::Output> {
    let outer = HELD.try_with(|held| Arc::new(held.clone())).ok();
    HELD.scope(Held { lease, outer }, work)
}

/// The kind of lock the current task holds on `key` through the client whose engine is
/// `engine_id` (the innermost, when nested), if it holds one.
pub(crate) fn held(engine_id: u64, key: &str) -> Option<LockKind> {
    HELD.try_with(|held| {
        held.iter()
            .find(|lease| lease.engine_id == engine_id && lease.covers(key))
            .map(|lease| lease.kind)
    })
    .ok()
    .flatten()
}

/// The lock the current locked function runs under.
///
/// ```no_run
/// use lockmacro_runtime::{redis_lock, LockContext, LockError};
///
/// #[redis_lock(prefix = "reports", key = day)]
/// async fn build_report(day: u32) -> Result<(), LockError> {
///     let lock = LockContext::current().expect("inside a locked function");
///     println!("holding {} for {:?} more", lock.key(), lock.time_left());
///     Ok(())
/// }
/// ```
#[derive(Clone)]
pub struct LockContext {
    lease: Arc<LeaseState>,
}

impl std::fmt::Debug for LockContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockContext")
            .field("key", &self.key())
            .field("kind", &self.kind())
            .field("fencing_token", &self.fencing_token())
            .field("renewals", &self.renewals())
            .field("time_left", &self.time_left())
            .finish_non_exhaustive()
    }
}

impl LockContext {
    /// The innermost lock held by the current task, or `None` outside locked work.
    pub fn current() -> Option<Self> {
        HELD.try_with(|held| Self {
            lease: held.lease.clone(),
        })
        .ok()
    }

    /// The Redis key: the first of [`keys`](Self::keys) for a lock over several.
    pub fn key(&self) -> &str {
        &self.lease.key
    }

    /// Every Redis key the lock holds, in the order given, each once: one for a lock on one key,
    /// several for `key = [...]` or [`LockClient::run_locked_many`](crate::LockClient::run_locked_many).
    pub fn keys(&self) -> &[String] {
        self.lease.all_keys()
    }

    /// The random value stored under the key: a UUID v4 in its simple form, 32 lowercase hex
    /// digits without hyphens (the key's value may carry a trailing `+` while a caller waits;
    /// this is always the bare token).
    pub fn token(&self) -> &str {
        self.lease.token()
    }

    /// The kind of lock held: exclusive, read, or one of N permits.
    pub fn kind(&self) -> crate::LockKind {
        self.lease.kind
    }

    /// The fencing token, when the lock was taken with `fencing = true`.
    pub fn fencing_token(&self) -> Option<u64> {
        self.lease.fencing_token
    }

    /// How many times the lease was extended so far.
    pub fn renewals(&self) -> u32 {
        self.lease.renewals()
    }

    /// Time until the local deadline of the current lease.
    pub fn time_left(&self) -> Duration {
        self.lease.time_left()
    }
}
