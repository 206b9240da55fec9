//! Waiting for a busy lock: woken by the release announcement, bounded by `wait`, no stampede.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{fast_client, opts, waiter_subscribed};
use lockmacro_runtime::LockClient;
use testkit::RedisServer;

const WORKER: &str = env!("CARGO_BIN_EXE_lock_worker");

#[tokio::test]
async fn waiter_takes_over_after_the_holder_process_is_killed() {
    let server = RedisServer::start();
    let mut holder = Command::new(WORKER)
        .args(["hold", &server.url(), "queue:3", "1000"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held");

    let locks = fast_client(&server).await;
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .run_locked(
                    "queue:3",
                    opts(1_000).wait(Duration::from_secs(10)),
                    async { Instant::now() },
                )
                .await
        }
    });
    waiter_subscribed(&server, "queue:3").await;
    let killed_at = Instant::now();
    holder.kill().unwrap();
    holder.wait().unwrap();

    let acquired_at = waiter.await.unwrap().unwrap();
    let after = acquired_at - killed_at;
    // A killed holder announces nothing: the waiter wakes when the holder's lease would end
    // (at most one ttl after the kill), plus its 10 % jitter and a round trip; the bound leaves
    // a loaded machine a second more (the waiter's wait is 10 s).
    eprintln!("took over {after:?} after the kill");
    assert!(
        after <= Duration::from_millis(2_300),
        "took over {after:?} after the kill"
    );
}

#[tokio::test]
async fn three_processes_times_sixteen_tasks_never_overlap() {
    let server = RedisServer::start();
    common::count_in_three_processes(&server.url());
    let count = server.command(&["GET", "jepsen:counter"]);
    assert_eq!(
        count,
        redis::Value::BulkString(b"480".to_vec()),
        "lost updates mean two holders at once"
    );
}

#[tokio::test]
async fn a_thousand_waiters_are_served_in_turn_without_stampeding_redis() {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.unwrap();
    let holder = locks.acquire("queue:herd", opts(30_000)).await.unwrap();
    let before = requests_served(&server);

    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..1_000 {
        let (locks, served) = (locks.clone(), served.clone());
        waiters.spawn(async move {
            locks
                .run_locked(
                    "queue:herd",
                    opts(30_000).wait(Duration::from_secs(60)),
                    async {
                        served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    },
                )
                .await
        });
    }
    // Every waiter has looked and parked (however long that takes on a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(30);
    while locks.waiting("queue:herd") < 1_000 {
        assert!(
            Instant::now() < deadline,
            "1 000 waiters parked within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Each waiter looks twice (before and after subscribing), then sleeps on the announcement:
    // the holder's lease has 30 s left, so no fallback timer fires while they join, but for
    // the one that has a waiter whose looks all came before it had waited too long (20 ms,
    // `protocol::RESERVE_AFTER`) look once more, to reserve the key (about a quarter of them
    // here). Those looks are over once the count of requests stands still.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut while_waiting = requests_served(&server) - before;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = requests_served(&server) - before;
        if now == while_waiting {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the waiters' looks stop within 30 s"
        );
        while_waiting = now;
    }
    assert!(
        while_waiting <= 3 * 1_000 + 50,
        "{while_waiting} requests while 1 000 waited"
    );

    // Once all have joined, waiting costs Redis nothing until the release is announced.
    let settled = requests_served(&server);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle = requests_served(&server) - settled;
    eprintln!(
        "1 000 waiters: {while_waiting} requests while joining, {idle} requests/s once waiting"
    );
    assert!(
        idle <= 10,
        "{idle} requests/s from 1 000 waiters on a held key"
    );

    holder.release().await.unwrap();
    while let Some(outcome) = waiters.join_next().await {
        outcome.unwrap().expect("every waiter is served in turn");
    }
    assert_eq!(served.load(std::sync::atomic::Ordering::SeqCst), 1_000);
    let per_acquisition = (requests_served(&server) - before) as f64 / 1_000.0;
    eprintln!("1 000 waiters: {per_acquisition:.2} requests per acquisition");
    assert!(
        per_acquisition < 6.0,
        "{per_acquisition:.1} requests per acquisition"
    );
}

/// Requests clients sent (commands inside scripts are not counted: they cost no round trip).
fn requests_served(server: &RedisServer) -> u64 {
    let redis::Value::BulkString(info) = server.command(&["INFO", "commandstats"]) else {
        panic!("INFO answers a bulk string");
    };
    String::from_utf8(info)
        .unwrap()
        .lines()
        .filter(|line| {
            [
                "cmdstat_evalsha:",
                "cmdstat_script|",
                "cmdstat_subscribe:",
                "cmdstat_unsubscribe:",
            ]
            .iter()
            .any(|name| line.starts_with(name))
        })
        .filter_map(|line| {
            line.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Within one client a caller that comes straight back after its release queues behind the
/// callers already waiting instead of barging in ahead of the one its release woke: the lock
/// changes hands at most acquisitions (about a third of them when callers barge) and every
/// task gets its share.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_of_one_client_take_turns_instead_of_barging() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = tokio::time::Instant::now() + Duration::from_millis(1500);
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..8usize {
        let (locks, order) = (locks.clone(), order.clone());
        tasks.spawn(async move {
            let options = opts(5_000).wait(Duration::from_secs(10));
            while tokio::time::Instant::now() < stop {
                locks
                    .run_locked("turns:1", options, async {
                        order.lock().unwrap().push(task);
                    })
                    .await
                    .unwrap();
            }
        });
    }
    while let Some(task) = tasks.join_next().await {
        task.unwrap();
    }
    let order = order.lock().unwrap();
    let changes = order.windows(2).filter(|pair| pair[0] != pair[1]).count();
    let mut per_task = [0usize; 8];
    for &task in order.iter() {
        per_task[task] += 1;
    }
    let (least, most) = (
        per_task.iter().min().unwrap(),
        per_task.iter().max().unwrap(),
    );
    assert!(order.len() >= 40, "{} acquisitions", order.len());
    assert!(
        changes as f64 >= 0.7 * (order.len() - 1) as f64,
        "the owner changed at {changes} of {} acquisitions",
        order.len()
    );
    assert!(
        *most as f64 <= 2.0 * *least as f64,
        "acquisitions per task: {per_task:?}"
    );
}

/// A release is announced only when a waiter marked the key: one nobody waits for costs Redis
/// no `PUBLISH`, and a waiter of another client is woken by the announcement (its 30 s lease
/// fallback could not fire within its 10 s wait).
#[tokio::test]
async fn a_release_is_announced_only_when_someone_waits() {
    use common::{command_calls, get};
    let server = RedisServer::start();
    let (holder, waiter) = (fast_client(&server).await, fast_client(&server).await);
    let publishes = command_calls(&server, "publish");
    let lease = holder.acquire("announce:1", opts(30_000)).await.unwrap();
    assert_eq!(
        common::holder(&server, "announce:1").await.as_deref(),
        Some(lease.token())
    );
    lease.release().await.unwrap();
    assert_eq!(
        command_calls(&server, "publish"),
        publishes,
        "nobody waited"
    );

    let lease = holder.acquire("announce:1", opts(30_000)).await.unwrap();
    let waiting = tokio::spawn(async move {
        let options = opts(1_000).wait(Duration::from_secs(10));
        waiter.run_locked("announce:1", options, async {}).await
    });
    waiter_subscribed(&server, "announce:1").await;
    common::eventually(Duration::from_secs(5), "the key marked", || async {
        get(&server, "announce:1").await.is_some_and(|value| {
            lockmacro_runtime::protocol::is_waited_for(&value)
                && lockmacro_runtime::protocol::holds(&value, lease.token())
        })
    })
    .await;
    lease.release().await.unwrap();
    waiting.await.unwrap().expect("woken by the announcement");
    // The holder's release was announced (the waiter's own is not: nobody marked it).
    let announced = command_calls(&server, "publish");
    assert!(announced > publishes, "the waited-for release announced");

    // Once nobody waits or listens any more, a release costs no PUBLISH again.
    common::eventually(
        Duration::from_secs(5),
        "the waiter unsubscribed",
        || async { common::listeners_in(&server, "lockmacro", "announce:1").await == 0 },
    )
    .await;
    let lease = holder.acquire("announce:1", opts(30_000)).await.unwrap();
    lease.release().await.unwrap();
    assert_eq!(
        command_calls(&server, "publish"),
        announced,
        "nobody waits any more"
    );
}

/// A watch marks the key it follows (a key named as its release channel, and the key itself:
/// its mark alone while free, `+` after its holder's value while held), so that a release
/// nobody waits for is announced too: the watch reports the hold between two of its looks. A
/// key nobody watches costs its release no `PUBLISH`, and reads nothing but the lock.
#[tokio::test]
async fn a_release_nobody_waits_for_is_announced_while_a_watch_follows_the_key() {
    use common::{command_calls, get};
    use lockmacro_runtime::{LockEvent, protocol};
    let server = RedisServer::start();
    let (holder, watcher) = (fast_client(&server).await, fast_client(&server).await);
    let mark = protocol::Names::default().release_channel("watched:1");
    // A stream does nothing until polled: a task follows it.
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let watching = tokio::spawn(async move {
        let mut events = watcher.watch("watched:1");
        while let Some(event) = events.next().await {
            let _ = seen_tx.send(event.expect("a watch event"));
        }
    });
    common::eventually(Duration::from_secs(5), "the watch's mark", || async {
        get(&server, &mark).await.is_some()
    })
    .await;
    let publishes = command_calls(&server, "publish");
    assert_eq!(
        get(&server, "watched:1").await.as_deref(),
        Some("+"),
        "the free key holds the watch's mark"
    );
    let lease = holder.acquire("watched:1", opts(30_000)).await.unwrap();
    let value = get(&server, "watched:1").await.expect("held");
    assert!(protocol::holds(&value, lease.token()), "{value}");
    assert!(
        protocol::is_waited_for(&value),
        "taken while watched, marked: {value}"
    );
    lease.release().await.unwrap();
    assert_eq!(
        get(&server, "watched:1").await.as_deref(),
        Some("+"),
        "released while watched, the watch's mark takes the holder's place"
    );
    assert_eq!(
        command_calls(&server, "publish"),
        publishes + 1,
        "the watched release announced"
    );
    let mut seen = Vec::new();
    for _ in 0..2 {
        let event = tokio::time::timeout(Duration::from_secs(5), seen_rx.recv()).await;
        seen.push(event.expect("an event").expect("the watch goes on"));
    }
    assert!(
        matches!(seen[..], [LockEvent::Acquired { .. }, LockEvent::Released]),
        "{seen:?}"
    );
    watching.abort();

    // A key nobody watches: no mark, no announcement, the key gone; the release read the lock
    // alone (a `GET`, no `MGET` of a watch mark).
    let lease = holder.acquire("unwatched:1", opts(30_000)).await.unwrap();
    let (gets, mgets) = (
        command_calls(&server, "get"),
        command_calls(&server, "mget"),
    );
    lease.release().await.unwrap();
    assert_eq!(get(&server, "unwatched:1").await, None);
    assert_eq!(
        (
            command_calls(&server, "get"),
            command_calls(&server, "mget")
        ),
        (gets + 2, mgets),
        "the release's GET (and the test's own), no MGET"
    );
    assert_eq!(
        command_calls(&server, "publish"),
        publishes + 1,
        "an unwatched release costs no PUBLISH"
    );
}

/// Issue 37's regression: several processes taking turns on one key or one pair of keys, each
/// with a few callers that hand the lock to each other. No process keeps the key to itself: each
/// process's share of the acquisitions stays near even (one process held it 1 842 times against
/// 11 before), no call ends `Busy` while the lock passes on continuously, and no caller waits
/// past a bound set by the work ahead of it (waits reached 1.4-2.9 s of a 5-10 s wait).
fn processes_take_turns_fairly(target: testkit::turns::Target, keys: &[&str]) {
    const PROCESSES: usize = 3;
    const TASKS: usize = 4;
    let run = Duration::from_secs(2);
    let summary = common::take_turns_in_processes(&target, keys, PROCESSES, TASKS, run);
    eprintln!(
        "{target:?} {keys:?}: held per process {:?}, wait p99 {:?} max {:?}, longest free while \
         waited {:?}, busy {}, other errors {}",
        summary.held_per_process,
        summary.wait_quantile(0.99),
        summary.wait_quantile(1.0),
        summary.longest_free_while_waited,
        summary.busy.len(),
        summary.failed,
    );
    // The lock passes on: every process gets it.
    assert!(
        summary.held_per_process.iter().all(|&held| held > 0),
        "a process never held the lock: acquisitions per process {:?}",
        summary.held_per_process
    );
    if matches!(target, testkit::turns::Target::Redlock(_)) {
        // On Redlock the masters may each hand the key to another caller it is reserved for
        // (each sees the reservations that reached it), and a split hand-over is undone: the lock is safe
        // and passes on, but its shares are reported, not yet promised (see docs/deployments.md, Redlock).
        return;
    }
    // Enough turns for the shares and waits below to mean something: a quiet machine makes
    // 350-600 here (Redlock's pair made 83 beside a CPU hog and a test run, before Redlock was
    // left out of this bound).
    assert!(summary.held() >= 60, "{} acquisitions", summary.held());
    assert!(
        summary.busy.is_empty(),
        "`Busy` while the lock passed on continuously: {:?}",
        summary.busy
    );
    assert_eq!(summary.failed, 0, "calls failed");
    // Generous for 2 loaded cores (a cluster run made 102 / 218 / 149, 2.14, beside a test
    // run): the defect this guards against made 1 842 against 11. FIFO turns between processes
    // are measured by the bench (issue 50), not bounded here.
    assert!(
        summary.share_ratio() <= 3.0,
        "a process kept the key to itself: acquisitions per process {:?}",
        summary.held_per_process
    );
    // The work ahead of a caller: every other caller's turn once, each about the run's mean
    // interval between two acquisitions; a second of slack for a loaded machine's stalls.
    let mean = run / summary.held() as u32;
    let bound = Duration::from_secs(1) + mean * (PROCESSES * TASKS * 2) as u32;
    assert!(
        summary.wait_quantile(1.0) <= bound,
        "a caller waited {:?}, past the work ahead of it ({bound:?})",
        summary.wait_quantile(1.0)
    );
}

#[test]
fn processes_take_turns_fairly_on_one_key_of_one_redis() {
    let server = RedisServer::start();
    processes_take_turns_fairly(testkit::turns::Target::Server(server.url()), &["fair:1"]);
}

#[test]
fn processes_take_turns_fairly_on_a_key_pair_of_one_redis() {
    let server = RedisServer::start();
    let target = testkit::turns::Target::Server(server.url());
    processes_take_turns_fairly(target, &["fair:from", "fair:to"]);
}

#[test]
fn processes_take_turns_fairly_on_a_cluster() {
    let cluster = testkit::RedisCluster::start(3, 0);
    let target = testkit::turns::Target::Cluster(cluster.seed_urls());
    processes_take_turns_fairly(target.clone(), &["fair:1"]);
    processes_take_turns_fairly(target, &["fair:{pair}:from", "fair:{pair}:to"]);
}

/// On Redlock: no two holders at once, and the lock passes on (its fairness is reported).
#[test]
fn processes_take_turns_on_redlock_safely() {
    let masters: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let target = testkit::turns::Target::Redlock(masters.iter().map(RedisServer::url).collect());
    processes_take_turns_fairly(target.clone(), &["fair:1"]);
    processes_take_turns_fairly(target, &["fair:from", "fair:to"]);
}

/// `wait` is a bound: a caller gets the lock within its wait (plus a look's round trip) or
/// `Busy` at its end, even while the lock passes among this client's callers and hand-overs
/// to one caller are declined for another that waited longer (issue 47: callers were handed
/// the lock up to 1.6 s past a 2 s wait, because each declined hand-over restarted the
/// waiter's sleep).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_gets_the_lock_within_its_wait_or_busy_at_its_end() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let wait = Duration::from_secs(2);
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..10 {
        let locks = locks.clone();
        callers.spawn(async move {
            let called = Instant::now();
            let options = opts(3_000).wait(wait);
            let outcome = locks
                .run_locked("bound:1", options, async {
                    let acquired = called.elapsed();
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    acquired
                })
                .await;
            (outcome, called.elapsed())
        });
    }
    let (mut acquired, mut busy) = (Vec::new(), Vec::new());
    while let Some(caller) = callers.join_next().await {
        match caller.unwrap() {
            (Ok(after), _) => acquired.push(after),
            (Err(lockmacro_runtime::LockError::Busy { .. }), after) => busy.push(after),
            (Err(error), _) => panic!("a caller failed: {error}"),
        }
    }
    eprintln!("acquired after {acquired:?}; busy after {busy:?}");
    // Generous for a loaded machine: the defect made it 500 ms late at least (one more hold).
    let late = wait + Duration::from_millis(400);
    assert!(
        !busy.is_empty() && !acquired.is_empty(),
        "10 holds of 500 ms cannot all fit in 2 s"
    );
    for after in acquired.iter().chain(&busy) {
        assert!(
            *after <= late,
            "a caller came back {after:?} after calling, with a {wait:?} wait"
        );
    }
}
