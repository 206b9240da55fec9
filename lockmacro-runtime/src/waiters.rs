//! Waiting for a busy lock without polling: releases are announced on a per-key channel, and one
//! subscription per client, on the client's runtime, wakes that client's waiters.
//!
//! A release wakes one waiter per client (FIFO, through [`Notify::notify_one`]), not all of
//! them, so a thousand waiters on one key do not stampede Redis. A release that handed the key
//! to a caller it was reserved for (one that waited too long, see `protocol::RESERVE_AFTER`)
//! wakes that caller alone, wherever it runs: the key is not free for anyone else; the callers
//! elsewhere that waited too long look again too, to reserve the key in turn should theirs have
//! gone unrecorded (a key keeps 16 reservations). A waiter also sleeps no longer than the
//! holder's remaining lease (jittered): that covers a holder that died without
//! announcing anything, and any time the subscription is down. When subscribing fails the
//! waiters are told at once (they fall back to that timing, and look again at each failed try),
//! and the subscription is reopened with backoff (at most [`REOPEN_CAP`] apart) and every
//! waited-for key subscribed again; their waiters then look again, since a release may have gone
//! by unheard meanwhile. A key newly waited for while the subscription is down opens it at once
//! rather than at the backoff's next try: its waiter's look was just answered, so Redis is most
//! likely back, and without a subscription it would sleep out the holder's whole lease.

use std::collections::VecDeque;
use std::collections::hash_map::Entry;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::background::Background;
use crate::clock::Backoff;
use crate::metrics::{self, Prefix};
use crate::options::LockOptions;
use crate::renewal::{LeaseCheck, LeaseChecker};
use crate::right::ReleaseRight;
use crate::store::protocol::{self, Announcement};
use crate::store::{ReleaseFeed, Store, StoreError};
use crate::sync::{Map, lock};

/// The longest pause between two tries to reopen a lost subscription: once Redis is back, its
/// waiters hear releases again within this, and every one of them looks then (one per key looks
/// at each failed try meanwhile). A waiting caller's own look-again pause grows to a second: a
/// free key whose waiters all paused after failed looks is found within this instead. One
/// connection attempt per client each time: cheap beside the waiters' looks.
const REOPEN_CAP: Duration = Duration::from_millis(250);

/// The shortest pause between two tries to open the subscription, however many keys ask.
const REOPEN_BASE: Duration = Duration::from_millis(100);

pub(crate) struct WaitQueue {
    keys: Arc<Keys>,
    /// How many keys have waiters (entries of `keys`, counted under its lock), read without
    /// the lock: a release while nobody of this client waits for anything takes no mutex.
    waited_keys: std::sync::atomic::AtomicUsize,
    commands: mpsc::UnboundedSender<Command>,
    /// The subscription was asked to stay open ([`listen`](Self::listen)); it then reopens
    /// itself whenever it is lost.
    listening: std::sync::atomic::AtomicBool,
}

type Keys = Mutex<Map<String, Arc<KeyWaiters>>>;

struct KeyWaiters {
    released: Notify,
    /// Releases heard so far: a waiter that was busy asking Redis when one went by (and so not
    /// parked on `released`) sees the count moved and looks again instead of sleeping.
    releases: std::sync::atomic::AtomicU64,
    waiters: Mutex<usize>,
    /// Waiters that must all look at each release (readers, fair waiters), not just one.
    everyone: std::sync::atomic::AtomicUsize,
    hearing: HearingNow,
    /// Parked waiters a release of this client may hand the lock to, longest parked first.
    candidates: Mutex<VecDeque<Candidate>>,
    /// Callers parked on a release of the key now.
    parked: std::sync::atomic::AtomicUsize,
    /// Parked callers that waited too long and reserve the key at each look.
    reserving: std::sync::atomic::AtomicUsize,
    /// Parked callers, by token, that a release may hand the key to (they reserved it), each
    /// with when it began waiting (ms since the Unix epoch, on this client's wall clock): woken
    /// alone when an announcement names them, and first after any other release.
    reservations: Mutex<Map<String, (u64, Arc<Notify>)>>,
    /// The next offer's id ([`Ticket::offer`]).
    offers: std::sync::atomic::AtomicU64,
    /// The value of this client's last release of the key: its waiters were woken already, so
    /// the announcement of that release is no news.
    released_here: Mutex<Option<String>>,
}

/// What a release of this client did for a waiter that offered to be handed the lock.
pub(crate) enum Handing {
    /// The lock is the waiter's now: a lease registered with the watchdog, and the right to
    /// release it (released in the background if the waiter is gone before it takes it).
    Handed(ReleaseRight),
    /// Another client waits too: the lock was released and announced instead. The waiter
    /// waits for that announcement, as the other client's waiters do.
    Declined,
    /// The key went to a caller that had reserved it (it waited too long): the waiter keeps
    /// its place, first in line for this client's next release of the key, which may well be
    /// that caller's own hand-over (announcing nothing).
    Passed,
    /// The lease was no longer the releaser's: the waiter looks again now.
    Look,
    /// The hand-over got no answer: the waiter's token may hold the key. It is given up
    /// (released in the background) and the waiter goes on with a new one.
    Uncertain,
}

/// A parked waiter that offered to take the lock straight from a release of this client.
pub(crate) struct Candidate {
    offer: u64,
    pub(crate) token: String,
    /// The time in the value of the waiter's last look (ms): the value it is handed is later.
    pub(crate) last_ms: u64,
    pub(crate) options: LockOptions,
    outcome: oneshot::Sender<Handing>,
}

impl Candidate {
    /// Tells the waiter what its release did; gives `handing` back when the waiter is gone (a
    /// handed lease is then released as it drops).
    pub(crate) fn tell(self, handing: Handing) -> Result<(), Handing> {
        self.outcome.send(handing)
    }
}

/// A waiter's offer to be handed the lock; withdrawn when dropped.
pub(crate) struct Offer {
    waiters: Arc<KeyWaiters>,
    id: u64,
    outcome: oneshot::Receiver<Handing>,
}

impl Offer {
    /// What the release that took the offer up did (the offer is gone then); never if `offer`
    /// is `None`. A release that went away without telling may have handed the lock over:
    /// that is [`Handing::Uncertain`].
    pub(crate) async fn settled(offer: &mut Option<Offer>) -> Handing {
        let Some(pending) = offer else {
            return std::future::pending().await;
        };
        let handing = (&mut pending.outcome).await.unwrap_or(Handing::Uncertain);
        *offer = None;
        handing
    }

    /// Withdraws the offer: `None` if no release took it up. Once a release has, waits for
    /// what it did (bounded by its request), so a lease handed meanwhile is never left behind
    /// nor its token used for another attempt.
    pub(crate) async fn withdraw(self) -> Option<Handing> {
        if self.remove() {
            return None;
        }
        Some(Self::settled(&mut Some(self)).await)
    }

    /// Takes the offer out of the queue; `false` when a release already took it.
    fn remove(&self) -> bool {
        let mut candidates = lock(&self.waiters.candidates);
        match candidates.iter().position(|c| c.offer == self.id) {
            Some(at) => {
                candidates.remove(at);
                true
            }
            None => false,
        }
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        self.remove();
    }
}

/// Whether releases of a key reach its waiters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hearing {
    /// Subscribing.
    Pending,
    /// Subscribed: every release from now on is heard.
    Heard,
    /// The subscription failed or was lost: waiters go by the holder's remaining lease.
    Unheard,
}

/// Whether releases of a key reach its waiters now, and a wake-up for those waiting until it is
/// settled. (A `watch` channel would do, but which of its waiters wakes first is drawn from
/// tokio's thread RNG, which a simulation cannot seed; `Notify` wakes in order.)
struct HearingNow {
    now: Mutex<Hearing>,
    changed: Notify,
}

impl Default for HearingNow {
    fn default() -> Self {
        Self {
            now: Mutex::new(Hearing::Pending),
            changed: Notify::new(),
        }
    }
}

impl HearingNow {
    fn get(&self) -> Hearing {
        *lock(&self.now)
    }

    fn set(&self, hearing: Hearing) {
        *lock(&self.now) = hearing;
        self.changed.notify_waiters();
    }

    /// Once it is no longer [`Hearing::Pending`]: what it is then.
    async fn settled(&self) -> Hearing {
        loop {
            let changed = self.changed.notified();
            let mut changed = std::pin::pin!(changed);
            // Listening before looking: a change after the look wakes us.
            changed.as_mut().enable();
            let now = self.get();
            if now != Hearing::Pending {
                return now;
            }
            changed.await;
        }
    }
}

enum Command {
    /// Keep the subscription open from now on: a lease is held, and its holder must hear a
    /// forced release of its key.
    Listen,
    Watch(String),
    /// A waiter on the key found the deployment answering again while the subscription is
    /// lost: reopen it now rather than at the next try of its backoff (unless the deployment
    /// refused it, or it was tried a moment ago).
    Resubscribe(String),
    Unwatch(String),
    /// Open the subscription now (a client being built), reporting how it went.
    Connect(oneshot::Sender<Result<(), StoreError>>),
}

/// One waiter's place in the queue of a key; leaving it (drop) unsubscribes the last one out.
pub(crate) struct Ticket<'a> {
    queue: &'a WaitQueue,
    key: String,
    waiters: Arc<KeyWaiters>,
    everyone: bool,
    prefix: Prefix,
}

impl WaitQueue {
    /// Starts the subscription task where the client's background work runs.
    pub(crate) fn start(
        store: Arc<dyn Store>,
        background: &Background,
        checker: LeaseChecker,
    ) -> Self {
        let keys = Arc::new(Keys::default());
        let (commands, received) = mpsc::unbounded_channel();
        // Shared so that a listener started again (on another runtime) takes over the commands.
        let received = Arc::new(tokio::sync::Mutex::new(received));
        let listening = keys.clone();
        background.spawn_service(move |stop| {
            let listener = Listener {
                store: store.clone(),
                keys: listening.clone(),
                feed: None,
                checker: checker.clone(),
                backoff: Backoff::new(REOPEN_BASE, REOPEN_CAP),
                reopen_at: None,
                tried_at: None,
                refused: false,
            };
            listener.run(received.clone(), stop)
        });
        Self {
            keys,
            waited_keys: std::sync::atomic::AtomicUsize::new(0),
            commands,
            listening: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// A lease is held: keep the subscription open from now on (once; it costs later leases an
    /// atomic read), so that holders hear forced releases and every lease is checked when the
    /// subscription's connection comes back after a loss.
    pub(crate) fn listen(&self) {
        if !self.listening.load(std::sync::atomic::Ordering::Relaxed)
            && !self
                .listening
                .swap(true, std::sync::atomic::Ordering::AcqRel)
        {
            let _ = self.commands.send(Command::Listen);
        }
    }

    /// Opens the subscription connection now, so the first waiter pays nothing.
    pub(crate) async fn connect(&self) -> Result<(), StoreError> {
        self.listening
            .store(true, std::sync::atomic::Ordering::Release);
        let (reply, outcome) = oneshot::channel();
        if self.commands.send(Command::Connect(reply)).is_err() {
            return Ok(());
        }
        outcome.await.unwrap_or(Ok(()))
    }

    /// A lease of this client on `key` (of `value`) was released: its waiters look again now,
    /// whether or not the release is announced (a release's announcement depends on a waiter's
    /// mark, which this client's own waiters need not rely on).
    pub(crate) fn released_here(&self, key: &str, value: &str) {
        if self.waited_keys.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return;
        }
        wake_after_release(&self.keys, key, value);
    }

    /// What wakes this client's waiters after a release made elsewhere (in the background).
    pub(crate) fn waker(&self) -> ReleaseWaker {
        ReleaseWaker(self.keys.clone())
    }

    /// How many callers of this client are parked waiting for `key` now.
    pub(crate) fn parked(&self, key: &str) -> usize {
        lock(&self.keys).get(key).map_or(0, |waiters| {
            waiters.parked.load(std::sync::atomic::Ordering::Acquire)
        })
    }

    /// Whether callers of this client are waiting for `key`.
    pub(crate) fn anyone_waits(&self, key: &str) -> bool {
        let keys = lock(&self.keys);
        keys.get(key)
            .is_some_and(|waiters| *lock(&waiters.waiters) > 0)
    }

    /// Joins the queue of `key`, subscribing to its releases if this is the first waiter. With
    /// `everyone`, each release wakes every waiter of the key in this client, not just one.
    pub(crate) fn join(&self, key: &str, everyone: bool, prefix: Prefix) -> Ticket<'_> {
        metrics::waiters(&prefix, 1.0);
        let mut keys = lock(&self.keys);
        let waiters = keys
            .entry(key.to_owned())
            .or_insert_with(|| {
                self.waited_keys
                    .fetch_add(1, std::sync::atomic::Ordering::Release);
                Arc::new(KeyWaiters {
                    released: Notify::new(),
                    releases: std::sync::atomic::AtomicU64::new(0),
                    waiters: Mutex::new(0),
                    everyone: std::sync::atomic::AtomicUsize::new(0),
                    hearing: HearingNow::default(),
                    candidates: Mutex::new(VecDeque::new()),
                    parked: std::sync::atomic::AtomicUsize::new(0),
                    reserving: std::sync::atomic::AtomicUsize::new(0),
                    reservations: Mutex::new(Map::default()),
                    offers: std::sync::atomic::AtomicU64::new(1),
                    released_here: Mutex::new(None),
                })
            })
            .clone();
        let first = {
            let mut count = lock(&waiters.waiters);
            *count += 1;
            *count == 1
        };
        drop(keys);
        if everyone {
            waiters
                .everyone
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        if first {
            let _ = self.commands.send(Command::Watch(key.to_owned()));
        }
        Ticket {
            queue: self,
            key: key.to_owned(),
            waiters,
            everyone,
            prefix,
        }
    }

    /// The waiter of this client that offered to be handed `key` and began waiting first among
    /// those that reserved it (the key's reservations go in that order, and a hand-over to
    /// another would pass to it), else the longest parked, taken out of the queue: the caller
    /// must [`tell`](Candidate::tell) it what became of its offer. None while readers or fair
    /// waiters of this client wait for the key: a release is theirs to look at.
    pub(crate) fn next_candidate(&self, key: &str) -> Option<Candidate> {
        if self.waited_keys.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return None;
        }
        let waiters = lock(&self.keys).get(key)?.clone();
        if waiters.everyone.load(std::sync::atomic::Ordering::Acquire) > 0 {
            return None;
        }
        let first_reserving = waiters.first_reserving();
        let mut candidates = lock(&waiters.candidates);
        let reserved = first_reserving
            .and_then(|(token, _)| candidates.iter().position(|next| next.token == token));
        match reserved {
            Some(at) => candidates.remove(at),
            None => candidates.pop_front(),
        }
    }
}

impl Ticket<'_> {
    /// The key it waits for.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Offers to take the lock straight from a release of this client, as `token` (whose last
    /// look's value was of `last_ms`) with `options`, until the offer is withdrawn.
    pub(crate) fn offer(&self, token: &str, last_ms: u64, options: &LockOptions) -> Offer {
        self.offer_in_line(token, last_ms, options, false)
    }

    /// Offers again, ahead of every other offer: a waiter [passed](Handing::Passed) over.
    pub(crate) fn offer_first(&self, token: &str, last_ms: u64, options: &LockOptions) -> Offer {
        self.offer_in_line(token, last_ms, options, true)
    }

    fn offer_in_line(
        &self,
        token: &str,
        last_ms: u64,
        options: &LockOptions,
        first: bool,
    ) -> Offer {
        let id = (self.waiters.offers).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (told, outcome) = oneshot::channel();
        let candidate = Candidate {
            offer: id,
            token: token.to_owned(),
            last_ms,
            options: *options,
            outcome: told,
        };
        let mut candidates = lock(&self.waiters.candidates);
        match first {
            true => candidates.push_front(candidate),
            false => candidates.push_back(candidate),
        }
        drop(candidates);
        Offer {
            waiters: self.waiters.clone(),
            id,
            outcome,
        }
    }

    /// Whether releases of the key reach this client now.
    pub(crate) fn hears(&self) -> bool {
        self.waiters.hearing.get() == Hearing::Heard
    }

    /// Asks for the key's releases again after the subscription was lost (the deployment
    /// answers again): it is reopened now, unless it was tried a moment ago;
    /// [`subscribed`](Self::subscribed) then waits for the outcome.
    pub(crate) fn resubscribe(&self) {
        if self.waiters.hearing.get() == Hearing::Unheard {
            self.waiters.hearing.set(Hearing::Pending);
            let _ = (self.queue.commands).send(Command::Resubscribe(self.key.clone()));
        }
    }

    /// Waits (at most `budget`) until the subscription is confirmed or has failed; `true` when
    /// releases of the key are heard from now on.
    pub(crate) async fn subscribed(&self, budget: Duration) -> bool {
        let settled = self.waiters.hearing.settled();
        matches!(
            tokio::time::timeout(budget, settled).await,
            Ok(Hearing::Heard)
        )
    }

    /// How many releases of the key this client has heard: read before an attempt, handed to
    /// [`released_or`](Self::released_or) after it.
    pub(crate) fn releases_heard(&self) -> u64 {
        self.waiters
            .releases
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// Counts this caller as parked on the key until the returned value drops; `reserving`
    /// when it waited too long (it reserves the key at each look).
    pub(crate) fn park(&self, reserving: bool) -> Parked<'_> {
        self.waiters
            .parked
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        if reserving {
            self.waiters
                .reserving
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
        Parked {
            waiters: &self.waiters,
            reserving,
        }
    }

    /// The reservation of the key for `token` (the caller's look reserved it), which began
    /// waiting at `since_ms`, heard here: the returned value is woken when an announcement says
    /// the key was handed to it, or when a release wakes this client's waiters (a wake-up that
    /// comes before it is awaited is kept), until it drops.
    pub(crate) fn reservation(&self, token: &str, since_ms: u64) -> Reservation {
        let handed = Arc::new(Notify::new());
        lock(&self.waiters.reservations).insert(token.to_owned(), (since_ms, handed.clone()));
        Reservation {
            waiters: self.waiters.clone(),
            token: token.to_owned(),
            handed,
        }
    }

    /// Waits for a release of the key, or until `until`, whichever comes first; at once if one was
    /// heard since `heard` was read ([`releases_heard`](Self::releases_heard)).
    pub(crate) async fn released_or(&self, until: tokio::time::Instant, heard: u64) {
        let notified = self.waiters.released.notified();
        let mut notified = std::pin::pin!(notified);
        // Registered before the count is checked: a release in between is not missed.
        notified.as_mut().enable();
        if self.releases_heard() != heard {
            return;
        }
        let _ = tokio::time::timeout_at(until, notified).await;
    }
}

/// A caller that reserved a key, waiting to be told it was handed the key.
pub(crate) struct Reservation {
    waiters: Arc<KeyWaiters>,
    token: String,
    handed: Arc<Notify>,
}

impl Reservation {
    /// Returns once an announcement said the key was handed to this caller.
    pub(crate) async fn handed(&self) {
        self.handed.notified().await;
    }

    /// Whether it expects the key for `token`.
    pub(crate) fn is_for(&self, token: &str) -> bool {
        self.token == token
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        lock(&self.waiters.reservations).remove(&self.token);
    }
}

/// Wakes a client's waiters after one of its releases, from wherever the release ran.
#[derive(Clone)]
pub(crate) struct ReleaseWaker(Arc<Keys>);

impl ReleaseWaker {
    /// As [`WaitQueue::released_here`].
    pub(crate) fn released_here(&self, key: &str, value: &str) {
        wake_after_release(&self.0, key, value);
    }
}

fn wake_after_release(keys: &Keys, key: &str, value: &str) {
    let Some(waiters) = lock(keys).get(key).cloned() else {
        return;
    };
    *lock(&waiters.released_here) = Some(value.to_owned());
    waiters.wake();
}

/// A caller parked on a key's release; counted until dropped.
pub(crate) struct Parked<'a> {
    waiters: &'a KeyWaiters,
    reserving: bool,
}

impl Drop for Parked<'_> {
    fn drop(&mut self) {
        self.waiters
            .parked
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        if self.reserving {
            self.waiters
                .reserving
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        metrics::waiters(&self.prefix, -1.0);
        if self.everyone {
            self.waiters
                .everyone
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
        let mut keys = lock(&self.queue.keys);
        let mut count = lock(&self.waiters.waiters);
        *count -= 1;
        if *count == 0 {
            drop(count);
            if let Entry::Occupied(entry) = keys.entry(self.key.clone())
                && Arc::ptr_eq(entry.get(), &self.waiters)
            {
                entry.remove();
                self.queue
                    .waited_keys
                    .fetch_sub(1, std::sync::atomic::Ordering::Release);
            }
            let _ = self.queue.commands.send(Command::Unwatch(self.key.clone()));
        }
    }
}

impl KeyWaiters {
    /// An announcement `message` was heard (see `protocol::Announcement`).
    fn heard(&self, message: &str) {
        let heard = Announcement::parse(message);
        if let Some(token) = heard.handed_to {
            // Handed to a caller it was reserved for: not free for anyone else. That caller,
            // if it is one of ours, takes it (and its release passes the key on to our other
            // waiters in turn). Handed to a caller elsewhere: ours that waited too long may have
            // gone unrecorded (the key keeps 16 reservations), and look again to reserve it in
            // turn, those parked at once and those looking right now as soon as their look is
            // answered (the count of releases heard moved).
            if let Some((_, handed)) = lock(&self.reservations).get(token) {
                handed.notify_one();
                return;
            }
            self.releases
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            if self.reserving.load(std::sync::atomic::Ordering::Acquire) > 0 {
                self.released.notify_waiters();
            }
            return;
        }
        let mut here = lock(&self.released_here);
        if !heard.released.is_empty() && here.as_deref() == Some(heard.released) {
            // This client's own release: its waiters were woken then.
            *here = None;
        } else {
            drop(here);
            self.wake();
        }
    }

    /// Every waiter looks, as after releases missed (a permit is kept for a waiter between two
    /// looks).
    fn wake_all(&self) {
        self.releases
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.released.notify_waiters();
        self.released.notify_one();
    }

    /// After a release: one waiter looks (FIFO within the client), or every waiter when some
    /// must all look; a permit is kept for a waiter between two looks. The one is the caller
    /// that began waiting first among those that reserved the key, if any: the key, free, may
    /// stand reserved for it, and a waiter woken in its place would be refused while it slept
    /// out its fallback (the parking order alone is not the arrival order: a caller parks again
    /// after each look).
    fn wake(&self) {
        self.releases
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        if self.everyone.load(std::sync::atomic::Ordering::Acquire) > 0 {
            self.released.notify_waiters();
        }
        match self.first_reserving() {
            Some((_, first)) => first.notify_one(),
            None => self.released.notify_one(),
        }
    }

    /// The caller of this client that began waiting first among those that reserved the key
    /// (ties: the smaller token, as the scripts order reservations), and how to wake it.
    fn first_reserving(&self) -> Option<(String, Arc<Notify>)> {
        lock(&self.reservations)
            .iter()
            .min_by(|(a, (a_since, _)), (b, (b_since, _))| (a_since, a).cmp(&(b_since, b)))
            .map(|(token, (_, woken))| (token.clone(), woken.clone()))
    }
}

/// The subscription task: follows watch/unwatch commands and turns announcements into wake-ups.
struct Listener {
    store: Arc<dyn Store>,
    keys: Arc<Keys>,
    feed: Option<Box<dyn ReleaseFeed>>,
    /// Told of forced releases, and of each time the subscription opens (every lease held
    /// then is checked: what went by unheard before, a restart after a loss among it).
    checker: LeaseChecker,
    backoff: Backoff,
    /// When to try opening the subscription again after it failed.
    reopen_at: Option<Instant>,
    /// When it was last tried.
    tried_at: Option<Instant>,
    /// The deployment refused the subscription (an ACL without channels, say): only the
    /// backoff tries it again.
    refused: bool,
}

impl Listener {
    async fn run(
        mut self,
        commands: Arc<tokio::sync::Mutex<mpsc::UnboundedReceiver<Command>>>,
        stop: CancellationToken,
    ) {
        let mut commands = commands.lock().await;
        if !lock(&self.keys).is_empty() {
            // Started again with waiters already waiting: subscribe them.
            let _ = self.open().await;
        }
        loop {
            let reopen_at = self.reopen_at;
            let feed = self.feed.as_mut();
            let released = async {
                match feed {
                    Some(feed) => feed.next_release().await,
                    None => std::future::pending().await,
                }
            };
            let reopen = async {
                match reopen_at {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            crate::sync::select! {
                () = stop.cancelled() => return,
                command = commands.recv() => match command {
                    Some(command) => self.obey(command).await,
                    None => return,
                },
                released = released => match released {
                    Some(released) => {
                        if released.key == protocol::FORCED_RELEASES {
                            self.checker.check(LeaseCheck::Forced(released.message.clone()));
                        }
                        if let Some(waiters) = lock(&self.keys).get(&released.key) {
                            waiters.heard(&released.message);
                        }
                    }
                    None => self.lost("the release subscription's connection closed"),
                },
                () = reopen => {
                    self.reopen_at = None;
                    let _ = self.open().await;
                }
            }
        }
    }

    async fn obey(&mut self, command: Command) {
        let resubscribing = matches!(command, Command::Resubscribe(_));
        match command {
            Command::Listen => {
                if self.feed.is_none() && self.reopen_at.is_none() {
                    let _ = self.open().await;
                }
            }
            Command::Connect(reply) => {
                let opened = match self.feed {
                    Some(_) => Ok(()),
                    None => self.open().await,
                };
                let _ = reply.send(opened);
            }
            Command::Watch(key) | Command::Resubscribe(key) => {
                let Some(waiters) = lock(&self.keys).get(&key).cloned() else {
                    return;
                };
                if self.feed.is_none() {
                    // Opening subscribes every waited-for key, this one included: now, unless
                    // it was tried a moment ago (then the backoff's next try will), or the
                    // deployment refused it and a waiter merely found it answering again.
                    let tried_lately = self.tried_at.is_some_and(|at| at.elapsed() < REOPEN_BASE);
                    if tried_lately || (resubscribing && self.refused) {
                        waiters.hearing.set(Hearing::Unheard);
                    } else {
                        self.reopen_at = None;
                        let _ = self.open().await;
                    }
                    return;
                }
                if waiters.hearing.get() == Hearing::Heard {
                    return;
                }
                let Some(feed) = self.feed.as_mut() else {
                    return;
                };
                match metrics::timed("subscribe", feed.watch(&key)).await {
                    Ok(()) => {
                        waiters.hearing.set(Hearing::Heard);
                    }
                    Err(error) => {
                        tracing::debug!(key = %key, error = %error, "cannot subscribe to releases; waiters go by the holder's remaining lease");
                        self.lost("subscribing failed");
                    }
                }
            }
            Command::Unwatch(key) => {
                if lock(&self.keys).contains_key(&key) {
                    // Waiters came back to the key since the last one left (their `Watch` is
                    // behind this command, or was answered already: an earlier `Watch`, or an
                    // `open`, subscribed it and marked them heard): unsubscribing now would
                    // leave them deaf, their `Watch` finding them heard.
                    return;
                }
                if let Some(feed) = self.feed.as_mut()
                    && let Err(error) = feed.unwatch(&key).await
                {
                    tracing::debug!(key = %key, error = %error, "unsubscribing failed");
                    self.lost("unsubscribing failed");
                }
            }
        }
    }

    /// Opens the subscription and subscribes every key that has waiters.
    async fn open(&mut self) -> Result<(), StoreError> {
        self.tried_at = Some(Instant::now());
        let watched: Vec<(String, Arc<KeyWaiters>)> = lock(&self.keys)
            .iter()
            .map(|(key, waiters)| (key.clone(), waiters.clone()))
            .collect();
        let opened = async {
            let mut feed = self.store.release_feed().await?;
            if let Err(error) = feed.watch(protocol::FORCED_RELEASES).await {
                // An ACL user without channels still locks: its holders learn of a forced
                // release at their next renewal, as before.
                tracing::debug!(error = %error, "cannot subscribe to forced releases; a holder learns of one at its next renewal");
            }
            for (key, waiters) in &watched {
                feed.watch(key).await?;
                waiters.hearing.set(Hearing::Heard);
            }
            Ok::<_, StoreError>(feed)
        };
        match opened.await {
            Ok(feed) => {
                self.feed = Some(feed);
                self.refused = false;
                self.backoff.reset();
                // Unheard until now: a forced release, or a restart, a failover or a flush
                // after a loss, may have taken keys of leases already held.
                self.checker.check(LeaseCheck::Unheard);
                // Releases may have gone by unheard while there was no subscription, any
                // number of them: every waiter looks again now rather than sleep out the
                // holder's remaining lease.
                for (_, waiters) in &watched {
                    waiters.wake_all();
                }
                Ok(())
            }
            Err(error) => {
                tracing::debug!(error = %error, "cannot open the release subscription");
                self.refused = !error.heals();
                self.lost("opening the release subscription failed");
                Err(error)
            }
        }
    }

    /// The subscription is gone or unusable: every waiter goes by timing until it is back, and
    /// one waiter per key looks at once, in case a release was missed.
    fn lost(&mut self, why: &str) {
        if self.feed.take().is_some() {
            tracing::debug!(why, "release subscription lost; reopening");
        }
        for waiters in lock(&self.keys).values() {
            waiters.hearing.set(Hearing::Unheard);
            waiters.wake();
        }
        self.reopen_at = Some(Instant::now() + self.backoff.next_delay());
    }
}
