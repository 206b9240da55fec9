//! The simulator's first promises: a seed replays exactly, and no two callers hold the lock at
//! once. A small in-memory world (a few simulated processes, each with its own wall-clock skew,
//! several tasks contending for one key with `wait`, pauses and bodies of lengths drawn from the
//! seed) runs on one thread in paused time. Its trace (each call's outcome, stamped with
//! simulated time, with tokens and fencing tokens) hashes the same every time its seed runs, and
//! differently for another seed.
//!
//! `scripts/sim.sh` runs it over other seeds (`SIM_SEEDS`), printing `trace <seed> <hash>` for
//! each seed that replayed and kept exclusion, and `seed <seed> failed: <why>` otherwise.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockmacro_runtime::__sim::{self, draw};
use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};
use tokio::time::Instant;

/// One thing a task saw, at a simulated time (µs since the world began).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Event {
    at_us: u128,
    /// `p<process>.t<task>`.
    who: String,
    what: What,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum What {
    /// Its body began, holding the lock.
    Acquired {
        token: String,
        fencing: Option<u64>,
    },
    /// Its body ended (the lock is released after).
    Released,
    Busy {
        retry_after: Option<Duration>,
    },
    Failed(String),
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:>9} {} ", self.at_us, self.who)?;
        match &self.what {
            What::Acquired { token, fencing } => write!(f, "acquired {token} fencing {fencing:?}"),
            What::Released => write!(f, "released"),
            What::Busy { retry_after } => write!(f, "busy, retry after {retry_after:?}"),
            What::Failed(error) => write!(f, "failed: {error}"),
        }
    }
}

/// What one seed's world did, in the order it happened.
struct Trace {
    events: Vec<Event>,
}

impl Trace {
    /// FNV-1a over the events as text: the same number on every platform and toolchain.
    fn hash(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for event in &self.events {
            for byte in event.to_string().bytes().chain([b'\n']) {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
        }
        hash
    }

    fn count(&self, what: fn(&What) -> bool) -> usize {
        self.events.iter().filter(|event| what(&event.what)).count()
    }

    /// At most one body holds the lock at any simulated instant: each body begins after the
    /// one before it ended. The first body that began while another held the lock, if any.
    fn exclusion(&self) -> Result<(), String> {
        let mut holder: Option<&Event> = None;
        for event in &self.events {
            match (&event.what, holder) {
                (What::Acquired { .. }, Some(held)) => {
                    return Err(format!(
                        "two holders: `{event}` while `{held}` had not ended"
                    ));
                }
                (What::Acquired { .. }, None) => holder = Some(event),
                (What::Released, Some(held)) if held.who == event.who => holder = None,
                (What::Released, _) => {
                    return Err(format!("`{event}` ended a body that did not hold the lock"));
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// One locked call of a task: drawn before the world runs, so the plan does not depend on the
/// order in which tasks happen to draw.
struct Call {
    pause: Duration,
    body: Duration,
    wait: Duration,
    fencing: bool,
}

/// How long a world may run, in simulated time.
const SIMULATED_LIMIT: Duration = Duration::from_secs(60);

/// Runs the world of `seed`: its trace, or why it did not end.
fn world(seed: u64) -> Result<Trace, String> {
    __sim::run(seed, || async {
        let store = __sim::memory();
        let start = Instant::now();
        let events = Arc::new(Mutex::new(Vec::new()));
        let record = {
            let events = events.clone();
            move |who: &str, what: What| {
                let event = Event {
                    at_us: start.elapsed().as_micros(),
                    who: who.to_owned(),
                    what,
                };
                events.lock().expect("not poisoned").push(event);
            }
        };
        let mut tasks = Vec::new();
        for n in 0..2 + draw() % 3 {
            let skew_ms = (draw() % 201) as i64 - 100;
            let client = LockClient::simulated(&store, n as u32, skew_ms);
            for t in 0..1 + draw() % 3 {
                let plan: Vec<Call> = (0..3)
                    .map(|_| Call {
                        pause: Duration::from_millis(draw() % 50),
                        body: Duration::from_millis(1 + draw() % 200),
                        wait: Duration::from_millis(draw() % 1500),
                        fencing: draw().is_multiple_of(2),
                    })
                    .collect();
                let (client, record) = (client.clone(), record.clone());
                let who = format!("p{n}.t{t}");
                tasks.push(tokio::spawn(async move {
                    for call in plan {
                        tokio::time::sleep(call.pause).await;
                        let options = LockOptions::new()
                            .ttl(Duration::from_secs(1))
                            .wait(call.wait)
                            .fencing(call.fencing);
                        let body = async {
                            let lock = LockContext::current().expect("inside the lock");
                            let token = lock.token().to_owned();
                            let fencing = lock.fencing_token();
                            record(&who, What::Acquired { token, fencing });
                            tokio::time::sleep(call.body).await;
                            record(&who, What::Released);
                        };
                        match client.run_locked("k", options, body).await {
                            Ok(()) => {}
                            Err(LockError::Busy { retry_after, .. }) => {
                                record(&who, What::Busy { retry_after });
                            }
                            Err(error) => record(&who, What::Failed(error.to_string())),
                        }
                    }
                }));
            }
        }
        // Every call ends within seconds: a world still running after a simulated minute is stuck.
        let ended = tokio::time::timeout(SIMULATED_LIMIT, async {
            for task in tasks {
                if let Err(error) = task.await {
                    return Err(format!("a task did not end: {error}"));
                }
            }
            Ok(())
        })
        .await
        .unwrap_or_else(|_| Err(format!("still running after {SIMULATED_LIMIT:?}")));
        let events = events.lock().expect("not poisoned").clone();
        ended.map(|()| Trace { events })
    })
    .unwrap_or_else(|error| Err(format!("no runtime: {error}")))
}

/// Runs `seed`'s world twice: its trace, or why the seed failed.
fn replay(seed: u64) -> Result<Trace, String> {
    let first = world(seed)?;
    let again = world(seed)?;
    if let Some((a, b)) = first.events.iter().zip(&again.events).find(|(a, b)| a != b) {
        return Err(format!("its two runs parted: `{a}`, then `{b}`"));
    }
    if first.events.len() != again.events.len() {
        return Err(format!(
            "its two runs parted: {} events, then {}",
            first.events.len(),
            again.events.len()
        ));
    }
    first.exclusion()?;
    Ok(first)
}

/// The seeds to run: `SIM_SEEDS` (`S` or `FROM..TO`, `TO` excluded), else 1 to 20.
fn seeds() -> std::ops::Range<u64> {
    let Ok(given) = std::env::var("SIM_SEEDS") else {
        return 1..21;
    };
    let parse = |number: &str| {
        number
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("SIM_SEEDS={given}: a seed or FROM..TO"))
    };
    match given.split_once("..") {
        Some((from, to)) => parse(from)..parse(to),
        None => parse(&given)..parse(&given) + 1,
    }
}

#[test]
fn a_seed_replays_its_trace_exactly_keeps_exclusion_and_another_seed_differs() {
    let mut failed = 0;
    let mut hashes = HashSet::new();
    let mut busy = 0;
    for seed in seeds() {
        match replay(seed) {
            Ok(trace) => {
                println!("trace {seed} {:016x}", trace.hash());
                assert!(
                    trace.count(|what| matches!(what, What::Acquired { .. })) > 0,
                    "seed {seed}: nobody got the lock"
                );
                busy += trace.count(|what| matches!(what, What::Busy { .. }));
                assert!(
                    hashes.insert(trace.hash()),
                    "seed {seed} gave an earlier seed's trace"
                );
            }
            Err(why) => {
                println!("seed {seed} failed: {why}");
                failed += 1;
            }
        }
    }
    assert_eq!(failed, 0, "seeds failed (printed above)");
    // The worlds contend: some calls wait their whole `wait` out (one seed alone may not).
    assert!(
        busy > 0 || std::env::var_os("SIM_SEEDS").is_some(),
        "no call ever found the lock busy"
    );
}

#[test]
fn the_checker_finds_two_holders_at_once() {
    let event = |at_us, who: &str, what| Event {
        at_us,
        who: who.to_owned(),
        what,
    };
    let acquired = || What::Acquired {
        token: "t".to_owned(),
        fencing: None,
    };
    let overlapping = Trace {
        events: vec![
            event(1, "p0.t0", acquired()),
            event(2, "p1.t0", acquired()),
            event(3, "p0.t0", What::Released),
        ],
    };
    let error = overlapping.exclusion().expect_err("two holders");
    assert!(error.contains("two holders"), "{error}");
    let in_turn = Trace {
        events: vec![
            event(1, "p0.t0", acquired()),
            event(2, "p0.t0", What::Released),
            event(2, "p1.t0", acquired()),
            event(3, "p1.t0", What::Released),
        ],
    };
    assert_eq!(in_turn.exclusion(), Ok(()));
}
