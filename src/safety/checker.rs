//! Reads a campaign's history and counts what the locks let through, per fault.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::history::{Call, Caller, Outcome, WAITING_WAIT, parse_fenced_value};
use super::promises::{
    Deployment, Fault, RIDES_OUT, WAKE_UP, WAKE_UP_BOUND, known_defect, promise, recovery_grace,
};

/// One window of the nemesis's schedule, on the monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct Phase {
    /// What was done.
    pub fault: Fault,
    /// When the fault was injected (the phase began).
    pub start: u64,
    /// When the fault was healed (the server back, the traffic flowing, the holder resumed).
    pub healed: u64,
    /// When the phase ended (the next one began).
    pub end: u64,
}

/// The figures of one fault on one deployment, summed (counts) or maxed (times) over its rounds.
#[derive(Debug, Clone, Default)]
pub struct Row {
    /// How many times the fault was injected.
    pub rounds: usize,
    /// Calls whose body ran to its end (applied or rejected by the fenced storage).
    pub completed: usize,
    /// Of those, calls whose read or write the fenced storage rejected as stale: fencing at work.
    pub rejected: usize,
    /// Calls with `wait` ([`Caller::Waiting`]) that ended in an error other than `Busy` (lost,
    /// exhausted, Redis, no quorum): what a failover costs a caller that asked to wait.
    pub failed_waiting: usize,
    /// The same for calls without `wait` ([`Caller::FailFast`]), which fail by design while the
    /// deployment cannot grant.
    pub failed_fail_fast: usize,
    /// Pairs of holders of an unfenced key whose bodies overlapped.
    pub overlaps_unfenced: usize,
    /// Pairs of holders of a fenced key whose bodies overlapped.
    pub overlaps_fenced: usize,
    /// The longest such overlap, in ms.
    pub longest_overlap_ms: f64,
    /// That overlap's pair of holders (key, worker, call, fencing token, body, outcome), to
    /// trace a breach.
    pub longest_overlap_where: Option<String>,
    /// Fenced writes the storage accepted from a holder whose token another holder had already
    /// used or passed.
    pub stale_accepted: usize,
    /// Unfenced increments that another increment overwrote (two applied writes from one read).
    pub lost_unfenced: usize,
    /// The same for the fenced counter, from the storage's own history.
    pub lost_fenced: usize,
    /// The longest time a key was held by nobody while a caller waited for it, in ms, outside
    /// the fault and the [`recovery_grace`] after it.
    pub longest_free_while_waited_ms: f64,
    /// Where that stretch lay: its key, the waiting call (worker, call number), and how long
    /// after its phase's heal it began (ms), to trace a breach.
    pub longest_free_while_waited_where: Option<(String, u32, u64, f64)>,
    /// The longest time from a fault's heal (the server back, the new master serving, the
    /// traffic flowing, the holder resumed) to the next lock taken on any key, in ms.
    pub recovery_ms: f64,
    /// The longest time a key went without a lock taken on it, from the fault's injection to
    /// its first lock after the heal, in ms: whether the deployment recovered inside a waiting
    /// caller's wait (a fault that leaves it granting, or hits other keys, costs little here).
    pub outage_ms: f64,
}

/// Everything the checker needs about one deployment's campaign.
#[derive(Debug)]
pub struct Campaign<'a> {
    /// Where the locks lived.
    pub deployment: Deployment,
    /// Every call of every worker.
    pub calls: &'a [Call],
    /// Per fenced lock key, the writes its storage accepted, in the order it applied them.
    pub applied: &'a BTreeMap<String, Vec<(u64, String)>>,
    /// The nemesis's schedule.
    pub phases: &'a [Phase],
}

impl Campaign<'_> {
    /// The figures per fault, in the order the faults first appear in the schedule.
    pub fn rows(&self) -> Vec<(Fault, Row)> {
        let mut rows: Vec<(Fault, Row)> = Vec::new();
        for phase in self.phases {
            if !rows.iter().any(|(fault, _)| *fault == phase.fault) {
                rows.push((phase.fault, Row::default()));
            }
        }
        let row_of = |rows: &[(Fault, Row)], at: u64| -> Option<usize> {
            let phase = self.phase_at(at)?;
            rows.iter().position(|(fault, _)| *fault == phase.fault)
        };
        let mut starts: Vec<u64> = self
            .calls
            .iter()
            .filter_map(|call| call.body.map(|(start, _)| start))
            .collect();
        starts.sort_unstable();
        for phase in self.phases {
            let index = row_of(&rows, phase.start).expect("a phase is its own");
            let row = &mut rows[index].1;
            row.rounds += 1;
            let first_after_heal = starts[starts.partition_point(|start| *start < phase.healed)..]
                .first()
                .copied()
                .unwrap_or(phase.end);
            let recovery = first_after_heal.saturating_sub(phase.healed);
            row.recovery_ms = row.recovery_ms.max(ms(recovery));
            row.outage_ms = row.outage_ms.max(ms(self.outage(phase)));
        }
        // A call counts where its outcome became known: a lease lost to a fault ends in the
        // fault's phase even when the call began before it.
        for call in self.calls {
            let Some(index) = row_of(&rows, call.returned) else {
                continue;
            };
            let row = &mut rows[index].1;
            match call.outcome {
                Outcome::Applied => row.completed += 1,
                Outcome::Rejected => {
                    row.completed += 1;
                    row.rejected += 1;
                }
                Outcome::Busy => {}
                _ if call.caller == Caller::Waiting => row.failed_waiting += 1,
                _ => row.failed_fail_fast += 1,
            }
        }
        for (at, fenced, length, pair) in self.overlaps() {
            if let Some(index) = row_of(&rows, at) {
                let row = &mut rows[index].1;
                if fenced {
                    row.overlaps_fenced += 1;
                } else {
                    row.overlaps_unfenced += 1;
                }
                if row.longest_overlap_where.is_none() || ms(length) > row.longest_overlap_ms {
                    row.longest_overlap_ms = ms(length);
                    row.longest_overlap_where = Some(pair);
                }
            }
        }
        for at in self.lost_unfenced() {
            if let Some(index) = row_of(&rows, at) {
                rows[index].1.lost_unfenced += 1;
            }
        }
        let (stale, lost) = self.fenced_storage_findings();
        for at in stale {
            if let Some(index) = row_of(&rows, at) {
                rows[index].1.stale_accepted += 1;
            }
        }
        for at in lost {
            if let Some(index) = row_of(&rows, at) {
                rows[index].1.lost_fenced += 1;
            }
        }
        for (at, length, call) in self.free_while_waited() {
            let (Some(index), Some(phase)) = (row_of(&rows, at), self.phase_at(at)) else {
                continue;
            };
            let row = &mut rows[index].1;
            if ms(length) > row.longest_free_while_waited_ms {
                row.longest_free_while_waited_ms = ms(length);
                let after_heal = (at as f64 - phase.healed as f64) / 1e6;
                row.longest_free_while_waited_where =
                    Some((call.key.clone(), call.worker, call.seq, after_heal));
            }
        }
        rows
    }

    /// The longest time in `phase` that a key went without a lock taken on it, from the
    /// injection to its first lock after the heal (or the phase's end).
    fn outage(&self, phase: &Phase) -> u64 {
        let mut longest = 0;
        for calls in self.holders().values() {
            let mut since = phase.start;
            let mut recovered = false;
            for (start, _) in calls.iter().filter_map(|call| call.body) {
                if start < phase.start {
                    continue;
                }
                longest = longest.max(start.min(phase.end) - since);
                if start >= phase.healed || start >= phase.end {
                    recovered = true;
                    break;
                }
                since = start;
            }
            if !recovered {
                longest = longest.max(phase.end.saturating_sub(since));
            }
        }
        longest
    }

    fn phase_at(&self, at: u64) -> Option<&Phase> {
        self.phases
            .iter()
            .find(|phase| phase.start <= at && at < phase.end)
    }

    /// Held calls per key, by body start.
    fn holders(&self) -> BTreeMap<&str, Vec<&Call>> {
        let mut holders: BTreeMap<&str, Vec<&Call>> = BTreeMap::new();
        for call in self.calls.iter().filter(|call| call.held()) {
            holders.entry(call.key.as_str()).or_default().push(call);
        }
        for calls in holders.values_mut() {
            calls.sort_by_key(|call| call.body.map(|(start, _)| start));
        }
        holders
    }

    /// Every pair of bodies on one key that ran at the same time: when the later began, whether
    /// the key is fenced, and how long they overlapped.
    fn overlaps(&self) -> Vec<(u64, bool, u64, String)> {
        let mut found = Vec::new();
        for calls in self.holders().values() {
            let fenced = calls.iter().any(|call| call.fence.is_some());
            for (index, earlier) in calls.iter().enumerate() {
                let (_, earlier_stop) = earlier.body.expect("held");
                for later in &calls[index + 1..] {
                    let (later_start, later_stop) = later.body.expect("held");
                    if later_start >= earlier_stop {
                        break;
                    }
                    found.push((
                        later_start,
                        fenced,
                        earlier_stop.min(later_stop) - later_start,
                        format!("{} and {}", holder(earlier), holder(later)),
                    ));
                }
            }
        }
        found
    }

    /// Unfenced increments applied from a value another applied increment had also read: when
    /// the later of them began.
    fn lost_unfenced(&self) -> Vec<u64> {
        let mut by_read: HashMap<(&str, u64), Vec<u64>> = HashMap::new();
        for call in self.calls {
            if call.fence.is_none()
                && call.outcome == Outcome::Applied
                && let (Some(read), Some((start, _))) = (call.read, call.body)
            {
                by_read.entry((&call.key, read)).or_default().push(start);
            }
        }
        later_of_each_group(by_read.into_values())
    }

    /// From the fenced storage's own history: writes accepted although another holder had used
    /// the same or a higher token before (stale), and writes of a counter value already written
    /// (lost updates); each at the start of the writer's body.
    fn fenced_storage_findings(&self) -> (Vec<u64>, Vec<u64>) {
        let started: HashMap<(u32, u64), u64> = self
            .calls
            .iter()
            .filter_map(|call| Some(((call.worker, call.seq), call.body?.0)))
            .collect();
        let start_of = |writer: &str| -> Option<u64> {
            let (worker, seq) = writer.strip_prefix('w')?.split_once('c')?;
            started
                .get(&(worker.parse().ok()?, seq.parse().ok()?))
                .copied()
        };
        let (mut stale, mut lost) = (Vec::new(), Vec::new());
        for writes in self.applied.values() {
            let mut highest: Option<(u64, &str)> = None;
            let mut by_counter: HashMap<u64, Vec<u64>> = HashMap::new();
            for (fence, value) in writes {
                let Some((counter, writer)) = parse_fenced_value(value) else {
                    continue;
                };
                let at = start_of(writer).unwrap_or(0);
                // One call writes under one token; another call with a token no higher than
                // the highest applied so far is a stale holder the storage let through.
                if let Some((top, top_writer)) = highest
                    && (*fence < top || (*fence == top && top_writer != writer))
                {
                    stale.push(at);
                }
                if highest.is_none_or(|(top, _)| *fence >= top) {
                    highest = Some((*fence, writer));
                }
                by_counter.entry(counter).or_default().push(at);
            }
            lost.extend(later_of_each_group(by_counter.into_values()));
        }
        (stale, lost)
    }

    /// The longest stretch, per waiting call, in which nobody held the key it waited for:
    /// when the stretch began, and how long it was. A holder whose body ran to its end holds
    /// the key until its call returns (the release is confirmed first); one cancelled, until
    /// its body stopped (its lease was over, or about to be). While a fault is injected, and
    /// for [`recovery_grace`] after its heal, the deployment may not answer or its clients may
    /// still reconnect: that time counts as recovery, not as a key left free.
    fn free_while_waited(&self) -> Vec<(u64, u64, &Call)> {
        let faults: Vec<(u64, u64)> = self
            .phases
            .iter()
            .filter(|phase| phase.fault != Fault::None)
            .map(|phase| {
                let grace = recovery_grace(self.deployment, phase.fault).as_nanos() as u64;
                (phase.start, phase.healed + grace)
            })
            .collect();
        let holders = self.holders();
        let held = |call: &Call| {
            let (start, stop) = call.body?;
            Some(match call.outcome {
                Outcome::Applied | Outcome::Rejected => (start, call.returned),
                _ => (start, stop),
            })
        };
        let mut found = Vec::new();
        for call in self.calls {
            let waited = match (call.body, call.outcome) {
                (Some((start, _)), _) => (call.called, start),
                (None, Outcome::Busy) => (call.called, call.returned),
                _ => continue,
            };
            let others = holders
                .get(call.key.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter(|other| (other.worker, other.seq) != (call.worker, call.seq))
                .filter_map(|other| held(other))
                .chain(faults.iter().copied());
            if let Some((at, length)) = longest_uncovered(waited, others) {
                found.push((at, length, call));
            }
        }
        found
    }
}

/// For groups of times of events that should each have happened once: every time but the
/// earliest of each group.
fn later_of_each_group(groups: impl Iterator<Item = Vec<u64>>) -> Vec<u64> {
    groups
        .flat_map(|mut times| {
            times.sort_unstable();
            times.into_iter().skip(1)
        })
        .collect()
}

/// The longest part of `window` that none of `covers` covers: its start and length.
fn longest_uncovered(
    (from, to): (u64, u64),
    covers: impl Iterator<Item = (u64, u64)>,
) -> Option<(u64, u64)> {
    let mut covers: Vec<(u64, u64)> = covers
        .filter(|(start, stop)| *stop > from && *start < to)
        .collect();
    covers.sort_unstable();
    let mut best: Option<(u64, u64)> = None;
    let mut free_from = from;
    let mut consider = |start: u64, stop: u64| {
        if stop > start && best.is_none_or(|(_, length)| stop - start > length) {
            best = Some((start, stop - start));
        }
    };
    for (start, stop) in covers {
        consider(free_from, start.min(to));
        free_from = free_from.max(stop);
    }
    consider(free_from, to);
    best
}

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A promise a row broke: the deployment, the fault, and what went wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broken {
    /// Where.
    pub deployment: Deployment,
    /// Under which fault.
    pub fault: Fault,
    /// Which figure was out of bounds, with its value.
    pub what: String,
    /// What is known of it, when it is a known defect (which does not fail the run).
    pub known: Option<&'static str>,
}

/// The promises `row` breaks for `fault` on `deployment`.
pub fn broken(deployment: Deployment, fault: Fault, row: &Row) -> Vec<Broken> {
    let promise = promise(deployment, fault);
    let mut figures = Vec::new();
    if promise.exclusive {
        figures.push(("overlapping holders (unfenced keys)", row.overlaps_unfenced));
        figures.push(("overlapping holders (fenced keys)", row.overlaps_fenced));
        figures.push(("lost unfenced updates", row.lost_unfenced));
    }
    if promise.fenced {
        figures.push(("stale fenced writes accepted", row.stale_accepted));
        figures.push(("lost fenced updates", row.lost_fenced));
    }
    let mut found: Vec<Broken> = figures
        .into_iter()
        .filter(|(_, count)| *count > 0)
        .map(|(what, count)| {
            let pair = match (what.starts_with("overlapping"), &row.longest_overlap_where) {
                (true, Some(pair)) => {
                    format!(" (the longest, {:.0} ms: {pair})", row.longest_overlap_ms)
                }
                _ => String::new(),
            };
            Broken {
                deployment,
                fault,
                what: format!("{what}: {count}{pair}"),
                known: known_defect(deployment, fault, what),
            }
        })
        .collect();
    if promise.rides_out && row.failed_waiting > 0 {
        found.push(Broken {
            deployment,
            fault,
            what: format!(
                "{RIDES_OUT}: {} (the longest a key went without a lock in the fault, {:.0} ms; \
                 the wait {} s)",
                row.failed_waiting,
                row.outage_ms,
                WAITING_WAIT.as_secs()
            ),
            known: known_defect(deployment, fault, RIDES_OUT),
        });
    }
    if promise.woken && row.longest_free_while_waited_ms > WAKE_UP_BOUND.as_secs_f64() * 1e3 {
        found.push(Broken {
            deployment,
            fault,
            what: format!(
                "{WAKE_UP}: {:.0} ms (bound {} ms){}",
                row.longest_free_while_waited_ms,
                WAKE_UP_BOUND.as_millis(),
                row.longest_free_while_waited_where
                    .as_ref()
                    .map(|(key, worker, seq, after_heal)| format!(
                        ", on {key} from {after_heal:.0} ms after the heal, while worker \
                         {worker}'s call {seq} waited"
                    ))
                    .unwrap_or_default()
            ),
            known: known_defect(deployment, fault, WAKE_UP),
        });
    }
    found
}

/// One holder of an overlapping pair, as the history names it: worker, call, fencing token,
/// body (ns on the campaign's clock) and outcome.
fn holder(call: &Call) -> String {
    let fence = call
        .fence
        .map_or_else(|| "unfenced".to_owned(), |f| format!("fence {f}"));
    let (start, stop) = call.body.unwrap_or_default();
    format!(
        "{} worker {} call {} ({fence}, body {start}..{stop}, {:?})",
        call.key, call.worker, call.seq, call.outcome
    )
}

/// The header of the table [`table_row`] fills.
pub fn table_header() -> String {
    "| deployment | fault | rounds | calls completed / fenced-rejected | failed waiting / fail-fast \
     | overlaps unfenced / fenced (longest) | stale fenced writes accepted \
     | lost updates unfenced / fenced | longest free while waited | recovery | verdict |\n\
     |---|---|---|---|---|---|---|---|---|---|---|\n"
        .to_owned()
}

/// One Markdown table line; the verdict says whether each promised figure held.
pub fn table_row(deployment: Deployment, fault: Fault, row: &Row) -> String {
    let promise = promise(deployment, fault);
    let fenced = |figure: usize| {
        if deployment.offers_fencing() {
            figure.to_string()
        } else {
            "n/a".to_owned()
        }
    };
    let mark = |promised: bool, figure: String| {
        if promised {
            format!("**{figure}**")
        } else {
            figure
        }
    };
    let overlaps = mark(
        promise.exclusive,
        format!(
            "{} / {}",
            row.overlaps_unfenced,
            fenced(row.overlaps_fenced)
        ),
    );
    let longest = if row.overlaps_unfenced + row.overlaps_fenced > 0 {
        format!(" ({:.0} ms)", row.longest_overlap_ms)
    } else {
        String::new()
    };
    let broken = broken(deployment, fault, row);
    let overlapped = row.overlaps_unfenced + row.overlaps_fenced + row.lost_unfenced > 0;
    let verdict = if broken.iter().any(|broken| broken.known.is_none()) {
        "BROKEN"
    } else if !broken.is_empty() {
        "KNOWN DEFECT"
    } else if promise.exclusive || !overlapped {
        "promises hold"
    } else {
        "promises hold; overlap documented"
    };
    let mut line = String::new();
    let _ = writeln!(
        line,
        "| {deployment} | {fault} | {} | {} / {} | {} / {} | {overlaps}{longest} | {} | {} / {} | **{:.0} ms** | {:.0} ms | {verdict} |",
        row.rounds,
        row.completed,
        fenced(row.rejected),
        mark(promise.rides_out, row.failed_waiting.to_string()),
        row.failed_fail_fast,
        mark(promise.fenced, fenced(row.stale_accepted)),
        mark(promise.exclusive, row.lost_unfenced.to_string()),
        mark(promise.fenced, fenced(row.lost_fenced)),
        row.longest_free_while_waited_ms,
        row.recovery_ms,
    );
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(worker: u32, seq: u64, key: &str, body: (u64, u64), read: u64) -> Call {
        Call {
            worker,
            caller: Caller::Waiting,
            seq,
            key: key.into(),
            fence: None,
            called: body.0 - 5,
            body: Some(body),
            returned: body.1 + 5,
            read: Some(read),
            outcome: Outcome::Applied,
        }
    }

    #[test]
    fn counts_overlaps_lost_updates_and_stale_fenced_writes() {
        let calls = vec![
            held(1, 1, "safety:u0", (100, 200), 0),
            held(2, 1, "safety:u0", (150, 250), 0),
            held(3, 1, "safety:u0", (300, 400), 1),
            Call {
                fence: Some(7),
                ..held(1, 2, "safety:f0", (100, 200), 0)
            },
            Call {
                fence: Some(7),
                ..held(2, 2, "safety:f0", (300, 400), 1)
            },
        ];
        let applied = BTreeMap::from([(
            "safety:f0".to_owned(),
            vec![(7, "1 w1c2".to_owned()), (7, "2 w2c2".to_owned())],
        )]);
        let phases = [Phase {
            fault: Fault::None,
            start: 0,
            healed: 0,
            end: 1_000,
        }];
        let campaign = Campaign {
            deployment: Deployment::Single,
            calls: &calls,
            applied: &applied,
            phases: &phases,
        };
        let rows = campaign.rows();
        let row = &rows[0].1;
        assert_eq!(row.overlaps_unfenced, 1);
        assert_eq!(row.overlaps_fenced, 0);
        assert_eq!(row.lost_unfenced, 1);
        assert_eq!(row.stale_accepted, 1, "two holders shared token 7");
        assert_eq!(row.lost_fenced, 0);
        let broken = broken(Deployment::Single, Fault::None, row);
        assert_eq!(broken.len(), 3);
        assert!(
            broken[0].what.contains(
                "safety:u0 worker 1 call 1 (unfenced, body 100..200, Applied) and \
                 safety:u0 worker 2 call 1 (unfenced, body 150..250, Applied)"
            ),
            "the pair is named: {}",
            broken[0].what
        );
    }

    #[test]
    fn failed_calls_are_counted_by_caller_and_waiting_ones_break_a_failover() {
        let failed = |worker, seq, caller, outcome| Call {
            caller,
            called: 400,
            body: None,
            returned: 500,
            read: None,
            outcome,
            ..held(worker, seq, "safety:u0", (100, 200), 0)
        };
        let calls = vec![
            held(1, 1, "safety:u0", (100, 200), 0),
            failed(2, 1, Caller::FailFast, Outcome::Redis),
            failed(2, 2, Caller::FailFast, Outcome::Busy),
            failed(3, 1, Caller::Waiting, Outcome::Redis),
            held(1, 2, "safety:u0", (900, 950), 1),
        ];
        let phases = [Phase {
            fault: Fault::Failover,
            start: 300,
            healed: 800,
            end: 1_000,
        }];
        let campaign = Campaign {
            deployment: Deployment::Sentinel,
            calls: &calls,
            applied: &BTreeMap::new(),
            phases: &phases,
        };
        let rows = campaign.rows();
        let row = &rows[0].1;
        assert_eq!((row.failed_waiting, row.failed_fail_fast), (1, 1));
        assert_eq!(
            row.outage_ms,
            ms(600),
            "no lock from the fault at 300 to 900"
        );
        let broken = broken(Deployment::Sentinel, Fault::Failover, row);
        assert_eq!(broken.len(), 1);
        assert!(broken[0].what.starts_with(RIDES_OUT), "{broken:?}");
    }

    #[test]
    fn free_time_is_the_longest_uncovered_part_of_a_wait() {
        assert_eq!(
            longest_uncovered((0, 100), [(10, 20), (15, 40), (90, 200)].into_iter()),
            Some((40, 50))
        );
        assert_eq!(longest_uncovered((0, 100), [(0, 100)].into_iter()), None);
    }
}
