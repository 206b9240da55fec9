//! The lease engine of one client, shared by the client, its clones and every lease it handed
//! out. A lock's life, in order: `acquire.rs` (at once, or by waiting: `wait.rs`), registered
//! with the watchdog (`renewal.rs`), `release.rs` (or handed to the next waiter); the client's
//! connect and shutdown here. Several keys at once: `many.rs`.

mod acquire;
mod many;
mod release;
mod turns;
mod wait;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::TaskTracker;
use tokio_util::task::task_tracker::TaskTrackerToken;

use crate::background::Background;
use crate::clock;
use crate::error::LockError;
use crate::metrics;
use crate::renewal::RenewalQueue;
use crate::right::{Keeper, ReleaseRight};
use crate::rt::{self, Driver};
use crate::state::LeaseState;
use crate::store::protocol::{Origin, new_token};
use crate::store::{Store, release_before, release_until_settled};
use crate::waiters::WaitQueue;

pub(crate) struct Engine {
    /// Unique in the process: a task's held leases name the engine that took them.
    pub(crate) id: u64,
    /// The next lease id ([`next_lease_id`](Self::next_lease_id)).
    lease_ids: AtomicU64,
    /// The wall clock as this client reads it.
    wall: clock::Wall,
    store: Arc<dyn Store>,
    renewals: RenewalQueue,
    waits: WaitQueue,
    response_timeout: Duration,
    /// Bounds the acquires and releases this client has on the wire at once.
    in_flight: turns::Turns,
    /// Set by [`shutdown`](Self::shutdown): no lock is taken or kept after it.
    closing: Closing,
    shutdown_timeout: Duration,
    /// Who takes this client's locks: written into every lock value.
    origin: Origin,
    /// Last: dropping it stops the watchdog and the subscriber.
    background: Background,
}

/// A client's shutdown: a flag that every call reads, a token that waiters await, and the
/// takes under way, which the shutdown waits for. (Asking the token alone would take its mutex
/// on every call, shared by every thread calling in.)
#[derive(Default)]
struct Closing {
    closed: AtomicBool,
    token: CancellationToken,
    takes: TaskTracker,
}

impl Closing {
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.token.cancel();
        self.takes.close();
    }

    /// Counts a take under way until the token drops, or `None` once the shutdown began. The
    /// count and the shutdown's mark share one atomic: either this take sees the mark, or the
    /// shutdown sees the take and waits until it gave back what it took.
    fn taking(&self) -> Option<TaskTrackerToken> {
        let taking = self.takes.token();
        (!self.takes.is_closed()).then_some(taking)
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }
}

/// Acquires and releases one client sends at once; more callers queue in the client, where no
/// response timeout runs yet. A hundred thousand first attempts sent at once queued on the one
/// connection past the response timeout (four in ten failed with "timed out"), and the replies
/// that came were so late that leases began with little of their ttl left. 256 in flight keep a
/// connection's pipeline full (a loopback round trip carries that many in well under a
/// millisecond); a thousand still timed out at 300 ms on a quarter of a starved core.
const REQUESTS_IN_FLIGHT: usize = 256;

/// The timing settings of a client.
pub(crate) struct Timing {
    pub(crate) scan_interval: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) wall: clock::Wall,
}

/// Whether an acquisition found the lock busy before it took it: its wait is zero otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Waited {
    No,
    Yes,
}

impl Engine {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        background: Background,
        timing: Timing,
        origin: Origin,
    ) -> Self {
        static IDS: AtomicU64 = AtomicU64::new(1);
        metrics::describe();
        let renewals = RenewalQueue::start(store.clone(), timing.scan_interval, &background);
        Self {
            id: IDS.fetch_add(1, Ordering::Relaxed),
            lease_ids: AtomicU64::new(1),
            wall: timing.wall,
            waits: WaitQueue::start(store.clone(), &background, renewals.checker()),
            renewals,
            store,
            response_timeout: timing.response_timeout,
            in_flight: turns::Turns::new(REQUESTS_IN_FLIGHT),
            closing: Closing::default(),
            shutdown_timeout: timing.shutdown_timeout,
            origin,
            background,
        }
    }

    /// Hands a lease just taken to the watchdog, and keeps the release subscription open so its
    /// holder hears a forced release of its key.
    fn hold(&self, lease: Arc<LeaseState>) {
        self.renewals.register(lease);
        self.waits.listen();
    }

    /// The value a lease of `token` taken now stores (the token, the time, and who takes it),
    /// and its time: later than `after_ms`, the time of the value made before for the same
    /// caller (0 for none). Two looks of one wait, or a look and a hand-over to its caller,
    /// never share a value: a look of unknown outcome is undone by comparing its whole value,
    /// and a look that lands late changes nothing where a later one took the key (values.lua
    /// `later_attempt`).
    fn value_of(&self, token: &str, after_ms: u64) -> (String, u64) {
        let ms = self.wall.millis().max(after_ms.saturating_add(1));
        (self.origin.value(token, ms), ms)
    }

    /// Sends an acquire in its turn (see [`REQUESTS_IN_FLIGHT`]): its reply, and when it went
    /// on the wire (nanos). A lease's time counts from then: time spent queued in the client is
    /// not the lease's.
    async fn acquire_in_turn<T: metrics::Answer>(
        &self,
        request: impl Future<Output = T>,
    ) -> (T, u64) {
        let _turn = self.in_flight.take().await;
        let sent_at = clock::now();
        (metrics::timed("acquire", request).await, sent_at)
    }

    /// Sends a release in its turn (see [`REQUESTS_IN_FLIGHT`]).
    async fn release_in_turn<T: metrics::Answer>(&self, request: impl Future<Output = T>) -> T {
        let _turn = self.in_flight.take().await;
        metrics::timed("release", request).await
    }

    /// A lease's id in this engine's watchdog registry. Counted per engine, not per process, so
    /// the registry's order does not depend on what else ran in the process before.
    fn next_lease_id(&self) -> u64 {
        self.lease_ids.fetch_add(1, Ordering::Relaxed)
    }

    /// The deployment, for inspection (`crate::inspect`).
    pub(crate) fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Stops taking locks, cancels the work held under this client's leases (it gets
    /// [`LockError::ShutDown`]) and the calls waiting for a lock, releases every lease and waits
    /// for the confirmations, for at most the shutdown timeout. A second call finds nothing to do.
    pub(crate) async fn shutdown(self: &Arc<Self>) -> Result<(), LockError> {
        self.closing.close();
        let give_up = tokio::time::Instant::now() + self.shutdown_timeout;
        let released = self.release_every_lease(give_up).await;
        // A take on the wire when the shutdown began may still succeed: it gives the lock back
        // itself (`take`), and the shutdown returns once it did.
        let takes_ended = tokio::time::timeout_at(give_up, self.closing.takes.wait())
            .await
            .is_ok();
        if !takes_ended && released.is_ok() {
            return Err(LockError::Redis {
                key: None,
                source: format!(
                    "{} acquisitions under way did not end within the shutdown timeout of {:?}; \
                     a lock they took is released in the background and expires with its lease \
                     at the latest",
                    self.closing.takes.len(),
                    self.shutdown_timeout
                )
                .into(),
            });
        }
        released
    }

    /// Releases every lease the watchdog keeps, each sent again until it is confirmed or
    /// `give_up` comes.
    async fn release_every_lease(
        self: &Arc<Self>,
        give_up: tokio::time::Instant,
    ) -> Result<(), LockError> {
        let rights: Vec<ReleaseRight> = self
            .renewals
            .drain()
            .into_iter()
            .filter_map(|lease| {
                lease.shut_down();
                ReleaseRight::claim(&lease, self)
            })
            .collect();
        if rights.is_empty() {
            return Ok(());
        }
        tracing::info!(
            leases = rights.len(),
            "lock client shutting down; releasing every lease"
        );
        // A Redis that stalls at shutdown and comes back within the timeout still gets every
        // release.
        let releases = rights.iter().map(|right| async move {
            let lease = right.lease();
            if lease.holds_on() {
                lease.extension_settled().await;
            }
            release_before(self.store.as_ref(), lease.lease_ref(), give_up).await
        });
        let outcomes =
            tokio::time::timeout_at(give_up, futures_util::future::join_all(releases)).await;
        let total = rights.len();
        let mut failed = 0;
        let mut last_error = None;
        for (i, right) in rights.into_iter().enumerate() {
            match &outcomes {
                Ok(outcomes) if outcomes[i].is_ok() => right.disarm(),
                // Dropped unconfirmed: retried in the background.
                _ => {
                    failed += 1;
                    if let Ok(outcomes) = &outcomes
                        && let Err(error) = &outcomes[i]
                    {
                        last_error = Some(error.to_string());
                    }
                    drop(right);
                }
            }
        }
        if failed == 0 {
            return Ok(());
        }
        let last_error = last_error.unwrap_or_else(|| "no answer".to_owned());
        Err(LockError::Redis {
            key: None,
            source: format!(
                "{failed} of {total} releases not confirmed within the shutdown timeout of {:?} \
                 (last: {last_error}); they are retried in the background and expire with their \
                 leases at the latest",
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

    fn retry_release(&self, lease: &Arc<LeaseState>) {
        metrics::release(&lease.prefix, "background");
        let (store, lease, waker) = (self.store.clone(), lease.clone(), self.waits.waker());
        self.background.spawn(async move {
            if lease.holds_on() {
                lease.extension_settled().await;
            }
            match release_until_settled(store.as_ref(), lease.lease_ref()).await {
                Some(true) => {
                    for key in lease.all_keys() {
                        waker.released_here(key, &lease.value);
                    }
                }
                Some(false) => {}
                None => metrics::release(&lease.prefix, "failed"),
            }
        });
    }

    /// The waiter of `token` leaves `key` without the lock, in the background (see
    /// `Store::leave`), tried again until answered or `ttl` has passed (by then a key handed to
    /// it has expired, and its count entry will).
    fn leave_in_background(&self, key: &str, token: &str, ttl: Duration) {
        let (store, key, token) = (self.store.clone(), key.to_owned(), token.to_owned());
        self.background.spawn(async move {
            let give_up = tokio::time::Instant::now() + ttl;
            let mut backoff = clock::Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
            loop {
                match store.leave(&key, &token).await {
                    Ok(()) => return,
                    Err(error) => {
                        let pause = backoff.next_delay();
                        if tokio::time::Instant::now() + pause >= give_up {
                            tracing::warn!(key = %key, error = %error, "a waiter could not leave the key; its reservation and count expire with it");
                            return;
                        }
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        });
    }

    /// The longest any one request waits for its reply.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.response_timeout
    }

    pub(crate) fn held_leases(&self) -> usize {
        self.renewals.len()
    }

    /// How many callers of this client are parked waiting for `key` now.
    pub(crate) fn parked_waiters(&self, key: &str) -> usize {
        self.waits.parked(key)
    }
}

impl Keeper for Engine {
    /// Releases `lease` on the client's runtime, retried until answered or the lease would
    /// have lapsed; safe from `Drop`, during a runtime's shutdown, or with no runtime at all.
    fn release_in_background(&self, lease: &Arc<LeaseState>) {
        self.renewals.deregister(lease.id);
        self.retry_release(lease);
    }

    /// Stops renewing `lease` (its holder knows it is gone). A lease out of the watchdog's
    /// registry already (released, or drained by the shutdown) costs no second look in it.
    fn forget(&self, lease: &LeaseState) {
        if !lease.is_finished() {
            self.renewals.deregister(lease.id);
        }
    }
}
