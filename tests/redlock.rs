//! Redlock over independent masters, under real faults: frozen masters (SIGSTOP), a master
//! killed or restarted without persistence, foreign values on every subset of masters, three
//! processes on one counter; availability while a majority answers, and leases that spread.
//!
//! Figures worth reporting are printed with `eprintln!`, which nextest shows for failing tests
//! and `--no-capture` always.

mod common;

use std::time::Duration;

use lockmacro_runtime::{
    Lease, LockClient, LockContext, LockError, LockOptions, protocol, redis_lock,
};
use testkit::{Deployment, RedisServer, Redlock};
use tokio::time::Instant;

async fn client(quorum: &Redlock) -> LockClient {
    LockClient::redlock_builder(quorum.urls())
        .scan_interval(Duration::from_millis(100))
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .build()
        .await
        .unwrap()
}

fn opts(ttl_ms: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_millis(ttl_ms))
}

/// The ttl of a lease renewed while only a bare majority of its masters answers: each renewal
/// then needs every one of them to answer within the client's 300 ms response timeout. A lease
/// of 600 or 900 ms (renewed at its third, so two tries before it lapses) lapsed now and then
/// beside a CPU hog; 3 s leaves several tries. A lease spreads at its next renewal, 1 s on.
const BARE_MAJORITY_TTL_MS: u64 = 3_000;

fn value(server: &RedisServer, key: &str) -> Option<String> {
    redis::from_redis_value(server.command(&["GET", key])).unwrap()
}

/// The token of the lock under `key` on `server`, marks left out.
fn holder(server: &RedisServer, key: &str) -> Option<String> {
    value(server, key)
        .map(|value| protocol::holder_token(&value).to_owned())
        .filter(|token| !token.is_empty())
}

/// Another owner's lock value (a lock of another process, not of this test's client).
fn another_owners() -> String {
    protocol::Origin::new("another-host", 1, "another-owner").value(&"f".repeat(32), 0)
}

/// One or two frozen masters of five cost nothing: locks are taken, renewed and released on the
/// other three or four.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_or_two_frozen_masters_cost_nothing() {
    let quorum = Redlock::start(5);
    let locks = client(&quorum).await;
    for frozen in [1, 2] {
        for server in &quorum.servers[..frozen] {
            server.pause();
        }
        let renewals = locks
            .run_locked(
                format!("frozen:{frozen}"),
                // Two frozen leave a bare majority: see `BARE_MAJORITY_TTL_MS`. Renewed about
                // every 500 ms, four times in the hold.
                opts(1_500).unlimited_renewals(),
                async {
                    tokio::time::sleep(Duration::from_millis(2_500)).await;
                    LockContext::current().unwrap().renewals()
                },
            )
            .await
            .unwrap_or_else(|err| panic!("{frozen} frozen: {err}"));
        eprintln!("{frozen} frozen of 5: {renewals} renewals in 2.5 s");
        assert!(renewals >= 2, "{frozen} frozen: {renewals} renewals");
        for server in &quorum.servers[frozen..] {
            assert_eq!(value(server, &format!("frozen:{frozen}")), None, "released");
        }
        for server in &quorum.servers[..frozen] {
            server.resume();
        }
    }
}

/// Three frozen masters of five leave no majority: the call fails with `NoQuorum` within its
/// bounds (never `Busy`, never taken), and nothing is left on the two that answered, then or
/// after the others thaw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_frozen_masters_are_no_quorum_and_leave_nothing_behind() {
    let quorum = Redlock::start(5);
    let locks = client(&quorum).await;
    for server in &quorum.servers[..3] {
        server.pause();
    }
    let started = Instant::now();
    let outcome = locks.run_locked("minority:1", opts(2_000), async {}).await;
    let took = started.elapsed();
    match outcome {
        Err(LockError::NoQuorum {
            ref key,
            answered,
            needed,
        }) => {
            assert_eq!(key, "minority:1");
            assert_eq!(needed, 3);
            assert!(answered <= 2, "{answered}");
        }
        other => panic!("expected NoQuorum, got {other:?}"),
    }
    eprintln!("3 of 5 masters frozen: NoQuorum after {took:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    for server in &quorum.servers[3..] {
        assert_eq!(
            value(server, "minority:1"),
            None,
            "undone on the masters that took it"
        );
    }
    for server in &quorum.servers[..3] {
        server.resume();
    }
    // The frozen masters ran the SET late, if at all: the undo reaches them too.
    let deadline = Instant::now() + Duration::from_secs(3);
    while quorum
        .servers
        .iter()
        .any(|server| value(server, "minority:1").is_some())
    {
        assert!(Instant::now() < deadline, "a late SET was never undone");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A master restarted without persistence mid-hold forgets the lease; the other four still
/// agree, so the lease lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_mid_hold_costs_the_lease_nothing() {
    let mut quorum = Redlock::start(5);
    let locks = client(&quorum).await;
    let lease = locks
        .acquire("restarted:1", opts(800).unlimited_renewals())
        .await
        .unwrap();
    quorum.servers[0].restart();
    let outcome = lease
        .run(tokio::time::sleep(Duration::from_millis(2_000)))
        .await;
    assert!(outcome.is_ok(), "{outcome:?}");
    assert_eq!(
        quorum.holder("restarted:1").await.as_deref(),
        Some(lease.token())
    );
    lease.release().await.unwrap();
}

/// A foreign value set beforehand on every one of the 32 subsets of five masters: the lock is
/// taken exactly when a majority is free (as redsync's subset test), `Busy` otherwise, and
/// nothing of ours is left behind either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_values_on_every_subset_of_masters() {
    let quorum = Redlock::start(5);
    let locks = client(&quorum).await;
    for subset in 0u32..32 {
        let key = format!("subset:{subset}");
        let held = (0..5).filter(|i| subset & (1 << i) != 0).count();
        for (i, server) in quorum.servers.iter().enumerate() {
            if subset & (1 << i) != 0 {
                server.command(&["SET", &key, &another_owners(), "PX", "30000"]);
            }
        }
        let outcome = locks.acquire(key.as_str(), opts(5_000)).await;
        if held <= 2 {
            let lease =
                outcome.unwrap_or_else(|err| panic!("free on a majority ({held} held): {err}"));
            lease.release().await.unwrap();
        } else {
            assert!(
                matches!(outcome, Err(LockError::Busy { .. })),
                "held on {held}: {outcome:?}"
            );
        }
        // A release is confirmed on a majority; the other masters finish in the background.
        for (i, server) in quorum.servers.iter().enumerate() {
            let expected = (subset & (1 << i) != 0).then(another_owners);
            let deadline = Instant::now() + Duration::from_secs(2);
            while value(server, &key) != expected && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            assert_eq!(
                value(server, &key),
                expected,
                "subset {subset:05b}, master {i}"
            );
        }
    }
}

/// An even number of masters, or fewer than three, is refused when the client is built.
#[tokio::test]
async fn an_even_number_or_fewer_than_three_masters_is_a_config_error() {
    for n in [0, 1, 2, 4, 6] {
        let urls: Vec<String> = (0..n)
            .map(|i| format!("redis://127.0.0.1:{}", 1 + i))
            .collect();
        match LockClient::redlock_builder(&urls).build_lazy() {
            Err(LockError::Config { message }) => {
                assert!(message.contains("odd number"), "{n}: {message}");
            }
            other => panic!("{n} masters: expected Config, got {other:?}"),
        }
    }
}

/// Three processes of sixteen tasks each increment one counter non-atomically under a Redlock
/// over three masters: the count is exact and no two critical sections overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_processes_on_one_counter_never_overlap() {
    let quorum = Redlock::start(3);
    common::count_in_three_processes(&format!("redlock:{}", quorum.urls().join(",")));
    assert_eq!(
        value(&quorum.servers[0], "jepsen:counter").as_deref(),
        Some("480"),
        "lost updates mean two holders at once"
    );
}

/// Sixteen callers of one client queue for one key over three masters: each gets the lock in
/// turn (a release hands it to the next of them on every master), none splits a majority with
/// another of its own client, so none gives up as `Busy`; and never two hold it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_waiters_never_split_a_majority_between_them() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    let quorum = Redlock::start(3);
    let locks = client(&quorum).await;
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (locks, inside, overlaps) = (locks.clone(), inside.clone(), overlaps.clone());
        tasks.spawn(async move {
            let options = opts(5_000).wait(Duration::from_secs(10));
            for _ in 0..25 {
                locks
                    .run_locked("contended:1", options, async {
                        if inside.swap(true, Ordering::SeqCst) {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        tokio::task::yield_now().await;
                        inside.store(false, Ordering::SeqCst);
                    })
                    .await?;
            }
            Ok::<_, LockError>(())
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.unwrap()
            .expect("every waiter of one client gets the lock in its wait");
    }
    let took = started.elapsed();
    eprintln!(
        "400 acquisitions by 16 waiters of one client over 3 masters in {took:?} ({:.0}/s)",
        400.0 / took.as_secs_f64()
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
}

/// A lock over several keys on five masters: each master takes the whole set or none of it, and
/// the majority rule is as for one key. A foreign value on one key of two masters costs nothing
/// (the other three take the set, the two take none of it); on three masters the set is busy,
/// naming that key, and nothing is left taken anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_master_takes_the_whole_set_or_none_of_it() {
    let quorum = Redlock::start(5);
    let locks = client(&quorum).await;
    let keys = ["set:a", "set:b", "set:c"];
    for server in &quorum.servers[..2] {
        server.command(&["SET", "set:b", &another_owners(), "PX", "30000"]);
    }
    let lease = locks.acquire_many(keys, opts(5_000)).await.unwrap();
    for server in &quorum.servers[2..] {
        for key in keys {
            assert_eq!(holder(server, key).as_deref(), Some(lease.token()), "{key}");
        }
    }
    for server in &quorum.servers[..2] {
        for key in ["set:a", "set:c"] {
            assert_eq!(
                value(server, key),
                None,
                "all or none on each master: {key}"
            );
        }
    }
    lease.release().await.unwrap();
    for server in &quorum.servers {
        for key in ["set:a", "set:c"] {
            assert_eq!(value(server, key), None, "released: {key}");
        }
    }

    quorum.servers[2].command(&["SET", "set:b", &another_owners(), "PX", "30000"]);
    let busy = locks.acquire_many(keys, opts(5_000)).await;
    assert!(
        matches!(&busy, Err(LockError::Busy { key, .. }) if key == "set:b"),
        "{busy:?}"
    );
    for server in &quorum.servers {
        for key in ["set:a", "set:c"] {
            assert_eq!(value(server, key), None, "nothing left taken: {key}");
        }
    }
}

/// An attempt that splits the live masters (one master down, ours on one, another's on the
/// other) is no `NoQuorum`: failing fast it is `Busy` with a short `retry_after`, and nothing of
/// it is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_attempt_is_busy_with_a_short_retry_never_no_quorum() {
    let mut quorum = Redlock::start(3);
    let locks = client(&quorum).await;
    quorum.servers[2].kill();
    quorum.servers[1].command(&["SET", "split:1", &another_owners(), "PX", "30000"]);
    let outcome = locks.acquire("split:1", opts(5_000)).await;
    match outcome {
        Err(LockError::Busy {
            ref key,
            retry_after: Some(retry_after),
        }) => {
            assert_eq!(key, "split:1");
            assert!(retry_after <= Duration::from_millis(100), "{retry_after:?}");
        }
        other => panic!("expected Busy with a short retry_after, got {other:?}"),
    }
    assert_eq!(value(&quorum.servers[0], "split:1"), None, "undone");
}

/// One master of three down, three clients (each on its own connections, as processes) of
/// eight tasks each contend for one key with `wait`: every call gets the lock, none ends
/// `NoQuorum` or `Busy` (their attempts split the two live masters again and again; each split
/// is "look again soon"), and never two hold it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_master_down_waiters_of_several_clients_all_get_the_lock() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    let mut quorum = Redlock::start(3);
    quorum.servers[2].kill();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(client(&quorum).await);
    }
    let inside = Arc::new(AtomicBool::new(false));
    let overlaps = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for locks in &clients {
        for _ in 0..8 {
            let (locks, inside, overlaps) = (locks.clone(), inside.clone(), overlaps.clone());
            tasks.spawn(async move {
                let options = opts(2_000).wait(Duration::from_secs(20));
                for _ in 0..10 {
                    locks
                        .run_locked("outage:1", options, async {
                            if inside.swap(true, Ordering::SeqCst) {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            inside.store(false, Ordering::SeqCst);
                        })
                        .await?;
                }
                Ok::<_, LockError>(())
            });
        }
    }
    while let Some(task) = tasks.join_next().await {
        task.unwrap()
            .expect("every waiter gets the lock while a majority answers");
    }
    eprintln!(
        "240 acquisitions by 3 clients x 8 tasks, one master of 3 down: {:?}",
        started.elapsed()
    );
    assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two holders at once");
}

struct FairJobs {
    locks: LockClient,
}

impl FairJobs {
    #[redis_lock(prefix = "fair-jobs", key = id, fair = true, wait = "1s", client = self.locks)]
    async fn run(&self, id: u32) -> Result<u32, LockError> {
        Ok(id)
    }
}

/// `fair = true` is refused on Redlock at once, from the attribute and programmatically, with
/// a reason (the masters' queues order waiters differently); nothing is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_is_refused_from_the_attribute_and_programmatically() {
    let quorum = Redlock::start(3);
    let locks = client(&quorum).await;
    let from_the_attribute = FairJobs {
        locks: locks.clone(),
    }
    .run(7)
    .await;
    let programmatic = locks
        .acquire("fair-jobs:8", opts(5_000).fair(true))
        .await
        .map(drop);
    for refused in [from_the_attribute.map(drop), programmatic] {
        match refused {
            Err(LockError::InvalidOptions { message }) => {
                assert!(message.contains("`fair = true`"), "{message}");
                assert!(message.contains("order"), "says why: {message}");
            }
            other => panic!("expected InvalidOptions, got {other:?}"),
        }
    }
    for server in &quorum.servers {
        assert_eq!(value(server, "fair-jobs:7"), None);
        assert_eq!(value(server, "fair-jobs:8"), None);
    }
}

/// Waits (polling the servers, bounded) until every master of `quorum` holds `lease` under its
/// key, and returns how long that took: a lease spreading is the watchdog's doing, in the
/// background, at the lease's next renewal. A failure says what became of the lease, so a lease
/// that lapsed (its renewals failed) is told from one that never spread.
async fn spread_to_all(quorum: &Redlock, lease: &Lease, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let held: Vec<Option<String>> = quorum
            .servers
            .iter()
            .map(|s| holder(s, lease.key()))
            .collect();
        if held
            .iter()
            .all(|held| held.as_deref() == Some(lease.token()))
        {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "the lease did not spread to every master within {within:?}: {held:?}; the lease: \
             lost {}, {} renewals, {:?} left",
            lease.is_lost(),
            lease.renewals(),
            lease.time_left(),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A master that accepts connections and never answers (SIGSTOP) before the client is built:
/// `build()` returns once the other two connected, well within one connect timeout, and every
/// acquire is taken on the two that answer without waiting for the silent one (before: `build()`
/// took three connect timeouts, and about one acquire in fifty waited a whole connect timeout,
/// past its lease's validity). Once the master answers again, the lease spreads to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_master_costs_the_build_and_the_acquires_nothing() {
    let quorum = Redlock::start(3);
    quorum.servers[2].pause();
    let connect_timeout = Duration::from_secs(2);
    let started = Instant::now();
    let locks = LockClient::redlock_builder(quorum.urls())
        .scan_interval(Duration::from_millis(100))
        .connect_timeout(connect_timeout)
        .response_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("a majority connects");
    let build = started.elapsed();
    assert!(build < connect_timeout, "build took {build:?}");
    let mut took = Vec::new();
    for i in 0..60 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        let lease = locks
            .acquire(format!("silent:{i}"), opts(2_000))
            .await
            .unwrap_or_else(|err| panic!("acquire {i}: {err}"));
        took.push(started.elapsed());
        lease.release().await.unwrap();
    }
    took.sort_unstable();
    eprintln!(
        "one silent master of 3: build {build:?}; 60 acquires: median {:?}, max {:?}",
        took[30], took[59]
    );
    assert!(took[59] < Duration::from_secs(1), "{:?}", took[59]);

    let lease = locks
        .acquire(
            "silent:spread",
            opts(BARE_MAJORITY_TTL_MS).unlimited_renewals(),
        )
        .await
        .unwrap();
    quorum.servers[2].resume();
    let spread = spread_to_all(&quorum, &lease, Duration::from_secs(10)).await;
    eprintln!("the lease spread to the master that answers again in {spread:?}");
    lease.release().await.unwrap();
}

/// A lease taken while one master of three was down is on all three once that master is back
/// (restarted empty) and one renewal has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_on_a_bare_majority_spreads_to_a_master_that_comes_back() {
    let mut quorum = Redlock::start(3);
    let locks = client(&quorum).await;
    quorum.servers[2].kill();
    let lease = locks
        .acquire("spread:1", opts(BARE_MAJORITY_TTL_MS).unlimited_renewals())
        .await
        .unwrap();
    assert_eq!(
        holder(&quorum.servers[0], "spread:1").as_deref(),
        Some(lease.token())
    );
    quorum.servers[2].restart();
    let spread = spread_to_all(&quorum, &lease, Duration::from_secs(10)).await;
    eprintln!("the lease spread to the restarted master in {spread:?}");
    lease.release().await.unwrap();
    for server in &quorum.servers {
        assert_eq!(value(server, "spread:1"), None, "released everywhere");
    }
}

/// Has `other` try `key` until it was told `Busy` `times` times: a held lock, after masters
/// restarted. Its connections to them broke, so its first attempts may find no majority
/// answering (`NoQuorum`, `Redis`) for up to 5 s, until they reconnect; never may it take it.
async fn busy_for_another_client(
    other: &LockClient,
    key: &str,
    options: LockOptions,
    times: usize,
) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut busy = 0;
    while busy < times {
        match other.acquire(key, options).await {
            Err(LockError::Busy { .. }) => busy += 1,
            Err(LockError::NoQuorum { .. } | LockError::Redis { .. })
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            taken => panic!("another client took a held lock: {taken:?}"),
        }
    }
}

/// A lease held on a bare majority, restarted under before it spread: one master was down when
/// it was taken, is back empty, and before the lease's first renewal one of the two masters it
/// was taken on restarts empty too. The lease is then on one master only, and the two restarted
/// masters would make a majority for another client; but a client that found a master
/// restarted does not count its take toward a lease as long as that lease's ttl (the Redlock
/// paper's delayed restart), so the other client never takes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_restarted_within_a_ttl_make_no_majority_for_another_client() {
    let mut quorum = Redlock::start(3);
    let (holder_client, other) = (client(&quorum).await, client(&quorum).await);
    quorum.servers[2].kill();
    // Renewed only after 10 s: no spreading within this test.
    let lease = holder_client
        .acquire("unspread:1", opts(30_000))
        .await
        .unwrap();
    quorum.servers[2].restart();
    quorum.servers[0].restart();
    assert_eq!(value(&quorum.servers[0], "unspread:1"), None);
    assert_eq!(value(&quorum.servers[2], "unspread:1"), None);
    // The other client finds its connections to both broken first (no majority answers); once
    // it has reconnected, the restarted masters take the key but do not count.
    busy_for_another_client(&other, "unspread:1", opts(30_000), 5).await;
    assert_eq!(
        holder(&quorum.servers[1], "unspread:1").as_deref(),
        Some(lease.token())
    );
    // The holder's own connections to the restarted masters are broken until it next uses
    // them: its release may find no majority answering; its lease expires on its own then.
    let _ = lease.release().await;
}

/// A lease held on a bare majority (one master was down when it was taken): once that master
/// is back and the lease spread to it, restarting one of the masters the lease was taken on
/// (its data gone) lets no other client take the key; the restarted master gets the lease back
/// at the next renewal. (Before: the restarted master and the one that came back empty made a
/// majority for another client, two holders at once.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_a_master_of_a_bare_majority_lease_lets_no_one_else_in() {
    let mut quorum = Redlock::start(3);
    let (holder_client, other) = (client(&quorum).await, client(&quorum).await);
    quorum.servers[2].kill();
    let lease = holder_client
        .acquire("bare:1", opts(BARE_MAJORITY_TTL_MS).unlimited_renewals())
        .await
        .unwrap();
    quorum.servers[2].restart();
    let spread = spread_to_all(&quorum, &lease, Duration::from_secs(10)).await;
    quorum.servers[0].restart();
    // The other client's connections to the restarted masters broke: its first attempts may
    // find no majority answering, until they reconnect. Never may it take the lock.
    busy_for_another_client(&other, "bare:1", opts(5_000), 1).await;
    let spread_again = spread_to_all(&quorum, &lease, Duration::from_secs(10)).await;
    eprintln!(
        "the lease spread to the master back empty in {spread:?}, \
         to the one restarted under it in {spread_again:?} more"
    );
    let outcome = lease.run(async {}).await;
    assert!(outcome.is_ok(), "{outcome:?}");
    lease.release().await.unwrap();
}

/// 256 callers at once on one client, each cycling on a key of its own: every release reaches
/// every master that took the key, so nothing is left behind when the callers are done. (A
/// master's take still unsent when the majority decided used to land after the caller's
/// release there, and kept the key for the whole ttl: in the cycle bench up to half the cycles
/// of 64 callers left their key on a master, where the next cycle found it busy; this test
/// failed one run in three.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_callers_at_once_leave_no_key_on_any_master() {
    let quorum = Redlock::start(3);
    let locks = LockClient::redlock_builder(quorum.urls())
        .build()
        .await
        .unwrap();
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..256 {
        let locks = locks.clone();
        callers.spawn(async move {
            let key = format!("crowd:{caller}");
            for _ in 0..30 {
                locks
                    .run_locked(key.as_str(), opts(30_000), async {})
                    .await?;
            }
            Ok::<_, LockError>(())
        });
    }
    for outcome in callers.join_all().await {
        outcome.expect("each cycle takes its own key");
    }
    // A take answered after the release is given back in the background, at once; a key left
    // would stay for its 30 s ttl.
    let keys: Vec<String> = (0..256).map(|caller| format!("crowd:{caller}")).collect();
    let left_behind = || {
        let mut left = Vec::new();
        for (master, server) in quorum.servers.iter().enumerate() {
            let mut mget = vec!["MGET"];
            mget.extend(keys.iter().map(String::as_str));
            let values: Vec<Option<String>> =
                redis::from_redis_value(server.command(&mget)).unwrap();
            for (key, value) in keys.iter().zip(values) {
                if let Some(value) = value {
                    let ttl: i64 = redis::from_redis_value(server.command(&["PTTL", key])).unwrap();
                    left.push(format!("{key} on master {master} ({ttl} ms left): {value}"));
                }
            }
        }
        left
    };
    let started = Instant::now();
    loop {
        let left = left_behind();
        if left.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{} keys left on a master after 5 s: {left:#?}",
            left.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "the last key left masters {:?} after the callers were done",
        started.elapsed()
    );
}
