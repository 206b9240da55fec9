//! Inspecting and managing locks: the questions operators ask (Redisson's `isLocked`,
//! `remainTimeToLive`, `forceUnlock`), on every deployment and in memory.
//!
//! [`LockClient::inspect`], [`LockClient::list`], [`LockClient::force_release`] and
//! [`LockClient::watch`] read what the library itself writes ([`protocol`](crate::protocol)):
//! a string key is a lock only when its value is one of our tokens, a hash only when it carries
//! our `kind` field, and the library's internal keys are never shown. On Redlock every figure is
//! the quorum's view. The `lockmacro` command-line tool is a thin layer over these.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::FutureExt;
use futures_util::stream::{self, Stream};

use crate::client::LockClient;
use crate::error::LockError;
use crate::key::check_key;
use crate::options::LockKind;
use crate::store::protocol::{Announcement, LockValue, hint};
use crate::store::{Cursor, ReleaseFeed, Snapshot, Store, StoreError};

/// How often [`LockClient::watch`] looks at its key between announcements: it notices an
/// expiry (which nothing announces) and a holder taking a free key within this long.
pub const WATCH_POLL: Duration = Duration::from_millis(200);

/// What holds a lock now, from [`LockClient::inspect`] or [`LockClient::list`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    key: String,
    kind: LockKind,
    holders: Vec<Holder>,
    fencing_token: Option<u64>,
    waiters: usize,
    reserved_for: Option<Waiter>,
}

impl LockInfo {
    /// The lock's Redis key, `"{prefix}:{key}"`.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Exclusive, readers, or permits.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// Who holds it: one holder for an exclusive lock, one per reader or permit holder.
    pub fn holders(&self) -> &[Holder] {
        &self.holders
    }

    /// How long until the lock is free unless renewed: the longest of its holders' leases.
    pub fn time_left(&self) -> Duration {
        self.holders
            .iter()
            .map(Holder::time_left)
            .max()
            .unwrap_or_default()
    }

    /// The key's fencing counter (the last fencing token handed out), if fencing was used on it
    /// within the counter's life (`protocol::FENCING_COUNTER_LIFE`). Always `None` on Redlock,
    /// which refuses fencing.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// Callers waiting for it: each caller counts once (eight callers of one client are eight),
    /// from its first look at the busy key while waiting until it takes the lock or gives up; a
    /// [`LockClient::watch`] is no caller. A caller parked behind others of its own client is
    /// counted from its first look (within 100 ms, unless it was handed the lock before); one
    /// whose process died counts until its entry lapses (its ttl, or the holder's remaining
    /// lease it would have slept out, at most). On Redlock, the most that a majority of the
    /// masters report.
    pub fn waiters(&self) -> usize {
        self.waiters
    }

    /// The caller the lock is reserved for, when one is: a caller waiting for an exclusive,
    /// unfair lock that has waited longer than
    /// [`protocol::RESERVE_AFTER`](crate::protocol::RESERVE_AFTER) reserves it, and the next
    /// release hands it the key. The one waiter whose origin the stored protocol keeps; the
    /// others are only counted ([`waiters`](Self::waiters)). On Redlock, the caller a majority
    /// of the masters reserve it for.
    pub fn reserved_for(&self) -> Option<&Waiter> {
        self.reserved_for.as_ref()
    }

    fn from_snapshot(snapshot: Snapshot) -> Self {
        let mut holders: Vec<Holder> = snapshot
            .holders
            .into_iter()
            .map(|(value, time_left)| Holder::of_value(&value, time_left))
            .collect();
        holders.sort_by_key(|holder| std::cmp::Reverse(holder.time_left));
        Self {
            key: snapshot.key,
            kind: snapshot.kind,
            holders,
            fencing_token: snapshot.fencing,
            waiters: snapshot.waiters,
            reserved_for: snapshot
                .reserved_for
                .map(|(value, since_ms)| Waiter::of_value(&value, since_ms)),
        }
    }
}

/// A caller waiting for a lock, as far as the lock's stored value says who it is: see
/// [`LockInfo::reserved_for`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiter {
    who: Holder,
    waiting_since: SystemTime,
}

impl Waiter {
    fn of_value(value: &str, since_ms: u64) -> Self {
        Self {
            who: Holder::of_value(value, Duration::ZERO),
            waiting_since: SystemTime::UNIX_EPOCH + Duration::from_millis(since_ms),
        }
    }

    /// At most the first 4 characters of its token: its lease's token once it holds the lock.
    pub fn token_hint(&self) -> &str {
        self.who.token_hint()
    }

    /// The host it runs on.
    pub fn host(&self) -> Option<&str> {
        self.who.host()
    }

    /// Its process id.
    pub fn pid(&self) -> Option<u32> {
        self.who.pid()
    }

    /// Its application name.
    pub fn app(&self) -> Option<&str> {
        self.who.app()
    }

    /// When it began waiting, by its own clock.
    pub fn waiting_since(&self) -> SystemTime {
        self.waiting_since
    }
}

/// One holder of a lock: which lease (a hint of its token), how long it has left, and who took
/// it when (read from the lock's value; `None` for a lock taken by a version before 0.1's
/// holder identity, whose value is the bare token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    token_hint: String,
    time_left: Duration,
    host: Option<String>,
    pid: Option<u32>,
    app: Option<String>,
    acquired_at: Option<SystemTime>,
}

impl Holder {
    /// The holder whose lock value is `value`, with `time_left`.
    fn of_value(value: &str, time_left: Duration) -> Self {
        let parsed = LockValue::parse(value);
        let token = parsed.map_or(value, |parsed| parsed.token);
        Self {
            token_hint: token_hint(token),
            time_left,
            host: parsed.and_then(|parsed| parsed.host).map(str::to_owned),
            pid: parsed.and_then(|parsed| parsed.pid),
            app: parsed.and_then(|parsed| parsed.app).map(str::to_owned),
            acquired_at: parsed
                .and_then(|parsed| parsed.acquired_ms)
                .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms)),
        }
    }

    /// The host the holder runs on (its name as the holder's process saw it, kept to
    /// `[A-Za-z0-9._-]`).
    pub fn host(&self) -> Option<&str> {
        self.host.as_deref()
    }

    /// The holder's process id.
    pub fn pid(&self) -> Option<u32> {
        self.pid
    }

    /// The holder's application name: [`LockClientBuilder::app_name`](crate::LockClientBuilder::app_name),
    /// else its executable's name.
    pub fn app(&self) -> Option<&str> {
        self.app.as_deref()
    }

    /// When the holder took the lock, by its own clock (a lock handed over from holder to
    /// holder: when this holder got it).
    pub fn acquired_at(&self) -> Option<SystemTime> {
        self.acquired_at
    }

    /// At most the first 4 characters of the holder's token: enough to tell holders apart in a
    /// log ([`LockContext::token`](crate::LockContext::token) of the holder starts with it),
    /// never enough to release the lock as its holder.
    pub fn token_hint(&self) -> &str {
        &self.token_hint
    }

    /// How long until this holder's lease runs out unless renewed.
    pub fn time_left(&self) -> Duration {
        self.time_left
    }
}

/// What [`LockClient::watch`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEvent {
    /// A holder took the key (for a shared lock, each new reader or permit holder).
    Acquired {
        /// At most the first 4 characters of the new holder's token.
        token_hint: String,
        /// Who took it, and when (its time left as the watch saw it: zero for a hold that
        /// began and ended between two of the watch's looks, known only from its release).
        holder: Holder,
    },
    /// The key became free: released, expired, or forced.
    Released,
}

fn token_hint(token: &str) -> String {
    hint(token).to_owned()
}

/// The event of a holder of `value` taking the key, with `time_left`.
fn acquired(value: &str, time_left: Duration) -> LockEvent {
    let holder = Holder::of_value(value, time_left);
    LockEvent::Acquired {
        token_hint: holder.token_hint.clone(),
        holder,
    }
}

/// What [`LockClient::list`] and [`LockClient::watch`] return: a stream of results, read with
/// [`next`](Self::next) (or [`try_next`](Self::try_next)) and no other crate. It is a
/// `futures::Stream` too, for `StreamExt`'s adapters, `tokio_stream`, or axum's SSE.
///
/// ```no_run
/// # async fn demo(locks: lockmacro_runtime::LockClient) -> Result<(), lockmacro_runtime::LockError> {
/// let mut listed = locks.list("Business1");
/// while let Some(lock) = listed.try_next().await? {
///     println!("{} {:?}", lock.key(), lock.time_left());
/// }
/// # Ok(()) }
/// ```
#[must_use = "a stream does nothing unless it is read"]
pub struct LockStream<T> {
    inner: Pin<Box<dyn Stream<Item = Result<T, LockError>> + Send + 'static>>,
}

impl<T> LockStream<T> {
    fn new(stream: impl Stream<Item = Result<T, LockError>> + Send + 'static) -> Self {
        Self {
            inner: Box::pin(stream),
        }
    }

    /// The next item; `None` once the stream has ended.
    ///
    /// # Cancellation safety
    /// Cancel-safe: an item is taken from the stream only when the returned future completes.
    pub async fn next(&mut self) -> Option<Result<T, LockError>> {
        std::future::poll_fn(|cx| self.inner.as_mut().poll_next(cx)).await
    }

    /// The next item with the error first: `Ok(None)` once the stream has ended, for `?`.
    ///
    /// # Errors
    /// The stream's next item, when it is an error.
    pub async fn try_next(&mut self) -> Result<Option<T>, LockError> {
        self.next().await.transpose()
    }

    /// Every item until the stream ends, for a listing known to be small (a
    /// [`watch`](LockClient::watch) never ends); `list` a million locks with
    /// [`try_next`](Self::try_next), one page in memory at a time.
    ///
    /// # Errors
    /// The first item that is an error.
    pub async fn try_collect(mut self) -> Result<Vec<T>, LockError> {
        let mut items = Vec::new();
        while let Some(item) = self.try_next().await? {
            items.push(item);
        }
        Ok(items)
    }
}

impl<T> Stream for LockStream<T> {
    type Item = Result<T, LockError>;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.inner.as_mut().poll_next(cx)
    }
}

impl<T> std::fmt::Debug for LockStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockStream").finish_non_exhaustive()
    }
}

impl LockClient {
    fn inspection(&self) -> Arc<dyn Store> {
        self.engine.store().clone()
    }

    /// What holds `key` now; `None` when nobody holds it (or it holds anything but a lock of
    /// this library). On Redlock, the quorum's view: held when a majority of the masters name
    /// the same holder, for as long as a majority still will.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockmacro_runtime::LockError> {
    /// use lockmacro_runtime::LockClient;
    ///
    /// let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
    /// match locks.inspect("Business1:1024").await? {
    ///     Some(lock) => println!(
    ///         "held by {} for {:?} more; {} waiting",
    ///         lock.holders()[0].token_hint(),
    ///         lock.time_left(),
    ///         lock.waiters()
    ///     ),
    ///     None => println!("free"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for an empty or oversized key; [`LockError::Redis`] when the
    /// deployment does not answer; [`LockError::NoQuorum`] on Redlock without a majority.
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let key = check_key(key.to_owned())?;
        let found = self
            .inspection()
            .inspect(&key)
            .await
            .map_err(|error| error.into_lock_error(Some(&key)))?;
        Ok(found.map(LockInfo::from_snapshot))
    }

    /// Every lock whose key starts with `prefix:` (`""`: every lock), never one of the
    /// library's internal keys. Scans incrementally (`SCAN … COUNT 1000`, on every master of a
    /// Cluster, on each Redlock master with each lock listed once, as the quorum sees it): one
    /// page of keys is in memory at a time, so a million keys never are. Each page's keys are
    /// sorted out with pipelined plain reads (`GETRANGE`, and `HGET` of a hash's `kind`), so a
    /// key that is no lock costs Redis no script; each lock costs one look. Locks are in no
    /// particular order; one taken or released during the scan may or may not be listed.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockmacro_runtime::LockError> {
    /// use lockmacro_runtime::LockClient;
    ///
    /// let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
    /// let mut listed = locks.list("Business1");
    /// while let Some(lock) = listed.try_next().await? {
    ///     println!("{} {:?}", lock.key(), lock.time_left());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// An item is [`LockError::Redis`] (or [`LockError::NoQuorum`]) when a master does not
    /// answer; the stream ends after it.
    pub fn list(&self, prefix: &str) -> LockStream<LockInfo> {
        struct Listing {
            store: Arc<dyn Store>,
            prefix: String,
            next: Option<Cursor>,
            page: VecDeque<Snapshot>,
        }
        let listing = Listing {
            store: self.inspection(),
            prefix: prefix.to_owned(),
            next: Some(Cursor::default()),
            page: VecDeque::new(),
        };
        LockStream::new(stream::unfold(listing, |mut listing| async move {
            loop {
                if let Some(found) = listing.page.pop_front() {
                    return Some((Ok(LockInfo::from_snapshot(found)), listing));
                }
                let cursor = listing.next.take()?;
                match listing.store.scan(&listing.prefix, cursor).await {
                    Ok(page) => {
                        listing.page = page.locks.into();
                        listing.next = page.next;
                    }
                    // `next` stays `None`: the stream ends after the error.
                    Err(error) => return Some((Err(error.into_lock_error(None)), listing)),
                }
            }
        }))
    }

    /// Removes every holder of `key` now, whoever holds it, and announces the release so that
    /// waiters take it at once: `true` when it was held. The holders' work gets
    /// [`LockError::Lost`] at its next renewal (it runs until then). A fair lock's queue and a
    /// waiting writer's claim stay, so the next in line still gets its turn. On Redlock it is
    /// removed from every master that answers.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockmacro_runtime::LockError> {
    /// use lockmacro_runtime::LockClient;
    ///
    /// let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
    /// if !locks.force_release("Business1:1024").await? {
    ///     println!("nobody held it");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`inspect`](Self::inspect).
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let key = check_key(key.to_owned())?;
        self.inspection()
            .force_release(&key)
            .await
            .map_err(|error| error.into_lock_error(Some(&key)))
    }

    /// Follows `key`: [`LockEvent::Acquired`] when a holder takes it, [`LockEvent::Released`]
    /// when it becomes free (released, expired or forced); a waiter arriving or leaving is no
    /// event. Driven by the key's release announcements (a watch marks the key as watched at
    /// each look, and every release of a watched key is announced), with a look every [`WATCH_POLL`]
    /// for expiries and new holders of a free key. A holder replaced between two looks is
    /// reported as `Released` then `Acquired`, and an announced release of a holder never seen
    /// as `Acquired` then `Released`: no hold that ends in a release is missed, however short.
    /// Only a hold that nobody releases (its process died) and that expires less than
    /// [`WATCH_POLL`] after it began can fall between two looks unseen.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockmacro_runtime::LockError> {
    /// use lockmacro_runtime::{LockClient, LockEvent};
    ///
    /// let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
    /// let mut events = locks.watch("Business1:1024");
    /// while let Some(event) = events.try_next().await? {
    ///     match event {
    ///         LockEvent::Acquired { token_hint, holder } => println!(
    ///             "acquired by {token_hint}… ({} on {})",
    ///             holder.app().unwrap_or("?"),
    ///             holder.host().unwrap_or("?")
    ///         ),
    ///         LockEvent::Released => println!("released"),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// An item is [`LockError::InvalidKey`] (then the stream ends) or [`LockError::Redis`] /
    /// [`LockError::NoQuorum`] when the deployment does not answer; after such an error the
    /// stream goes on, looking again after a pause.
    pub fn watch(&self, key: &str) -> LockStream<LockEvent> {
        let key = match check_key(key.to_owned()) {
            Ok(key) => key,
            Err(error) => return LockStream::new(stream::iter([Err(error)])),
        };
        let watcher = Watcher {
            store: self.inspection(),
            key,
            feed: None,
            held: Vec::new(),
            reported: VecDeque::new(),
            events: VecDeque::new(),
            look_now: true,
            failed: false,
        };
        LockStream::new(stream::unfold(watcher, |mut watcher| async move {
            let next = watcher.next().await;
            Some((next, watcher))
        }))
    }
}

/// The state of one [`LockClient::watch`].
struct Watcher {
    store: Arc<dyn Store>,
    key: String,
    feed: Option<Box<dyn ReleaseFeed>>,
    /// The tokens of the holders last seen (a holder's value may change under it: a waiter
    /// handed the key rewrites it when it looks).
    held: Vec<String>,
    /// Tokens whose release was reported already (an announcement may come after a look).
    reported: VecDeque<String>,
    events: VecDeque<LockEvent>,
    look_now: bool,
    /// The last call failed: pause before trying again.
    failed: bool,
}

/// How many released tokens a watch remembers.
const REPORTED_MEMORY: usize = 64;

impl Watcher {
    async fn next(&mut self) -> Result<LockEvent, LockError> {
        loop {
            if let Some(event) = self.events.pop_front() {
                return Ok(event);
            }
            if self.failed {
                self.failed = false;
                tokio::time::sleep(WATCH_POLL).await;
            }
            if let Err(error) = self.step().await {
                self.failed = true;
                self.look_now = true;
                return Err(error.into_lock_error(Some(&self.key)));
            }
        }
    }

    /// Waits for an announcement or the next poll, then looks.
    async fn step(&mut self) -> Result<(), StoreError> {
        if self.feed.is_none() {
            let mut feed = self.store.release_feed().await?;
            feed.watch(&self.key).await?;
            self.feed = Some(feed);
            // A release may have gone by unheard while there was no subscription.
            self.look_now = true;
        }
        if !self.look_now
            && let Some(feed) = self.feed.as_mut()
        {
            crate::sync::select! {
                heard = feed.next_release() => match heard {
                    Some(released) if released.key == self.key => self.heard(&released.message),
                    Some(_) => return Ok(()),
                    None => {
                        self.feed = None;
                        return Ok(());
                    }
                },
                () = tokio::time::sleep(WATCH_POLL) => {}
            }
        }
        self.look_now = false;
        // Marked before the look, and after the subscription: every release from the look on
        // is announced, and heard.
        self.store.mark_watched(&self.key).await?;
        let found = self.store.inspect(&self.key).await?;
        let news = found.as_ref().is_some_and(|snapshot| {
            snapshot
                .holders
                .iter()
                .map(|(value, _)| crate::protocol::holder_token(value))
                .any(|token| !self.is_held(token) && !self.is_reported(token))
        });
        if news && let Some(feed) = self.feed.as_mut() {
            // A holder the watch has not seen: the announcements of the holds that ended before
            // it may still be on their way. Hear them first, so the events keep their order.
            feed.settle(&self.key).await?;
            let mut heard = Vec::new();
            let gone = loop {
                match feed.next_release().now_or_never() {
                    Some(Some(released)) => heard.push(released),
                    Some(None) => break true,
                    None => break false,
                }
            };
            if gone {
                self.feed = None;
            }
            for released in heard {
                if released.key == self.key {
                    self.heard(&released.message);
                }
            }
        }
        self.saw(found);
        Ok(())
    }

    /// An announcement `message` was heard: a holder's release (its value), a hold that kept
    /// the key or an undone attempt ("look again", empty), or a release that handed the key to
    /// a waiter (whose hold the next look sees).
    fn heard(&mut self, message: &str) {
        self.look_now = true;
        let released = Announcement::parse(message).released;
        let token = crate::protocol::holder_token(released);
        if token.is_empty() || self.is_reported(token) {
            return;
        }
        if let Some(at) = self.held.iter().position(|held| held == token) {
            self.held.remove(at);
            if self.held.is_empty() {
                self.events.push_back(LockEvent::Released);
            }
        } else if self.held.is_empty() {
            // A hold that began and ended between two looks.
            self.events.push_back(acquired(released, Duration::ZERO));
            self.events.push_back(LockEvent::Released);
        } else {
            // A shared holder never seen, leaving while others hold: the key stays held.
            return;
        }
        self.remember(token.to_owned());
    }

    /// A look found `found`.
    fn saw(&mut self, found: Option<Snapshot>) {
        let now: Vec<(String, Duration)> = found
            .map(|snapshot| snapshot.holders)
            .unwrap_or_default()
            .into_iter()
            .filter(|(value, _)| !self.is_reported(crate::protocol::holder_token(value)))
            .collect();
        let tokens: Vec<String> = now
            .iter()
            .map(|(value, _)| crate::protocol::holder_token(value).to_owned())
            .collect();
        if !self.held.is_empty() && !self.held.iter().any(|held| tokens.contains(held)) {
            self.events.push_back(LockEvent::Released);
            for token in std::mem::take(&mut self.held) {
                self.remember(token);
            }
        }
        for ((value, left), token) in now.iter().zip(&tokens) {
            if !self.is_held(token) {
                self.events.push_back(acquired(value, *left));
            }
        }
        self.held = tokens;
    }

    fn is_held(&self, token: &str) -> bool {
        self.held.iter().any(|held| held == token)
    }

    fn is_reported(&self, token: &str) -> bool {
        self.reported.iter().any(|reported| reported == token)
    }

    fn remember(&mut self, token: String) {
        if self.reported.len() == REPORTED_MEMORY {
            self.reported.pop_front();
        }
        self.reported.push_back(token);
    }
}
