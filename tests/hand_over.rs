//! Within one client, a release passes an exclusive lock straight to the next waiter of that
//! client: no moment free, no announcement, no `SET` of the waiter's own; unless a caller
//! elsewhere has waited too long for the key (`protocol::RESERVE_AFTER`) and reserved it: then
//! it passes to that caller.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Log, command_calls, eventually, fast_client, get, opts};
use lockmacro_runtime::{LockClient, LockContext, protocol};
use testkit::{Fault, FaultProxy, RedisCluster, RedisServer};
use tokio::sync::oneshot;

const PARKED: &str = "parked until the lock is released or handed to this caller";
const RESERVING: &str = "waited past the starvation bound; reserving the lock";
const HANDING: &str = "handing the lock to the next waiter of this client";

/// The token hints of the callers that logged reserving a key, in the order they did.
fn reserving_hints(log: &Log) -> Vec<String> {
    let text = log.text();
    let lines = text.lines().filter(|line| line.contains(RESERVING));
    lines
        .map(|line| line.split("token_hint=").nth(1).unwrap()[..4].to_owned())
        .collect()
}

async fn cluster_client(cluster: &RedisCluster) -> LockClient {
    LockClient::cluster_builder(cluster.seed_urls())
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap()
}

/// Holds `key` through `locks`, parks a second caller of the same client on it and releases:
/// the waiter has the key at once with its own token and ttl, and `node` (the server of the
/// key) saw no `DEL` and no `publish`.
async fn assert_handed_over(locks: &LockClient, node: &RedisServer, key: &str, publish: &str) {
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);
    let held = locks.acquire(key, opts(5_000)).await.unwrap();
    let (entered, entered_rx) = oneshot::channel();
    let (leave, leave_rx) = oneshot::channel::<()>();
    let waiter = tokio::spawn({
        let (locks, key) = (locks.clone(), key.to_owned());
        async move {
            let options = opts(4_000).wait(Duration::from_secs(10));
            locks
                .run_locked(key, options, async move {
                    let token = LockContext::current().unwrap().token().to_owned();
                    entered.send(token).unwrap();
                    leave_rx.await.unwrap();
                })
                .await
        }
    });
    log.seen(PARKED).await;
    // A waiter whose look came more than `RESERVE_AFTER` after it began waiting (a loaded
    // machine) reserved the key at that look: serving its reservation is not announced either
    // (every other caller that reserved the key keeps its place, see reservations.lua).
    let parked_on = get(node, key).await.expect("held");

    let (publishes, dels) = (command_calls(node, publish), command_calls(node, "del"));
    let holder = held.token().to_owned();
    held.release().await.unwrap();
    let next = entered_rx.await.unwrap();
    assert_ne!(next, holder);
    let value = get(node, key).await.expect("held");
    assert_eq!(protocol::holder_token(&value), next);
    assert!(
        protocol::is_waited_for(&value),
        "the waiter's mark stays on the key: whoever waits still hears the next release"
    );
    assert_eq!(log.count(HANDING), 1);
    assert_eq!(
        command_calls(node, publish),
        publishes,
        "not announced ({parked_on})"
    );
    assert_eq!(command_calls(node, "del"), dels, "never deleted");
    let ttl = match node.command(&["PTTL", key]) {
        redis::Value::Int(ms) => ms,
        other => panic!("PTTL answered {other:?}"),
    };
    assert!((1..=4_000).contains(&ttl), "the waiter's own ttl: {ttl} ms");

    leave.send(()).unwrap();
    waiter.await.unwrap().unwrap();
    assert_eq!(get(node, key).await, None);
}

#[tokio::test(flavor = "current_thread")]
async fn a_release_hands_the_lock_to_a_waiter_of_the_same_client_without_freeing_it() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    assert_handed_over(&locks, &server, "handover:1", "publish").await;
}

#[tokio::test(flavor = "current_thread")]
async fn on_a_cluster_a_release_hands_the_lock_to_a_waiter_of_the_same_client() {
    let cluster = RedisCluster::start(3, 0);
    let locks = cluster_client(&cluster).await;
    let key = "{handover}:c1";
    assert_handed_over(&locks, cluster.master_of(key), key, "spublish").await;
}

/// `here` holds `key` and one caller of each client waits for it: while the caller of `there`
/// has not waited too long, a release of `here` would hand the key to its own waiter; once it
/// has, it reserves the key, and the release passes the key to it (announced once, to it) before
/// `here`'s waiter, which takes it after.
async fn assert_handed_to_the_caller_elsewhere_that_waited_too_long(
    (here, there): (&LockClient, &LockClient),
    node: &RedisServer,
    key: &'static str,
    publish: &str,
) {
    let held = here.acquire(key, opts(5_000)).await.unwrap();
    let options = opts(5_000).wait(Duration::from_secs(10));
    let (entered, mut entries) = tokio::sync::mpsc::unbounded_channel();
    let (leave, _) = tokio::sync::watch::channel(false);
    let spawn_waiter = |locks: LockClient, name: &'static str| {
        let (entered, mut leave) = (entered.clone(), leave.subscribe());
        tokio::spawn(async move {
            let work = async move {
                entered.send(name).unwrap();
                leave.wait_for(|go| *go).await.unwrap();
            };
            locks.run_locked(key, options, work).await
        })
    };
    // The caller elsewhere waits first, and reserves the key once it has waited too long.
    let remote = spawn_waiter(there.clone(), "there");
    eventually(
        Duration::from_secs(5),
        "the key reserved for the caller elsewhere",
        || async {
            get(node, key).await.is_some_and(|value| {
                protocol::Stored::parse(&value).is_some_and(|stored| stored.reserved.is_some())
            })
        },
    )
    .await;
    // A caller of `here` parks on it, ready to be handed the lock by `here`'s release.
    let local = spawn_waiter(here.clone(), "here");
    eventually(
        Duration::from_secs(5),
        "the local waiter parked",
        || async { here.waiting(key) == 1 },
    )
    .await;

    let publishes = command_calls(node, publish);
    held.release().await.unwrap();
    assert_eq!(
        entries.recv().await.unwrap(),
        "there",
        "the caller the key is reserved for first"
    );
    assert_eq!(
        command_calls(node, publish),
        publishes + 1,
        "announced to the caller it was handed to"
    );
    leave.send(true).unwrap();
    remote.await.unwrap().unwrap();
    assert_eq!(entries.recv().await.unwrap(), "here");
    local.await.unwrap().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_release_hands_the_lock_to_a_caller_elsewhere_that_waited_too_long() {
    let server = RedisServer::start();
    let (here, there) = (fast_client(&server).await, fast_client(&server).await);
    let clients = (&here, &there);
    assert_handed_to_the_caller_elsewhere_that_waited_too_long(
        clients,
        &server,
        "handover:2",
        "publish",
    )
    .await;
}

#[tokio::test(flavor = "current_thread")]
async fn on_a_cluster_a_release_hands_the_lock_to_a_caller_elsewhere_that_waited_too_long() {
    let cluster = RedisCluster::start(3, 0);
    let (here, there) = (
        cluster_client(&cluster).await,
        cluster_client(&cluster).await,
    );
    let key = "{handover}:c2";
    let node = cluster.master_of(key);
    assert_handed_to_the_caller_elsewhere_that_waited_too_long(
        (&here, &there),
        node,
        key,
        "spublish",
    )
    .await;
}

/// A client whose callers keep taking turns on a key does not keep it from another client's
/// waiter: once that waiter has waited too long, the key passes to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_client_does_not_keep_a_key_from_another_client() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let server = RedisServer::start();
    let (busy, other) = (fast_client(&server).await, fast_client(&server).await);
    let options = opts(5_000).wait(Duration::from_secs(10));
    let other_done = Arc::new(AtomicBool::new(false));
    let taken = Arc::new(AtomicU64::new(0));
    let give_up = tokio::time::Instant::now() + Duration::from_secs(15);
    let mut turns = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (busy, other_done, taken) = (busy.clone(), other_done.clone(), taken.clone());
        turns.spawn(async move {
            while !other_done.load(Ordering::SeqCst) && tokio::time::Instant::now() < give_up {
                busy.run_locked("handover:3", options, async {})
                    .await
                    .unwrap();
                taken.fetch_add(1, Ordering::SeqCst);
            }
        });
    }
    eventually(
        Duration::from_secs(5),
        "the busy client taking turns",
        || async { taken.load(Ordering::SeqCst) >= 50 },
    )
    .await;
    other
        .run_locked("handover:3", options, async {})
        .await
        .expect("the other client got its turn within its wait");
    other_done.store(true, Ordering::SeqCst);
    while let Some(turns) = turns.join_next().await {
        turns.unwrap();
    }
}

/// A waiter cancelled while a release hands it the lock leaves nothing behind: the lease handed
/// to it is released at once, not left to expire.
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_cancelled_while_being_handed_the_lock_has_it_released() {
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = LockClient::builder(&proxy.url())
        .scan_interval(Duration::from_millis(100))
        .response_timeout(Duration::from_secs(3))
        .build()
        .await
        .unwrap();
    let held = locks.acquire("handover:4", opts(30_000)).await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let options = opts(30_000).wait(Duration::from_secs(20));
            locks
                .run_locked("handover:4", options, std::future::pending::<()>())
                .await
        }
    });
    log.seen(PARKED).await;

    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let release = tokio::spawn(held.release());
    log.seen(HANDING).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    release.await.unwrap().unwrap();
    proxy.set(Fault::Pass);
    // Its lease is 30 s: gone within 5 s, it was released.
    eventually(
        Duration::from_secs(5),
        "the handed lock released",
        || async { get(&server, "handover:4").await.is_none() },
    )
    .await;
}

/// A user the ACL does not allow any pub/sub command still has its locks pass to its waiters:
/// a hand-over asks nothing of pub/sub (who waits elsewhere is in the key's value).
#[tokio::test(flavor = "current_thread")]
async fn without_pubsub_in_the_acl_a_release_still_hands_the_lock_over() {
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);
    let server = RedisServer::start();
    let granted = server.command(&[
        "ACL", "SETUSER", "locker", "on", ">pw", "~*", "&*", "+@all", "-pubsub",
    ]);
    assert_eq!(granted, redis::Value::Okay);
    let url = format!("redis://locker:pw@127.0.0.1:{}", server.port());
    let locks = LockClient::builder(&url)
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let held = locks.acquire("handover:5", opts(5_000)).await.unwrap();
    let (entered, entered_rx) = oneshot::channel();
    let (leave, leave_rx) = oneshot::channel::<()>();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let options = opts(5_000).wait(Duration::from_secs(10));
            let work = async move {
                entered.send(()).unwrap();
                leave_rx.await.unwrap();
            };
            locks.run_locked("handover:5", options, work).await
        }
    });
    log.seen(PARKED).await;
    let parked_on = get(&server, "handover:5").await.expect("held");

    let publishes = command_calls(&server, "publish");
    held.release().await.expect("released without an error");
    entered_rx.await.unwrap();
    assert_eq!(log.count(HANDING), 1, "handed over");
    assert_eq!(
        command_calls(&server, "publish"),
        publishes,
        "not announced ({parked_on})"
    );
    leave.send(()).unwrap();
    waiter.await.unwrap().unwrap();
    assert_eq!(get(&server, "handover:5").await, None);
}

/// A key that frees itself without a release (its readers' hold ran out) cannot hand itself
/// over: the writer that waited past the starvation bound keeps its reservation among the key's
/// waiters, so the free key waits for it rather than going to whoever looks first.
#[tokio::test]
async fn a_key_its_readers_held_goes_to_the_writer_that_reserved_it() {
    use std::sync::Mutex;
    let server = RedisServer::start();
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);
    let (reader, reserving, late) = (
        fast_client(&server).await,
        fast_client(&server).await,
        fast_client(&server).await,
    );
    let key = "handover:readers";
    let hold = Duration::from_millis(800);
    reader
        .run_locked(key, opts(5_000).read().hold_at_least(hold), async {})
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let writer = |client: LockClient, name: &'static str| {
        let order = order.clone();
        async move {
            let options = opts(5_000).wait(Duration::from_secs(10));
            client
                .run_locked(key, options, async { order.lock().unwrap().push(name) })
                .await
                .unwrap();
        }
    };
    let first = tokio::spawn(writer(reserving.clone(), "reserved"));
    // Past the starvation bound, its look reserves the key.
    log.seen(RESERVING).await;
    eventually(
        Duration::from_secs(5),
        "the reserving writer parked",
        || async { reserving.waiting(key) == 1 },
    )
    .await;
    let second = tokio::spawn(writer(late.clone(), "late"));
    first.await.unwrap();
    second.await.unwrap();
    assert_eq!(*order.lock().unwrap(), ["reserved", "late"]);
}

/// A release wakes one parked waiter of each client: the one that reserved the key, when one
/// did. Any other would find the key, once it frees itself (its readers' hold ran out,
/// unannounced), reserved for that caller and be told to wait for it, while the caller slept
/// out the fallback of its last look (a reader's whole lease). Found by the generated
/// combinations in memory: a writer's wait of 3.2 s ran out on a key free for 3 s. The
/// parking order alone is not the arrival order: a caller parks again after each look.
#[tokio::test]
async fn a_release_wakes_the_waiter_of_its_client_that_reserved_the_key() {
    use std::sync::Mutex;
    use std::time::Instant;
    let server = RedisServer::start();
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);
    let key = "handover:wakes-reserver";
    let started = Instant::now();
    // One reader gone but kept by its hold, two holding on with leases far longer than it.
    let lease = Duration::from_secs(8);
    let hold = Duration::from_millis(1_000);
    let kept = fast_client(&server).await;
    kept.run_locked(key, opts(8_000).read().hold_at_least(hold), async {})
        .await
        .unwrap();
    let (first, second) = (fast_client(&server).await, fast_client(&server).await);
    let first = first.acquire(key, opts(8_000).read()).await.unwrap();
    let second_lease = second.acquire(key, opts(8_000).read()).await.unwrap();

    let writers = fast_client(&server).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let writer = |name: &'static str| {
        let (writers, order) = (writers.clone(), order.clone());
        async move {
            let options = opts(5_000).wait(Duration::from_secs(20));
            writers
                .run_locked(key, options, async {
                    order.lock().unwrap().push((name, started.elapsed()));
                })
                .await
                .unwrap();
        }
    };
    let parks_of = |hint: &str| {
        let hint = format!("token_hint={hint}");
        let text = log.text();
        text.lines()
            .filter(|line| line.contains(PARKED) && line.contains(&hint))
            .count()
    };
    let reserving = tokio::spawn(writer("reserving"));
    // Past the starvation bound, its look reserves the key; then it parks.
    // (`inspect` names only a reservation an exclusive holder carries.)
    log.seen(RESERVING).await;
    let hint = reserving_hints(&log).remove(0);
    eventually(
        Duration::from_secs(5),
        "the reserving writer parked",
        || async { parks_of(&hint) > 0 && writers.waiting(key) == 1 },
    )
    .await;
    let later = tokio::spawn(writer("later"));
    eventually(
        Duration::from_secs(5),
        "the later writer looked and parked",
        || async {
            let counted = kept.inspect(key).await.unwrap().map(|info| info.waiters());
            counted == Some(2) && writers.waiting(key) == 2
        },
    )
    .await;
    // A reader's release wakes the reserving writer, which parks again behind the later one.
    let parks = parks_of(&hint);
    first.release().await.unwrap();
    eventually(
        Duration::from_secs(5),
        "the reserving writer looked again",
        || async { parks_of(&hint) > parks && writers.waiting(key) == 2 },
    )
    .await;
    // The next release wakes it again (woken in parking order, the later writer would be), and
    // it learns when the hold ends.
    second_lease.release().await.unwrap();
    reserving.await.unwrap();
    later.await.unwrap();
    let order = order.lock().unwrap().clone();
    eprintln!("entered (since the start): {order:?}");
    assert_eq!(order[0].0, "reserving", "{order:?}");
    // The hold ends at about 1 s; a writer asleep on its fallback would enter at the readers'
    // lease end, 8 s.
    assert!(order[0].1 < lease / 2, "{order:?}");
}

/// Every caller that waited past the starvation bound keeps its place among the key's waiters
/// (`reserved`, then `reserved_next`, see docs/protocol.md), in the order they began waiting, up
/// to 16; the key, freed by its readers' hold running out, goes to them in that order. Those
/// beyond 16 go unrecorded (`reserved_more` says so) and look again as places free, and are
/// served after them, in order too. While two places were kept, a third went unrecorded until a
/// place freed, and callers after it could pass it (the simulator's tier two, seeds 820 and 955).
#[tokio::test]
async fn every_caller_past_the_starvation_bound_keeps_its_place_in_order() {
    use redis::AsyncCommands;
    use std::sync::Mutex;
    let server = RedisServer::start();
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);
    let key = "handover:queue";
    let reader = fast_client(&server).await;
    let hold = Duration::from_millis(2_500);
    reader
        .run_locked(key, opts(8_000).read().hold_at_least(hold), async {})
        .await
        .unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut writers = Vec::new();
    let mut tokens = Vec::new();
    let (kept, writer_count) = (16, 20);
    for name in 0..writer_count {
        let (client, order) = (fast_client(&server).await, order.clone());
        writers.push(tokio::spawn(async move {
            let options = opts(5_000).wait(Duration::from_secs(20));
            client
                .run_locked(key, options, async {
                    order.lock().unwrap().push(name);
                })
                .await
                .unwrap();
        }));
        // Past the bound, its look reserves the key: the next one begins waiting after it.
        let reserving = || {
            let hints = reserving_hints(&log);
            hints.into_iter().find(|hint| !tokens.contains(hint))
        };
        eventually(
            Duration::from_secs(5),
            "the writer reserved the key",
            || {
                let reserved = reserving().is_some();
                async move { reserved }
            },
        )
        .await;
        tokens.push(reserving().unwrap());
    }
    // The first 16 stand recorded, in the order they began waiting; the others went unrecorded.
    let waiters = protocol::Names::default().waiters(key);
    let mut conn = server.connection().await;
    let first: Option<String> = conn.hget(&waiters, "reserved").await.unwrap();
    let next: Option<String> = conn.hget(&waiters, "reserved_next").await.unwrap();
    let more: Option<String> = conn.hget(&waiters, "reserved_more").await.unwrap();
    let recorded: Vec<String> = first
        .into_iter()
        .chain(
            next.iter()
                .flat_map(|next| next.split('|').map(str::to_owned)),
        )
        .map(|reservation| {
            let reservation = protocol::Reservation::parse(&reservation).expect("a reservation");
            protocol::holder_token(reservation.value)[..4].to_owned()
        })
        .collect();
    assert_eq!(
        recorded,
        tokens[..kept],
        "the reservations among the key's waiters"
    );
    assert_eq!(more.as_deref(), Some("1"), "callers went unrecorded");
    for writer in writers {
        writer.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order, (0..writer_count).collect::<Vec<_>>());
}
