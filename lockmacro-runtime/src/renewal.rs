//! The renewal queue: one watchdog thread per client that keeps every live lease alive.
//!
//! The thread runs its own small tokio runtime, so leases are renewed and drop-time releases are
//! sent whatever happens to the runtimes of the callers (one per `#[tokio::test]`, say). It scans
//! every `scan_interval` and extends, in one round trip, each lease that is a third or more
//! through and has renewals left. A lease whose ttl is too short for the scan period (it would pass
//! half its ttl before the next scan) gets a wake-up of its own at its third.
//!
//! Registering and deregistering only touch a mutex-guarded map: the hot path never wakes the
//! thread, except for such a short lease.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{Notify, mpsc};
use tokio_util::task::TaskTracker;

use crate::backend::{Backend, ExtendBatch, Extension};
use crate::lease::{LeaseState, instant_at, now_nanos};

pub(crate) struct RenewalQueue {
    shared: Arc<Shared>,
    jobs: mpsc::UnboundedSender<Job>,
    /// The watchdog thread's runtime, for other background work of the client.
    background: tokio::runtime::Handle,
}

struct Shared {
    leases: Mutex<HashMap<u64, Arc<LeaseState>>>,
    /// When the watchdog plans to wake next (nanos); a new lease due earlier wakes it.
    planned_wake: AtomicU64,
    /// When the next regular scan is (nanos).
    next_scan: AtomicU64,
    wake: Notify,
    scan_interval: Duration,
    backend: Arc<Backend>,
}

enum Job {
    Release {
        key: String,
        token: String,
        ttl: Duration,
    },
}

impl RenewalQueue {
    /// Starts the watchdog thread; it ends once the queue is dropped and pending releases are sent.
    pub(crate) fn start(backend: Arc<Backend>, scan_interval: Duration) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            leases: Mutex::new(HashMap::new()),
            planned_wake: AtomicU64::new(u64::MAX),
            next_scan: AtomicU64::new(now_nanos().saturating_add(nanos(scan_interval))),
            wake: Notify::new(),
            scan_interval,
            backend,
        });
        let (jobs, queue) = mpsc::unbounded_channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let background = runtime.handle().clone();
        let watchdog = shared.clone();
        std::thread::Builder::new()
            .name("lockmacro-watchdog".into())
            .spawn(move || runtime.block_on(watch(watchdog, queue)))?;
        Ok(Self {
            shared,
            jobs,
            background,
        })
    }

    pub(crate) fn register(&self, lease: Arc<LeaseState>) {
        let wake_now = self.shared.wakes_too_late_for(&lease);
        self.shared.lock().insert(lease.id, lease);
        if wake_now {
            self.shared.wake.notify_one();
        }
    }

    /// After this returns the watchdog sends no new extension for the lease. One already on the
    /// wire cannot re-create a released key: extensions only touch keys that hold our token.
    pub(crate) fn deregister(&self, id: u64) {
        if let Some(lease) = self.shared.lock().remove(&id) {
            lease.finish();
        }
    }

    /// Compare-and-delete from the watchdog thread; safe from `Drop`, during a runtime's shutdown,
    /// or with no runtime at all.
    pub(crate) fn release_in_background(&self, key: String, token: String, ttl: Duration) {
        // Fails only when the watchdog is gone, i.e. the process is exiting: the key expires.
        let _ = self.jobs.send(Job::Release { key, token, ttl });
    }

    pub(crate) fn background(&self) -> &tokio::runtime::Handle {
        &self.background
    }

    pub(crate) fn len(&self) -> usize {
        self.shared.lock().len()
    }
}

impl Shared {
    /// Whether `lease` needs a wake-up of its own before the one the watchdog has planned.
    fn wakes_too_late_for(&self, lease: &LeaseState) -> bool {
        own_wake_up(lease, self.next_scan.load(Ordering::Acquire))
            .is_some_and(|own| own < self.planned_wake.load(Ordering::Acquire))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<LeaseState>>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The wake-up a lease needs of its own: at its third, when half its ttl would pass before
/// `next_scan`. Rounded up to a grid of ttl/12 (so still well before half), so that leases of
/// one ttl taken at about the same time share wake-ups and one pipelined round trip.
fn own_wake_up(lease: &LeaseState, next_scan: u64) -> Option<u64> {
    if !lease.renewals_left() {
        return None;
    }
    let sent = lease.confirmed_sent_at();
    let half = sent.saturating_add(nanos(lease.ttl / 2));
    (half < next_scan).then(|| {
        let third = sent.saturating_add(nanos(lease.ttl / 3));
        let grid = nanos(lease.ttl / 12).max(1);
        third.div_ceil(grid).saturating_mul(grid)
    })
}

async fn watch(shared: Arc<Shared>, mut jobs: mpsc::UnboundedReceiver<Job>) {
    let in_flight = TaskTracker::new();
    loop {
        let wake_at = scan(&shared, &in_flight);
        shared.planned_wake.store(wake_at, Ordering::Release);
        tokio::select! {
            job = jobs.recv() => match job {
                Some(Job::Release { key, token, ttl }) => {
                    in_flight.spawn(release_until_settled(shared.backend.clone(), key, token, ttl));
                }
                None => break,
            },
            () = tokio::time::sleep_until(instant_at(wake_at).into()) => {}
            () = shared.wake.notified() => {}
        }
    }
    in_flight.close();
    in_flight.wait().await;
}

/// Sends one batch of due extensions; returns when to wake next.
fn scan(shared: &Arc<Shared>, in_flight: &TaskTracker) -> u64 {
    let now = now_nanos();
    let interval = nanos(shared.scan_interval);
    let mut next_scan = shared.next_scan.load(Ordering::Acquire);
    while next_scan <= now {
        next_scan = next_scan.saturating_add(interval);
    }
    shared.next_scan.store(next_scan, Ordering::Release);
    let mut due = Vec::new();
    let mut wake_at = next_scan;
    for lease in shared.lock().values() {
        if !lease.renewals_left() || lease.is_lost() || lease.extending.load(Ordering::Acquire) {
            continue;
        }
        let third = lease
            .confirmed_sent_at()
            .saturating_add(nanos(lease.ttl / 3));
        if third <= now {
            lease.extending.store(true, Ordering::Release);
            due.push(lease.clone());
        } else if let Some(own) = own_wake_up(lease, next_scan) {
            wake_at = wake_at.min(own);
        }
    }
    if !due.is_empty() {
        in_flight.spawn(extend(shared.clone(), due));
    }
    wake_at
}

async fn extend(shared: Arc<Shared>, due: Vec<Arc<LeaseState>>) {
    let sent_at = now_nanos();
    let extensions: Vec<Extension<'_>> = due
        .iter()
        .map(|lease| Extension {
            key: &lease.key,
            token: &lease.token,
            ttl: lease.ttl,
        })
        .collect();
    let batch = ExtendBatch::new(&extensions);
    drop(extensions);
    match shared.backend.extend(&batch).await {
        Ok(extended) => {
            for (lease, extended) in due.iter().zip(extended) {
                if lease.is_finished() || lease.is_lost() {
                    // Its holder has stopped already; nothing to record.
                } else if extended {
                    let renewals = lease.extended(sent_at);
                    let max_renewals = lease
                        .max_renewals
                        .map_or("unlimited".into(), |max| max.to_string());
                    tracing::info!(key = %lease.key, renewals, %max_renewals, "lock lease renewed");
                } else {
                    tracing::warn!(key = %lease.key, "lock lost: key gone or held by another owner at renewal");
                    lease.mark_lost();
                }
            }
        }
        Err(failure) => {
            // The holder's local deadline still stands; the next scan tries again before it.
            tracing::warn!(leases = due.len(), error = %failure, "lock renewal failed");
        }
    }
    for lease in &due {
        lease.extending.store(false, Ordering::Release);
    }
    // Short leases need their next own wake-up computed from the new send time.
    if due.iter().any(|lease| shared.wakes_too_late_for(lease)) {
        shared.wake.notify_one();
    }
}

/// Retries the compare-and-delete until it is confirmed or the lease would have expired anyway.
async fn release_until_settled(backend: Arc<Backend>, key: String, token: String, ttl: Duration) {
    let give_up = Instant::now() + ttl;
    loop {
        match backend.release(&key, &token).await {
            Ok(true) => {
                tracing::debug!(key = %key, "lock released in the background");
                return;
            }
            Ok(false) => return,
            Err(failure) if Instant::now() + Duration::from_millis(100) < give_up => {
                tracing::debug!(key = %key, error = %failure, "background release failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(failure) => {
                tracing::warn!(key = %key, error = %failure, "background release gave up; the key expires with its lease");
                return;
            }
        }
    }
}

fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}
