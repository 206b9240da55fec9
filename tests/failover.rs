//! Failovers under load, for Sentinel and Cluster: a master killed, a planned failover, a slot
//! resharded, a replica resynced; and, for callers that wait, a network blip on one Redis. Calls made during the change fail with `LockError::Redis` (or succeed); after it
//! the next calls work within seconds; and no two holders ever overlap unless one of them was
//! told it lost the lock.
//!
//! Figures worth reporting are printed with `eprintln!`, which nextest shows for failing tests
//! and `--no-capture` always.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockmacro_runtime::{LockClient, LockError, LockOptions, LostReason};
use testkit::{Fault, FaultProxy, RedisCluster, RedisSentinel, RedisServer};
use tokio::time::Instant;

/// What one locked call saw.
#[derive(Debug, Clone, Copy)]
struct Hold {
    from: Instant,
    to: Instant,
    /// Finished without being told of a lost lease.
    clean: bool,
}

/// Outcomes of a counter run.
#[derive(Debug, Default)]
struct Tally {
    holds: Vec<Hold>,
    /// Calls that ended `Busy`.
    busy: usize,
    /// Calls that ended with another error: what each said.
    failed: Vec<String>,
    lost: usize,
    /// The longest a call took to get the lock.
    longest_wait: Duration,
}

impl Tally {
    fn errors(&self) -> usize {
        self.busy + self.failed.len()
    }
}

/// Eight tasks of one client take `key` in turn (with a 2 s wait) and each holds it ~5 ms,
/// until `stop`; returns every hold and how the other calls ended.
async fn counter_run(locks: LockClient, key: &'static str, stop: Instant) -> Tally {
    let options = LockOptions::new()
        .ttl(Duration::from_millis(1_500))
        .unlimited_renewals()
        .wait(Duration::from_secs(2));
    counter_run_on(vec![locks], 8, options, key, stop).await
}

/// `tasks` tasks of each client take `key` in turn with `options` and each holds it ~5 ms,
/// until `stop`; returns every hold and how the other calls ended.
async fn counter_run_on(
    clients: Vec<LockClient>,
    tasks: usize,
    options: LockOptions,
    key: &'static str,
    stop: Instant,
) -> Tally {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut running = tokio::task::JoinSet::new();
    for locks in clients {
        for _ in 0..tasks {
            let (locks, tally) = (locks.clone(), tally.clone());
            running.spawn(async move {
                while Instant::now() < stop {
                    let from = std::sync::Mutex::new(None);
                    let called = Instant::now();
                    let outcome = locks
                        .run_locked(key, options, async {
                            *from.lock().unwrap() = Some(Instant::now());
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            Instant::now()
                        })
                        .await;
                    let started = *from.lock().unwrap();
                    let failed = {
                        let mut tally = tally.lock().unwrap();
                        if let Some(from) = started {
                            tally.longest_wait = tally.longest_wait.max(from - called);
                        }
                        match (outcome, started) {
                            (Ok(to), Some(from)) => {
                                tally.holds.push(Hold {
                                    from,
                                    to,
                                    clean: true,
                                });
                                false
                            }
                            (Err(LockError::Lost { .. }), Some(from)) => {
                                tally.lost += 1;
                                let to = Instant::now();
                                tally.holds.push(Hold {
                                    from,
                                    to,
                                    clean: false,
                                });
                                false
                            }
                            (Err(LockError::Busy { .. }), _) => {
                                tally.busy += 1;
                                true
                            }
                            // A wait that ran out in the fault: on an error, or on a grant
                            // confirmed past its lease's deadline (its work never started).
                            (
                                Err(
                                    error @ (LockError::Redis { .. }
                                    | LockError::NoQuorum { .. }
                                    | LockError::Lost {
                                        reason: LostReason::Unconfirmed,
                                        ..
                                    }),
                                ),
                                _,
                            ) => {
                                tally.failed.push(error.to_string());
                                true
                            }
                            (other, _) => panic!("unexpected outcome: {other:?}"),
                        }
                    };
                    if failed {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            });
        }
    }
    while let Some(task) = running.join_next().await {
        task.unwrap();
    }
    Arc::try_unwrap(tally).unwrap().into_inner().unwrap()
}

/// No two clean holds overlap: an overlap is allowed only where one of the two was told `Lost`.
fn assert_no_unreported_overlap(tally: &Tally) {
    let mut holds = tally.holds.clone();
    holds.sort_by_key(|hold| hold.from);
    for pair in holds.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.from < a.to {
            assert!(
                !(a.clean && b.clean),
                "two holders overlapped and neither was told: {a:?} and {b:?}"
            );
        }
    }
}

/// The first moment after `from` at which a call on `key` succeeds, trying every 20 ms.
async fn works_again(locks: &LockClient, key: &str, from: Instant, within: Duration) -> Duration {
    loop {
        let options = LockOptions::new().ttl(Duration::from_secs(1));
        if locks.run_locked(key, options, async {}).await.is_ok() {
            return from.elapsed();
        }
        assert!(
            from.elapsed() < within,
            "`{key}` not usable within {within:?} of the failover"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn summary(tally: &Tally) -> String {
    format!(
        "{} holds, {} told lost, {} busy, {} failed ({:?}), the longest wait {:?}",
        tally.holds.len(),
        tally.lost,
        tally.busy,
        tally.failed.len(),
        tally.failed.iter().take(3).collect::<Vec<_>>(),
        tally.longest_wait,
    )
}

/// Two clients (each its own connections, as two processes), four tasks each, with a 10 s wait:
/// the callers of the "Failovers are waits" promise.
async fn waiting_callers(
    builder: impl Fn() -> lockmacro_runtime::LockClientBuilder,
) -> Vec<LockClient> {
    let mut clients = Vec::new();
    for _ in 0..2 {
        let client = builder()
            .scan_interval(Duration::from_millis(100))
            .connect_timeout(Duration::from_millis(500))
            .response_timeout(Duration::from_millis(500))
            .build()
            .await
            .unwrap();
        clients.push(client);
    }
    clients
}

fn waiting_options() -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_millis(1_500))
        .unlimited_renewals()
        .wait(Duration::from_secs(10))
}

/// What a run of waiting callers through a fault must show: no error and no `Busy` (the
/// deployment recovered well inside the 10 s wait), no unreported overlap, and the lock passed
/// on before and after the fault.
fn assert_rode_it_out(what: &str, tally: &Tally) {
    eprintln!("{what}: {}", summary(tally));
    assert_no_unreported_overlap(tally);
    assert_eq!(
        tally.errors(),
        0,
        "{what}: waiting callers saw the fault: {}",
        summary(tally)
    );
    assert!(tally.holds.len() > 50, "{what}: {}", summary(tally));
}

/// Sentinel, the master killed: callers with a 10 s wait ride out the failover (about 3-5 s
/// here) as a wait; none gets an error (222 of 1 667 calls did before, issue 47).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_killed_is_a_wait_for_waiting_callers() {
    let mut deployment = RedisSentinel::start();
    let url = deployment.url();
    let clients = waiting_callers(|| LockClient::builder(&url)).await;
    let stop = Instant::now() + Duration::from_secs(10);
    let run = tokio::spawn(counter_run_on(
        clients,
        4,
        waiting_options(),
        "rides:sentinel",
        stop,
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = deployment.kill_master_now();
    let failover = tokio::task::spawn_blocking(move || {
        deployment.wait_for_failover(killed);
        deployment
    });
    let tally = run.await.unwrap();
    let _deployment = failover.await.unwrap();
    assert_rode_it_out("sentinel, master killed", &tally);
}

/// Sentinel, the replica lost for 4 s and then restarted empty (a full resync): grants that
/// no replica acknowledges are undone and looked at again within the wait, so waiting callers
/// see no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_replica_lost_and_resynced_is_a_wait_for_waiting_callers() {
    let deployment = Arc::new(Mutex::new(RedisSentinel::start()));
    let url = deployment.lock().unwrap().url();
    let clients = waiting_callers(|| LockClient::builder(&url)).await;
    let stop = Instant::now() + Duration::from_secs(9);
    let run = tokio::spawn(counter_run_on(
        clients,
        4,
        waiting_options(),
        "rides:resync",
        stop,
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let fault = tokio::task::spawn_blocking({
        let deployment = deployment.clone();
        move || {
            let replica = {
                let mut deployment = deployment.lock().unwrap();
                let master = deployment.master().port();
                let replica = deployment
                    .data
                    .iter()
                    .position(|node| node.port() != master)
                    .unwrap();
                deployment.data[replica].kill();
                replica
            };
            std::thread::sleep(Duration::from_secs(4));
            deployment.lock().unwrap().restart_as_replica(replica);
        }
    });
    fault.await.unwrap();
    let tally = run.await.unwrap();
    assert_rode_it_out("sentinel, replica lost and resynced", &tally);
}

/// Cluster, the key's master killed: its replica takes over and callers with a 10 s wait ride
/// it out with no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_killed_is_a_wait_for_waiting_callers() {
    let mut cluster = RedisCluster::start(3, 1);
    let seeds = cluster.seed_urls();
    let clients = waiting_callers(|| LockClient::cluster_builder(&seeds)).await;
    let stop = Instant::now() + Duration::from_secs(10);
    let run = tokio::spawn(counter_run_on(
        clients,
        4,
        waiting_options(),
        "rides:cluster",
        stop,
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = cluster.kill_master_now("rides:cluster");
    let failover = tokio::task::spawn_blocking(move || {
        cluster.wait_for_failover("rides:cluster", killed);
        cluster
    });
    let tally = run.await.unwrap();
    let _cluster = failover.await.unwrap();
    assert_rode_it_out("cluster, master killed", &tally);
}

/// Sentinel: the master is killed under a counter run; the client finds the promoted replica
/// through the sentinels within seconds, and no holders overlap unreported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_master_killed_under_load() {
    let mut deployment = RedisSentinel::start();
    let locks = LockClient::builder(&deployment.url())
        .scan_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let stop = Instant::now() + Duration::from_secs(8);
    let run = tokio::spawn(counter_run(locks.clone(), "failover:sentinel", stop));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = deployment.kill_master_now();
    let killed_at = Instant::now();
    let failover = tokio::task::spawn_blocking(move || {
        deployment.wait_for_failover(killed);
        deployment
    });
    let back = works_again(
        &locks,
        "failover:sentinel:probe",
        killed_at,
        Duration::from_secs(15),
    )
    .await;
    let tally = run.await.unwrap();
    let _deployment = failover.await.unwrap();
    eprintln!(
        "sentinel: usable again {back:?} after the master was killed; {}",
        summary(&tally)
    );
    assert_no_unreported_overlap(&tally);
    assert!(tally.holds.len() > 50, "{}", summary(&tally));
}

/// Sentinel: a planned failover (`SENTINEL FAILOVER`) demotes a live master to a replica; the
/// client follows `+switch-master` (or the demoted master's `READONLY`) to the new master within
/// seconds, and a lease held across the failover is kept on the new master or reported `Lost`,
/// never kept on the demoted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_planned_failover_moves_the_client_to_the_new_master() {
    let deployment = RedisSentinel::start();
    let locks = LockClient::builder(&deployment.url())
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap();
    let old = deployment.master().port();
    let across = LockOptions::new()
        .ttl(Duration::from_millis(1_000))
        .unlimited_renewals();
    let held = locks.acquire("planned:held", across).await.unwrap();
    let switched_at = Instant::now();
    deployment.sentinels[0].command(&["SENTINEL", "FAILOVER", testkit::SENTINEL_SERVICE]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while deployment.master().port() == old {
        assert!(Instant::now() < deadline, "the sentinels did not fail over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Writes reach the new master once the client has heard of the switch.
    let moved = loop {
        let lease = locks.acquire("planned:probe", LockOptions::new()).await;
        if let Ok(lease) = &lease {
            let stored = deployment.master().command(&["GET", "planned:probe"]);
            if token_in(stored).as_deref() == Some(lease.token()) {
                break switched_at.elapsed();
            }
        }
        assert!(
            switched_at.elapsed() < Duration::from_secs(10),
            "the client never moved: {lease:?}"
        );
        drop(lease);
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    eprintln!("sentinel: locks land on the new master {moved:?} after a planned failover");
    let outcome = held
        .run(tokio::time::sleep(Duration::from_millis(1_500)))
        .await;
    match outcome {
        Ok(()) => {
            let stored = deployment.master().command(&["GET", "planned:held"]);
            assert_eq!(token_in(stored).as_deref(), Some(held.token()));
        }
        Err(LockError::Lost { .. }) => {}
        Err(other) => panic!("a lease across the failover: {other:?}"),
    }
}

/// Cluster: the master of the key is killed under a counter run; its replica takes over and the
/// client follows within seconds, with no unreported overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_master_killed_under_load() {
    let mut cluster = RedisCluster::start(3, 1);
    let locks = LockClient::cluster_builder(cluster.seed_urls())
        .scan_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let stop = Instant::now() + Duration::from_secs(8);
    let run = tokio::spawn(counter_run(locks.clone(), "failover:cluster", stop));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = cluster.kill_master_now("failover:cluster");
    let killed_at = Instant::now();
    let kill = tokio::task::spawn_blocking(move || {
        cluster.wait_for_failover("failover:cluster", killed);
        cluster
    });
    let back = works_again(
        &locks,
        "failover:cluster",
        killed_at,
        Duration::from_secs(15),
    )
    .await;
    let tally = run.await.unwrap();
    let _cluster = kill.await.unwrap();
    eprintln!(
        "cluster: usable again {back:?} after the key's master was killed; {}",
        summary(&tally)
    );
    assert_no_unreported_overlap(&tally);
    assert!(tally.holds.len() > 50, "{}", summary(&tally));
}

/// Cluster: a planned `CLUSTER FAILOVER` and a slot migration (`ASK` while it runs, `MOVED`
/// after) under a counter run: calls succeed or fail with `Redis`, none hangs or panics, holders
/// never overlap unreported, and a lease held across the migration keeps being renewed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_planned_failover_and_reshard_under_load() {
    let cluster = Arc::new(RedisCluster::start(3, 1));
    let locks = LockClient::cluster_builder(cluster.seed_urls())
        .scan_interval(Duration::from_millis(100))
        .response_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap();
    let long = LockOptions::new()
        .ttl(Duration::from_millis(900))
        .unlimited_renewals();
    let across = locks.acquire("reshard:held", long).await.unwrap();
    let stop = Instant::now() + Duration::from_secs(8);
    let run = tokio::spawn(counter_run(locks.clone(), "reshard:counted", stop));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let changes = tokio::task::spawn_blocking({
        let cluster = cluster.clone();
        move || {
            cluster.fail_over("reshard:counted");
            for key in ["reshard:counted", "reshard:held"] {
                let slot = cluster.slot_of(key);
                let from = cluster.master_of(key).port();
                let to = cluster
                    .masters()
                    .into_iter()
                    .find(|master| master.port() != from)
                    .map(|master| master.port())
                    .unwrap();
                let migration = cluster.begin_migration(slot, to);
                std::thread::sleep(Duration::from_millis(300));
                migration.finish();
            }
        }
    });
    changes.await.unwrap();
    let tally = run.await.unwrap();
    eprintln!("cluster reshard: {}", summary(&tally));
    assert_no_unreported_overlap(&tally);
    assert!(tally.holds.len() > 50, "{}", summary(&tally));
    let renewals_before = across.renewals();
    let outcome = across
        .run(tokio::time::sleep(Duration::from_millis(1_500)))
        .await;
    assert!(
        outcome.is_ok(),
        "the lease held across the migration: {outcome:?}"
    );
    assert!(across.renewals() > renewals_before);
    across.release().await.unwrap();
}

/// The token of the lock value a `GET` answered, if any.
fn token_in(stored: redis::Value) -> Option<String> {
    match stored {
        redis::Value::BulkString(value) => Some(
            lockmacro_runtime::protocol::holder_token(&String::from_utf8_lossy(&value)).to_owned(),
        ),
        _ => None,
    }
}

/// One Redis behind a link that blackholes everything for 1.5 s and then resets its
/// connections (a blip, as when a middlebox drops its state): callers with a 10 s wait ride it
/// out with no error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_blip_is_a_wait_for_waiting_callers() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let url = proxy.url();
    let clients = waiting_callers(|| LockClient::builder(&url)).await;
    let stop = Instant::now() + Duration::from_secs(6);
    let run = tokio::spawn(counter_run_on(
        clients,
        4,
        waiting_options(),
        "rides:blip",
        stop,
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    proxy.set(Fault::Blackhole);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    proxy.heal();
    proxy.reset_all();
    let tally = run.await.unwrap();
    assert_rode_it_out("one Redis, a network blip", &tally);
}
