//! Several keys at once (`key = [...]`, `LockClient::run_locked_many`): what every deployment
//! promises of a lock over a set of keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use lockmacro_runtime::{LockContext, LockError, LockOptions, LostReason, MAX_KEYS, protocol};
use testkit::Deployment;
use tokio::sync::oneshot;
use tokio::time::Instant;

fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(ttl_ms))
}

pub async fn several_keys_are_taken_all_or_none(deployment: &impl Deployment) {
    let locks = deployment.client().await;
    // The busy key is the last in slot order: on a cluster the slots before it are taken first
    // and must be given back.
    let mut keys = vec!["transfer:1", "transfer:2", "transfer:3"];
    keys.sort_by_key(|key| protocol::slot_number(key));
    let slots: Vec<u16> = keys.iter().map(|key| protocol::slot_number(key)).collect();
    assert!(
        slots[0] < slots[1] && slots[1] < slots[2],
        "three slots: {slots:?}"
    );
    let busy = keys[2];
    let other = locks.acquire(busy, opts(30_000)).await.unwrap();
    let ran = AtomicBool::new(false);
    let refused = locks
        .run_locked_many([keys[1], keys[0], keys[2]], opts(30_000), async {
            ran.store(true, Ordering::SeqCst)
        })
        .await;
    assert!(
        matches!(&refused, Err(LockError::Busy { key, .. }) if key == busy),
        "{refused:?}"
    );
    assert!(
        !ran.load(Ordering::SeqCst),
        "the work never runs without every key"
    );
    for free in &keys[..2] {
        assert_eq!(deployment.holder(free).await, None, "none taken: `{free}`");
    }
    assert_eq!(
        deployment.holder(busy).await.as_deref(),
        Some(other.token())
    );
    other.release().await.unwrap();

    let seen = locks
        .run_locked_many(keys.clone(), opts(30_000), async {
            let lock = LockContext::current().unwrap();
            let mut holders = Vec::new();
            for key in lock.keys() {
                holders.push(deployment.holder(key).await);
            }
            (
                lock.key().to_owned(),
                lock.keys().to_vec(),
                lock.token().to_owned(),
                holders,
            )
        })
        .await
        .unwrap();
    let (first, listed, token, holders) = seen;
    assert_eq!(first, keys[0]);
    assert_eq!(listed, keys);
    assert!(
        holders
            .iter()
            .all(|holder| holder.as_deref() == Some(&token)),
        "{holders:?}"
    );
    for key in &keys {
        assert_eq!(deployment.holder(key).await, None, "released: `{key}`");
    }
}

pub async fn opposite_orders_never_deadlock(deployment: &impl Deployment) {
    let (one, two) = (deployment.client().await, deployment.another_client().await);
    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU32::new(0));
    let run = |locks: lockmacro_runtime::LockClient, keys: [&'static str; 2]| {
        let (inside, done) = (inside.clone(), done.clone());
        async move {
            for _ in 0..10 {
                let options = opts(5_000).wait(Duration::from_secs(20));
                locks
                    .run_locked_many(keys, options, async {
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                        tokio::task::yield_now().await;
                        inside.store(false, Ordering::SeqCst);
                    })
                    .await
                    .unwrap();
                done.fetch_add(1, Ordering::SeqCst);
            }
        }
    };
    let both = futures_util::future::join(
        tokio::spawn(run(one, ["acct:a", "acct:b"])),
        tokio::spawn(run(two, ["acct:b", "acct:a"])),
    );
    let (a, b) = tokio::time::timeout(Duration::from_secs(60), both)
        .await
        .expect("opposite orders never deadlock");
    a.unwrap();
    b.unwrap();
    assert_eq!(done.load(Ordering::SeqCst), 20);
}

pub async fn a_waiter_for_several_keys_is_woken_by_the_release_of_either(
    deployment: &impl Deployment,
) {
    let locks = deployment.client().await;
    let waiting = deployment.another_client().await;
    for busy in ["pair:x", "pair:y"] {
        let holder = locks.acquire(busy, opts(30_000)).await.unwrap();
        let (running_tx, running) = oneshot::channel();
        let waiter = tokio::spawn({
            let waiting = waiting.clone();
            async move {
                let options = opts(30_000).wait(Duration::from_secs(20));
                waiting
                    .run_locked_many(["pair:x", "pair:y"], options, async move {
                        running_tx.send(Instant::now()).unwrap();
                    })
                    .await
            }
        });
        deployment.waiter_subscribed(busy).await;
        let released_at = Instant::now();
        holder.release().await.unwrap();
        let running_at = running.await.unwrap();
        waiter.await.unwrap().unwrap();
        // The holder's lease had 30 s left: only the release's announcement wakes it this soon.
        let woken = running_at - released_at;
        assert!(
            woken < Duration::from_secs(2),
            "`{busy}`: woken after {woken:?}"
        );
    }
}

pub async fn losing_one_key_loses_the_whole_lock(deployment: &impl Deployment) {
    let locks = deployment.client().await;
    let (started, running) = oneshot::channel();
    let holder = tokio::spawn({
        let locks = locks.clone();
        async move {
            let options = opts(900).unlimited_renewals();
            locks
                .run_locked_many(["lose:1", "lose:2"], options, async move {
                    started.send(()).unwrap();
                    std::future::pending::<()>().await
                })
                .await
        }
    });
    running.await.unwrap();
    let other_owner = deployment
        .impose("lose:2", Duration::from_secs(3_600))
        .await;
    let outcome = tokio::time::timeout(Duration::from_secs(3), holder)
        .await
        .expect("the holder hears of the loss at its next renewal")
        .unwrap();
    assert!(
        matches!(&outcome, Err(LockError::Lost { key, reason: LostReason::Taken }) if key == "lose:1"),
        "{outcome:?}"
    );
    assert_eq!(deployment.holder("lose:2").await, Some(other_owner));
    assert_eq!(
        deployment.holder("lose:1").await,
        None,
        "the keys still held are released on the way out"
    );
}

pub async fn equal_keys_count_once_and_a_lease_lists_its_keys(deployment: &impl Deployment) {
    let locks = deployment.client().await;
    let lease = locks
        .acquire_many(["dup:b", "dup:a", "dup:b", "dup:a"], opts(30_000))
        .await
        .unwrap();
    assert_eq!(lease.keys(), ["dup:b", "dup:a"]);
    assert_eq!(lease.key(), "dup:b");
    assert_eq!(locks.held_leases(), 1, "one lease covers every key");
    let busy = locks.acquire("dup:a", opts(30_000)).await;
    assert!(
        matches!(&busy, Err(LockError::Busy { key, .. }) if key == "dup:a"),
        "{busy:?}"
    );
    lease.release().await.unwrap();
    for key in ["dup:a", "dup:b"] {
        assert_eq!(deployment.holder(key).await, None, "released: `{key}`");
    }
    // A list that is one key after its repeats is a lock on that key.
    let one = locks
        .acquire_many(["dup:c", "dup:c"], opts(30_000))
        .await
        .unwrap();
    assert_eq!(one.keys(), ["dup:c"]);
    one.release().await.unwrap();
}

pub async fn at_most_sixty_four_keys_checked_before_any_io(deployment: &impl Deployment) {
    let locks = deployment.client().await;
    let keys = |n: usize| (0..n).map(|i| format!("batch:{i}")).collect::<Vec<_>>();
    let most = locks
        .run_locked_many(keys(MAX_KEYS), opts(30_000), async {
            LockContext::current().unwrap().keys().len()
        })
        .await
        .unwrap();
    assert_eq!(most, 64);
    assert_eq!(deployment.holder("batch:63").await, None, "released");
    // Refused before any I/O: a client that never connected says so at once.
    let unconnected = deployment.unconnected_client();
    for refused in [
        keys(MAX_KEYS + 1),
        Vec::new(),
        vec!["batch:1".into(), String::new()],
    ] {
        let outcome = unconnected
            .run_locked_many(refused.clone(), opts(30_000), async {})
            .await;
        assert!(
            matches!(outcome, Err(LockError::InvalidKey { .. })),
            "{} keys: {outcome:?}",
            refused.len()
        );
    }
    let shared = locks
        .run_locked_many(["batch:1", "batch:2"], opts(30_000).read(), async {})
        .await;
    assert!(
        matches!(shared, Err(LockError::InvalidOptions { .. })),
        "{shared:?}"
    );
}

pub async fn a_nested_call_on_some_of_the_keys_reenters(deployment: &impl Deployment) {
    let locks = deployment.client().await;
    locks
        .run_locked_many(["nest:1", "nest:2", "nest:3"], opts(30_000), async {
            let token = LockContext::current().unwrap().token().to_owned();
            let inner = locks
                .run_locked_many(["nest:3", "nest:1"], opts(30_000), async {
                    LockContext::current().unwrap().token().to_owned()
                })
                .await
                .expect("a subset re-enters");
            assert_eq!(inner, token);
            let one = locks.run_locked("nest:2", opts(30_000), async {}).await;
            assert!(one.is_ok(), "one of the keys re-enters: {one:?}");
            let partly = locks
                .run_locked_many(["nest:1", "nest:4"], opts(30_000), async {})
                .await;
            assert!(
                matches!(partly, Err(LockError::InvalidOptions { .. })),
                "holding some of a set is refused: {partly:?}"
            );
            assert_eq!(deployment.holder("nest:1").await, Some(token));
        })
        .await
        .unwrap();
    assert_eq!(deployment.holder("nest:1").await, None);
}

/// A forced release of a lease's last key reaches its holder at once, as of its first: the
/// holder's client looks at the forced key alone. It looked at each key still its own first,
/// three looks 200 ms apart, so a holder of eight keys heard of its last key's forced release
/// 2.8 s late (found by the simulator's forced-release incidents).
pub async fn a_forced_release_of_any_key_of_a_list_reaches_its_holder_at_once(
    deployment: &impl Deployment,
) {
    let locks = deployment.client().await;
    let operator = deployment.another_client().await;
    let lease = locks
        .acquire_many(
            (1..=8).map(|n| format!("forced:{n}")),
            opts(60_000).unlimited_renewals(),
        )
        .await
        .unwrap();
    let last = lease.keys().last().expect("eight keys").to_owned();
    let holder = tokio::spawn(async move { lease.run(std::future::pending::<()>()).await });
    deployment
        .waiter_subscribed(protocol::FORCED_RELEASES)
        .await;
    let forced_at = Instant::now();
    assert!(
        operator.force_release(&last).await.unwrap(),
        "{last} was held"
    );
    let outcome = tokio::time::timeout(Duration::from_secs(10), holder)
        .await
        .unwrap_or_else(|_| panic!("the holder of {last} heard nothing within 10 s"))
        .unwrap();
    let heard = forced_at.elapsed();
    assert!(
        matches!(
            outcome,
            Err(LockError::Lost {
                reason: LostReason::Gone,
                ..
            })
        ),
        "{outcome:?}"
    );
    eprintln!("{last}: holder stopped {heard:?} after the forced release");
    // Before the fix, the seven keys before it were looked at for 400 ms each: 2.8 s. The
    // bound leaves a loaded machine room and still tells the two apart.
    assert!(
        heard < Duration::from_millis(1_500),
        "the holder heard of {last}'s forced release {heard:?} after it"
    );
}
