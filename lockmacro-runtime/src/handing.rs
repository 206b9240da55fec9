//! What a release of a client did for its waiter that offered to be handed the lock: the
//! message from the engine (the releaser) to the waiters, kept below both so the waiters never
//! import the engine.

use std::sync::Arc;

use crate::state::LeaseState;

/// What a release of this client did for a waiter that offered to be handed the lock.
pub(crate) enum Handing {
    /// The lock is the waiter's now.
    Handed(Handed),
    /// Another client waits too: the lock was released and announced instead. The waiter
    /// waits for that announcement, as the other client's waiters do.
    Declined,
    /// The lease was no longer the releaser's: the waiter looks again now.
    Look,
    /// The hand-over got no answer: the waiter's token may hold the key. It is given up
    /// (released in the background) and the waiter goes on with a new one.
    Uncertain,
}

/// A lease handed to a waiter, registered with the watchdog: released in the background if
/// the waiter is gone before it takes it.
pub(crate) struct Handed {
    lease: Arc<LeaseState>,
    /// The client that handed it, which takes it back if nobody does.
    client: Arc<dyn Reclaim>,
    taken: bool,
}

/// Takes back a handed lease whose waiter is gone (the engine, as the waiters see it).
pub(crate) trait Reclaim: Send + Sync {
    fn reclaim(&self, lease: &Arc<LeaseState>);
}

impl Handed {
    pub(crate) fn new(lease: Arc<LeaseState>, client: Arc<dyn Reclaim>) -> Self {
        Self {
            lease,
            client,
            taken: false,
        }
    }

    pub(crate) fn take(mut self) -> Arc<LeaseState> {
        self.taken = true;
        self.lease.clone()
    }
}

impl Drop for Handed {
    fn drop(&mut self) {
        if self.taken {
            return;
        }
        tracing::debug!(key = %self.lease.key, "the waiter handed the lock was gone; releasing it");
        self.client.reclaim(&self.lease);
    }
}
