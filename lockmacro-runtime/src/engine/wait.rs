//! Waiting for a busy lock: parked on a release of the key (announced, or made by this client),
//! offered a hand-over by this client's releases, or looking again when the holder's lease would
//! have run out.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::acquire::Attempt;
use super::{Engine, Waited, new_token, next_lease_id};
use crate::clock;
use crate::error::LockError;
use crate::metrics::Prefix;
use crate::options::{LockKind, LockOptions};
use crate::state::LeaseState;
use crate::waiters::{Handing, Offer, Ticket};

impl Engine {
    /// Takes `key`, waiting at most `wait` for it.
    pub(super) async fn wait_for(
        &self,
        key: String,
        options: &LockOptions,
        wait: Duration,
    ) -> Result<(Arc<LeaseState>, Waited), LockError> {
        let give_up = clock::after(Instant::now(), wait);
        // One token for every attempt of this wait: it keeps its place in a fair queue and its
        // claim as a waiting writer. Only `Busy` leads to another attempt, and a busy attempt
        // took nothing, so nothing of an earlier attempt can be mistaken for the new lease.
        let mut token = new_token();
        let mut ticket: Option<Ticket<'_>> = None;
        let mut polls = clock::Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let mut waited = Waited::No;
        // A fair waiter keeps its place in the queue from its first attempt. An exclusive
        // lock's first attempt is a plain `SET NX` (most find the key free, and no earlier
        // attempt of this token left a claim to clear); from its second attempt a writer that
        // waits on readers also keeps new readers out, and a busy key is marked as waited for
        // (its release is announced only then).
        let mut keeps_place = options.fair || options.kind != LockKind::Exclusive;
        if options.kind == LockKind::Exclusive && !options.fair && self.waits.anyone_waits(&key) {
            // Others of this client already wait for the key: queue behind them rather than
            // barge in ahead of the waiter a release just woke (a releaser that comes straight
            // back would otherwise take the lock again and again). A release wakes the longest
            // parked first; a short poll covers a queue that has nobody left to release.
            waited = Waited::Yes;
            let joined = ticket.insert(self.waits.join(&key, false, Prefix::of(options.label)));
            let heard = joined.releases_heard();
            let turn = polls
                .next_delay()
                .min(give_up.saturating_duration_since(Instant::now()));
            if let Some(lease) = self
                .park(joined, &key, &mut token, options, turn, heard)
                .await?
            {
                return Ok((lease, waited));
            }
            // Subscribed already: an attempt that finds the key busy marks it, so that its
            // holder's release is announced.
            keeps_place = true;
        }
        loop {
            let heard = ticket.as_ref().map_or(0, Ticket::releases_heard);
            let attempt = self.try_acquire(&key, token.clone(), options, keeps_place);
            let remaining = match attempt.await? {
                Attempt::Taken(lease) => return Ok((lease, waited)),
                Attempt::Busy { remaining } => remaining,
            };
            keeps_place = true;
            waited = Waited::Yes;
            let left = give_up.saturating_duration_since(Instant::now());
            if left.is_zero() {
                tracing::debug!(key = %key, "lock still busy when the wait ran out");
                return Err(LockError::Busy {
                    key,
                    retry_after: remaining,
                });
            }
            let ticket = match &ticket {
                Some(ticket) => ticket,
                None => {
                    tracing::debug!(key = %key, "lock busy; waiting");
                    // Readers can all go in at once, and a fair queue's head may be anyone:
                    // every such waiter looks at each release, not just one.
                    let everyone = options.fair || options.kind != LockKind::Exclusive;
                    let prefix = Prefix::of(options.label);
                    let joined = ticket.insert(self.waits.join(&key, everyone, prefix));
                    let heard = tokio::select! {
                        heard = joined.subscribed(left) => heard,
                        () = self.closing.cancelled() => return Err(LockError::ShutDown { key }),
                    };
                    if heard {
                        // Subscribed: no release can slip by unheard from now on. Look again.
                        continue;
                    }
                    joined
                }
            };
            // A holder that died announces nothing: sleep at most its remaining lease.
            let mut fallback = match remaining {
                Some(remaining) => clock::jittered(remaining, 0.05) + Duration::from_millis(1),
                None => polls.next_delay(),
            };
            if options.fair {
                // Come back well within the time a place in the fair queue is kept.
                fallback = fallback.min(options.ttl.max(Duration::from_secs(1)) / 3);
            }
            let left = give_up.saturating_duration_since(Instant::now());
            let parked = self.park(ticket, &key, &mut token, options, fallback.min(left), heard);
            if let Some(lease) = parked.await? {
                return Ok((lease, waited));
            }
        }
    }

    /// Waits for a release of the key (heard since `heard`), at most `fallback`. A waiter that
    /// asks for nothing but the exclusive lock also offers to be handed it by a release of this
    /// client, saving the release's announcement and its own `SET`: `Some` is the lease handed
    /// to it. A hand-over that got no answer leaves `token` given up and replaced. `ShutDown`
    /// when the client shuts down.
    async fn park(
        &self,
        ticket: &Ticket<'_>,
        key: &str,
        token: &mut String,
        options: &LockOptions,
        fallback: Duration,
        heard: u64,
    ) -> Result<Option<Arc<LeaseState>>, LockError> {
        let takes_hand_over = options.kind == LockKind::Exclusive
            && !options.fair
            && !options.fencing
            && self.store.hands_over().is_some();
        let _parked = ticket.park();
        let mut offer = takes_hand_over.then(|| ticket.offer(token, options));
        loop {
            let settled = tokio::select! {
                () = ticket.released_or(fallback, heard) => None,
                handing = Offer::settled(&mut offer) => Some(handing),
                () = self.closing.cancelled() => {
                    return Err(LockError::ShutDown { key: key.to_owned() });
                }
            };
            let handing = match (settled, offer.take()) {
                (Some(handing), _) => handing,
                (None, None) => return Ok(None),
                (None, Some(offer)) => match offer.withdraw().await {
                    Some(handing) => handing,
                    None => return Ok(None),
                },
            };
            match handing {
                Handing::Handed(right) => return Ok(Some(right.surrender())),
                Handing::Look => return Ok(None),
                // Wait for the announcement of that release (or the fallback).
                Handing::Declined => {}
                Handing::Uncertain => {
                    self.give_up_token(key, token, options);
                    *token = new_token();
                    return Ok(None);
                }
            }
        }
    }

    /// Releases, in the background, whatever `token` may hold of `key`: a token a hand-over
    /// may have put there without either side learning it.
    pub(super) fn give_up_token(&self, key: &str, token: &str, options: &LockOptions) {
        // No work ran under it: deleted, whatever `hold_at_least` says.
        let options = options.without_hold();
        let given_up = LeaseState::new(
            next_lease_id(),
            self.id,
            key.to_owned(),
            token.to_owned(),
            &options,
            None,
            clock::now(),
        );
        self.retry_release(&Arc::new(given_up));
    }
}
