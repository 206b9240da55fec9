//! Callers in several processes taking turns on one key (or one set of keys), and what their
//! turns say about waiting across processes: each process's share, the waits, `Busy` after a
//! full wait, and the longest time the lock stood free while someone waited for it.
//!
//! One process runs [`take_turns`] (the test kit's `lock_worker turns …`, or the benchmark's
//! own child), which prints one line per call; [`read_calls`] reads them back, and [`Summary`]
//! puts every process's calls of one run together. Times are `CLOCK_MONOTONIC`
//! ([`monotonic_ns`](crate::monotonic_ns)), one clock for every process of the machine.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Duration;

use lockmacro_runtime::{LockClient, LockError, LockOptions};

use crate::monotonic_ns;

/// Where the turns are taken, as a child process is told on its command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One Redis: its URL.
    Server(String),
    /// A Redis Cluster: its seed nodes' URLs.
    Cluster(Vec<String>),
    /// A Redlock quorum: its masters' URLs.
    Redlock(Vec<String>),
}

impl Target {
    /// `server:URL`, `cluster:URL,URL…` or `redlock:URL,URL…`.
    pub fn arg(&self) -> String {
        match self {
            Self::Server(url) => format!("server:{url}"),
            Self::Cluster(urls) => format!("cluster:{}", urls.join(",")),
            Self::Redlock(urls) => format!("redlock:{}", urls.join(",")),
        }
    }

    /// What [`arg`](Self::arg) wrote.
    pub fn parse(arg: &str) -> Self {
        let (kind, urls) = arg.split_once(':').expect("KIND:URLS");
        let list = || urls.split(',').map(str::to_owned).collect();
        match kind {
            "server" => Self::Server(urls.to_owned()),
            "cluster" => Self::Cluster(list()),
            "redlock" => Self::Redlock(list()),
            other => panic!("unknown deployment `{other}`"),
        }
    }

    /// A client of it.
    pub async fn client(&self) -> LockClient {
        let built = match self {
            Self::Server(url) => LockClient::builder(url).build().await,
            Self::Cluster(urls) => LockClient::cluster_builder(urls).build().await,
            Self::Redlock(urls) => LockClient::redlock_builder(urls).build().await,
        };
        built.unwrap_or_else(|error| panic!("cannot build a client of {self:?}: {error}"))
    }
}

/// What one process does: `tasks` tasks each calling `run_locked` (or `run_locked_many` for
/// several keys) again and again from `start_ns` until `start_ns + run`, each body holding the
/// lock for `hold`, each call waiting up to `wait`.
#[derive(Debug, Clone)]
pub struct Plan {
    pub target: Target,
    pub keys: Vec<String>,
    pub tasks: usize,
    pub hold: Duration,
    pub wait: Duration,
    pub ttl: Duration,
    /// When every process starts calling (`CLOCK_MONOTONIC`, ns): they start together.
    pub start_ns: u64,
    pub run: Duration,
}

impl Plan {
    /// The plan as command-line arguments, for [`from_args`](Self::from_args) in a child.
    pub fn args(&self) -> Vec<String> {
        vec![
            self.target.arg(),
            self.keys.join(","),
            self.tasks.to_string(),
            self.hold.as_micros().to_string(),
            self.wait.as_millis().to_string(),
            self.ttl.as_millis().to_string(),
            self.start_ns.to_string(),
            self.run.as_millis().to_string(),
        ]
    }

    /// What [`args`](Self::args) wrote.
    pub fn from_args(args: &[String]) -> Self {
        let number = |at: usize| -> u64 {
            args[at]
                .parse()
                .unwrap_or_else(|_| panic!("not a number: {}", args[at]))
        };
        Self {
            target: Target::parse(&args[0]),
            keys: args[1].split(',').map(str::to_owned).collect(),
            tasks: number(2) as usize,
            hold: Duration::from_micros(number(3)),
            wait: Duration::from_millis(number(4)),
            ttl: Duration::from_millis(number(5)),
            start_ns: number(6),
            run: Duration::from_millis(number(7)),
        }
    }
}

/// One call, as its caller saw it (`CLOCK_MONOTONIC`, ns).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    /// Taken: asked, entered the body, left it.
    Held { asked: u64, entered: u64, left: u64 },
    /// `Busy` after the whole wait: asked, given up, and the error's `retry_after` (ms).
    Busy {
        asked: u64,
        ended: u64,
        retry_after_ms: Option<u64>,
    },
    /// Any other error.
    Failed { asked: u64, ended: u64 },
}

impl Call {
    /// When it asked.
    pub fn asked(&self) -> u64 {
        match *self {
            Self::Held { asked, .. } | Self::Busy { asked, .. } | Self::Failed { asked, .. } => {
                asked
            }
        }
    }

    /// When it stopped waiting: it entered the body, or gave up.
    pub fn waited_until(&self) -> u64 {
        match *self {
            Self::Held { entered, .. } => entered,
            Self::Busy { ended, .. } | Self::Failed { ended, .. } => ended,
        }
    }

    /// The line [`take_turns`] prints for it.
    fn line(&self) -> String {
        match *self {
            Self::Held {
                asked,
                entered,
                left,
            } => format!("held {asked} {entered} {left}"),
            Self::Busy {
                asked,
                ended,
                retry_after_ms,
            } => {
                let retry = retry_after_ms.map_or("-".to_owned(), |ms| ms.to_string());
                format!("busy {asked} {ended} {retry}")
            }
            Self::Failed { asked, ended } => format!("failed {asked} {ended}"),
        }
    }
}

/// Runs `plan` in this process and prints one line per call (`held ASKED ENTERED LEFT`, `busy
/// ASKED ENDED RETRY_MS`, `failed ASKED ENDED`), then `done`. An error other than `Busy` is
/// printed to stderr too.
pub async fn take_turns(plan: Plan) {
    let locks = plan.target.client().await;
    let options = LockOptions::new().ttl(plan.ttl).wait(plan.wait);
    let deadline = plan.start_ns + plan.run.as_nanos() as u64;
    let start_in = Duration::from_nanos(plan.start_ns.saturating_sub(monotonic_ns()));
    tokio::time::sleep(start_in).await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..plan.tasks {
        let (locks, keys, hold) = (locks.clone(), plan.keys.clone(), plan.hold);
        tasks.spawn(async move {
            let mut calls = Vec::new();
            while monotonic_ns() < deadline {
                let asked = monotonic_ns();
                let body = async {
                    let entered = monotonic_ns();
                    tokio::time::sleep(hold).await;
                    (entered, monotonic_ns())
                };
                let outcome = match keys.as_slice() {
                    [key] => locks.run_locked(key.clone(), options, body).await,
                    keys => locks.run_locked_many(keys.to_vec(), options, body).await,
                };
                let ended = monotonic_ns();
                calls.push(match outcome {
                    Ok((entered, left)) => Call::Held {
                        asked,
                        entered,
                        left,
                    },
                    Err(LockError::Busy { retry_after, .. }) => Call::Busy {
                        asked,
                        ended,
                        retry_after_ms: retry_after.map(|after| after.as_millis() as u64),
                    },
                    Err(error) => {
                        eprintln!("call failed: {error}");
                        Call::Failed { asked, ended }
                    }
                });
            }
            calls
        });
    }
    let mut out = String::new();
    while let Some(calls) = tasks.join_next().await {
        for call in calls.expect("a caller task") {
            out.push_str(&call.line());
            out.push('\n');
        }
    }
    out.push_str("done\n");
    print!("{out}");
}

/// The calls in the lines [`take_turns`] printed; panics on a line it did not write.
pub fn read_calls(output: &str) -> Vec<Call> {
    output
        .lines()
        .filter(|line| *line != "done")
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let at = |i: usize| -> u64 {
                fields
                    .get(i)
                    .and_then(|field| field.parse().ok())
                    .unwrap_or_else(|| panic!("not a call: {line}"))
            };
            match fields.first() {
                Some(&"held") => Call::Held {
                    asked: at(1),
                    entered: at(2),
                    left: at(3),
                },
                Some(&"busy") => Call::Busy {
                    asked: at(1),
                    ended: at(2),
                    retry_after_ms: fields.get(3).and_then(|ms| ms.parse().ok()),
                },
                Some(&"failed") => Call::Failed {
                    asked: at(1),
                    ended: at(2),
                },
                _ => panic!("not a call: {line}"),
            }
        })
        .collect()
}

/// What one run's calls, in every process, say about waiting.
#[derive(Debug, Clone)]
pub struct Summary {
    /// Calls that took the lock within the run, per process.
    pub held_per_process: Vec<usize>,
    /// Each taken call's wait, from asking to entering the body.
    pub waits: Vec<Duration>,
    /// Calls that ended `Busy` after their whole wait, and their `retry_after`s (ms).
    pub busy: Vec<Option<u64>>,
    /// Calls that failed otherwise.
    pub failed: usize,
    /// The longest stretch the lock stood free (from one holder leaving its body to the next
    /// entering) while a caller was waiting for it.
    pub longest_free_while_waited: Duration,
    /// The longest two holders overlapped (0 unless the lock failed).
    pub longest_overlap: Duration,
}

impl Summary {
    /// Puts together every process's calls of one run, counting the calls that took the lock
    /// before `until` (`CLOCK_MONOTONIC`, ns: the run's end).
    pub fn of(processes: &[Vec<Call>], until: u64) -> Self {
        let calls: Vec<&Call> = processes.iter().flatten().collect();
        let held_per_process = processes
            .iter()
            .map(|calls| {
                let held =
                    |call: &&Call| matches!(call, Call::Held { entered, .. } if *entered < until);
                calls.iter().filter(held).count()
            })
            .collect();
        let mut holds: Vec<(u64, u64)> = calls
            .iter()
            .filter_map(|call| match **call {
                Call::Held { entered, left, .. } => Some((entered, left)),
                _ => None,
            })
            .collect();
        holds.sort_unstable();
        let waits = calls
            .iter()
            .filter_map(|call| match **call {
                Call::Held { asked, entered, .. } => Some(Duration::from_nanos(entered - asked)),
                _ => None,
            })
            .collect();
        let busy = calls
            .iter()
            .filter_map(|call| match **call {
                Call::Busy { retry_after_ms, .. } => Some(retry_after_ms),
                _ => None,
            })
            .collect();
        let failed = calls
            .iter()
            .filter(|call| matches!(call, Call::Failed { .. }))
            .count();
        let longest_overlap = holds
            .windows(2)
            .map(|pair| pair[0].1.saturating_sub(pair[1].0))
            .max()
            .unwrap_or(0);
        Self {
            held_per_process,
            waits,
            busy,
            failed,
            longest_free_while_waited: free_while_waited(&holds, &calls),
            longest_overlap: Duration::from_nanos(longest_overlap),
        }
    }

    /// Calls that took the lock within the run, in every process.
    pub fn held(&self) -> usize {
        self.held_per_process.iter().sum()
    }

    /// The most acquisitions of one process over the fewest of another (infinite when a
    /// process got none).
    pub fn share_ratio(&self) -> f64 {
        let most = self.held_per_process.iter().copied().max().unwrap_or(0);
        let least = self.held_per_process.iter().copied().min().unwrap_or(0);
        most as f64 / least as f64
    }

    /// The `q`-quantile (0..=1) of the waits, nearest rank.
    pub fn wait_quantile(&self, q: f64) -> Duration {
        let mut waits = self.waits.clone();
        waits.sort_unstable();
        let rank = ((q * waits.len() as f64).ceil() as usize).clamp(1, waits.len().max(1));
        waits.get(rank - 1).copied().unwrap_or_default()
    }
}

/// The longest gap between two holds (`holds` sorted by entry) during which a caller was
/// waiting: from the later of the gap's start and the earliest waiter's asking, to the gap's end.
fn free_while_waited(holds: &[(u64, u64)], calls: &[&Call]) -> Duration {
    let mut waiters: Vec<(u64, u64)> = calls
        .iter()
        .map(|call| (call.asked(), call.waited_until()))
        .collect();
    waiters.sort_unstable();
    let mut waiters = waiters.into_iter().peekable();
    // The waiters asked by now, earliest first; those done waiting are dropped as they surface.
    let mut asked: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut longest = 0;
    for pair in holds.windows(2) {
        let (free_from, free_until) = (pair[0].1, pair[1].0);
        if free_until <= free_from {
            continue;
        }
        while let Some(waiter) = waiters.next_if(|(asked, _)| *asked < free_until) {
            asked.push(Reverse(waiter));
        }
        while asked
            .peek()
            .is_some_and(|Reverse((_, until))| *until < free_until)
        {
            asked.pop();
        }
        if let Some(Reverse((earliest, _))) = asked.peek() {
            longest = longest.max(free_until - free_from.max(*earliest));
        }
    }
    Duration::from_nanos(longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_while_waited_counts_only_gaps_with_a_waiter() {
        let held = |asked, entered, left| Call::Held {
            asked,
            entered,
            left,
        };
        // Nobody waits through the gap 10..50; the third caller waits from 55 through 60..90.
        let calls = vec![
            vec![held(0, 0, 10), held(40, 50, 60)],
            vec![held(55, 90, 95)],
        ];
        let summary = Summary::of(&calls, 100);
        assert_eq!(summary.longest_free_while_waited, Duration::from_nanos(30));
        assert_eq!(summary.held_per_process, [2, 1]);
        assert_eq!(summary.share_ratio(), 2.0);
        assert_eq!(summary.longest_overlap, Duration::ZERO);
    }

    #[test]
    fn plans_round_trip_through_arguments() {
        let plan = Plan {
            target: Target::Redlock(vec!["redis://a".into(), "redis://b".into()]),
            keys: vec!["a".into(), "b".into()],
            tasks: 4,
            hold: Duration::from_millis(1),
            wait: Duration::from_secs(5),
            ttl: Duration::from_secs(30),
            start_ns: 12,
            run: Duration::from_secs(3),
        };
        let back = Plan::from_args(&plan.args());
        assert_eq!(back.target, plan.target);
        assert_eq!(back.keys, plan.keys);
        assert_eq!((back.tasks, back.hold, back.start_ns), (4, plan.hold, 12));
    }
}
