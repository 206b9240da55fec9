//! The lease engine of one client: how a lock is taken (at once, or by waiting), registered with
//! the watchdog, and released; shared by the client, its clones and every lease it handed out.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::background::Background;
use crate::clock;
use crate::error::LockError;
use crate::handing::{Handed, Handing, Reclaim};
use crate::metrics::{self, Prefix};
use crate::options::{LockKind, LockOptions};
use crate::renewal::RenewalQueue;
use crate::rt::{self, Driver};
use crate::state::LeaseState;
use crate::store::{
    AcquireRequest, Acquired, HandOver, HandsOver, LeaseRef, Store, release_until_settled,
};
use crate::waiters::{Candidate, Offer, Ticket, WaitQueue};

pub(crate) struct Engine {
    pub(crate) id: u64,
    store: Arc<dyn Store>,
    renewals: RenewalQueue,
    waits: WaitQueue,
    response_timeout: Duration,
    /// Set by [`shutdown`](Self::shutdown): no lock is taken or kept after it.
    closing: Closing,
    shutdown_timeout: Duration,
    /// Last: dropping it stops the watchdog and the subscriber.
    background: Background,
}

/// A client's shutdown: a flag that every call reads, and a token that waiters await. (Asking
/// the token alone would take its mutex on every call, shared by every thread calling in.)
#[derive(Default)]
struct Closing {
    closed: AtomicBool,
    token: CancellationToken,
}

impl Closing {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.token.cancel();
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }
}

/// The timing settings of a client.
pub(crate) struct Timing {
    pub(crate) scan_interval: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) shutdown_timeout: Duration,
}

/// What one attempt found.
enum Attempt {
    Taken(Arc<LeaseState>),
    Busy { remaining: Option<Duration> },
}

/// Whether an acquisition found the lock busy before it took it: its wait is zero otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    No,
    Yes,
}

impl Engine {
    pub(crate) fn new(store: Arc<dyn Store>, background: Background, timing: Timing) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        metrics::describe();
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            renewals: RenewalQueue::start(store.clone(), timing.scan_interval, &background),
            waits: WaitQueue::start(store.clone(), &background),
            store,
            response_timeout: timing.response_timeout,
            closing: Closing::default(),
            shutdown_timeout: timing.shutdown_timeout,
            background,
        }
    }

    /// Stops taking locks, cancels the work held under this client's leases (it gets
    /// [`LockError::ShutDown`]) and the calls waiting for a lock, releases every lease and waits
    /// for the confirmations, for at most the shutdown timeout. A second call finds nothing to do.
    pub(crate) async fn shutdown(&self) -> Result<(), LockError> {
        self.closing.close();
        let leases: Vec<Arc<LeaseState>> = self
            .renewals
            .drain()
            .into_iter()
            .filter(|lease| {
                lease.shut_down();
                lease.claim_release()
            })
            .collect();
        if leases.is_empty() {
            return Ok(());
        }
        tracing::info!(
            leases = leases.len(),
            "lock client shutting down; releasing every lease"
        );
        let releases = leases
            .iter()
            .map(|lease| self.store.release(lease.lease_ref()));
        let outcomes = tokio::time::timeout(
            self.shutdown_timeout,
            futures_util::future::join_all(releases),
        )
        .await;
        let failed: Vec<&Arc<LeaseState>> = match &outcomes {
            Ok(outcomes) => leases
                .iter()
                .zip(outcomes)
                .filter(|(_, outcome)| outcome.is_err())
                .map(|(lease, _)| lease)
                .collect(),
            Err(_) => leases.iter().collect(),
        };
        if failed.is_empty() {
            return Ok(());
        }
        for lease in &failed {
            self.retry_release(lease);
        }
        Err(LockError::Redis {
            key: None,
            source: format!(
                "{} of {} releases not confirmed within the shutdown timeout of {:?}; \
                 they are retried in the background and expire with their leases at the latest",
                failed.len(),
                leases.len(),
                self.shutdown_timeout
            )
            .into(),
        })
    }

    /// The error for a call on `key` after the shutdown began.
    fn shut(&self, key: &str) -> Result<(), LockError> {
        if self.closing.is_closed() {
            return Err(LockError::ShutDown {
                key: key.to_owned(),
            });
        }
        Ok(())
    }

    /// Opens every connection the client keeps: the caller's, the watchdog's and the
    /// subscriber's, so no lease pays for a connect (or a TLS handshake) inside its ttl.
    pub(crate) async fn connect(&self) -> Result<(), LockError> {
        rt::require(Driver::Time)?;
        self.background.ensure_running();
        self.store
            .connect()
            .await
            .map_err(|error| error.into_lock_error(None))?;
        let store = self.store.clone();
        let (reply, on_watchdog) = tokio::sync::oneshot::channel();
        self.background.spawn(async move {
            let _ = reply.send(store.connect().await);
        });
        if let Ok(Err(error)) = on_watchdog.await {
            return Err(error.into_lock_error(None));
        }
        self.waits
            .connect()
            .await
            .map_err(|error| error.into_lock_error(None))
    }

    /// Takes `key` (waiting for it when `options` say so) and registers the lease with the
    /// watchdog.
    pub(crate) async fn acquire(
        &self,
        key: String,
        options: &LockOptions,
    ) -> Result<Arc<LeaseState>, LockError> {
        let prefix = Prefix::of(options.label, &key);
        // Read only for a wait's metrics: a clock read is not free.
        let started = options.wait.map(|_| Instant::now());
        let taken = self.take(key, options).await;
        let outcome = match &taken {
            Ok(_) => "acquired",
            Err(LockError::Busy { .. }) => "busy",
            Err(_) => "error",
        };
        metrics::acquisition(&prefix, outcome);
        if let Some(started) = started {
            let waited = match &taken {
                Ok((_, Waited::No)) => Duration::ZERO,
                _ => started.elapsed(),
            };
            metrics::waited(&prefix, waited);
        }
        taken.map(|(lease, _)| lease)
    }

    async fn take(
        &self,
        key: String,
        options: &LockOptions,
    ) -> Result<(Arc<LeaseState>, Waited), LockError> {
        rt::require(Driver::Time)?;
        check(options)?;
        self.shut(&key)?;
        self.background.ensure_running();
        let (lease, waited) = self.acquire_or_wait(key, options).await?;
        if self.closing.is_closed() {
            // Taken while the client shut down: give it back at once.
            if lease.claim_release() {
                self.forget(&lease);
                let _ = self.store.release(lease.lease_ref()).await;
            }
            return Err(LockError::ShutDown {
                key: lease.key.clone(),
            });
        }
        Ok((lease, waited))
    }

    async fn acquire_or_wait(
        &self,
        key: String,
        options: &LockOptions,
    ) -> Result<(Arc<LeaseState>, Waited), LockError> {
        let Some(wait) = options.wait else {
            return match self.try_acquire(&key, new_token(), options, false).await? {
                Attempt::Taken(lease) => Ok((lease, Waited::No)),
                Attempt::Busy { remaining } => Err(LockError::Busy {
                    key,
                    retry_after: remaining,
                }),
            };
        };
        // Boxed: the waiting path's state machine is large, and inline it would make every
        // caller's future as large, copied on each acquisition, waiting or not.
        Box::pin(self.wait_for(key, options, wait)).await
    }

    /// Takes `key`, waiting at most `wait` for it.
    async fn wait_for(
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
            let joined = ticket.insert(self.waits.join(
                &key,
                false,
                Prefix::of(options.label, &key),
            ));
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
                    let prefix = Prefix::of(options.label, &key);
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
                Handing::Handed(handed) => return Ok(Some(handed.take())),
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
    fn give_up_token(&self, key: &str, token: &str, options: &LockOptions) {
        let given_up = LeaseState::new(
            next_lease_id(),
            self.id,
            key.to_owned(),
            token.to_owned(),
            options,
            None,
            clock::now(),
        );
        self.retry_release(&Arc::new(given_up));
    }

    /// One attempt to take `key`; a `waiting` attempt keeps the caller's place when busy.
    async fn try_acquire(
        &self,
        key: &str,
        token: String,
        options: &LockOptions,
        waiting: bool,
    ) -> Result<Attempt, LockError> {
        let ttl = options.ttl;
        // A reply later than the lease itself is worthless: the lock may have lapsed already.
        let budget = self.response_timeout.min(
            ttl.saturating_sub(clock::drift(ttl))
                .max(Duration::from_millis(1)),
        );
        let request = AcquireRequest {
            key,
            token: &token,
            kind: options.kind,
            ttl,
            fencing: options.fencing,
            waiting,
            fair: options.fair,
        };
        let sent_at = clock::now();
        match metrics::timed("acquire", self.store.acquire(request, budget)).await {
            Ok(Acquired::Taken { fencing_token }) => {
                let lease = Arc::new(LeaseState::new(
                    next_lease_id(),
                    self.id,
                    key.to_owned(),
                    token,
                    options,
                    fencing_token,
                    sent_at,
                ));
                self.renewals.register(lease.clone());
                tracing::debug!(key = %key, ttl_ms = clock::millis(ttl), fencing_token, "lock acquired");
                Ok(Attempt::Taken(lease))
            }
            Ok(Acquired::Busy { remaining }) => {
                tracing::debug!(key = %key, "lock busy");
                Ok(Attempt::Busy { remaining })
            }
            Err(error) => Err(error.into_lock_error(Some(key))),
        }
    }

    /// Releases `lease` and waits for the answer: `true` when it was ours and is gone now, or
    /// handed to the next waiter of this client.
    pub(crate) async fn release(self: &Arc<Self>, lease: &LeaseState) -> Result<bool, LockError> {
        self.renewals.deregister(lease.id);
        if lease.kind == LockKind::Exclusive
            && let Some(store) = self.store.hands_over()
            && !self.closing.is_closed()
            && let Some(next) = self.waits.next_candidate(&lease.key)
        {
            // Boxed, as the waiting path is: it stays out of every release's future.
            return Box::pin(self.hand_over(store, lease, next)).await;
        }
        let released = metrics::timed("release", self.store.release(lease.lease_ref()))
            .await
            .map_err(|error| error.into_lock_error(Some(&lease.key)));
        if let Ok(deleted) = released {
            metrics::release(&lease.prefix, "confirmed");
            if deleted {
                self.waits.released_here(&lease.key, &lease.token);
            }
        }
        released
    }

    /// Passes `lease` straight to `next`, a parked waiter of this client, unless another client
    /// waits for the key too (then it is released and announced, and `next` looks again).
    async fn hand_over(
        self: &Arc<Self>,
        store: &dyn HandsOver,
        lease: &LeaseState,
        next: Candidate,
    ) -> Result<bool, LockError> {
        let to = LeaseRef {
            key: &lease.key,
            token: &next.token,
            kind: LockKind::Exclusive,
            ttl: next.options.ttl,
        };
        tracing::debug!(key = %lease.key, "handing the lock to the next waiter of this client");
        let sent_at = clock::now();
        let outcome = metrics::timed("release", store.hand_over(lease.lease_ref(), to)).await;
        match outcome {
            Ok(HandOver::Handed) => {
                metrics::release(&lease.prefix, "confirmed");
                let handed = Arc::new(LeaseState::new(
                    next_lease_id(),
                    self.id,
                    lease.key.clone(),
                    next.token.clone(),
                    &next.options,
                    None,
                    sent_at,
                ));
                self.renewals.register(handed.clone());
                tracing::debug!(key = %lease.key, "lock handed to the next waiter of this client");
                // A waiter gone meanwhile gets it back here, and its drop releases it.
                let _ = next.tell(Handing::Handed(Handed::new(handed, self.clone())));
                Ok(true)
            }
            Ok(HandOver::Released) => {
                metrics::release(&lease.prefix, "confirmed");
                let _ = next.tell(Handing::Declined);
                self.waits.released_here(&lease.key, &lease.token);
                Ok(true)
            }
            Ok(HandOver::NotOurs) => {
                let _ = next.tell(Handing::Look);
                Ok(false)
            }
            Err(error) => {
                // The key may hold either token now. Ours is released in the background by the
                // caller's guard; the waiter gives its own up (or, gone, has it given up here).
                let (key, token, options) = (lease.key.clone(), next.token.clone(), next.options);
                if next.tell(Handing::Uncertain).is_err() {
                    self.give_up_token(&key, &token, &options);
                }
                Err(error.into_lock_error(Some(&lease.key)))
            }
        }
    }

    /// Releases `lease` on the client's runtime, retried until answered or the lease would
    /// have lapsed; safe from `Drop`, during a runtime's shutdown, or with no runtime at all.
    pub(crate) fn release_in_background(&self, lease: &Arc<LeaseState>) {
        self.renewals.deregister(lease.id);
        self.retry_release(lease);
    }

    fn retry_release(&self, lease: &Arc<LeaseState>) {
        metrics::release(&lease.prefix, "background");
        let (store, lease, waker) = (self.store.clone(), lease.clone(), self.waits.waker());
        self.background.spawn(async move {
            match release_until_settled(store.as_ref(), lease.lease_ref()).await {
                Some(true) => waker.released_here(&lease.key, &lease.token),
                Some(false) => {}
                None => metrics::release(&lease.prefix, "failed"),
            }
        });
    }

    /// Stops renewing `lease` (its holder knows it lost it).
    pub(crate) fn forget(&self, lease: &LeaseState) {
        self.renewals.deregister(lease.id);
    }

    pub(crate) fn held_leases(&self) -> usize {
        self.renewals.len()
    }

    /// How many callers of this client are parked waiting for `key` now.
    pub(crate) fn parked_waiters(&self, key: &str) -> usize {
        self.waits.parked(key)
    }
}

impl Reclaim for Engine {
    fn reclaim(&self, lease: &Arc<LeaseState>) {
        if lease.claim_release() {
            self.release_in_background(lease);
        } else {
            self.forget(lease);
        }
    }
}

/// A lease's id in the watchdog's registry: unique within the process.
fn next_lease_id() -> u64 {
    static IDS: AtomicU64 = AtomicU64::new(1);
    IDS.fetch_add(1, Ordering::Relaxed)
}

/// A fresh 128-bit random token, 32 hex digits: proof that a lease is ours.
fn new_token() -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = rand::random::<u128>();
    let digits: [u8; 32] = std::array::from_fn(|i| HEX[(bits >> ((31 - i) * 4)) as usize & 0xf]);
    String::from_utf8(digits.to_vec()).expect("hex digits are ASCII")
}

/// Options that can only be refused at run time.
fn check(options: &LockOptions) -> Result<(), LockError> {
    match options.kind {
        LockKind::Permits(0) => Err(LockError::InvalidOptions {
            message: "`permits` must be at least 1: a semaphore of no permits is never free".into(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::new_token;

    #[test]
    fn a_token_is_32_lowercase_hex_digits_and_fresh_each_time() {
        let token = new_token();
        assert_eq!(token.len(), 32);
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{token}"
        );
        assert_ne!(token, new_token());
    }
}
