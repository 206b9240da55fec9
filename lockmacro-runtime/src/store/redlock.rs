//! Redlock: one lock over N independent Redis masters (odd N ≥ 3), held while a majority agrees.
//! `LockClient::redlock_builder([...])`.
//!
//! Each master is a one-server deployment of its own ([`RedisStore<Server>`]); this module only counts.
//! - Acquire: on every master at once, each with a budget far below the ttl. Taken when a
//!   majority took it and time is left: validity = ttl − elapsed − drift. Otherwise the attempt
//!   is undone on every master before returning. `Busy` only when a majority names another
//!   holder; no majority either way is [`LockError::NoQuorum`](crate::LockError::NoQuorum).
//! - Renewal: one batch per master per tick, all at once; a lease is extended when a majority
//!   confirmed it, lost when a majority says it is not ours, and otherwise retried. A failed
//!   tick never releases anything.
//! - Release: sent to every master from the caller (so it reaches each master ahead of the
//!   caller's next acquire there); answered once a majority answered and the others too, or
//!   20 ms later: a master slower than that finishes in the background.
//! - Hand-over: a release passes the lock to the next waiter of the same client on every master
//!   at once, handed when a majority handed it; otherwise the waiter's token is taken back
//!   wherever it landed. One client's waiters never compete with each other for a majority.
//! - Waiting: announcements from every master, one per release (they carry the released value;
//!   an undone attempt's say "look again" only, so a watch does not take it for a hold).
//! - Fencing is refused: the largest counter over a quorum need not grow, since the next holder's
//!   quorum may miss the master that counted the last token.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{Either, join_all, select_all};
use futures_util::stream::{FuturesUnordered, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::inspect::{self, Cursor, Page, Snapshot};
use super::protocol;
use super::redis::RedisStore;
use super::redis::server::Server;
use super::{
    AcquireRequest, Acquired, AcquiredMany, BoxFuture, HandOver, HandsOver, LeaseRef, ManyRequest,
    OwnedLease, ReleaseFeed, Released, Renewal, Settings, Store, StoreError,
};
use crate::clock::{self, Backoff};
use crate::error::{LockError, LostReason};
use crate::health::{Health, NodeRole};
use crate::metrics;
use crate::options::LockKind;
use crate::sync::{Set, lock};
use tally::{Answer, BusyAnswer, Decision, HandOvers, Renewals, Tally, decide};

mod tally;

/// A Redlock quorum.
#[derive(Clone)]
pub(crate) struct RedlockStore {
    masters: Vec<RedisStore<Server>>,
    settings: Settings,
    path: Arc<Path>,
    settling: Arc<Settling>,
}

/// Attempts decided before every master answered, by token, while their late answers are
/// handled. A waiter looks again with the same token: its next attempt waits for the last
/// one's late answers (each bounded by the per-master budget), so that giving back a late
/// "taken" (by token) can never remove what the next attempt took on that master, leaving it
/// a lease on fewer masters than it counted.
type Settling = Mutex<HashMap<Arc<str>, Arc<LateAnswers>>>;

/// An attempt whose slow masters answer in the background.
#[derive(Default)]
struct LateAnswers {
    /// Held until they are handled.
    gate: Arc<tokio::sync::Mutex<()>>,
    /// The lease was released (or handed on) meanwhile: a late "taken" is given back, not
    /// kept with the others. A release sent before that master's take landed found nothing.
    released: AtomicBool,
}

/// Which masters are in the hot path. A master that failed (no answer within its budget, a
/// broken or refused connection) is kept out: callers skip it at once, as if it had failed
/// again, until a probe in the background hears it answer. So a dead or silent master costs a
/// caller nothing once it failed, however long it stays so, and comes back by itself.
struct Path {
    out: Vec<AtomicBool>,
}

/// A set of masters, by index: a bit each for the first 64 (no allocation), a flag each on the
/// heap beyond.
struct MasterSet {
    low: u64,
    high: Box<[bool]>,
}

impl MasterSet {
    /// The masters `0..n` for which `member` says so.
    fn of(n: usize, member: impl Fn(usize) -> bool) -> Self {
        let low = (0..n.min(64))
            .filter(|&index| member(index))
            .fold(0, |low, index| low | 1 << index);
        let high = (64..n).map(member).collect();
        Self { low, high }
    }

    fn contains(&self, index: usize) -> bool {
        match index.checked_sub(64) {
            None => self.low & 1 << index != 0,
            Some(high) => self.high.get(high).copied().unwrap_or(false),
        }
    }
}

impl RedlockStore {
    /// A quorum over `masters`; refuses anything but an odd number, at least 3.
    pub(crate) fn new(
        masters: Vec<RedisStore<Server>>,
        settings: Settings,
    ) -> Result<Self, String> {
        let n = masters.len();
        if n < 3 || n.is_multiple_of(2) {
            return Err(format!(
                "Redlock needs an odd number of independent masters, at least 3; got {n}"
            ));
        }
        let path = Arc::new(Path {
            out: (0..n).map(|_| AtomicBool::new(false)).collect(),
        });
        Ok(Self {
            masters,
            settings,
            path,
            settling: Arc::default(),
        })
    }

    /// How long a renewal, a release or a hand-over waits for the other masters once a
    /// majority decided.
    const GRACE: Duration = Duration::from_millis(20);

    /// About how long a waiter that split the masters with another waiter waits before it looks
    /// again (jittered, so the racers spread out).
    const SPLIT_RETRY: Duration = Duration::from_millis(25);

    fn quorum(&self) -> usize {
        tally::majority(self.masters.len())
    }

    /// Whether master `master` is in the hot path (see [`Path`]).
    fn in_path(&self, master: usize) -> bool {
        !self.path.out[master].load(Ordering::Acquire)
    }

    /// Notes what master `master` answered: a failure to answer takes it out of the path.
    fn note<T>(&self, master: usize, answer: &Result<T, StoreError>) {
        if let Err(error @ StoreError::Unavailable(_)) = answer {
            self.take_out(master, error);
        }
    }

    /// Takes master `master` out of the path (unless it is out already) and probes it in the
    /// background, with backoff (50 to 250 ms), until it answers; then it is back in the path, and every
    /// runtime may connect to it at once.
    fn take_out(&self, master: usize, error: &StoreError) {
        if self.path.out[master].swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(master, error = %error, "a Redlock master failed; kept out of the path until it answers again");
        let (store, path) = (self.masters[master].clone(), self.path.clone());
        let bound = self.settings.connect_timeout + self.settings.response_timeout;
        self.settings.background.spawn(async move {
            // Capped low: a master back from a restart rejoins the path (and the leases spread
            // to it at their next renewal) within a quarter of a second.
            let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_millis(250));
            loop {
                if let Ok(Ok(())) = tokio::time::timeout(bound, store.connect()).await {
                    store.answers_again();
                    path.out[master].store(false, Ordering::Release);
                    tracing::info!(master, "a Redlock master answers again; back in the path");
                    return;
                }
                tokio::time::sleep(backoff.next_delay()).await;
            }
        });
    }

    /// Compare-and-delete of an undone attempt (or hand-over) on every master in the path,
    /// awaited until a majority answered (bounded), a slow master finishing in the background.
    /// `true` when every master in the path answered.
    async fn release_everywhere(&self, lease: &OwnedLease) -> bool {
        let budget = self.settings.response_timeout;
        let masters = self.masters.len();
        let quorum = self.quorum();
        let undone = tokio::time::timeout(
            budget,
            self.on_every_master(
                |master| {
                    let lease = lease.clone();
                    async move { master.release(undone(&lease)).await }
                },
                |answers| oks(answers) >= quorum,
            ),
        );
        match undone.await {
            Ok(answers) => {
                let out = (0..masters).filter(|&i| !self.in_path(i)).count();
                oks(&answers) + out >= masters
            }
            Err(_) => false,
        }
    }

    /// One attempt (`on_master`, one key or several) on every master in the path at once, each
    /// within a budget far below the ttl (the Redlock paper), decided as soon as the answers
    /// so far settle it: taken when a majority took it with time to spare (validity = ttl −
    /// elapsed − drift); otherwise undone where it was taken before answering; `Busy` when a
    /// majority found a key busy, or soon again when a majority answered split between us and
    /// others; [`StoreError::NoQuorum`] only when no majority answered at all. The masters that
    /// answer after the decision count too (see [`late_answers`](Self::late_answers)).
    async fn on_a_majority<F>(
        &self,
        ttl: Duration,
        attempt: OwnedLease,
        budget: Duration,
        on_master: impl Fn(RedisStore<Server>, Duration) -> F,
    ) -> Result<AcquiredMany, StoreError>
    where
        F: Future<Output = Result<AcquiredMany, StoreError>> + Send + 'static,
    {
        let per_master = budget.min((ttl / 10).max(Duration::from_millis(10)));
        let quorum = self.quorum();
        let token = protocol::holder_token(attempt.as_ref().value);
        let earlier = lock(&self.settling).get(token).cloned();
        if let Some(earlier) = earlier {
            let _settled = earlier.gate.lock().await;
        }
        // A master a client found restarted within this lease's ttl may have lost a lease
        // taken on a bare majority before: its take does not count toward this one's majority
        // (it still takes the key, so a lease taken now is there too). The Redlock paper's
        // delayed restart, kept by the clients.
        let masters = self.masters.len();
        let restarted = MasterSet::of(masters, |index| self.masters[index].restarted_within(ttl));
        let started = Instant::now();
        let (answers, late) = self
            .fan_out(
                |master| on_master(master, per_master),
                |answers| decide(&self.tally(answers, &restarted), quorum, None) != Decision::Wait,
            )
            .await;
        let elapsed = started.elapsed();
        let tally = self.tally(&answers, &restarted);
        let mut busy: Vec<(usize, BusyAnswer)> = Vec::new();
        let mut not_a_lock = None;
        for (index, answer) in answers {
            self.note(index, &answer);
            match answer {
                Ok(AcquiredMany::Busy {
                    key,
                    remaining,
                    estimate,
                }) => busy.push((index, (key, remaining, estimate))),
                Err(StoreError::Unusable(error)) if not_a_lock.is_none() => {
                    // The first master's to say so. A new error, not the shared one: its other
                    // copies live on elsewhere.
                    if let LockError::NotALock { key, found } = &*error {
                        not_a_lock = Some(StoreError::from(LockError::NotALock {
                            key: key.clone(),
                            found: found.clone(),
                        }));
                    }
                }
                _ => {}
            }
        }
        drop(restarted);
        let validity = ttl
            .checked_sub(elapsed + clock::drift(ttl))
            .filter(|left| !left.is_zero());
        let decision = decide(&tally.closed(), quorum, validity);
        let ours = decision == Decision::Taken;
        if let Some(late) = late {
            // The others answer in the background: a master that takes it late holds it with
            // the others, or gives it back when it is not ours.
            let store = self.clone();
            let token: Arc<str> = token.into();
            let attempt = attempt.clone();
            let late_answers = Arc::new(LateAnswers::default());
            let settling = late_answers.gate.clone().try_lock_owned().ok();
            lock(&self.settling).insert(token.clone(), late_answers.clone());
            self.settings.background.spawn(async move {
                let late = late.answers().await;
                let released = late_answers.released.load(Ordering::SeqCst);
                store.late_answers(late, &attempt, ours, released).await;
                let mut waiting = lock(&store.settling);
                if waiting
                    .get(&token)
                    .is_some_and(|now| Arc::ptr_eq(now, &late_answers))
                {
                    waiting.remove(&token);
                }
                drop(settling);
            });
        }
        if ours {
            self.leave_where_busy(&attempt, busy.iter().map(|(index, _)| *index));
            return Ok(AcquiredMany::Taken);
        }
        self.refused(&attempt, tally).await;
        let split_retry = || clock::jittered(Self::SPLIT_RETRY, 0.8);
        let no_quorum = |answered| StoreError::NoQuorum {
            answered,
            needed: quorum,
        };
        match decision {
            // Never: a closed tally is decided, and a take was answered above.
            Decision::Wait | Decision::Taken => Err(no_quorum(tally.counted.max(tally.busy))),
            // Something that is no lock sits under the key on some master: it is left as it is.
            Decision::NotALock => Err(not_a_lock.unwrap_or_else(|| no_quorum(0))),
            Decision::Busy { raced } => {
                let busy: Vec<BusyAnswer> = busy.into_iter().map(|(_, answer)| answer).collect();
                // Having raced, look again soon (the Redlock paper's random retry), not after
                // leases that are being undone.
                let retry = raced.then(split_retry);
                let (key, remaining, estimate) =
                    tally::busy(&busy, self.masters.len(), quorum, retry);
                Ok(AcquiredMany::Busy {
                    key,
                    remaining,
                    estimate,
                })
            }
            Decision::TooLate => Err(StoreError::unavailable(format!(
                "a majority took the lock only after {elapsed:?}, past the lease's validity"
            ))),
            Decision::Split => {
                // Neither has the lock for sure, and the racers' attempts are being undone as
                // ours was: look again soon (jittered, so the racers spread out), inside the
                // caller's wait; a caller that fails fast is told to come back as soon.
                let key = busy.iter().map(|(_, (key, ..))| *key).min().unwrap_or(0);
                let retry = split_retry();
                Ok(AcquiredMany::Busy {
                    key,
                    remaining: Some(retry),
                    estimate: Some(retry),
                })
            }
            Decision::NoQuorum { answered } => Err(no_quorum(answered)),
        }
    }

    /// An attempt not ours is undone where it was taken, before answering (the caller may look
    /// again with the same token). A master whose answer was lost undoes it itself.
    async fn refused(&self, attempt: &OwnedLease, tally: Tally) {
        if tally.took > 0 && tally.busy > 0 {
            // Split with another attempt: some masters ours, others busy, no majority ours.
            metrics::redlock_split();
        }
        if tally.took > 0 {
            self.release_everywhere(attempt).await;
        }
    }

    /// The `answers` so far (by master) counted, the masters yet to answer as unknown
    /// (`restarted`: whose take does not count).
    fn tally(
        &self,
        answers: &[(usize, Result<AcquiredMany, StoreError>)],
        restarted: &MasterSet,
    ) -> Tally {
        let mut tally = Tally::default();
        for (index, answer) in answers {
            tally.add(answer_of(answer, restarted, *index));
        }
        for _ in answers.len()..self.masters.len() {
            tally.add(Answer::Unknown);
        }
        tally
    }

    /// Answers that came after the attempt was decided (`ours`: taken). A master that took it
    /// late holds it with the others when it is ours (the lease spreads), and gives it back
    /// when not, or when the lease was `released` meanwhile; a busy master keeps no reservation of a caller that holds the lock. A master
    /// that did not answer is out of the path until it does (its lost request undoes itself).
    async fn late_answers(
        &self,
        late: Vec<(usize, Result<AcquiredMany, StoreError>)>,
        attempt: &OwnedLease,
        ours: bool,
        released: bool,
    ) {
        let mut busy = Vec::new();
        for (index, answer) in late {
            self.note(index, &answer);
            match answer {
                Ok(AcquiredMany::Taken) if !ours || released => {
                    if let Err(error) = self.masters[index].release(undone(attempt)).await {
                        tracing::debug!(error = %error, "a late Redlock take could not be undone; it expires with its lease");
                    }
                }
                Ok(AcquiredMany::Busy { .. }) if ours => busy.push(index),
                _ => {}
            }
        }
        self.leave_where_busy(attempt, busy.into_iter());
    }
}

impl RedlockStore {
    /// A lease a majority just extended spreads to every master in the path that has lost its
    /// key, or never had it (down or slow when it was taken, restarted empty since): there it
    /// is taken again where the key is missing and free (`SET NX PX`, an exclusive lock's
    /// value). So a lease taken on a bare majority is on every live master after its next
    /// renewal, and losing one master's data cannot hand the key to another caller. A key held
    /// by anyone else there is left alone; a lease a majority did not confirm is never spread
    /// (a forced release, which removes it everywhere, stays a release).
    async fn spread(
        &self,
        leases: &[LeaseRef<'_>],
        renewals: &[Renewal],
        per_master: &[(usize, Vec<Renewal>)],
    ) {
        let missing = per_master.iter().flat_map(|(index, answers)| {
            answers.iter().enumerate().filter_map(move |(i, answer)| {
                let spreads = matches!(renewals[i], Renewal::Extended)
                    && matches!(answer, Renewal::Lost(LostReason::Gone))
                    && leases[i].kind == LockKind::Exclusive;
                spreads.then_some((*index, leases[i]))
            })
        });
        let taken = join_all(missing.map(|(index, lease)| async move {
            (
                index,
                lease.key,
                self.masters[index].take_if_missing(lease).await,
            )
        }))
        .await;
        for (index, key, taken) in taken {
            match taken {
                Ok(true) => {
                    tracing::debug!(key = %key, master = index, "a Redlock lease spread to a master that did not hold it");
                }
                Ok(false) => {}
                Err(error) => self.note(index, &Err::<(), _>(error)),
            }
        }
    }
}

/// What master `index` answered an attempt, for its [`Tally`] (`restarted`: whose take does not
/// count).
fn answer_of(
    answer: &Result<AcquiredMany, StoreError>,
    restarted: &MasterSet,
    index: usize,
) -> Answer {
    match answer {
        Ok(AcquiredMany::Taken) => Answer::Took {
            counts: !restarted.contains(index),
        },
        Ok(AcquiredMany::Busy { .. }) => Answer::Busy,
        Err(StoreError::Unusable(error)) if matches!(**error, LockError::NotALock { .. }) => {
            Answer::NotALock
        }
        Err(_) => Answer::Failed,
    }
}

/// An attempt's lease as its undo names it: no work ran under it, so the release is announced
/// as "look again", not as a holder's release.
fn undone(attempt: &OwnedLease) -> LeaseRef<'_> {
    LeaseRef {
        undone: true,
        ..attempt.as_ref()
    }
}

/// A master's part in a request to every master: its call's answer (`asked`; `None`, out of the
/// path: not asked) given to `tell`. A combinator rather than an `async` block, which held the
/// call twice (captured, then again while awaited): that doubled each master's future (2 056
/// bytes on an acquire, 1 240 on a release), and `join_all` moves each one into its place and
/// out again.
fn answered<T, F>(
    asked: Option<F>,
    tell: impl FnOnce(Result<T, StoreError>),
) -> impl Future<Output = ()>
where
    F: Future<Output = Result<T, StoreError>>,
{
    let answer = match asked {
        Some(asked) => Either::Left(asked),
        None => Either::Right(std::future::ready(Err(out_of_path()))),
    };
    answer.map(tell)
}

/// How many masters answered, of `answers` (by master).
fn oks<T>(answers: &[(usize, Result<T, StoreError>)]) -> usize {
    answers.iter().filter(|(_, answer)| answer.is_ok()).count()
}

/// What a master out of the path answers, without being asked.
fn out_of_path() -> StoreError {
    StoreError::unavailable(
        "a Redlock master out of the path: it failed lately, and is probed in the background",
    )
}

impl RedlockStore {
    /// A waiter that took the lock on a majority may have reserved the key on a master that
    /// was busy (see `protocol::Reservation`): that master would hand it the key, under a value
    /// its lease does not know, at its holder's release. It leaves those masters (in the
    /// background): the reservation is taken off, or a key handed meanwhile given back.
    fn leave_where_busy(&self, lease: &OwnedLease, busy: impl Iterator<Item = usize>) {
        let busy: Vec<RedisStore<Server>> = busy.map(|i| self.masters[i].clone()).collect();
        if busy.is_empty() {
            return;
        }
        let lease = lease.as_ref();
        let keys: Vec<String> = match lease.keys {
            [] => vec![lease.key.to_owned()],
            keys => keys.to_vec(),
        };
        let token = protocol::holder_token(lease.value).to_owned();
        self.settings.background.spawn(async move {
            for master in &busy {
                for key in &keys {
                    if let Err(error) = master.leave(key, &token).await {
                        tracing::debug!(key = %key, error = %error, "a Redlock master kept a reservation of a caller that took the lock; it expires with its holder");
                    }
                }
            }
        });
    }
}

/// An [`AcquireRequest`] that owns its strings: a master may answer after the majority decided.
#[derive(Clone)]
struct OwnedRequest {
    key: Arc<str>,
    value: Arc<str>,
    request: AcquireRequest<'static>,
}

impl OwnedRequest {
    /// `request`, its strings shared with `attempt`, its lease.
    fn of(request: &AcquireRequest<'_>, attempt: &OwnedLease) -> Self {
        Self {
            key: attempt.key.clone(),
            value: attempt.value.clone(),
            request: AcquireRequest {
                key: "",
                value: "",
                ..*request
            },
        }
    }

    fn as_request(&self) -> AcquireRequest<'_> {
        AcquireRequest {
            key: &self.key,
            value: &self.value,
            ..self.request
        }
    }
}

/// A [`ManyRequest`] that owns its strings, as [`OwnedRequest`].
#[derive(Clone)]
struct OwnedMany {
    keys: Arc<[String]>,
    value: Arc<str>,
    request: ManyRequest<'static>,
}

impl OwnedMany {
    /// `request`, its strings shared with `attempt`, its lease.
    fn of(request: &ManyRequest<'_>, attempt: &OwnedLease) -> Self {
        Self {
            keys: attempt.keys.clone().unwrap_or_else(|| request.keys.into()),
            value: attempt.value.clone(),
            request: ManyRequest {
                keys: &[],
                value: "",
                ..*request
            },
        }
    }

    fn as_request(&self) -> ManyRequest<'_> {
        ManyRequest {
            keys: &self.keys,
            value: &self.value,
            ..self.request
        }
    }
}

impl Store for RedlockStore {
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<Acquired, StoreError>> {
        Box::pin(async move {
            if request.fair {
                return Err(StoreError::from(LockError::InvalidOptions {
                    message: "`fair = true` is not offered over Redlock: each master queues the \
                              waiters in the order their attempts reach it, and those orders \
                              differ, so no waiter need head a majority of the queues and \
                              arrival order cannot be promised; wait without `fair` (a waiter \
                              that waited too long still goes first)"
                        .into(),
                }));
            }
            if request.fencing {
                return Err(StoreError::from(LockError::InvalidOptions {
                    message: "fencing tokens are not offered over Redlock: the largest counter \
                              of a quorum need not grow from one holder to the next; take fenced \
                              locks on one Redis, Sentinel or a Cluster"
                        .into(),
                }));
            }
            // One command for every master: they share the quorum's settings. Owned, as the
            // request is: a master may answer after the majority decided.
            let cmd = Arc::new(self.masters[0].acquire_cmd(&request)?);
            let attempt = OwnedLease::of(request.lease());
            let owned = OwnedRequest::of(&request, &attempt);
            let on_master = |master: RedisStore<Server>, per_master| {
                let (cmd, owned) = (cmd.clone(), owned.clone());
                async move {
                    let answer = master
                        .acquire_with(owned.as_request(), &cmd, per_master)
                        .await?;
                    Ok(match answer {
                        Acquired::Taken { .. } => AcquiredMany::Taken,
                        Acquired::Busy {
                            remaining,
                            estimate,
                        } => AcquiredMany::Busy {
                            key: 0,
                            remaining,
                            estimate,
                        },
                    })
                }
            };
            let decided = self
                .on_a_majority(request.ttl, attempt, budget, on_master)
                .await?;
            Ok(match decided {
                AcquiredMany::Taken => Acquired::Taken {
                    fencing_token: None,
                },
                AcquiredMany::Busy {
                    remaining,
                    estimate,
                    ..
                } => Acquired::Busy {
                    remaining,
                    estimate,
                },
            })
        })
    }

    /// As [`acquire`](Self::acquire), each master taking the whole set at once (all or none
    /// there): taken when a majority took every key with time to spare, `Busy` when a majority
    /// found a key busy (naming the first of the keys they found busy).
    fn acquire_many<'a>(
        &'a self,
        request: ManyRequest<'a>,
        budget: Duration,
    ) -> BoxFuture<'a, Result<AcquiredMany, StoreError>> {
        Box::pin(async move {
            let attempt = OwnedLease::of(request.lease());
            let owned = OwnedMany::of(&request, &attempt);
            let on_master = |master: RedisStore<Server>, per_master| {
                let owned = owned.clone();
                async move { master.acquire_many(owned.as_request(), per_master).await }
            };
            self.on_a_majority(request.ttl, attempt, budget, on_master)
                .await
        })
    }

    fn extend<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Renewal>> {
        Box::pin(async move {
            // Answers until every lease is decided: a frozen master must not hold back the
            // majority's confirmations past the leases' deadlines. A master slower than the
            // grace after that is not awaited: its keys are extended at the next tick.
            let quorum = self.quorum();
            let owned: Arc<[OwnedLease]> =
                leases.iter().map(|lease| OwnedLease::of(*lease)).collect();
            let renewals_of = |answers: &[(usize, Result<Vec<Renewal>, StoreError>)], i: usize| {
                let outcomes = answers
                    .iter()
                    .filter_map(|(_, answer)| answer.as_ref().ok()?.get(i));
                Renewals::of(outcomes)
            };
            let (answers, late) = self
                .fan_out(
                    |master| {
                        let owned = owned.clone();
                        async move {
                            let leases: Vec<LeaseRef<'_>> =
                                owned.iter().map(OwnedLease::as_ref).collect();
                            Ok(master.extend(&leases).await)
                        }
                    },
                    |answers| (0..leases.len()).all(|i| renewals_of(answers, i).decided(quorum)),
                )
                .await;
            drop(late);
            let renewals: Vec<Renewal> = (0..leases.len())
                .map(|i| renewals_of(&answers, i).outcome(quorum))
                .collect();
            let per_master: Vec<(usize, Vec<Renewal>)> = answers
                .into_iter()
                .filter_map(|(index, answer)| Some((index, answer.ok()?)))
                .collect();
            for (index, answers) in &per_master {
                if let Some(Renewal::Failed(error @ StoreError::Unavailable(_))) = answers.first() {
                    self.take_out(*index, error);
                }
            }
            self.spread(leases, &renewals, &per_master).await;
            renewals
        })
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            self.ends(lease.value);
            let quorum = self.quorum();
            // One plan for every master (they share the quorum's settings), shared with a slow
            // master's release that finishes in the background.
            let plan = Arc::new((OwnedLease::of(lease), self.masters[0].release_plan(lease)?));
            let answers = self
                .on_every_master(
                    |master| {
                        let plan = plan.clone();
                        async move { master.release_by(plan.0.as_ref(), &plan.1, None).await }
                    },
                    |answers| oks(answers) >= quorum,
                )
                .await;
            tally::majority_answered(&answers, quorum)?;
            let deleted = answers
                .iter()
                .filter(|(_, answer)| matches!(answer, Ok(true)));
            Ok(deleted.count() >= quorum)
        })
    }

    fn hands_over(&self) -> Option<&dyn HandsOver> {
        Some(self)
    }

    /// On every master: a majority must answer, so that a key handed to the waiter meanwhile is
    /// not left held on a majority.
    fn leave<'a>(&'a self, key: &'a str, token: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let quorum = self.quorum();
            let answers = self
                .on_every_master(
                    |master| {
                        let (key, token) = (key.to_owned(), token.to_owned());
                        async move { master.leave(&key, &token).await }
                    },
                    |answers| oks(answers) >= quorum,
                )
                .await;
            tally::majority_answered(&answers, quorum)
        })
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        Box::pin(async move {
            // Every master in the path at once; the feed is ready once a majority subscribed
            // (or every master answered): the others join it when they are open, so a silent
            // master costs no waiter its wake-ups.
            let n = self.masters.len();
            let mut opening: FuturesUnordered<_> = (0..n)
                .filter(|&index| self.in_path(index))
                .map(|index| open_feed(self.masters[index].clone(), index))
                .collect();
            let mut feeds: Vec<Option<Box<dyn ReleaseFeed>>> = (0..n).map(|_| None).collect();
            let (mut opened, mut failure) = (0, None);
            // Still opening: every master in the path that has not answered yet.
            let mut reopening: Vec<bool> = (0..n).map(|index| self.in_path(index)).collect();
            while opened < self.quorum() {
                let Some((index, feed)) = opening.next().await else {
                    break;
                };
                reopening[index] = false;
                match feed {
                    Ok(feed) => {
                        feeds[index] = Some(feed);
                        opened += 1;
                    }
                    Err(error) => failure = Some(error),
                }
            }
            // One master's announcements are enough to wake waiters; none at all is a failure.
            if opened == 0 {
                return Err(failure.unwrap_or(StoreError::NoQuorum {
                    answered: 0,
                    needed: 1,
                }));
            }
            let (arrive, arrivals) = mpsc::unbounded_channel();
            if !opening.is_empty() {
                let arrive = arrive.clone();
                tokio::spawn(async move {
                    while let Some(opened) = opening.next().await {
                        let _ = arrive.send(opened);
                    }
                });
            }
            // Down and not opening (failed, or out of the path): opened again with backoff.
            let down = (0..n).any(|index| feeds[index].is_none() && !reopening[index]);
            let mut reopen = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
            Ok(Box::new(QuorumFeed {
                masters: self.masters.clone(),
                path: self.path.clone(),
                feeds,
                watched: Set::default(),
                reopen_at: down.then(|| Instant::now() + reopen.next_delay()),
                reopen,
                reopening,
                arrive,
                arrivals,
                look_again: VecDeque::new(),
                heard: HashMap::new(),
            }) as Box<dyn ReleaseFeed>)
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Snapshot>, StoreError>> {
        Box::pin(inspect::quorum_look(&self.masters, key))
    }

    fn mark_watched<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(inspect::quorum_mark_watched(&self.masters, key))
    }

    fn scan<'a>(
        &'a self,
        prefix: &'a str,
        cursor: Cursor,
    ) -> BoxFuture<'a, Result<Page, StoreError>> {
        Box::pin(inspect::quorum_scan(&self.masters, prefix, cursor))
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(inspect::quorum_force_release(&self.masters, key))
    }

    fn health(&self) -> BoxFuture<'_, Health> {
        Box::pin(async move {
            let nodes = join_all(
                self.masters
                    .iter()
                    .map(|master| master.node_health(NodeRole::Master)),
            )
            .await;
            let (answering, quorum) = (
                nodes.iter().filter(|node| node.answers()).count(),
                self.quorum(),
            );
            let verdict = format!(
                "{answering} of {} masters answer ({quorum} needed)",
                nodes.len()
            );
            Health::new("redlock", answering >= quorum, verdict, nodes)
        })
    }

    fn connect(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            // Every master in the path at once; done once a majority connected: the others go
            // on in the background (bounded by the connect timeout), and one that fails is out
            // of the path until it answers. So a silent master costs the build nothing.
            let quorum = self.quorum();
            let mut connecting: FuturesUnordered<_> = (0..self.masters.len())
                .filter(|&index| self.in_path(index))
                .map(|index| {
                    let master = self.masters[index].clone();
                    async move { (index, master.connect().await) }
                })
                .collect();
            let (mut reached, mut failed) = (0, Vec::new());
            let mut answered = vec![false; self.masters.len()];
            while reached < quorum {
                let Some((index, connected)) = connecting.next().await else {
                    break;
                };
                answered[index] = true;
                self.note(index, &connected);
                match connected {
                    Ok(()) => reached += 1,
                    Err(error) => failed.push(error),
                }
            }
            if !connecting.is_empty() {
                // A moment more for the others, as an acquire waits; one still connecting then
                // (hung, or behind a silent link) is out of the path until a probe hears it,
                // so it costs the first acquires nothing either.
                let late = tokio::time::timeout(Self::GRACE, async {
                    while let Some((index, connected)) = connecting.next().await {
                        answered[index] = true;
                        self.note(index, &connected);
                    }
                });
                if late.await.is_err() {
                    let silent = StoreError::unavailable(
                        "not connected when a majority of the masters was; probed in the background",
                    );
                    for index in (0..self.masters.len()).filter(|&index| !answered[index]) {
                        self.take_out(index, &silent);
                    }
                    let store = self.clone();
                    self.settings.background.spawn(async move {
                        while let Some((index, connected)) = connecting.next().await {
                            store.note(index, &connected);
                        }
                    });
                }
            }
            if reached >= quorum {
                if !failed.is_empty() {
                    let failed: Vec<String> = failed.iter().map(ToString::to_string).collect();
                    tracing::warn!(reached, failed = ?failed, "some Redlock masters cannot be reached");
                }
                return Ok(());
            }
            Err(failed.into_iter().next().unwrap_or(StoreError::NoQuorum {
                answered: reached,
                needed: quorum,
            }))
        })
    }
}

impl RedlockStore {
    /// The lease whose value is `value` ends (a release, a hand-over): a take of it that a slow
    /// master has not answered yet is given back when it lands, not kept.
    fn ends(&self, value: &str) {
        let settling = lock(&self.settling);
        if !settling.is_empty()
            && let Some(late) = settling.get(protocol::holder_token(value))
        {
            late.released.store(true, Ordering::SeqCst);
        }
    }

    /// Sends `call` to every master in the path from this task, so that each request is on its
    /// master's connection before anything this caller sends next (a release then reaches every
    /// master ahead of the caller's next acquire), and returns once `decided` says the answers
    /// so far settle it and the other masters answered too, or [`GRACE`](Self::GRACE) passed:
    /// the answers by master, in the masters' order, and the calls still unanswered.
    async fn fan_out<T, F>(
        &self,
        call: impl Fn(RedisStore<Server>) -> F,
        decided: impl Fn(&[(usize, Result<T, StoreError>)]) -> bool,
    ) -> (ByMaster<T>, Option<Late<T>>)
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        // The calls are polled together (one allocation for all of them) and tell their answers
        // as they come. A master out of the path is not asked.
        let answers = Arc::new(Mutex::new(Vec::with_capacity(self.masters.len())));
        let mut pending = join_all(self.masters.iter().enumerate().map(|(index, master)| {
            let asked = self.in_path(index).then(|| call(master.clone()));
            let answers = answers.clone();
            answered(asked, move |answer| lock(&answers).push((index, answer)))
        }));
        let mut all_answered = false;
        std::future::poll_fn(|cx| {
            all_answered = pending.poll_unpin(cx).is_ready();
            match all_answered || decided(&lock(&answers)) {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        })
        .await;
        if !all_answered {
            // A moment more for the others: they usually answer within it, and a master whose
            // request was still unsent when the majority decided (its connection's queue full)
            // would otherwise get it after the caller's next one.
            all_answered = tokio::time::timeout(Self::GRACE, &mut pending)
                .await
                .is_ok();
        }
        // Taken out (the pending calls run only when polled: none lands meanwhile), so that
        // the answers that come after are the late ones alone.
        let mut so_far = std::mem::take(&mut *lock(&answers));
        so_far.sort_unstable_by_key(|(index, _)| *index);
        let late = (!all_answered).then(|| Late {
            pending: Box::pin(pending.map(drop)),
            answers,
        });
        (so_far, late)
    }

    /// [`fan_out`](Self::fan_out), the slow masters' calls left to finish in the background:
    /// the answers so far. A task handed to the background for every call cost more client CPU
    /// than all the rest of a cycle under load (W2 on 3 masters: 49 µs a cycle with the answers
    /// awaited here, 79 µs with a task per release); only a slow master's goes there.
    async fn on_every_master<T, F>(
        &self,
        call: impl Fn(RedisStore<Server>) -> F,
        decided: impl Fn(&[(usize, Result<T, StoreError>)]) -> bool,
    ) -> ByMaster<T>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, StoreError>> + Send + 'static,
    {
        let (answers, late) = self.fan_out(call, decided).await;
        if let Some(late) = late {
            self.settings.background.spawn(late.pending);
        }
        answers
    }
}

/// Masters' answers to one request, each with its master's index.
type ByMaster<T> = Vec<(usize, Result<T, StoreError>)>;

/// The masters that had not answered when a request to every master was decided: their calls,
/// to run to the end (in the background) or to drop.
struct Late<T> {
    pending: BoxFuture<'static, ()>,
    answers: Arc<Mutex<ByMaster<T>>>,
}

impl<T> Late<T> {
    /// Runs the calls to the end: the late answers, by master.
    async fn answers(self) -> ByMaster<T> {
        self.pending.await;
        std::mem::take(&mut *lock(&self.answers))
    }
}

impl HandsOver for RedlockStore {
    /// On every master at once: handed when a majority handed it. Otherwise the next holder's
    /// value is taken back wherever it landed, and the lease counts as handed to a waiter it is
    /// reserved for, as released, or as not ours, as a majority says.
    fn hand_over<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        next: LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<HandOver, StoreError>> {
        Box::pin(async move {
            self.ends(lease.value);
            let (n, quorum) = (self.masters.len(), self.quorum());
            let (ours, theirs) = (OwnedLease::of(lease), OwnedLease::of(next));
            let answers = self
                .on_every_master(
                    |master| {
                        let (ours, theirs) = (ours.clone(), theirs.clone());
                        async move { master.hand_over(ours.as_ref(), theirs.as_ref()).await }
                    },
                    |answers| {
                        let handed = HandOvers::of(answers.iter().map(|(_, answer)| answer)).handed;
                        tally::settled(handed, answers.len(), n)
                    },
                )
                .await;
            let counts = HandOvers::of(answers.iter().map(|(_, answer)| answer));
            let outcome = counts.outcome(quorum);
            if outcome == Some(HandOver::Handed) {
                if counts.not_ours > 0 {
                    self.spread_hand_over(&theirs);
                }
                return Ok(HandOver::Handed);
            }
            // Not enough to hold it: the next holder's token is no lock. It is taken back before
            // answering, since the waiter looks again with that same token (an attempt that
            // finds its own token takes it as its own): a take-back still on its way would
            // delete the lock from under it. Unconfirmed, the waiter must change tokens.
            if counts.handed > 0 && !self.release_everywhere(&theirs).await {
                return Err(StoreError::unavailable(
                    "a partial hand-over could not be taken back from every master",
                ));
            }
            let answers = answers.into_iter().map(|(_, answer)| answer);
            outcome.ok_or_else(|| StoreError::short_of_quorum(answers, counts.answered(), quorum))
        })
    }
}

impl RedlockStore {
    /// A lock handed over on a majority, where some master did not hold our lease (it was
    /// down or slow when the lease was taken, or restarted empty since): the next holder takes
    /// the key on every master where it is missing (`SET NX PX`, in the background). Without
    /// this, a chain of short holds handed from waiter to waiter, none renewed, would keep the
    /// lock on a bare majority for as long as the chain lasts.
    fn spread_hand_over(&self, next: &OwnedLease) {
        let masters: Vec<(usize, RedisStore<Server>)> = (0..self.masters.len())
            .filter(|&index| self.in_path(index))
            .map(|index| (index, self.masters[index].clone()))
            .collect();
        let next = next.clone();
        self.settings.background.spawn(async move {
            let taken = masters.iter().map(|(index, master)| {
                let next = next.as_ref();
                async move { (*index, master.take_if_missing(next).await) }
            });
            for (index, taken) in join_all(taken).await {
                if let Ok(true) = taken {
                    tracing::debug!(key = %next.as_ref().key, master = index, "a Redlock lease handed over spread to a master that did not hold it");
                }
            }
        });
    }
}

/// Release announcements from every master, one per release. A master whose subscription is
/// lost (restarted, unreachable) is subscribed again with backoff, while the others carry on;
/// once it is back, the waiters of every watched key look again, since a release may have gone
/// by unheard there (a waiter that split the masters with another hears their undo only from
/// the masters it holds). Subscribing runs beside the feed, never in its way: a master that
/// is slow to answer delays no announcement of the others; one out of the path is left alone
/// until it answers again.
struct QuorumFeed {
    masters: Vec<RedisStore<Server>>,
    path: Arc<Path>,
    /// One per master; `None` while its subscription is down.
    feeds: Vec<Option<Box<dyn ReleaseFeed>>>,
    /// The keys watched, to subscribe again on a master that comes back.
    watched: Set<String>,
    reopen: Backoff,
    /// When to try the masters whose subscription is down.
    reopen_at: Option<Instant>,
    /// Per master: a subscription is being opened, to arrive on `arrivals`.
    reopening: Vec<bool>,
    arrive: mpsc::UnboundedSender<Opened>,
    arrivals: mpsc::UnboundedReceiver<Opened>,
    /// Keys whose waiters look again, reported as releases of no token.
    look_again: VecDeque<String>,
    /// Releases heard lately: when first, and from which masters (by index), to let the other
    /// masters' announcements of the same release pass.
    heard: HashMap<Released, (Instant, Vec<usize>)>,
}

impl QuorumFeed {
    /// How long the other masters' announcements of one release are expected to trail.
    const ECHO: Duration = Duration::from_millis(250);

    /// Whether `released`, heard from master `master`, is news rather than another master's
    /// announcement of a release heard already. One master can send the same message twice in a
    /// row (two undone attempts' "look again", each an empty message), so a master that
    /// announces it again announces something new; and one heard late counts as news: a look too many costs a round trip, a wake-up missed a lease.
    fn is_news(&mut self, master: usize, released: Released) -> bool {
        if protocol::Announcement::parse(&released.message)
            .handed_to
            .is_some()
        {
            // A key handed to a waiter: each master hands over on its own, and two undone
            // attempts' hand-overs read alike; a waiter told twice looks once more, one never
            // told sleeps out its wait.
            return true;
        }
        let now = Instant::now();
        self.heard
            .retain(|_, (first, _)| now.duration_since(*first) < Self::ECHO);
        match self.heard.get_mut(&released) {
            Some((_, masters)) if !masters.contains(&master) => {
                masters.push(master);
                false
            }
            _ => {
                self.heard.insert(released, (now, vec![master]));
                true
            }
        }
    }
}

impl QuorumFeed {
    /// Starts subscribing again, beside the feed, on every master whose subscription is down
    /// and that is in the path; the others are tried again later.
    fn reopen_down(&mut self) {
        let mut still_down = false;
        for index in 0..self.masters.len() {
            if self.feeds[index].is_some() || self.reopening[index] {
                continue;
            }
            if self.path.out[index].load(Ordering::Acquire) {
                still_down = true;
                continue;
            }
            self.reopening[index] = true;
            let opened = open_feed(self.masters[index].clone(), index);
            let arrive = self.arrive.clone();
            tokio::spawn(async move {
                let _ = arrive.send(opened.await);
            });
        }
        if still_down {
            self.reopen_later();
        }
    }

    fn reopen_later(&mut self) {
        if self.reopen_at.is_none() {
            self.reopen_at = Some(Instant::now() + self.reopen.next_delay());
        }
    }

    /// A subscription opened beside the feed: it watches every watched key, then joins the
    /// feed, and the waiters of every watched key look again (a release may have gone by
    /// unheard there).
    async fn arrived(&mut self, index: usize, opened: Result<Box<dyn ReleaseFeed>, StoreError>) {
        self.reopening[index] = false;
        let watching = async {
            let mut feed = opened?;
            for key in &self.watched {
                feed.watch(key).await?;
            }
            Ok::<_, StoreError>(feed)
        };
        match watching.await {
            Ok(feed) => {
                self.feeds[index] = Some(feed);
                if self.feeds.iter().all(Option::is_some) {
                    self.reopen.reset();
                }
                self.look_again.extend(self.watched.iter().cloned());
            }
            Err(error) => {
                tracing::debug!(master = index, error = %error, "a Redlock master's release subscription is still down");
                self.reopen_later();
            }
        }
    }

    /// Drops the subscriptions of masters out of the path: a silent master's would hold up
    /// every watch; it is subscribed again once it answers.
    fn drop_out_of_path(&mut self) {
        let mut dropped = false;
        for (index, feed) in self.feeds.iter_mut().enumerate() {
            if feed.is_some() && self.path.out[index].load(Ordering::Acquire) {
                *feed = None;
                dropped = true;
            }
        }
        if dropped {
            self.reopen_later();
        }
    }
}

/// A call on every live subscription of a [`QuorumFeed`].
#[derive(Debug, Clone, Copy)]
enum FeedCall {
    Watch,
    Unwatch,
    Settle,
}

impl QuorumFeed {
    /// How long the other subscriptions have to confirm a call once one did; one that has not
    /// by then is dropped and opened again beside the feed (a master gone silent would hold up
    /// every waiter's subscription for a whole response timeout).
    const LAGGARD: Duration = Duration::from_millis(100);

    /// `call` for `key` on every live subscription at once: done once one confirmed and the
    /// others did too or [`LAGGARD`](Self::LAGGARD) passed; an error when none confirmed.
    async fn on_live_feeds(&mut self, key: &str, call: FeedCall) -> Result<(), StoreError> {
        self.drop_out_of_path();
        let mut asked: FuturesUnordered<_> = self
            .feeds
            .iter_mut()
            .enumerate()
            .filter_map(|(index, feed)| {
                let feed = feed.as_mut()?;
                Some(async move {
                    let done = match call {
                        FeedCall::Watch => feed.watch(key),
                        FeedCall::Unwatch => feed.unwatch(key),
                        FeedCall::Settle => feed.settle(key),
                    };
                    (index, done.await)
                })
            })
            .collect();
        let (mut confirmed, mut failure, mut answered) = (false, None, Vec::new());
        while let Some((index, done)) = asked.next().await {
            answered.push(index);
            match done {
                Ok(()) => {
                    confirmed = true;
                    break;
                }
                Err(error) => failure = Some(error),
            }
        }
        if confirmed {
            let others = async {
                while let Some((index, done)) = asked.next().await {
                    answered.push(index);
                    if let Err(error) = done {
                        tracing::debug!(master = index, error = %error, "a Redlock master's release subscription failed a call");
                    }
                }
            };
            let _ = tokio::time::timeout(Self::LAGGARD, others).await;
        }
        drop(asked);
        let mut dropped = false;
        for (index, feed) in self.feeds.iter_mut().enumerate() {
            if feed.is_some() && !answered.contains(&index) {
                tracing::debug!(
                    master = index,
                    "a Redlock master's release subscription is slow to answer; opened again"
                );
                *feed = None;
                dropped = true;
            }
        }
        if dropped {
            self.reopen_later();
        }
        match confirmed {
            true => Ok(()),
            false => Err(failure.unwrap_or(StoreError::NoQuorum {
                answered: 0,
                needed: 1,
            })),
        }
    }
}

/// What woke a [`QuorumFeed`] waiting for its next release.
enum Woke {
    /// A master's announcement, or `None`: its subscription closed.
    Heard(usize, Option<Released>),
    /// Time to subscribe again where subscriptions are down.
    Reopen,
    /// A subscription opened beside the feed.
    Arrived(usize, Result<Box<dyn ReleaseFeed>, StoreError>),
}

/// A master's release subscription, opened (or not), by master index.
type Opened = (usize, Result<Box<dyn ReleaseFeed>, StoreError>);

/// Opens master `index`'s release subscription.
async fn open_feed(master: RedisStore<Server>, index: usize) -> Opened {
    (index, master.release_feed().await)
}

impl ReleaseFeed for QuorumFeed {
    fn watch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.watched.insert(key.to_owned());
            // One master that hears releases is enough; the lease-timed fallback covers the rest.
            self.on_live_feeds(key, FeedCall::Watch).await
        })
    }

    fn unwatch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.watched.remove(key);
            self.on_live_feeds(key, FeedCall::Unwatch).await
        })
    }

    fn settle<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.on_live_feeds(key, FeedCall::Settle))
    }

    fn next_release(&mut self) -> BoxFuture<'_, Option<Released>> {
        Box::pin(async move {
            loop {
                if let Some(key) = self.look_again.pop_front() {
                    return Some(Released {
                        key,
                        message: String::new(),
                    });
                }
                if self.feeds.iter().all(Option::is_none) {
                    // No master left: the listener opens the whole feed again.
                    return None;
                }
                let reopen_at = self.reopen_at;
                let live = self
                    .feeds
                    .iter_mut()
                    .enumerate()
                    .filter_map(|(index, feed)| {
                        let feed = feed.as_mut()?;
                        Some(Box::pin(async move { (index, feed.next_release().await) }))
                    });
                let heard = select_all(live);
                let reopen = async {
                    match reopen_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                let woke = crate::sync::select! {
                    ((index, released), _, _) = heard => Woke::Heard(index, released),
                    () = reopen => Woke::Reopen,
                    Some((index, opened)) = self.arrivals.recv() => Woke::Arrived(index, opened),
                };
                match woke {
                    Woke::Heard(index, Some(released)) => {
                        if self.is_news(index, released.clone()) {
                            return Some(released);
                        }
                    }
                    Woke::Heard(index, None) => {
                        // That master's subscription is gone: the others carry on, and it is
                        // subscribed again with backoff.
                        tracing::debug!(
                            master = index,
                            "a Redlock master's release subscription closed"
                        );
                        self.feeds[index] = None;
                        self.reopen_later();
                    }
                    Woke::Reopen => {
                        self.reopen_at = None;
                        self.reopen_down();
                    }
                    Woke::Arrived(index, opened) => self.arrived(index, opened).await,
                }
            }
        })
    }
}
