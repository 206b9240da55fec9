//! The right to release one lease, as a value.
//!
//! Exactly one party releases a lease: its guard, the waiter it was handed to, or the client's
//! shutdown. Whoever claims the right first holds it ([`ReleaseRight::claim`]); it is given up
//! once, either disarmed when the release is *confirmed* ([`ReleaseRight::disarm`]), or dropped
//! unconfirmed (a panic, a dropped future, an error), which hands the compare-and-delete to the
//! client's own runtime. As tokio-util's `DropGuard`: never a flag set before the `.await` that
//! confirms it.

use std::sync::Arc;

use crate::state::LeaseState;

/// What keeps a client's leases: the engine, seen from below it.
pub(crate) trait Keeper: Send + Sync {
    /// Releases `lease` on the client's runtime, retried until answered or lapsed.
    fn release_in_background(&self, lease: &Arc<LeaseState>);

    /// Stops renewing `lease`: its holder knows it is gone.
    fn forget(&self, lease: &LeaseState);
}

/// The right to release one lease; dropping it unconfirmed releases in the background.
#[must_use = "dropping a release right releases the lease in the background"]
pub(crate) struct ReleaseRight {
    held: Option<(Arc<LeaseState>, Arc<dyn Keeper>)>,
}

impl ReleaseRight {
    /// Claims the right to release `lease`: `None` when another party holds it already, or when
    /// the lease is known lost (there is nothing of ours to release; it is forgotten). A lease
    /// over several keys lost one of them: the others are still released.
    pub(crate) fn claim<K: Keeper + 'static>(
        lease: &Arc<LeaseState>,
        keeper: &Arc<K>,
    ) -> Option<Self> {
        if (lease.is_lost() && lease.keys.is_empty()) || !lease.claim_release() {
            keeper.forget(lease);
            return None;
        }
        Some(Self {
            held: Some((lease.clone(), keeper.clone())),
        })
    }

    /// The lease it releases.
    pub(crate) fn lease(&self) -> &Arc<LeaseState> {
        match &self.held {
            Some((lease, _)) => lease,
            None => unreachable!("a release right is held until it is consumed"),
        }
    }

    /// The release is confirmed (or nothing of ours is left): stop renewing, release nothing.
    pub(crate) fn disarm(mut self) {
        if let Some((lease, keeper)) = self.held.take() {
            keeper.forget(&lease);
        }
    }

    /// Gives the right up without releasing, for its lease's guard to claim again: a lease
    /// handed to a waiter becomes that waiter's like any lease it took itself.
    pub(crate) fn surrender(mut self) -> Arc<LeaseState> {
        let (lease, _) = self
            .held
            .take()
            .unwrap_or_else(|| unreachable!("a release right is held until it is consumed"));
        lease.unclaim_release();
        lease
    }
}

impl Drop for ReleaseRight {
    fn drop(&mut self) {
        if let Some((lease, keeper)) = self.held.take() {
            keeper.release_in_background(&lease);
        }
    }
}
