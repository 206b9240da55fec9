//! Releasing a lease: a compare-and-delete, or a hand-over to the next waiter of this client
//! (or, by either, to a caller elsewhere that waited too long and reserved the key); after a
//! release this client's waiters for the key look again.

use std::sync::Arc;

use super::Engine;
use crate::clock;
use crate::error::LockError;
use crate::metrics;
use crate::options::LockKind;
use crate::right::ReleaseRight;
use crate::state::LeaseState;
use crate::store::protocol::hint;
use crate::store::{HandOver, HandsOver, LeaseRef};
use crate::waiters::{Candidate, Handing};

impl Engine {
    /// Releases the lease `right` holds and waits for the answer: `true` when it was ours and
    /// is gone now, or handed to the next waiter of this client. The right is disarmed once the
    /// answer came; dropped before it (or on an error), it releases in the background.
    pub(crate) async fn release(self: &Arc<Self>, right: ReleaseRight) -> Result<bool, LockError> {
        let lease = right.lease().clone();
        self.renewals.deregister(lease.id);
        if lease.holds_on() {
            // `hold_at_least`: the key stays taken, so there is nothing to hand over.
            lease.extension_settled().await;
        } else if lease.kind == LockKind::Exclusive
            && lease.keys.is_empty()
            && let Some(store) = self.store.hands_over()
            && !self.closing.is_closed()
            && let Some(next) = self.waits.next_candidate(&lease.key)
        {
            // Boxed, as the waiting path is: it stays out of every release's future.
            return Box::pin(self.hand_over(store, right, next)).await;
        }
        let released = self
            .release_in_turn(self.store.release(lease.lease_ref()))
            .await;
        let released = released.map_err(|error| error.into_lock_error(Some(&lease.key)))?;
        right.disarm();
        metrics::release(&lease.prefix, "confirmed");
        // After a release that kept the key (`hold_at_least`) too: this client's waiters learn
        // the hold's end as the key's time left, rather than sleep out the lease they saw.
        if released {
            for key in lease.all_keys() {
                self.waits.released_here(key, &lease.value);
            }
        }
        Ok(released)
    }

    /// Passes the lease `right` holds straight to `next`, a parked waiter of this client, unless
    /// a caller waited too long and reserved the key (then it passes to that caller, and `next`
    /// keeps its place, first in line).
    async fn hand_over(
        self: &Arc<Self>,
        store: &dyn HandsOver,
        right: ReleaseRight,
        next: Candidate,
    ) -> Result<bool, LockError> {
        let lease = right.lease().clone();
        let (value, _) = self.value_of(&next.token, next.last_ms);
        let to = LeaseRef {
            key: &lease.key,
            keys: &[],
            value: &value,
            kind: LockKind::Exclusive,
            ttl: next.options.ttl,
            hold_until: None,
            undone: false,
        };
        tracing::debug!(key = %lease.key, token_hint = %hint(lease.token()), to = %hint(&next.token), "handing the lock to the next waiter of this client");
        let sent_at = clock::now();
        let outcome = metrics::timed("hand_over", store.hand_over(lease.lease_ref(), to)).await;
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => {
                // The key may hold either token now. Ours is released in the background (the
                // right drops here); the waiter gives its own up (or, gone, has it given up).
                drop(right);
                let (key, token, ttl) = (lease.key.clone(), next.token.clone(), next.options.ttl);
                if next.tell(Handing::Uncertain).is_err() {
                    self.give_up_token(&key, &token, ttl);
                }
                return Err(error.into_lock_error(Some(&lease.key)));
            }
        };
        right.disarm();
        match outcome {
            HandOver::Handed => {
                metrics::release(&lease.prefix, "confirmed");
                let handed = Arc::new(LeaseState::new(
                    self.next_lease_id(),
                    self.id,
                    lease.key.clone(),
                    value,
                    &next.options,
                    None,
                    sent_at,
                ));
                self.hold(handed.clone());
                tracing::debug!(key = %lease.key, token_hint = %hint(lease.token()), to = %hint(&next.token), "lock handed to the next waiter of this client");
                // Nobody else knows the new lease yet: its right is free to claim. A waiter gone
                // meanwhile gets it back here, and dropping it releases the lease.
                if let Some(right) = ReleaseRight::claim(&handed, self) {
                    let _ = next.tell(Handing::Handed(right));
                }
                Ok(true)
            }
            HandOver::Released => {
                metrics::release(&lease.prefix, "confirmed");
                let _ = next.tell(Handing::Declined);
                self.waits.released_here(&lease.key, &lease.value);
                Ok(true)
            }
            HandOver::ToReservation => {
                // Not free: the next of this client keeps its place for a later release. (Told
                // to wait for an announcement, it slept out its fallback when that caller was
                // of this client: its release is a hand-over, announced to nobody.)
                metrics::release(&lease.prefix, "confirmed");
                tracing::debug!(key = %lease.key, "lock handed to a caller that waited longer");
                let _ = next.tell(Handing::Passed);
                Ok(true)
            }
            HandOver::NotOurs => {
                let _ = next.tell(Handing::Look);
                Ok(false)
            }
        }
    }
}
