//! The in-memory store against a real Redis: generated sequences of calls run one after another
//! on both, and every outcome is compared — taken or busy, `Busy`'s `retry_after`, errors and
//! their fields, fencing tokens (present, strictly increasing per key, never below the clock),
//! reentrancy across kinds, renewals, keys kept by `hold_at_least`, locks over several keys.
//!
//! The in-memory store is what users test against; any difference here is a test of theirs that
//! passes while production behaves otherwise.

mod common;

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockmacro_runtime::{Lease, LockClient, LockContext, LockError, LockOptions};
use proptest::prelude::*;
use testkit::{Deployment, InMemory, SingleRedis};

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
