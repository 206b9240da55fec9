//! The renewal queue: one watchdog task per client that keeps every live lease alive.
//!
//! It runs where the client's background work runs ([`Background`]). It scans every
//! `scan_interval` and extends each lease that is a third or more through and has renewals left,
//! in batches of at most 10 000 leases, one round trip each, four on the wire at once (one batch
//! a tick below 10 000 leases). A lease whose ttl is too short for the scan period (it would pass
//! half its ttl before the next scan) gets a wake-up of its own at its third.
//!
//! A failed extension is retried with a growing, jittered pause, always before the lease's local
//! deadline: an outage costs a few attempts a second, not a busy loop. Registering and
//! deregistering only touch a mutex-guarded map: the hot path never wakes the task, except for
//! such a short lease.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::background::Background;
use crate::clock::{self, nanos};
use crate::error::LostReason;
use crate::metrics;
use crate::options::LockKind;
use crate::state::LeaseState;
use crate::store::inspect::Snapshot;
use crate::store::{LeaseRef, Renewal, Store, StoreError, protocol};

pub(crate) struct RenewalQueue {
    shared: Arc<Shared>,
}

struct Shared {
    leases: Mutex<Registry>,
    /// When the watchdog plans to wake next (nanos); a new lease due earlier wakes it.
    planned_wake: AtomicU64,
    /// When the next regular scan is (nanos).
    next_scan: AtomicU64,
    wake: Notify,
    scan_interval: Duration,
    store: Arc<dyn Store>,
}

/// The live leases by id.
type Registry = HashMap<u64, Arc<LeaseState>, BuildHasherDefault<IdHasher>>;

/// Hashes a lease's id with one multiplication. Ids are unique in the process and handed out in
/// sequence, never chosen from outside, so SipHash's defence against chosen keys buys nothing
/// here, and it cost every lock cycle a register and a deregister's worth of it.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(self.0.rotate_left(8) ^ u64::from(byte));
        }
    }

    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing: spreads sequential ids over the high bits the table probes with.
        self.0 = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl RenewalQueue {
    /// Starts the watchdog on the client's runtime; it ends with the client.
    pub(crate) fn start(
        store: Arc<dyn Store>,
        scan_interval: Duration,
        background: &Background,
    ) -> Self {
        let shared = Arc::new(Shared {
            leases: Mutex::new(Registry::default()),
            planned_wake: AtomicU64::new(u64::MAX),
            next_scan: AtomicU64::new(clock::now().saturating_add(nanos(scan_interval))),
            wake: Notify::new(),
            scan_interval,
            store,
        });
        let watchdog = shared.clone();
        background.spawn_service(move |stop| watch(watchdog.clone(), stop));
        Self { shared }
    }

    /// What checks leases at once when news says they may be gone ([`LeaseCheck`]).
    pub(crate) fn checker(&self) -> LeaseChecker {
        LeaseChecker(self.shared.clone())
    }

    pub(crate) fn register(&self, lease: Arc<LeaseState>) {
        metrics::leases(&lease.prefix, 1.0);
        let wake_now = self.shared.wakes_too_late_for(&lease);
        self.shared.lock().insert(lease.id, lease);
        if wake_now {
            self.shared.wake.notify_one();
        }
    }

    /// After this returns the watchdog sends no new extension for the lease. One already on the
    /// wire cannot re-create a released key: extensions only touch keys that hold our token.
    pub(crate) fn deregister(&self, id: u64) {
        let removed = self.shared.lock().remove(&id);
        if let Some(lease) = removed {
            lease.finish();
            metrics::leases(&lease.prefix, -1.0);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.shared.lock().len()
    }

    /// Stops renewing every lease, and hands them over.
    pub(crate) fn drain(&self) -> Vec<Arc<LeaseState>> {
        let drained: Vec<Arc<LeaseState>> =
            self.shared.lock().drain().map(|(_, lease)| lease).collect();
        for lease in &drained {
            lease.finish();
            metrics::leases(&lease.prefix, -1.0);
        }
        drained
    }
}

impl Shared {
    /// Whether `lease` needs a wake-up of its own before the one the watchdog has planned.
    fn wakes_too_late_for(&self, lease: &LeaseState) -> bool {
        own_wake_up(lease, self.next_scan.load(Ordering::Acquire))
            .is_some_and(|own| own < self.planned_wake.load(Ordering::Acquire))
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The wake-up a lease needs of its own, before `next_scan`: when a failed extension's retry is
/// due; or at its third, when half its ttl would pass before `next_scan`. The third is rounded up
/// to a grid of ttl/12 (so still well before half), so that leases of one ttl taken at about the
/// same time share wake-ups and one round trip.
fn own_wake_up(lease: &LeaseState, next_scan: u64) -> Option<u64> {
    if !lease.renewals_left() || lease.is_lost() {
        return None;
    }
    let sent = lease.confirmed_sent_at();
    let third = sent.saturating_add(lease.timing.third);
    let due = lease.due_at();
    if due > third {
        // A retry after a failure.
        return (due < next_scan).then_some(due);
    }
    let half = sent.saturating_add(lease.timing.half);
    (half < next_scan).then(|| {
        let grid = lease.timing.grid;
        third.div_ceil(grid).saturating_mul(grid)
    })
}

async fn watch(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let wake_at = scan(&shared);
        shared.planned_wake.store(wake_at, Ordering::Release);
        crate::sync::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep_until(clock::instant_at(wake_at)) => {}
            () = shared.wake.notified() => {}
        }
    }
}

/// Sends one batch of due extensions; returns when to wake next.
fn scan(shared: &Arc<Shared>) -> u64 {
    let now = clock::now();
    let interval = nanos(shared.scan_interval);
    let mut next_scan = shared.next_scan.load(Ordering::Acquire);
    while next_scan <= now {
        next_scan = next_scan.saturating_add(interval);
    }
    shared.next_scan.store(next_scan, Ordering::Release);
    let mut due = Vec::new();
    let mut wake_at = next_scan;
    for lease in shared.lock().values() {
        if !lease.renewals_left()
            || lease.is_lost()
            || lease.extending.load(Ordering::Acquire)
            // Past its deadline its holder is being cancelled: nothing left to keep.
            || lease.deadline_nanos() <= now
        {
            continue;
        }
        if lease.due_at() <= now {
            lease.extending.store(true, Ordering::Release);
            due.push(lease.clone());
        } else if let Some(own) = own_wake_up(lease, next_scan) {
            wake_at = wake_at.min(own);
        }
    }
    if !due.is_empty() {
        tokio::spawn(extend(shared.clone(), due));
    }
    wake_at
}

/// Leases extended in one round trip at most. Redis runs a connection's pipeline without
/// serving other clients between its commands, so a million leases in one batch held it for
/// about a second a tick: other clients' commands (this client's acquires too) timed out behind
/// it, and so did the batch itself, whose renewals went unconfirmed though Redis had made them.
const LEASES_PER_ROUND_TRIP: usize = 10_000;

/// Renewal batches on the wire at once. One at a time, a million leases of 30 s were renewed at
/// about 43 000 a second on a loaded 2-core machine where 83 000 were due, and leases lapsed,
/// with neither Redis nor the watchdog half busy: each batch waited for the reply to the one
/// before. A few in flight overlap one batch's encoding with another's run in Redis.
const BATCHES_IN_FLIGHT: usize = 4;

/// Extends the due leases, [`LEASES_PER_ROUND_TRIP`] at a time, at most
/// [`BATCHES_IN_FLIGHT`] round trips at once.
async fn extend(shared: Arc<Shared>, due: Vec<Arc<LeaseState>>) {
    futures_util::stream::iter(due.chunks(LEASES_PER_ROUND_TRIP))
        .for_each_concurrent(BATCHES_IN_FLIGHT, |batch| extend_batch(&shared, batch))
        .await;
}

/// Extends the leases of `batch` still registered. A batch may wait for the ones before it, and
/// leases released meanwhile are left out: releasing a million leases while they were due cost
/// Redis a lookup for each released key in the batches sent after its release.
async fn extend_batch(shared: &Shared, batch: &[Arc<LeaseState>]) {
    let mut due = Vec::with_capacity(batch.len());
    for lease in batch {
        if lease.is_finished() {
            lease.extending.store(false, Ordering::Release);
        } else {
            due.push(lease.clone());
        }
    }
    if !due.is_empty() {
        renew(shared, &due).await;
    }
}

async fn renew(shared: &Shared, due: &[Arc<LeaseState>]) {
    let sent_at = clock::now();
    // A multi-key lease is extended key by key, in the same batch: it is extended when every
    // key was, lost when any key was.
    let mut leases: Vec<LeaseRef<'_>> = Vec::with_capacity(due.len());
    for lease in due {
        let one = lease.lease_ref();
        if one.keys.is_empty() {
            leases.push(one);
        } else {
            leases.extend(one.keys.iter().map(|key| LeaseRef {
                key,
                keys: &[],
                ..one
            }));
        }
    }
    let outcomes = metrics::timed("extend", shared.store.extend(&leases)).await;
    let outcomes = per_lease(due, outcomes);
    drop(leases);
    // One backoff for the whole batch: its leases failed together and retry together.
    let in_a_row = due.iter().map(|lease| lease.failures()).max().unwrap_or(0);
    let pause = clock::backoff(Duration::from_millis(50), Duration::from_secs(1), in_a_row);
    let mut failed = Vec::new();
    for (lease, outcome) in due.iter().zip(outcomes) {
        if lease.is_finished() || lease.is_lost() {
            // Its holder has stopped already; nothing to record.
            continue;
        }
        match outcome {
            Renewal::Extended => {
                metrics::renewal(&lease.prefix, "ok");
                let renewals = lease.extended(sent_at);
                // Formatted only when DEBUG is on: a tick of a million leases made as many
                // strings for nobody.
                tracing::debug!(
                    key = %lease.key,
                    renewals,
                    max_renewals = %lease.max_renewals.map_or("unlimited".into(), |max| max.to_string()),
                    "lock lease renewed"
                );
            }
            Renewal::Lost(reason) => {
                metrics::renewal(&lease.prefix, "lost");
                tracing::warn!(key = %lease.key, token_hint = %protocol::hint(lease.token()), %reason, "lock lost at renewal");
                lease.mark_lost(reason);
            }
            Renewal::Failed(error) => {
                metrics::renewal(&lease.prefix, "failed");
                let in_a_row = lease.extension_failed(clock::now(), pause);
                failed.push((lease, in_a_row, error));
            }
        }
    }
    if let Some((first, _, error)) = failed.first() {
        // One line per failed batch (a thousand leases share one outage), louder on a new streak.
        let fresh = failed
            .iter()
            .filter(|(_, in_a_row, _)| *in_a_row == 1)
            .count();
        if fresh > 0 {
            tracing::warn!(key = %first.key, leases = failed.len(), error = %error, "lock renewal failed; retrying before the lease's deadline");
        } else {
            tracing::debug!(key = %first.key, leases = failed.len(), error = %error, "lock renewal failed again");
        }
    }
    for lease in due {
        lease.extending.store(false, Ordering::Release);
    }
    // Leases renewed or failed just now may need a wake-up earlier than the one planned.
    if due.iter().any(|lease| shared.wakes_too_late_for(lease)) {
        shared.wake.notify_one();
    }
}

/// News that leases may be gone before their next renewal would tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LeaseCheck {
    /// An operator freed this key (`force_release`): its holder stops at once.
    Forced(String),
    /// The release subscription opened (at first, or back after a loss): forced releases
    /// before it went unheard, and a restart, a failover or a flush may have taken any key.
    Unheard,
}

/// Checks the leases news concerns, in the background, reading only: a key found without our
/// hold ends its lease `Lost` now (`Gone`, or `Taken` when another holds it); anything else (ours, or Redis not answering) is left
/// to the watchdog's next renewal, so a check never costs a lease a renewal.
#[derive(Clone)]
pub(crate) struct LeaseChecker(Arc<Shared>);

impl LeaseChecker {
    pub(crate) fn check(&self, news: LeaseCheck) {
        let shared = self.0.clone();
        tokio::spawn(async move {
            let concerned = |lease: &Arc<LeaseState>| match &news {
                LeaseCheck::Forced(key) => lease.covers(key),
                LeaseCheck::Unheard => true,
            };
            let leases: Vec<Arc<LeaseState>> = shared
                .lock()
                .values()
                .filter(|lease| concerned(lease))
                .cloned()
                .collect();
            // A forced release may still be on its way to other servers (Redlock's masters
            // each remove and announce it in turn): a key still ours is looked at again. Only
            // the forced key needs a look: a lease of several keys looked at each key still
            // its own in turn first, 200 ms apart, and heard of its second key's forced release
            // up to 400 ms late (simulator seed 857).
            let forced = match &news {
                LeaseCheck::Forced(key) => Some(key.as_str()),
                LeaseCheck::Unheard => None,
            };
            futures_util::stream::iter(leases)
                .for_each_concurrent(CHECKS_IN_FLIGHT, |lease| check(&shared, lease, forced))
                .await;
        });
    }
}

/// Leases checked at once after news: a reconnect under ten thousand leases asks a few keys at
/// a time rather than all of them in one burst.
const CHECKS_IN_FLIGHT: usize = 16;

/// Looks a check makes at a key before it leaves the lease to its next renewal.
const CHECK_ATTEMPTS: u32 = 3;

/// Whether `found` (a look at `key`) shows `lease`'s hold there.
fn holds(found: &Option<Snapshot>, lease: &LeaseState) -> bool {
    found.as_ref().is_some_and(|found| {
        found
            .holders
            .iter()
            .any(|(value, _)| protocol::holds(value, &lease.value))
    })
}

/// `forced`: the key of a forced release, which may reach the key a moment after the news; only
/// that key of the lease is looked at. Otherwise every key of the lease is.
async fn check(shared: &Shared, lease: Arc<LeaseState>, forced: Option<&str>) {
    for key in lease.all_keys() {
        if forced.is_some_and(|forced| forced != key) {
            continue;
        }
        let forced = forced.is_some();
        if lease.is_finished() || lease.is_lost() {
            return;
        }
        // A connection back after a loss may fail its first command, and a forced release may
        // not have reached every server yet: look a few times.
        let mut found = shared.store.inspect(key).await;
        for _ in 1..CHECK_ATTEMPTS {
            match &found {
                Ok(look) if !(forced && holds(look, &lease)) => break,
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            found = shared.store.inspect(key).await;
        }
        let Ok(found) = found else {
            return;
        };
        // As an extension would say: another holder there is `Taken`; nothing there, or a
        // shared lock of our kind without our hold, `Gone`.
        if holds(&found, &lease) {
            continue;
        }
        let reason = match found {
            None => LostReason::Gone,
            Some(found) if found.kind == lease.kind && lease.kind != LockKind::Exclusive => {
                LostReason::Gone
            }
            Some(_) => LostReason::Taken,
        };
        if !lease.is_finished() && !lease.is_lost() {
            tracing::warn!(key = %key, %reason, "lock lost: its key no longer holds it (freed by force, taken, or lost to a restart, failover or flush)");
            lease.mark_lost(reason);
        }
        return;
    }
}

/// One outcome per lease from one per key: a multi-key lease is lost when any key was, extended
/// when every key was, and failed otherwise.
fn per_lease(due: &[Arc<LeaseState>], outcomes: Vec<Renewal>) -> Vec<Renewal> {
    if outcomes.len() == due.len() {
        return outcomes;
    }
    let mut outcomes = outcomes.into_iter();
    due.iter()
        .map(|lease| {
            let keys = lease.keys.len().max(1);
            outcomes
                .by_ref()
                .take(keys)
                .reduce(|all, one| match (all, one) {
                    (Renewal::Lost(reason), _) | (_, Renewal::Lost(reason)) => {
                        Renewal::Lost(reason)
                    }
                    (Renewal::Failed(error), _) | (_, Renewal::Failed(error)) => {
                        Renewal::Failed(error)
                    }
                    (Renewal::Extended, Renewal::Extended) => Renewal::Extended,
                })
                .unwrap_or_else(|| Renewal::Failed(StoreError::unavailable("no renewal reply")))
        })
        .collect()
}
