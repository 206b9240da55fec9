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

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use futures_util::FutureExt;
use futures_util::future::{join_all, select_all};
use futures_util::stream::{FuturesUnordered, StreamExt};
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
use crate::sync::lock;

/// A master's `Busy`: the first busy key, the time until it may be free, the estimated wait.
type BusyAnswer = (usize, Option<Duration>, Option<Duration>);

/// A Redlock quorum.
#[derive(Clone)]
pub(crate) struct RedlockStore {
    masters: Vec<RedisStore<Server>>,
    settings: Settings,
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
        Ok(Self { masters, settings })
    }

    /// How long a renewal, a release or a hand-over waits for the other masters once a
    /// majority decided.
    const GRACE: Duration = Duration::from_millis(20);

    /// About how long a waiter that split the masters with another waiter waits before it looks
    /// again (jittered, so the racers spread out).
    const SPLIT_RETRY: Duration = Duration::from_millis(25);

    fn quorum(&self) -> usize {
        self.masters.len() / 2 + 1
    }

    /// Compare-and-delete on every master, awaited (bounded), for undoing an attempt.
    /// `true` when every master answered.
    async fn release_everywhere(&self, lease: LeaseRef<'_>) -> bool {
        let budget = self.settings.response_timeout;
        let releases = self.masters.iter().map(|master| master.release(lease));
        match tokio::time::timeout(budget, join_all(releases)).await {
            Ok(answers) => answers.iter().all(Result::is_ok),
            Err(_) => false,
        }
    }

    /// One attempt (`on_master`, one key or several) on every master at once, each within a
    /// budget far below the ttl (the Redlock paper), decided by a majority: taken when a
    /// majority took it with time to spare (validity = ttl − elapsed − drift); otherwise undone
    /// on every master where it was taken (or may have been) before answering, `Busy` when a
    /// majority found a key busy, [`StoreError::NoQuorum`] when no majority either way.
    async fn on_a_majority<'s, F, Fut>(
        &'s self,
        ttl: Duration,
        undo: LeaseRef<'_>,
        budget: Duration,
        on_master: F,
    ) -> Result<AcquiredMany, StoreError>
    where
        F: Fn(&'s RedisStore<Server>, Duration) -> Fut,
        Fut: Future<Output = Result<AcquiredMany, StoreError>>,
    {
        let per_master = budget.min((ttl / 10).max(Duration::from_millis(10)));
        let started = Instant::now();
        // Every master's answer, each bounded by the per-master budget: a slow master that
        // takes it is part of the lock, not undone for being late.
        let quorum = self.quorum();
        let answers = join_all(
            self.masters
                .iter()
                .map(|master| on_master(master, per_master)),
        )
        .await;
        let elapsed = started.elapsed();
        let taken = answers
            .iter()
            .filter(|answer| matches!(answer, Ok(AcquiredMany::Taken)))
            .count();
        let busy: Vec<BusyAnswer> = answers
            .iter()
            .filter_map(|answer| match answer {
                Ok(AcquiredMany::Busy {
                    key,
                    remaining,
                    estimate,
                }) => Some((*key, *remaining, *estimate)),
                _ => None,
            })
            .collect();
        let validity = ttl
            .checked_sub(elapsed + clock::drift(ttl))
            .filter(|left| !left.is_zero());
        if taken >= quorum && validity.is_some() {
            self.leave_where_busy(undo, &answers);
            return Ok(AcquiredMany::Taken);
        }
        if taken > 0 && !busy.is_empty() {
            // Split with another attempt: some masters ours, others busy, no majority ours.
            metrics::redlock_split();
        }
        // Not ours: undo wherever it was taken (or may have been), before answering.
        if taken > 0 || busy.len() + taken < self.masters.len() {
            self.release_everywhere(undo).await;
        }
        if let Some(not_a_lock) = answers.iter().find_map(|answer| match answer {
            Err(StoreError::Unusable(error)) if matches!(**error, LockError::NotALock { .. }) => {
                Some(StoreError::Unusable(error.clone()))
            }
            _ => None,
        }) {
            // Something that is no lock sits under the key on some master: it is left as it is.
            return Err(not_a_lock);
        }
        if busy.len() >= quorum {
            let key = busy.iter().map(|(key, ..)| *key).min().unwrap_or(0);
            // Free again once all but a minority of the busy masters are free.
            let frees_a_majority = busy.len() - (self.masters.len() - quorum);
            let majority_view = |pick: fn(&BusyAnswer) -> Option<Duration>| {
                let mut times: Vec<Option<Duration>> = busy.iter().map(pick).collect();
                times.sort_unstable();
                times.get(frees_a_majority - 1).copied().flatten()
            };
            let mut remaining = majority_view(|(_, left, _)| *left);
            let estimate = majority_view(|(.., estimate)| *estimate);
            if taken > 0 {
                // We took some masters: others may be racing us for the rest, and their keys go
                // as ours did. Look again soon (the Redlock paper's random retry), not after
                // leases that are being undone.
                let retry = clock::jittered(Self::SPLIT_RETRY, 0.8);
                remaining = Some(remaining.map_or(retry, |left| left.min(retry)));
            }
            return Ok(AcquiredMany::Busy {
                key,
                remaining,
                estimate,
            });
        }
        if taken >= quorum {
            return Err(StoreError::unavailable(format!(
                "a majority took the lock only after {elapsed:?}, past the lease's validity"
            )));
        }
        if taken + busy.len() >= quorum {
            // A majority answered, split between us and another holder or racer: neither has
            // the lock for sure, and the racers' attempts are being undone as ours was. Look
            // again soon (jittered, so the racers spread out), inside the caller's wait; a
            // caller that fails fast is told to come back as soon.
            let key = busy.iter().map(|(key, ..)| *key).min().unwrap_or(0);
            let retry = clock::jittered(Self::SPLIT_RETRY, 0.8);
            return Ok(AcquiredMany::Busy {
                key,
                remaining: Some(retry),
                estimate: Some(retry),
            });
        }
        Err(StoreError::NoQuorum {
            answered: taken.max(busy.len()),
            needed: quorum,
        })
    }
}

impl RedlockStore {
    /// A waiter that took the lock on a majority may have reserved the key on a master that
    /// was busy (see `protocol::Reservation`): that master would hand it the key, under a value
    /// its lease does not know, at its holder's release. It leaves those masters (in the
    /// background): the reservation is taken off, or a key handed meanwhile given back.
    fn leave_where_busy(&self, lease: LeaseRef<'_>, answers: &[Result<AcquiredMany, StoreError>]) {
        let busy: Vec<RedisStore<Server>> = self
            .masters
            .iter()
            .zip(answers)
            .filter(|(_, answer)| matches!(answer, Ok(AcquiredMany::Busy { .. })))
            .map(|(master, _)| master.clone())
            .collect();
        if busy.is_empty() {
            return;
        }
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
            // One command for every master: they share the quorum's settings.
            let cmd = &self.masters[0].acquire_cmd(&request)?;
            let on_master = |master: &'a RedisStore<Server>, per_master| async move {
                let answer = master.acquire_with(request, cmd, per_master).await?;
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
            };
            let decided = self
                .on_a_majority(request.ttl, request.lease(), budget, on_master)
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
            let on_master = |master: &'a RedisStore<Server>, per_master| {
                master.acquire_many(request, per_master)
            };
            self.on_a_majority(request.ttl, request.lease(), budget, on_master)
                .await
        })
    }

    fn extend<'a>(&'a self, leases: &'a [LeaseRef<'a>]) -> BoxFuture<'a, Vec<Renewal>> {
        Box::pin(async move {
            // Answers until every lease is decided: a frozen master must not hold back the
            // majority's confirmations past the leases' deadlines.
            let quorum = self.quorum();
            let mut pending: FuturesUnordered<_> = self
                .masters
                .iter()
                .map(|master| master.extend(leases))
                .collect();
            let mut per_master: Vec<Vec<Renewal>> = Vec::with_capacity(self.masters.len());
            let decided = |per_master: &[Vec<Renewal>]| {
                (0..leases.len()).all(|i| {
                    let (extended, lost) = per_master
                        .iter()
                        .filter_map(|answers| answers.get(i))
                        .fold((0, 0), |(extended, lost), outcome| match outcome {
                            Renewal::Extended => (extended + 1, lost),
                            Renewal::Lost(_) => (extended, lost + 1),
                            Renewal::Failed(_) => (extended, lost),
                        });
                    extended >= quorum || lost >= quorum
                })
            };
            while let Some(answers) = pending.next().await {
                per_master.push(answers);
                if decided(&per_master) {
                    // A moment more for the others, so that their keys are extended too.
                    let others = async {
                        while let Some(answers) = pending.next().await {
                            per_master.push(answers);
                        }
                    };
                    let _ = tokio::time::timeout(Self::GRACE, others).await;
                    break;
                }
            }
            drop(pending);
            (0..leases.len())
                .map(|i| {
                    let outcomes = per_master.iter().filter_map(|answers| answers.get(i));
                    let (mut extended, mut lost, mut failure) = (0, 0, None);
                    // Taken when any master of the majority that lost it names another owner.
                    let mut reason = LostReason::Gone;
                    for outcome in outcomes {
                        match outcome {
                            Renewal::Extended => extended += 1,
                            Renewal::Lost(found) => {
                                lost += 1;
                                if *found == LostReason::Taken {
                                    reason = LostReason::Taken;
                                }
                            }
                            Renewal::Failed(error) => failure = Some(error.clone()),
                        }
                    }
                    if extended >= quorum {
                        Renewal::Extended
                    } else if lost >= quorum {
                        Renewal::Lost(reason)
                    } else {
                        Renewal::Failed(failure.unwrap_or(StoreError::NoQuorum {
                            answered: extended.max(lost),
                            needed: quorum,
                        }))
                    }
                })
                .collect()
        })
    }

    fn release<'a>(&'a self, lease: LeaseRef<'a>) -> BoxFuture<'a, Result<bool, StoreError>> {
        Box::pin(async move {
            let quorum = self.quorum();
            // One command for every master (they share the quorum's settings), shared with a
            // slow master's release that finishes in the background.
            let call = Arc::new(self.masters[0].release_call(lease)?);
            let answers = self
                .on_every_master(
                    |master| {
                        let call = call.clone();
                        async move { master.release_with(&call).await }
                    },
                    |answers| answers.iter().filter(|answer| answer.is_ok()).count() >= quorum,
                )
                .await;
            let deleted = answers
                .iter()
                .filter(|answer| matches!(answer, Ok(true)))
                .count();
            let answered = answers.iter().filter(|answer| answer.is_ok()).count();
            if answered >= quorum {
                return Ok(deleted >= quorum);
            }
            Err(answers
                .into_iter()
                .find_map(Result::err)
                .unwrap_or(StoreError::NoQuorum {
                    answered,
                    needed: quorum,
                }))
        })
    }

    fn hands_over(&self) -> Option<&dyn HandsOver> {
        Some(self)
    }

    /// On every master: a majority must answer, so that a key handed to the waiter meanwhile is
    /// not left held on a majority.
    fn leave<'a>(&'a self, key: &'a str, token: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let outcomes =
                join_all(self.masters.iter().map(|master| master.leave(key, token))).await;
            let answered = outcomes.iter().filter(|outcome| outcome.is_ok()).count();
            match answered >= self.quorum() {
                true => Ok(()),
                false => Err(StoreError::short_of_quorum(
                    outcomes,
                    answered,
                    self.quorum(),
                )),
            }
        })
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        Box::pin(async move {
            let opened = join_all(self.masters.iter().map(|master| master.release_feed())).await;
            let mut feeds = Vec::new();
            let mut failure = None;
            for feed in opened {
                match feed {
                    Ok(feed) => feeds.push(Some(feed)),
                    Err(error) => {
                        failure = Some(error);
                        feeds.push(None);
                    }
                }
            }
            // One master's announcements are enough to wake waiters; none at all is a failure.
            // The others are opened again in the background of the feed.
            if feeds.iter().all(Option::is_none) {
                return Err(failure.unwrap_or(StoreError::NoQuorum {
                    answered: 0,
                    needed: 1,
                }));
            }
            let down = feeds.iter().any(Option::is_none);
            let mut reopen = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
            Ok(Box::new(QuorumFeed {
                masters: self.masters.clone(),
                feeds,
                watched: HashSet::new(),
                reopen_at: down.then(|| Instant::now() + reopen.next_delay()),
                reopen,
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
            let connected = join_all(self.masters.iter().map(|master| master.connect())).await;
            let failed: Vec<String> = connected
                .iter()
                .filter_map(|outcome| outcome.as_ref().err().map(ToString::to_string))
                .collect();
            let reached = connected.len() - failed.len();
            if reached >= self.quorum() {
                if !failed.is_empty() {
                    tracing::warn!(reached, failed = ?failed, "some Redlock masters cannot be reached");
                }
                Ok(())
            } else {
                Err(connected
                    .into_iter()
                    .find_map(Result::err)
                    .unwrap_or(StoreError::NoQuorum {
                        answered: reached,
                        needed: self.quorum(),
                    }))
            }
        })
    }
}

impl RedlockStore {
    /// Sends `call` to every master from this task, so that each request is on its master's
    /// connection before anything this caller sends next (a release then reaches every master
    /// ahead of the caller's next acquire); returns the answers once `decided` says they settle
    /// it and the other masters answered too or [`GRACE`](Self::GRACE) passed, and lets the
    /// rest finish in the background.
    async fn on_every_master<T, F>(
        &self,
        call: impl Fn(RedisStore<Server>) -> F,
        decided: impl Fn(&[T]) -> bool,
    ) -> Vec<T>
    where
        T: Send + 'static,
        F: std::future::Future<Output = T> + Send + 'static,
    {
        // The calls are polled together (one allocation for all of them) and tell their answers
        // as they come; a slow master's call goes to the background as it is.
        let answers = Arc::new(Mutex::new(Vec::with_capacity(self.masters.len())));
        let mut pending = join_all(self.masters.iter().map(|master| {
            let (answers, answer) = (answers.clone(), call(master.clone()));
            async move {
                let answer = answer.await;
                lock(&answers).push(answer);
            }
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
            // The other masters usually answer within the same moment: a task handed to the
            // background thread for each call cost more client CPU than all the rest of a
            // cycle under load (W2 on 3 masters: 49 µs a cycle with the answers awaited here,
            // 79 µs with a task per release). Only a slow master is left to the background.
            all_answered = tokio::time::timeout(Self::GRACE, &mut pending)
                .await
                .is_ok();
        }
        if !all_answered {
            self.settings.background.spawn(pending);
        }
        std::mem::take(&mut *lock(&answers))
    }
}

impl HandsOver for RedlockStore {
    /// On every master at once: handed when a majority handed it. Otherwise the next holder's
    /// value is taken back wherever it landed, and the lease counts as handed to a waiter owed
    /// it, as released, or as not ours, as a majority says.
    fn hand_over<'a>(
        &'a self,
        lease: LeaseRef<'a>,
        next: LeaseRef<'a>,
    ) -> BoxFuture<'a, Result<HandOver, StoreError>> {
        Box::pin(async move {
            let (n, quorum) = (self.masters.len(), self.quorum());
            let (ours, theirs) = (OwnedLease::of(lease), OwnedLease::of(next));
            let answers = self
                .on_every_master(
                    |master| {
                        let (ours, theirs) = (ours.clone(), theirs.clone());
                        async move { master.hand_over(ours.as_ref(), theirs.as_ref()).await }
                    },
                    |answers| {
                        let handed = answers
                            .iter()
                            .filter(|answer| matches!(answer, Ok(HandOver::Handed)))
                            .count();
                        handed >= quorum || answers.len() - handed > n - quorum
                    },
                )
                .await;
            let count = |outcome: HandOver| {
                answers
                    .iter()
                    .filter(|answer| matches!(answer, Ok(found) if *found == outcome))
                    .count()
            };
            let (handed, released, elsewhere, not_ours) = (
                count(HandOver::Handed),
                count(HandOver::Released),
                count(HandOver::HandedElsewhere),
                count(HandOver::NotOurs),
            );
            if handed >= quorum {
                return Ok(HandOver::Handed);
            }
            // Not enough to hold it: the next holder's token is no lock. It is taken back before
            // answering, since the waiter looks again with that same token (an attempt that
            // finds its own token takes it as its own): a take-back still on its way would
            // delete the lock from under it. Unconfirmed, the waiter must change tokens.
            if handed > 0 && !self.release_everywhere(theirs.as_ref()).await {
                return Err(StoreError::unavailable(
                    "a partial hand-over could not be taken back from every master",
                ));
            }
            if not_ours >= quorum {
                Ok(HandOver::NotOurs)
            } else if elsewhere >= quorum {
                Ok(HandOver::HandedElsewhere)
            } else if handed + released + elsewhere >= quorum {
                // Gone from a majority (freed, or passed to a waiter owed it): no longer ours.
                Ok(HandOver::Released)
            } else {
                Err(answers
                    .into_iter()
                    .find_map(Result::err)
                    .unwrap_or(StoreError::NoQuorum {
                        answered: handed + released + elsewhere + not_ours,
                        needed: quorum,
                    }))
            }
        })
    }
}

/// Release announcements from every master, one per release. A master whose subscription is
/// lost (restarted, unreachable) is subscribed again with backoff, while the others carry on;
/// once it is back, the waiters of every watched key look again, since a release may have gone
/// by unheard there (a waiter that split the masters with another hears their undo only from
/// the masters it holds).
struct QuorumFeed {
    masters: Vec<RedisStore<Server>>,
    /// One per master; `None` while its subscription is down.
    feeds: Vec<Option<Box<dyn ReleaseFeed>>>,
    /// The keys watched, to subscribe again on a master that comes back.
    watched: HashSet<String>,
    reopen: Backoff,
    /// When to try the masters whose subscription is down.
    reopen_at: Option<Instant>,
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
    /// Subscribes again on every master whose subscription is down; tells the waiters of every
    /// watched key to look again when one comes back.
    async fn reopen_down(&mut self) {
        let mut still_down = false;
        for (master, slot) in self.masters.iter().zip(self.feeds.iter_mut()) {
            if slot.is_some() {
                continue;
            }
            let opened = async {
                let mut feed = master.release_feed().await?;
                for key in &self.watched {
                    feed.watch(key).await?;
                }
                Ok::<_, StoreError>(feed)
            };
            match opened.await {
                Ok(feed) => *slot = Some(feed),
                Err(error) => {
                    tracing::debug!(error = %error, "a Redlock master's release subscription is still down");
                    still_down = true;
                }
            }
        }
        if still_down {
            self.reopen_at = Some(Instant::now() + self.reopen.next_delay());
        } else {
            self.reopen.reset();
        }
        // Whether or not all are back: those that are may have missed releases.
        self.look_again.extend(self.watched.iter().cloned());
    }
}

impl ReleaseFeed for QuorumFeed {
    fn watch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.watched.insert(key.to_owned());
            let live = self.feeds.iter_mut().flatten();
            let watched = join_all(live.map(|feed| feed.watch(key))).await;
            // One master that hears releases is enough; the lease-timed fallback covers the rest.
            if watched.iter().any(Result::is_ok) {
                Ok(())
            } else {
                watched.into_iter().find_map(Result::err).map_or(
                    Err(StoreError::NoQuorum {
                        answered: 0,
                        needed: 1,
                    }),
                    Err,
                )
            }
        })
    }

    fn unwatch<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            self.watched.remove(key);
            let live = self.feeds.iter_mut().flatten();
            let unwatched = join_all(live.map(|feed| feed.unwatch(key))).await;
            unwatched
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), Err)
        })
    }

    fn settle<'a>(&'a mut self, key: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let live = self.feeds.iter_mut().flatten();
            let settled = join_all(live.map(|feed| feed.settle(key))).await;
            settled
                .into_iter()
                .find_map(Result::err)
                .map_or(Ok(()), Err)
        })
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
                let heard = tokio::select! {
                    ((index, released), _, _) = heard => Some((index, released)),
                    () = reopen => None,
                };
                match heard {
                    Some((index, Some(released))) => {
                        if self.is_news(index, released.clone()) {
                            return Some(released);
                        }
                    }
                    Some((index, None)) => {
                        // That master's subscription is gone: the others carry on, and it is
                        // subscribed again with backoff.
                        tracing::debug!(
                            master = index,
                            "a Redlock master's release subscription closed"
                        );
                        self.feeds[index] = None;
                        if self.reopen_at.is_none() {
                            self.reopen_at = Some(Instant::now() + self.reopen.next_delay());
                        }
                    }
                    None => {
                        self.reopen_at = None;
                        self.reopen_down().await;
                    }
                }
            }
        })
    }
}
