//! The simulator's first promise: a seed replays exactly. A small in-memory world (a few
//! simulated processes, each with its own wall-clock skew, several tasks contending for one key
//! with `wait`, pauses and bodies of lengths drawn from the seed) runs on one thread in paused
//! time; its trace (each call's outcome, stamped with simulated time, with tokens and fencing
//! tokens) hashes the same every time its seed runs, and differently for another seed.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use lockmacro_runtime::__sim::{self, draw};
use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};
use tokio::time::Instant;

/// What one seed's world did, in order: one line per event, stamped with simulated time (µs).
struct Trace {
    lines: Vec<String>,
}

impl Trace {
    /// FNV-1a over the lines: the same number on every platform and toolchain.
    fn hash(&self) -> u64 {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in self
            .lines
            .iter()
            .flat_map(|line| line.bytes().chain([b'\n']))
        {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        hash
    }

    /// How many calls got the lock, and how many gave up on it busy.
    fn count(&self, what: &str) -> usize {
        self.lines.iter().filter(|line| line.contains(what)).count()
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

/// Runs the world of `seed` and returns its trace.
fn world(seed: u64) -> Trace {
    __sim::run(seed, || async {
        let store = __sim::memory();
        let start = Instant::now();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let record = {
            let lines = lines.clone();
            move |who: &str, what: String| {
                let at = start.elapsed().as_micros();
                lines
                    .lock()
                    .expect("not poisoned")
                    .push(format!("{at:>9} {who} {what}"));
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
                            record(
                                &who,
                                format!(
                                    "acquired {} fencing {:?}",
                                    lock.token(),
                                    lock.fencing_token()
                                ),
                            );
                            tokio::time::sleep(call.body).await;
                            record(&who, "released".to_owned());
                        };
                        match client.run_locked("k", options, body).await {
                            Ok(()) => {}
                            Err(LockError::Busy { retry_after, .. }) => {
                                record(&who, format!("busy, retry after {retry_after:?}"));
                            }
                            Err(error) => record(&who, format!("failed: {error}")),
                        }
                    }
                }));
            }
        }
        for task in tasks {
            task.await.expect("a task of the world ran to its end");
        }
        Trace {
            lines: lines.lock().expect("not poisoned").clone(),
        }
    })
    .expect("a runtime")
}

#[test]
fn a_seed_replays_its_trace_exactly_and_another_seed_differs() {
    let mut hashes = std::collections::HashSet::new();
    for seed in 1..=20 {
        let first = world(seed);
        let again = world(seed);
        assert_eq!(
            first.lines, again.lines,
            "seed {seed} ran twice gave two traces"
        );
        assert_eq!(first.hash(), again.hash());
        assert!(
            first.count("acquired") > 0,
            "seed {seed}: {:#?}",
            first.lines
        );
        assert!(
            hashes.insert(first.hash()),
            "seed {seed} gave an earlier seed's trace"
        );
    }
    // The worlds contend: some calls wait their whole `wait` out.
    assert!((1..=20).any(|seed| world(seed).count("busy") > 0));
}
