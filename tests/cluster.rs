//! What is particular to Redis Cluster: a script cache emptied on one node, keys whose braces
//! cannot keep the lock's own names in its slot, renewals spread over the masters, and locks over
//! keys in several slots.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};
use testkit::RedisCluster;

async fn client(cluster: &RedisCluster) -> LockClient {
    LockClient::cluster_builder(cluster.seed_urls())
        .scan_interval(Duration::from_millis(100))
        .build()
        .await
        .unwrap()
}

fn script_loads(node: &testkit::RedisServer) -> u64 {
    let info: String = redis::from_redis_value(node.command(&["INFO", "commandstats"])).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_script|load:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// A node that forgot the scripts (`SCRIPT FLUSH`, or a replica promoted with an empty cache)
/// answers `NOSCRIPT`: the scripts are loaded on that node alone and renewals go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noscript_on_one_node_is_handled_on_that_node_alone() {
    let cluster = RedisCluster::start(3, 0);
    let locks = client(&cluster).await;
    let key = "flushed:1";
    let flushed = cluster.master_of(key);
    let others: Vec<_> = cluster
        .masters()
        .into_iter()
        .filter(|master| master.port() != flushed.port())
        .collect();
    let loads_before: Vec<u64> = others.iter().map(|node| script_loads(node)).collect();
    assert_eq!(flushed.command(&["SCRIPT", "FLUSH"]), redis::Value::Okay);
    let renewals = locks
        .run_locked(
            key,
            LockOptions::new()
                .ttl(Duration::from_millis(600))
                .unlimited_renewals(),
            async {
                tokio::time::sleep(Duration::from_millis(1_500)).await;
                LockContext::current().unwrap().renewals()
            },
        )
        .await
        .expect("renewals survive the flushed cache");
    assert!(renewals >= 2, "{renewals}");
    assert!(
        script_loads(flushed) > 0,
        "the flushed node loaded the scripts again"
    );
    let loads_after: Vec<u64> = others.iter().map(|node| script_loads(node)).collect();
    assert_eq!(loads_before, loads_after, "other nodes were left alone");
}

/// A key whose braces would put its fencing counter or release channel in another slot is
/// refused before any I/O would take it, with a reason, never a CROSSSLOT error; keys with one
/// tag or none work, fencing and waiting included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_placed_in_their_slot_or_refused() {
    let cluster = RedisCluster::start(3, 0);
    let locks = client(&cluster).await;
    let full = LockOptions::new()
        .ttl(Duration::from_secs(5))
        .fencing(true)
        .wait(Duration::from_millis(200));
    for key in ["orders:42", "{user:7}:cart", "x{y}z", "ünïcode:☃", "{a}"] {
        let fence = locks
            .run_locked(key, full, async {
                LockContext::current().unwrap().fencing_token()
            })
            .await
            .unwrap_or_else(|err| panic!("{key}: {err}"));
        assert!(fence.is_some(), "{key}");
    }
    for key in ["a{}b{c}", "{}{x}", "a}b"] {
        let outcome = locks.run_locked(key, full, async {}).await;
        match outcome {
            Err(LockError::InvalidKey { reason, .. }) => {
                assert!(reason.contains("slot"), "{reason}")
            }
            other => panic!("{key}: expected InvalidKey, got {other:?}"),
        }
    }
}

/// A thousand leases over three masters are renewed in each tick: every master runs the renewal
/// script for its own keys, and no lease lapses. The ttl leaves room for a starved machine: beside
/// four busy loops on two cores, taking a thousand locks took up to 0.65 s from send to answer, so
/// a 0.9 s lease began with 0.25 s left and its holder was (rightly) cancelled as `Lost` at its
/// local deadline before a renewal could be confirmed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_leases_over_three_masters_are_renewed_together() {
    let cluster = RedisCluster::start(3, 0);
    let locks = client(&cluster).await;
    let options = LockOptions::new()
        .ttl(Duration::from_millis(1_500))
        .unlimited_renewals();
    let asked_again = Arc::new(AtomicUsize::new(0));
    let mut holders = tokio::task::JoinSet::new();
    for n in 0..1_000 {
        let (locks, asked_again) = (locks.clone(), asked_again.clone());
        holders.spawn(async move {
            loop {
                let ran = AtomicBool::new(false);
                let outcome = locks
                    .run_locked(format!("spread:{n}"), options, async {
                        ran.store(true, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_secs(3)).await;
                        LockContext::current().unwrap().renewals()
                    })
                    .await;
                // A grant confirmed past its lease's deadline on a starved machine starts no
                // work (`Lost`, the body never ran): that caller was refused the lease, not
                // lost it, and asks again. What is tested is that a lease held never lapses.
                if outcome.is_err() && !ran.load(Ordering::SeqCst) {
                    asked_again.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                return outcome;
            }
        });
    }
    let mut fewest = u32::MAX;
    while let Some(outcome) = holders.join_next().await {
        fewest = fewest.min(outcome.unwrap().expect("no lease lapses"));
    }
    eprintln!(
        "1 000 leases over three masters: fewest renewals {fewest}; {} acquires asked again",
        asked_again.load(Ordering::SeqCst)
    );
    assert!(
        fewest >= 2,
        "every lease renewed at least twice, fewest {fewest}"
    );
}

/// `cluster_builder` on a plain server: the server answered, so the error says it is not a
/// cluster (and to use `builder`), not that it cannot be reached.
#[tokio::test]
async fn cluster_builder_on_a_plain_server_says_it_is_not_a_cluster() {
    let server = testkit::RedisServer::start();
    let error = LockClient::cluster_builder([server.url()])
        .build()
        .await
        .expect_err("not a cluster");
    let message = error.to_string();
    assert!(message.contains("not a cluster"), "{message}");
    assert!(message.contains("LockClient::builder"), "{message}");
    assert!(!message.contains("cannot reach"), "{message}");
}

fn evalsha_calls(node: &testkit::RedisServer) -> u64 {
    let info: String = redis::from_redis_value(node.command(&["INFO", "commandstats"])).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// A lock over several keys: keys that share a slot (one hash tag) are taken in one script call
/// and released in one; keys across slots take one call per slot, and a busy slot gives back
/// the slots taken before it, whatever order the caller named them in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_keys_take_one_call_per_slot_and_a_busy_slot_undoes_the_others() {
    let cluster = RedisCluster::start(3, 0);
    let locks = client(&cluster).await;
    let tagged = ["{user7}:cart", "{user7}:wallet", "{user7}:profile"];
    let node = cluster.master_of(tagged[0]);
    let before = evalsha_calls(node);
    let lease = locks
        .acquire_many(tagged, LockOptions::new())
        .await
        .unwrap();
    lease.release().await.unwrap();
    assert_eq!(
        evalsha_calls(node) - before,
        2,
        "one call to take, one to release"
    );

    // Four keys in four slots; the busy one is the last in slot order.
    let mut keys = ["spread:a", "spread:b", "spread:c", "spread:d"];
    keys.sort_by_key(|key| cluster.slot_of(key));
    let slots = keys.map(|key| cluster.slot_of(key));
    assert!(slots.windows(2).all(|pair| pair[0] < pair[1]), "{slots:?}");
    let busy = keys[3];
    let other = locks.acquire(busy, LockOptions::new()).await.unwrap();
    for named in [keys, [keys[3], keys[2], keys[1], keys[0]]] {
        let refused = locks.acquire_many(named, LockOptions::new()).await;
        assert!(
            matches!(&refused, Err(LockError::Busy { key, .. }) if key == busy),
            "{refused:?}"
        );
        for key in &keys[..3] {
            let held: Option<String> =
                redis::from_redis_value(cluster.master_of(key).command(&["GET", key])).unwrap();
            assert_eq!(held, None, "`{key}` given back before Busy was answered");
        }
    }
    other.release().await.unwrap();
    let lease = locks.acquire_many(keys, LockOptions::new()).await.unwrap();
    assert_eq!(lease.keys(), keys);
    lease.release().await.unwrap();
}
