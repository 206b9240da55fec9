//! The in-memory store against a real Redis: generated sequences of calls run one after another
//! on both, and every outcome is compared — taken or busy, `Busy`'s `retry_after`, errors and
//! their fields, fencing tokens (present, strictly increasing per key, never below the clock),
//! reentrancy across kinds, renewals, keys kept by `hold_at_least`, locks over several keys.
//!
//! The in-memory store is what users test against; any difference here is a test of theirs that
//! passes while production behaves otherwise.
//!
//! The hand-over (a release passing the key straight to a waiter, see `hand_over.lua`) is held to
//! the same standard by cases written out step by step, compared on their path as well as their
//! outcomes: the key's value after each step (its holder, the waiter's mark, a reservation) and
//! every announcement of its releases, tokens named by the callers that held them.

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::Log;
use futures_util::StreamExt;
use lockmacro_runtime::protocol::{self, Announcement, Stored};
use lockmacro_runtime::{Lease, LockClient, LockContext, LockError, LockEvent, LockOptions};
use proptest::prelude::*;
use testkit::{Deployment, InMemory, SingleRedis};
use tokio::sync::{mpsc, oneshot};

const TTL: Duration = Duration::from_secs(60);
/// `hold_at_least`, when on: longer than any case, so a kept key stays kept to its end on both
/// stores (Redis's clock runs on between steps, the paused one does not: a hold ending within a
/// case would end at a different step on each). The short one ends before a lease taken in the
/// case would: a key kept by it may be free before its expiry said when it was taken.
const SHORT_HOLD: Duration = Duration::from_secs(20);
const LONG_HOLD: Duration = Duration::from_secs(90);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Exclusive,
    Read,
    Permits(u32),
}

#[derive(Debug, Clone, Copy)]
struct Options {
    kind: Kind,
    fencing: bool,
    fair: bool,
    /// A short wait: a busy key is still busy when it runs out.
    waits: bool,
    /// `hold_at_least`, if any: [`SHORT_HOLD`] or [`LONG_HOLD`].
    hold: Option<Duration>,
}

impl Options {
    fn build(self) -> LockOptions {
        let options = LockOptions::new()
            .label("combinations")
            .ttl(TTL)
            .fencing(self.fencing)
            .fair(self.fair);
        let options = match self.kind {
            Kind::Exclusive => options,
            Kind::Read => options.read(),
            Kind::Permits(permits) => options.permits(permits),
        };
        let options = match self.hold {
            Some(hold) => options.hold_at_least(hold),
            None => options,
        };
        if self.waits {
            options.wait(Duration::from_millis(30))
        } else {
            options
        }
    }
}

/// One step of a sequence.
#[derive(Debug, Clone)]
enum Step {
    /// Client `client` takes `key`; the lease goes to the next free slot.
    Acquire {
        client: usize,
        key: usize,
        options: Options,
    },
    /// Releases the lease in slot `slot` (modulo the slots held), if any.
    Release { slot: usize },
    /// Client `client` runs a call on `key` with `inner` nested in one with `outer`.
    Nested {
        client: usize,
        key: usize,
        outer: Options,
        inner: Options,
    },
    /// Client `client` holds `key` until its renewals of a short lease run out.
    Renewed { client: usize, key: usize },
    /// Client `client` takes every key of `keys` at once (repeats and all); the lease goes to
    /// the next free slot.
    AcquireMany {
        client: usize,
        keys: Vec<usize>,
        options: Options,
    },
}

fn options() -> impl Strategy<Value = Options> {
    let kind = prop_oneof![
        3 => Just(Kind::Exclusive),
        2 => Just(Kind::Read),
        1 => (0u32..=2).prop_map(Kind::Permits),
    ];
    (
        kind,
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.3),
        prop_oneof![
            8 => Just(None),
            1 => Just(Some(SHORT_HOLD)),
            1 => Just(Some(LONG_HOLD)),
        ],
    )
        .prop_map(|(kind, fencing, fair, waits, hold)| Options {
            kind,
            fencing,
            fair,
            waits,
            hold,
        })
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        6 => (0usize..2, 0usize..2, options())
            .prop_map(|(client, key, options)| Step::Acquire { client, key, options }),
        3 => (0usize..8).prop_map(|slot| Step::Release { slot }),
        2 => (0usize..2, 0usize..2, options(), options())
            .prop_map(|(client, key, outer, inner)| Step::Nested { client, key, outer, inner }),
        1 => (0usize..2, 0usize..2).prop_map(|(client, key)| Step::Renewed { client, key }),
        2 => (0usize..2, prop::collection::vec(0usize..2, 1..4), options())
            .prop_map(|(client, keys, options)| Step::AcquireMany { client, keys, options }),
    ];
    prop::collection::vec(step, 1..12)
}

/// An outcome, as both stores must give it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Seen {
    Taken {
        fencing: Fencing,
    },
    Busy {
        retry_after: RetryAfter,
        key: String,
    },
    Error(String),
    Released,
    Nothing,
    Nested(Box<Seen>, Box<Seen>),
    Renewals(u32),
}

/// A fencing token, judged against the key's last one and the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fencing {
    None,
    /// Above the key's last token and not below the clock (microseconds) at the call.
    Increasing,
    /// Otherwise: the token and what it should have been above.
    Wrong {
        token: u64,
        above: u64,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RetryAfter {
    None,
    /// Some, within a short hold: the key is kept by one, and free when it ends.
    WithinShortHold,
    /// Some, within the holder's lease.
    WithinLease,
    /// Some, past any lease of the case (a long hold).
    Past,
}

fn micros_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// Runs `steps` on two clients of `deployment` under `prefix`; what each step saw.
async fn run(deployment: &impl Deployment, prefix: &str, steps: &[Step]) -> Vec<Seen> {
    let clients = [deployment.client().await, deployment.another_client().await];
    let key = |key: usize| format!("{prefix}:{key}");
    let mut held: Vec<Lease> = Vec::new();
    let mut last_fence: HashMap<String, u64> = HashMap::new();
    let mut seen = Vec::new();
    for step in steps {
        let outcome = match step {
            Step::Acquire {
                client,
                key: k,
                options,
            } => {
                let key = key(*k);
                let floor = micros_now();
                let acquired = clients[*client].acquire(key.clone(), options.build()).await;
                if acquired.is_err() && options.waits {
                    waiter_left(&clients[*client], std::slice::from_ref(&key)).await;
                }
                match acquired {
                    Ok(lease) => {
                        let fencing = judge(&mut last_fence, &key, lease.fencing_token(), floor);
                        held.push(lease);
                        Seen::Taken { fencing }
                    }
                    Err(error) => describe(error),
                }
            }
            Step::Release { slot } => {
                if held.is_empty() {
                    Seen::Nothing
                } else {
                    let lease = held.remove(slot % held.len());
                    match lease.release().await {
                        Ok(()) => Seen::Released,
                        Err(error) => describe(error),
                    }
                }
            }
            Step::Nested {
                client,
                key: k,
                outer,
                inner,
            } => {
                let locks = &clients[*client];
                let key = key(*k);
                let floor = micros_now();
                let outcome = locks
                    .run_locked(key.clone(), outer.build(), async {
                        let fence = LockContext::current().and_then(|c| c.fencing_token());
                        let nested = locks.run_locked(key.clone(), inner.build(), async {}).await;
                        (fence, nested)
                    })
                    .await;
                if outcome.is_err() && outer.waits {
                    waiter_left(locks, std::slice::from_ref(&key)).await;
                }
                match outcome {
                    Ok((fence, nested)) => {
                        let fencing = judge(&mut last_fence, &key, fence, floor);
                        let nested = match nested {
                            Ok(()) => Seen::Nothing,
                            Err(error) => describe(error),
                        };
                        Seen::Nested(Box::new(Seen::Taken { fencing }), Box::new(nested))
                    }
                    Err(error) => describe(error),
                }
            }
            Step::AcquireMany {
                client,
                keys,
                options,
            } => {
                let keys: Vec<String> = keys.iter().map(|k| key(*k)).collect();
                let acquired = clients[*client]
                    .acquire_many(keys.clone(), options.build())
                    .await;
                if acquired.is_err() && options.waits {
                    waiter_left(&clients[*client], &keys).await;
                }
                match acquired {
                    Ok(lease) => {
                        let fencing = judge(&mut last_fence, &keys[0], lease.fencing_token(), 0);
                        held.push(lease);
                        Seen::Taken { fencing }
                    }
                    Err(error) => describe(error),
                }
            }
            Step::Renewed { client, key: k } => {
                // One renewal of a 200 ms lease, then the last lease runs out.
                let options = LockOptions::new()
                    .ttl(Duration::from_millis(200))
                    .max_renewals(1);
                let outcome = clients[*client]
                    .run_locked(key(*k), options, std::future::pending::<()>())
                    .await;
                match outcome {
                    Err(LockError::RenewalsExhausted { renewals, .. }) => Seen::Renewals(renewals),
                    Ok(()) => unreachable!("pending work never ends"),
                    Err(error) => describe(error),
                }
            }
        };
        seen.push(outcome);
    }
    for lease in held {
        lease.release().await.unwrap();
    }
    seen
}

fn judge(last: &mut HashMap<String, u64>, key: &str, token: Option<u64>, floor: u64) -> Fencing {
    let Some(token) = token else {
        return Fencing::None;
    };
    let above = last.get(key).copied().unwrap_or(0);
    last.insert(key.to_owned(), token);
    // The clocks of this process and of the server may differ by a little: a second.
    if token > above && token + 1_000_000 >= floor {
        Fencing::Increasing
    } else {
        Fencing::Wrong { token, above }
    }
}

/// Waits until a caller that gave up waiting has left `keys` (it does so in the background: its
/// count and any reservation it made go). A release in the next step would otherwise hand the
/// key to it on one store and not on the other, depending on which ran first.
async fn waiter_left(client: &LockClient, keys: &[String]) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    for key in keys {
        while let Some(info) = client.inspect(key).await.unwrap() {
            if info.waiters() == 0 {
                break;
            }
            assert!(
                tokio::time::Instant::now() < give_up,
                "a waiter that gave up never left {key}"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}

fn describe(error: LockError) -> Seen {
    match error {
        LockError::Busy { key, retry_after } => Seen::Busy {
            key: key
                .rsplit_once(':')
                .map_or(key.clone(), |(_, k)| k.to_owned()),
            retry_after: match retry_after {
                None => RetryAfter::None,
                Some(after) if after <= SHORT_HOLD => RetryAfter::WithinShortHold,
                Some(after) if after <= TTL => RetryAfter::WithinLease,
                Some(_) => RetryAfter::Past,
            },
        },
        other => Seen::Error(format!("{other:?}").replace(char::is_numeric, "")),
    }
}

#[test]
fn the_in_memory_store_answers_as_redis_does() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let redis = SingleRedis::start();
    let ran = common::run_generated("differential", 48, 128, &steps(), |case, steps| {
        let prefix = format!("diff{case}");
        let in_redis = runtime.block_on(run(&redis, &prefix, &steps));
        // The in-memory store follows tokio's clock: under paused time its leases pass at once.
        let paused = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let in_memory = paused.block_on(run(&InMemory::start(), &prefix, &steps));
        prop_assert_eq!(in_redis, in_memory, "steps: {:?}", steps);
        Ok(())
    });
    eprintln!("{ran} generated sequences compared");
}

// The hand-over, case by case.

/// What a deployment shows of a key beyond the library's answers: what the hand-over cases
/// compare.
trait Paths: Deployment {
    /// The exclusive lock's value under `key` as stored (`protocol::Stored`), `None` when free.
    async fn stored(&self, key: &str) -> Option<String>;

    /// Hears the announcements of `key`'s releases from now on.
    async fn hear(&self, key: &str) -> Heard;
}

impl Paths for SingleRedis {
    async fn stored(&self, key: &str) -> Option<String> {
        let mut connection = self.server.connection().await;
        let value: Option<String> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut connection)
            .await
            .expect("GET");
        // A free key a watch follows holds the watch's mark alone.
        value.filter(|value| value != "+")
    }

    async fn hear(&self, key: &str) -> Heard {
        let channel = protocol::Names::default().release_channel(key);
        let client = redis::Client::open(self.server.url()).expect("a valid URL");
        let mut subscription = client.get_async_pubsub().await.expect("a subscription");
        // Another channel on the same connection, which delivers in the order published, and
        // one no waiter hears (a message on the key's own would wake them).
        let looks_channel = format!("looks at {key}");
        for channel in [&channel, &looks_channel] {
            subscription.subscribe(channel).await.expect("SUBSCRIBE");
        }
        Heard::Redis {
            messages: subscription.into_on_message(),
            publisher: self.server.connection().await,
            looks_channel,
            looks: 0,
        }
    }
}

impl Paths for InMemory {
    async fn stored(&self, key: &str) -> Option<String> {
        self.locks.memory_hooks().expect("in memory").stored(key)
    }

    async fn hear(&self, key: &str) -> Heard {
        Heard::Memory(
            self.locks
                .memory_hooks()
                .expect("in memory")
                .announcements(key),
        )
    }
}

/// The announcements of one key, as they come.
enum Heard {
    Memory(std::sync::mpsc::Receiver<String>),
    Redis {
        messages: redis::aio::PubSubStream,
        publisher: redis::aio::MultiplexedConnection,
        looks_channel: String,
        looks: u64,
    },
}

impl Heard {
    /// Every announcement made since the last call, in order.
    async fn take(&mut self) -> Vec<String> {
        match self {
            Self::Memory(heard) => heard.try_iter().collect(),
            Self::Redis {
                messages,
                publisher,
                looks_channel,
                looks,
            } => {
                // A message of our own, published now, comes after everything published before
                // it: what comes before it is what was announced so far.
                *looks += 1;
                let end = format!("end of look {looks}");
                redis::cmd("PUBLISH")
                    .arg(&*looks_channel)
                    .arg(&end)
                    .query_async::<i64>(publisher)
                    .await
                    .expect("PUBLISH");
                let mut heard = Vec::new();
                loop {
                    let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
                        .await
                        .expect("our own message heard")
                        .expect("the subscription open");
                    let ours = message.get_channel_name() == looks_channel;
                    let message: String = message.get_payload().expect("a text message");
                    match ours {
                        true if message == end => return heard,
                        true => {}
                        false => heard.push(message),
                    }
                }
            }
        }
    }
}

/// One thing a case saw, its tokens named by the callers that held them.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Saw {
    /// The key's value: `free`, or its holder, `+` for the waiter's mark, then the reservation
    /// (`for R, 5000 ms, 1 key`).
    Stored(String),
    /// The announcements since the last look: a release (its holder), `H>W` (the key handed
    /// from H to W), `look again`.
    Announced(Vec<String>),
    /// A caller's work began, holding the key.
    Entered(&'static str),
    /// What a call returned.
    Returned(&'static str, String),
    /// What a watch of the key reported.
    Watched(Vec<String>),
    /// The engine's path through the releases, as logged: a hand-over tried, and what it did.
    Path(Vec<&'static str>),
}

/// What a case saw before its tokens were named (a caller's token is known only once it holds
/// the key, its reservation seen before).
enum Raw {
    Stored(Option<String>),
    Announced(Vec<String>),
    Entered(&'static str),
    Returned(&'static str, String),
    Watched(Vec<(bool, String)>),
    Path(Vec<&'static str>),
}

/// A case on one deployment: the key it follows, what it saw, and who holds which token.
struct Case<'d, D: Paths> {
    deployment: &'d D,
    key: String,
    heard: Heard,
    raw: Vec<Raw>,
    names: Vec<(String, &'static str)>,
    entered: mpsc::UnboundedSender<(&'static str, String)>,
    entries: mpsc::UnboundedReceiver<(&'static str, String)>,
}

/// A caller holding, or waiting for, the key; it releases when told to leave.
struct Caller {
    role: &'static str,
    leave: oneshot::Sender<()>,
    call: tokio::task::JoinHandle<Result<(), LockError>>,
}

/// The lock the cases take: exclusive, neither fair nor fenced, so a release may hand it over.
fn exclusive(ttl_ms: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(ttl_ms))
}

/// A waiter's lock: 5 s leases, a wait long enough for any case.
fn waiter() -> LockOptions {
    exclusive(5_000).wait(Duration::from_secs(10))
}

impl<'d, D: Paths> Case<'d, D> {
    async fn new(deployment: &'d D, key: String) -> Self {
        let heard = deployment.hear(&key).await;
        let (entered, entries) = mpsc::unbounded_channel();
        Self {
            deployment,
            key,
            heard,
            raw: Vec::new(),
            names: Vec::new(),
            entered,
            entries,
        }
    }

    fn name(&mut self, token: &str, role: &'static str) {
        self.names.push((token.to_owned(), role));
    }

    /// Looks at the key's value, and at what was announced since the last look.
    async fn look(&mut self) {
        let stored = self.deployment.stored(&self.key).await;
        self.raw.push(Raw::Stored(stored));
        let heard = self.heard.take().await;
        self.raw.push(Raw::Announced(heard));
    }

    fn returned(&mut self, what: &'static str, outcome: Result<(), LockError>) {
        let outcome =
            outcome.map_or_else(|error| format!("{:?}", describe(error)), |()| "ok".into());
        self.raw.push(Raw::Returned(what, outcome));
    }

    /// Starts a caller of `client` taking `keys` (the case's key when empty) with `options`.
    fn call(
        &self,
        client: &LockClient,
        role: &'static str,
        keys: Vec<String>,
        options: LockOptions,
    ) -> Caller {
        let keys = if keys.is_empty() {
            vec![self.key.clone()]
        } else {
            keys
        };
        let (client, entered) = (client.clone(), self.entered.clone());
        let (leave, left) = oneshot::channel();
        let call = tokio::spawn(async move {
            let lease = match keys.as_slice() {
                [key] => client.acquire(key.clone(), options).await?,
                keys => client.acquire_many(keys.to_vec(), options).await?,
            };
            entered.send((role, lease.token().to_owned())).unwrap();
            let _ = left.await;
            lease.release().await
        });
        Caller { role, leave, call }
    }

    /// Waits for the next caller to hold the key, and names its token.
    async fn entered(&mut self) {
        let (role, token) = tokio::time::timeout(Duration::from_secs(20), self.entries.recv())
            .await
            .expect("a caller entered")
            .expect("callers running");
        self.name(&token, role);
        self.raw.push(Raw::Entered(role));
    }

    /// Lets `caller` go, and notes what its call returned.
    async fn leave(&mut self, caller: Caller) {
        let _ = caller.leave.send(());
        let outcome = caller.call.await.expect("the caller did not panic");
        self.returned(caller.role, outcome);
    }

    /// Waits until the stored value says `what`.
    async fn until_stored(&self, what: &str, holds: impl Fn(&Stored<'_>) -> bool) {
        until(what, || async {
            self.deployment
                .stored(&self.key)
                .await
                .is_some_and(|value| Stored::parse(&value).is_some_and(|stored| holds(&stored)))
        })
        .await;
    }

    /// Whether the value at the last look carried a reservation: on a real server, a waiter
    /// whose first looks came late (a loaded machine) waited past the starvation bound.
    fn reserved_at_last_look(&self) -> bool {
        self.raw
            .iter()
            .rev()
            .find_map(|raw| match raw {
                Raw::Stored(value) => Some(value.as_deref().and_then(Stored::parse)),
                _ => None,
            })
            .flatten()
            .is_some_and(|stored| stored.reserved.is_some())
    }

    /// What it saw, every token named.
    fn saw(self) -> Vec<Saw> {
        let name = |token: &str| {
            self.names
                .iter()
                .find(|(known, _)| known == token)
                .map_or("?", |(_, role)| *role)
        };
        let hinted = |hint: &str| {
            self.names
                .iter()
                .find(|(known, _)| known.starts_with(hint))
                .map_or("?", |(_, role)| *role)
        };
        self.raw
            .into_iter()
            .map(|raw| match raw {
                Raw::Stored(None) => Saw::Stored("free".into()),
                Raw::Stored(Some(value)) => Saw::Stored(match Stored::parse(&value) {
                    Some(stored) => {
                        let mut shown = name(protocol::holder_token(stored.holder)).to_owned();
                        if stored.waited {
                            shown.push('+');
                        }
                        if let Some(reservation) = stored.reserved {
                            let (owed_by, ttl, keys) = (
                                name(protocol::holder_token(reservation.value)),
                                reservation.ttl_ms,
                                reservation.keys,
                            );
                            shown.push_str(&format!(" for {owed_by}, {ttl} ms, {keys} key(s)"));
                        }
                        shown
                    }
                    None => format!("no lock: {value}"),
                }),
                Raw::Announced(messages) => Saw::Announced(
                    messages
                        .iter()
                        .map(|message| {
                            let heard = Announcement::parse(message);
                            let released = name(protocol::holder_token(heard.released));
                            match (message.is_empty(), heard.handed_to) {
                                (true, _) => "look again".to_owned(),
                                (false, Some(to)) => format!("{released}>{}", name(to)),
                                (false, None) => released.to_owned(),
                            }
                        })
                        .collect(),
                ),
                Raw::Entered(role) => Saw::Entered(role),
                Raw::Returned(what, outcome) => Saw::Returned(what, outcome),
                Raw::Watched(events) => Saw::Watched(
                    events
                        .iter()
                        .map(|(acquired, hint)| match acquired {
                            true => format!("acquired by {}", hinted(hint)),
                            false => "released".to_owned(),
                        })
                        .collect(),
                ),
                Raw::Path(path) => Saw::Path(path),
            })
            .collect()
    }
}

/// The engine's events of a release's path, each with what a case calls it.
const PATH: [(&str, &str); 4] = [
    (
        "handing the lock to the next waiter of this client",
        "hand-over",
    ),
    ("lock handed to the next waiter of this client", "handed"),
    (
        "lock handed to a caller that waited longer",
        "handed to a reservation",
    ),
    (
        "lock had already expired or changed owner at release",
        "not ours",
    ),
];

/// The release path `log` shows, in order.
fn path(log: &Log) -> Vec<&'static str> {
    log.text()
        .lines()
        .filter_map(|line| {
            PATH.iter()
                .find(|(event, _)| line.contains(event))
                .map(|(_, name)| *name)
        })
        .collect()
}

/// Waits until `check` holds: polled every millisecond (a caller starves 20 ms after it began
/// waiting, and the cases act before), for 10 s at most.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(std::time::Instant::now() < give_up, "never: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until a caller of `client` is parked on `key`, offering to be handed it.
async fn parked(client: &LockClient, key: &str) {
    until("the waiter parked", || async { client.waiting(key) == 1 }).await;
}

/// The cases, each run on both stores from the same code.
#[derive(Debug, Clone, Copy)]
enum HandOverCase {
    ToAWaiterOfTheSameClient,
    ToAWaiterThatReservedTheKey,
    ElsewhereToAReservationDeclinedHere,
    OfAKeyNoLongerOurs,
    OfAWatchedKey,
    KeepingAReservationForSeveralKeys,
}

/// The case ran otherwise than it means to, and why (on a real server, a step came later than
/// the case meant): run it again.
struct Again(&'static str);

impl HandOverCase {
    /// What the case saw; `log` captures the engine's events as it runs.
    async fn run(self, deployment: &impl Paths, key: String, log: &Log) -> Result<Vec<Saw>, Again> {
        let here = deployment.client().await;
        let mut case = Case::new(deployment, key.clone()).await;
        let held = here.acquire(key.clone(), exclusive(60_000)).await.unwrap();
        case.name(held.token(), "H");
        match self {
            // A release with a caller of the same client parked on the key passes the key to it:
            // its value and ttl, the waiter's mark kept, nothing announced.
            Self::ToAWaiterOfTheSameClient => {
                let waiter = case.call(&here, "W", vec![], waiter());
                parked(&here, &key).await;
                case.look().await;
                case.returned("H's release", held.release().await);
                case.entered().await;
                case.look().await;
                // The waiter began 20 ms before and reserved the key: the next case's path.
                if case
                    .raw
                    .iter()
                    .any(|raw| matches!(raw, Raw::Announced(heard) if !heard.is_empty()))
                {
                    return Err(Again("the waiter reserved the key before the release"));
                }
                let info = here.inspect(&key).await.unwrap().expect("held");
                let ttl = if info.time_left() <= Duration::from_secs(5) {
                    "W's"
                } else {
                    "H's"
                };
                case.raw
                    .push(Raw::Returned("the lease's ttl", ttl.to_owned()));
                case.raw
                    .push(Raw::Returned("waiters", info.waiters().to_string()));
                case.leave(waiter).await;
            }
            // A waiter of the same client that waited too long reserved the key: the hand-over
            // serves its reservation, unannounced (other callers that reserved the key keep their
            // places among its waiters).
            Self::ToAWaiterThatReservedTheKey => {
                let waiter = case.call(&here, "W", vec![], waiter());
                case.until_stored("reserved", |stored| stored.reserved.is_some())
                    .await;
                parked(&here, &key).await;
                case.look().await;
                case.returned("H's release", held.release().await);
                case.entered().await;
                case.look().await;
                case.leave(waiter).await;
            }
            // A caller elsewhere reserved the key: a release of `here` with its own caller
            // parked hands the key to the caller elsewhere (announced to it), and `here`'s caller,
            // declined, waits on; it reserves the key in turn, and the next release hands it over.
            Self::ElsewhereToAReservationDeclinedHere => {
                let there = deployment.another_client().await;
                let remote = case.call(&there, "R", vec![], waiter());
                case.until_stored("reserved", |stored| stored.reserved.is_some())
                    .await;
                case.look().await;
                let local = case.call(&here, "W", vec![], waiter());
                parked(&here, &key).await;
                case.returned("H's release", held.release().await);
                case.entered().await;
                case.until_stored("reserved again", |stored| {
                    stored.reserved.is_some() && stored.holder.starts_with(case_token(&case, "R"))
                })
                .await;
                case.look().await;
                case.leave(remote).await;
                case.entered().await;
                case.look().await;
                case.leave(local).await;
            }
            // The key changed owner under the holder: its hand-over finds nothing of its own, and
            // the waiter looks again; it takes the key once the other owner's lease ran out.
            Self::OfAKeyNoLongerOurs => {
                let waiter = case.call(&here, "W", vec![], waiter());
                parked(&here, &key).await;
                let other = deployment.impose(&key, Duration::from_millis(300)).await;
                case.name(&other, "O");
                case.look().await;
                if case.reserved_at_last_look() {
                    return Err(Again("the waiter reserved the key before the release"));
                }
                case.returned("H's release", held.release().await);
                case.entered().await;
                case.look().await;
                case.leave(waiter).await;
            }
            // A watch follows the key: the hand-over is announced, so the watch sees every
            // holder, and the next holder is marked.
            Self::OfAWatchedKey => {
                let watcher = deployment.another_client().await;
                let (events, mut watched) = mpsc::unbounded_channel();
                let mut watch = watcher.watch(&key);
                let watching = tokio::spawn(async move {
                    while let Some(Ok(event)) = watch.next().await {
                        let event = match event {
                            LockEvent::Acquired { token_hint, .. } => (true, token_hint),
                            _ => (false, String::new()),
                        };
                        if events.send(event).is_err() {
                            return;
                        }
                    }
                });
                let first = watched.recv().await.expect("the watch saw the holder");
                let waiter = case.call(&here, "W", vec![], waiter());
                parked(&here, &key).await;
                case.look().await;
                if case.reserved_at_last_look() {
                    return Err(Again("the waiter reserved the key before the release"));
                }
                case.returned("H's release", held.release().await);
                case.entered().await;
                case.look().await;
                case.leave(waiter).await;
                // Up to the key free again after W's hold.
                let next = case_token(&case, "W").to_owned();
                let (mut events, mut saw_next) = (vec![first], false);
                loop {
                    let event = tokio::time::timeout(Duration::from_secs(10), watched.recv());
                    let (acquired, hint) =
                        event.await.expect("the watch saw W's hold end").unwrap();
                    let done = saw_next && !acquired;
                    saw_next |= acquired && next.starts_with(&hint);
                    events.push((acquired, hint));
                    if done {
                        break;
                    }
                }
                watching.abort();
                case.raw.push(Raw::Watched(events));
            }
            // A caller of several keys elsewhere reserved the key (for all of them): a hand-over
            // keeps its reservation for a release of them all, announces nothing, and the next
            // holder's release frees the key for it.
            Self::KeepingAReservationForSeveralKeys => {
                let there = deployment.another_client().await;
                let keys = vec![key.clone(), format!("{key}.other")];
                let remote = case.call(&there, "M", keys, waiter());
                case.until_stored("reserved", |stored| stored.reserved.is_some())
                    .await;
                let local = case.call(&here, "W", vec![], waiter());
                parked(&here, &key).await;
                case.returned("H's release", held.release().await);
                case.entered().await;
                case.look().await;
                case.leave(local).await;
                case.entered().await;
                case.look().await;
                case.leave(remote).await;
            }
        }
        case.look().await;
        // Each case releases while a caller of the same client is parked, offering to be handed
        // the key: one that was looking at that moment (on a real server, a look after 20 ms
        // of waiting can land then) withdrew its offer, and the release took the other path.
        let path = path(log);
        if !path.contains(&"hand-over") {
            return Err(Again("no release tried a hand-over"));
        }
        case.raw.push(Raw::Path(path));
        Ok(case.saw())
    }
}

/// The token of the caller named `role` (known once it held the key).
fn case_token<'c, D: Paths>(case: &'c Case<'_, D>, role: &str) -> &'c str {
    case.names
        .iter()
        .find(|(_, known)| *known == role)
        .map_or("", |(token, _)| token.as_str())
}

/// Runs `case` on a real Redis (again while a step came later than the case means) and in
/// memory under paused time, and compares what each saw.
///
/// Each runs on one thread, so that the log of that thread holds the engine's every event of the
/// case (a Redis client's watchdog and subscriber run on their own, and log nothing compared).
fn compare(case: HandOverCase) {
    let redis = SingleRedis::start();
    let in_redis = (1..=5)
        .find_map(|attempt| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let (log, _guard) = Log::capture(tracing::Level::DEBUG);
            let key = format!("handover:{attempt}");
            runtime.block_on(case.run(&redis, key, &log)).ok()
        })
        .unwrap_or_else(|| panic!("{case:?} never ran as meant on Redis in 5 attempts"));
    let paused = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);
    let in_memory = paused
        .block_on(case.run(&InMemory::start(), "handover:1".to_owned(), &log))
        .unwrap_or_else(|Again(why)| panic!("{case:?} in memory: {why}"));
    assert_eq!(in_redis, in_memory, "{case:?}: Redis, then memory");
}

#[test]
fn a_release_hands_the_key_to_a_waiter_of_the_same_client_as_in_redis() {
    compare(HandOverCase::ToAWaiterOfTheSameClient);
}

#[test]
fn a_hand_over_serves_the_next_holders_reservation_as_in_redis() {
    compare(HandOverCase::ToAWaiterThatReservedTheKey);
}

#[test]
fn a_key_reserved_elsewhere_is_handed_there_and_declined_here_as_in_redis() {
    compare(HandOverCase::ElsewhereToAReservationDeclinedHere);
}

#[test]
fn a_hand_over_of_a_key_no_longer_ours_changes_nothing_as_in_redis() {
    compare(HandOverCase::OfAKeyNoLongerOurs);
}

#[test]
fn a_hand_over_of_a_watched_key_is_announced_as_in_redis() {
    compare(HandOverCase::OfAWatchedKey);
}

#[test]
fn a_reservation_for_several_keys_stays_through_a_hand_over_as_in_redis() {
    compare(HandOverCase::KeepingAReservationForSeveralKeys);
}
