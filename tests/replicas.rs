//! Replica acknowledgement on Sentinel and Cluster: a lock, and each renewal, counts only once a
//! replica acknowledged it (`WAIT` behind the write). With the replica frozen (`SIGSTOP`), no
//! lock is granted and nothing stays held; with `replica_acks(0)` it is.
//!
//! A failover to a replica cut off from its master (`RedisServer::cut_off_from`, then a failover
//! forced while the master runs) keeps every acknowledged lock, and the holder of one granted
//! without acknowledgement is told it lost it.
//!
//! Figures worth reporting are printed with `eprintln!` (`--no-capture` shows them).

mod common;

use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockError, LockOptions};
use testkit::{RedisCluster, RedisSentinel, RedisServer, ReplicaCut};

/// Unfreezes a server when dropped, so that a failing assertion leaves no process stopped.
struct Frozen<'a>(&'a RedisServer);

impl<'a> Frozen<'a> {
    fn freeze(server: &'a RedisServer) -> Self {
        server.pause();
        Self(server)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

/// A client of `sentinel` asking `acks` replicas to acknowledge.
async fn on_sentinel(sentinel: &RedisSentinel, acks: u32) -> LockClient {
    LockClient::builder(&sentinel.url())
        .replica_acks(acks)
        .build()
        .await
        .unwrap()
}

/// A client of `cluster` asking `acks` replicas to acknowledge.
async fn on_cluster(cluster: &RedisCluster, acks: u32) -> LockClient {
    LockClient::cluster_builder(cluster.seed_urls())
        .replica_acks(acks)
        .build()
        .await
        .unwrap()
}

fn options() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(5))
}

/// With the replica frozen, a lock is not granted: the caller gets `LockError::Redis` saying no
/// replica acknowledged it, in about the ack timeout, and the key is free afterwards.
async fn frozen_replica_grants_nothing(
    locks: &LockClient,
    no_acks: &LockClient,
    replica: &RedisServer,
    master: &RedisServer,
    key: &str,
) {
    // Healthy: granted, and the uncontended cycle works.
    locks
        .run_locked(key, options(), async {})
        .await
        .expect("granted while the replica keeps up");
    let frozen = Frozen::freeze(replica);
    let started = Instant::now();
    let error = locks
        .run_locked(key, options(), async { panic!("the body never runs") })
        .await
        .expect_err("not granted while the replica is frozen");
    let took = started.elapsed();
    eprintln!("frozen replica: {took:?}: {error}");
    assert!(
        matches!(&error, LockError::Redis { .. })
            && error.to_string().contains("no replica acknowledged"),
        "{error:?}"
    );
    assert_eq!(
        common::get(master, key).await,
        None,
        "the unacknowledged grant was undone before the caller heard"
    );
    // Several keys at once: the same.
    let keys = [format!("{key}-a"), format!("{key}-b")];
    let error = locks
        .run_locked_many(keys.clone(), options(), async {})
        .await
        .expect_err("not granted while the replica is frozen");
    assert!(
        error.to_string().contains("no replica acknowledged"),
        "{error:?}"
    );
    // With acknowledgement off, the grant does not wait for the replica.
    no_acks
        .run_locked(key, options(), async {})
        .await
        .expect("granted without acknowledgement");
    drop(frozen);
    locks
        .run_locked(key, options(), async {})
        .await
        .expect("granted again once the replica is back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_grants_no_lock_its_frozen_replica_did_not_acknowledge() {
    let sentinel = RedisSentinel::start();
    let (locks, no_acks) = (
        on_sentinel(&sentinel, 1).await,
        on_sentinel(&sentinel, 0).await,
    );
    frozen_replica_grants_nothing(
        &locks,
        &no_acks,
        sentinel.replica(),
        sentinel.master(),
        "acks:sentinel",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_grants_no_lock_its_frozen_replica_did_not_acknowledge() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .unwrap();
    // `{k}` keeps the multi-key lock's keys on the master whose replica is frozen.
    let key = "{acks}:cluster";
    let (locks, no_acks) = (on_cluster(&cluster, 1).await, on_cluster(&cluster, 0).await);
    frozen_replica_grants_nothing(
        &locks,
        &no_acks,
        cluster.replica_of(key),
        cluster.master_of(key),
        key,
    )
    .await;
}

/// A renewal no replica acknowledged does not move the lease's deadline: with the replica frozen
/// while the lock is held, the holder is cancelled with `Lost` at its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_renewals_do_not_keep_a_lease() {
    let sentinel = RedisSentinel::start();
    let locks = LockClient::builder(&sentinel.url())
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let replica = sentinel.replica();
    let (held, frozen) = tokio::sync::oneshot::channel();
    let run = locks.run_locked(
        "acks:renewal",
        LockOptions::new()
            .ttl(Duration::from_millis(1_500))
            .unlimited_renewals(),
        async move {
            held.send(()).unwrap();
            tokio::time::sleep(Duration::from_secs(4)).await;
        },
    );
    let freeze = async {
        frozen.await.unwrap();
        Frozen::freeze(replica)
    };
    let started = Instant::now();
    let (outcome, frozen) = tokio::join!(run, freeze);
    let took = started.elapsed();
    drop(frozen);
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?} after {took:?}"
    );
    assert!(
        took < Duration::from_secs(4),
        "cancelled at its deadline: {took:?}"
    );
}

/// One Redis without replicas: acknowledgement on by default changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_without_replicas_grants_as_before() {
    let server = RedisServer::start();
    let locks = LockClient::builder(&server.url()).build().await.unwrap();
    for _ in 0..3 {
        locks
            .run_locked("acks:one", options(), async {})
            .await
            .unwrap();
    }
}

/// Three keys on one master (one hash tag, for a cluster).
const LAGGING_KEYS: [&str; 3] = ["{lag}:held", "{lag}:refused", "{lag}:unacked"];

/// A failover to a lagging replica, on clients built for the deployment: a lock granted before
/// the replica was cut off is still held after the failover; while it is cut off a grant is
/// refused (undone), and one granted without acknowledgement (`no_acks`) is lost, its holder
/// told with `Lost`.
async fn a_failover_to_a_lagging_replica_keeps_acknowledged_locks<'a>(
    [locks, no_acks, other]: [&LockClient; 3],
    cut_off: impl FnOnce() -> ReplicaCut<'a>,
    fail_over: impl FnOnce(),
) {
    let [held, refused, unacked] = LAGGING_KEYS;
    let long = || LockOptions::new().ttl(Duration::from_secs(30));
    let (held_entered, held_entered_rx) = tokio::sync::oneshot::channel();
    let (finish, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let (cut_done, cut_done_rx) = tokio::sync::oneshot::channel();
    let (unacked_entered, unacked_entered_rx) = tokio::sync::oneshot::channel();
    let holder = locks.run_locked(held, long(), async move {
        held_entered.send(()).unwrap();
        let _ = finish_rx.await;
    });
    // Taken only once the replica is cut off, so no replica has it.
    let unacked_holder = async {
        cut_done_rx.await.unwrap();
        let body = async move {
            unacked_entered.send(()).unwrap();
            tokio::time::sleep(Duration::from_secs(60)).await;
        };
        let outcome = no_acks.run_locked(unacked, long(), body).await;
        (outcome, Instant::now())
    };
    let nemesis = async {
        held_entered_rx.await.unwrap();
        let cut = cut_off();
        let error = locks
            .run_locked(refused, long(), async { panic!("the body never runs") })
            .await
            .expect_err("no grant while the replica is cut off");
        assert!(
            error.to_string().contains("no replica acknowledged"),
            "{error:?}"
        );
        cut_done.send(()).unwrap();
        unacked_entered_rx.await.unwrap();
        tokio::task::block_in_place(fail_over);
        let failed_over = Instant::now();
        drop(cut);
        let busy = other.run_locked(held, LockOptions::new(), async {}).await;
        assert!(
            matches!(busy, Err(LockError::Busy { .. })),
            "the acknowledged lock survived the failover: {busy:?}"
        );
        finish.send(()).unwrap();
        failed_over
    };
    let (held_outcome, (unacked_outcome, told), failed_over) =
        tokio::join!(holder, unacked_holder, nemesis);
    held_outcome.expect("the acknowledged lock held to the end");
    assert!(
        matches!(unacked_outcome, Err(LockError::Lost { .. })),
        "the unacknowledged lock was lost in the failover: {unacked_outcome:?}"
    );
    eprintln!(
        "the holder of the unacknowledged lock was told {:?} after the failover",
        told.saturating_duration_since(failed_over)
    );
    // Free, for a caller that waits out the new master's first replica attaching (until then a
    // grant finds no replica to acknowledge it, and is undone: a look again within the wait).
    let free_at = Instant::now();
    other
        .run_locked(
            unacked,
            LockOptions::new().wait(Duration::from_secs(10)),
            async {},
        )
        .await
        .expect("the lost key is free");
    eprintln!(
        "the lost key was taken {:?} after the failover ({:?} of it waiting for a replica)",
        Instant::now().saturating_duration_since(failed_over),
        free_at.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_to_a_lagging_replica_keeps_acknowledged_locks() {
    let sentinel = RedisSentinel::start();
    let (locks, no_acks, other) = (
        on_sentinel(&sentinel, 1).await,
        on_sentinel(&sentinel, 0).await,
        on_sentinel(&sentinel, 1).await,
    );
    a_failover_to_a_lagging_replica_keeps_acknowledged_locks(
        [&locks, &no_acks, &other],
        || sentinel.replica().cut_off_from(sentinel.master()),
        || {
            sentinel.fail_over();
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_to_a_lagging_replica_keeps_acknowledged_locks() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .unwrap();
    let (locks, no_acks, other) = (
        on_cluster(&cluster, 1).await,
        on_cluster(&cluster, 0).await,
        on_cluster(&cluster, 1).await,
    );
    let key = LAGGING_KEYS[0];
    a_failover_to_a_lagging_replica_keeps_acknowledged_locks(
        [&locks, &no_acks, &other],
        || cluster.replica_of(key).cut_off_from(cluster.master_of(key)),
        || {
            cluster.take_over(key);
        },
    )
    .await;
}

/// Callers writing at once on one connection share rounds of `WAIT` (one in flight at a time
/// covers every write answered before it): each is acknowledged, a frozen replica fails them
/// all, and callers that give up in the middle of a round (aborted while `WAIT` waits) leave no
/// later caller waiting on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_wait_rounds_and_none_is_left_waiting() {
    let sentinel = RedisSentinel::start();
    let locks = on_sentinel(&sentinel, 1).await;
    let burst = |tag: &'static str| {
        let mut tasks = tokio::task::JoinSet::new();
        for task in 0..16 {
            let locks = locks.clone();
            tasks.spawn(async move {
                let key = format!("rounds:{tag}:{task}");
                for _ in 0..5 {
                    locks.run_locked(key.as_str(), options(), async {}).await?;
                }
                Ok::<_, LockError>(())
            });
        }
        tasks
    };
    let all = |tasks: tokio::task::JoinSet<Result<(), LockError>>| async move {
        tokio::time::timeout(Duration::from_secs(20), tasks.join_all())
            .await
            .expect("every caller answered: none waits on a round that never runs")
    };
    for outcome in all(burst("healthy")).await {
        outcome.expect("acknowledged");
    }
    let frozen = Frozen::freeze(sentinel.replica());
    for outcome in all(burst("frozen")).await {
        let error = outcome.expect_err("no replica acknowledges");
        assert!(
            error.to_string().contains("no replica acknowledged"),
            "{error:?}"
        );
    }
    // Give up in the middle of rounds: aborted while their `WAIT`s wait on the frozen replica.
    let mut abandoned = burst("abandoned");
    tokio::time::sleep(Duration::from_millis(100)).await;
    abandoned.abort_all();
    while abandoned.join_next().await.is_some() {}
    drop(frozen);
    for outcome in all(burst("after")).await {
        outcome.expect("acknowledged once the replica is back");
    }
}

/// One count of a cluster master's replicas covers every slot it serves: locks on 64 keys in as
/// many slots cost one `INFO` per master (and a recount each second while writes there are
/// acknowledged), not one per slot, and each is acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_masters_replicas_are_counted_once_for_all_its_slots() {
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(3, 1))
        .await
        .unwrap();
    let masters = cluster.masters();
    for master in &masters {
        master.command(&["CONFIG", "RESETSTAT"]);
    }
    let locks = on_cluster(&cluster, 1).await;
    let keys: Vec<String> = (0..64).map(|i| format!("acks:slots:{i}")).collect();
    let slots: std::collections::HashSet<u16> =
        keys.iter().map(|key| cluster.slot_of(key)).collect();
    assert!(slots.len() >= 60, "the keys span {} slots", slots.len());
    let started = Instant::now();
    for key in &keys {
        locks
            .run_locked(key.as_str(), options(), async {})
            .await
            .unwrap();
    }
    let took = started.elapsed();
    let counts: u64 = masters
        .iter()
        .map(|master| common::command_calls(master, "info"))
        .sum();
    let bound = 3 * (2 + took.as_secs());
    eprintln!(
        "{counts} INFO for {} keys in {} slots in {took:?}",
        keys.len(),
        slots.len()
    );
    assert!(
        counts <= bound,
        "{counts} INFO for {} slots in {took:?} (at most {bound})",
        slots.len()
    );
}

/// `field` of `server`'s `INFO replication`.
fn replication_field(server: &RedisServer, field: &str) -> String {
    let info = match server.command(&["INFO", "replication"]) {
        redis::Value::BulkString(info) => String::from_utf8_lossy(&info).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("INFO replication answered {other:?}"),
    };
    info.lines()
        .find_map(|line| line.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no `{field}` in {info}"))
        .trim()
        .to_owned()
}

/// Waits (up to 20 s) until `server`'s `INFO replication` says `field` is `value`.
fn wait_for_replication(server: &RedisServer, field: &str, value: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while replication_field(server, field) != value {
        assert!(Instant::now() < deadline, "`{field}` never became {value}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `INFO` calls `server` served while a client of it held one renewing lease (3 s ttl,
/// renewed every second or so) for `held`: the client's counts of the master's replicas (the
/// client's build and first lock are over before the count starts; its connection is open).
async fn info_calls_while_held(server: &RedisServer, held: Duration) -> u64 {
    let locks = LockClient::builder(&server.url()).build().await.unwrap();
    let options = LockOptions::new()
        .ttl(Duration::from_secs(3))
        .unlimited_renewals();
    locks
        .run_locked("acks:recount:warm", options, async {})
        .await
        .unwrap();
    server.command(&["CONFIG", "RESETSTAT"]);
    let renewed = locks
        .run_locked("acks:recount", options, tokio::time::sleep(held))
        .await;
    renewed.unwrap();
    // The `INFO commandstats` that reads it is not counted in its own answer.
    common::command_calls(server, "info")
}

/// A master without replicas is counted at most every 5 s while the client asks for one (the
/// default), not after every renewal; a master that lost its replica (`repl_backlog_active:1`:
/// it has had one) still every second, so a replica coming back counts soon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_never_had_a_replica_is_counted_every_5_s_at_most() {
    let held = Duration::from_secs(12);
    let never = RedisServer::start();
    assert_eq!(replication_field(&never, "repl_backlog_active"), "0");
    // A master whose replica left: the replica is promoted away (`REPLICAOF NO ONE`).
    let lost = RedisServer::start();
    let replica = RedisServer::start();
    replica.command(&["REPLICAOF", "127.0.0.1", &lost.port().to_string()]);
    wait_for_replication(&replica, "master_link_status", "up");
    wait_for_replication(&lost, "repl_backlog_active", "1");
    replica.command(&["REPLICAOF", "NO", "ONE"]);
    wait_for_replication(&lost, "connected_slaves", "0");

    let (never_calls, lost_calls) = tokio::join!(
        info_calls_while_held(&never, held),
        info_calls_while_held(&lost, held)
    );
    // One count per 5 s started, and one more for a renewal late at the boundary.
    let at_most = held.as_secs().div_ceil(5) + 1;
    eprintln!(
        "INFO calls while a lease was held {held:?}: {never_calls} on a master that never had a \
         replica (at most {at_most}), {lost_calls} on one that lost its replica"
    );
    assert!(
        never_calls <= at_most,
        "{never_calls} INFO in {held:?} on a master without replicas (at most {at_most})"
    );
    // Counted every second while renewals run (one every 1 s or so): well over a count per 5 s,
    // however late the renewals.
    assert!(
        lost_calls > at_most,
        "{lost_calls} INFO in {held:?} on a master that lost its replica (more than {at_most})"
    );
}
