//! Replica acknowledgement (Sentinel, Cluster): a grant, and each renewal, counts only once
//! `WAIT` says enough replicas have it, so that a failover to a replica keeps every lock its
//! holder believes in.
//!
//! How many replicas a write needs is counted per shard (the one server, or the slots one
//! cluster master serves) from its master's `INFO replication`: replicas `online` whose last
//! acknowledgement is at most [`SILENT_AFTER`] old. On a cluster the same request asks the
//! master which slots it serves (`CLUSTER SLOTS`), so one count covers them all: a key in a slot
//! not seen yet costs no `INFO` when its master was counted. A shard is counted at its first write, again when `WAIT` answers short,
//! and at most every [`RECOUNT`] in the background while fewer than asked are counted (a replica
//! back, or one a failover brought, counts soon) or while writes there are acknowledged (so a
//! master a failover put in place is known before it loses a replica).
//!
//! So one Redis without replicas sends no `WAIT`. A frozen replica, or one whose link to the
//! master broke, fails grants (each undone) until [`SILENT_AFTER`] has passed since a write there
//! was last acknowledged: it may be promoted yet, without the writes it missed. A replica lost for
//! longer no longer holds locks up. A failover starts afresh: the new master (a new
//! `master_replid`) is taken at its count.
//!
//! On one server the writes share rounds of `WAIT` ([`Replicas::lead`]).

use std::collections::{BTreeMap, HashMap};
use std::ops::RangeInclusive;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::oneshot;

use super::info_field as field;
use crate::clock::{self, nanos};
use crate::store::StoreError;

/// A replica whose last acknowledgement is older than this no longer counts: the master lost it.
pub(crate) const SILENT_AFTER: Duration = Duration::from_secs(5);

/// How often a shard is counted again: while fewer replicas than asked were counted, or while
/// writes there are acknowledged (so its master's `master_replid` stays known).
const RECOUNT: Duration = Duration::from_secs(1);

/// How often a shard short of replicas is counted again when its master never had one: its
/// `INFO replication` said `repl_backlog_active:0` (a master keeps its backlog for
/// `repl-backlog-ttl`, an hour by default, after its last replica left, so one that lost a
/// replica is still counted every [`RECOUNT`]).
const RECOUNT_NEVER_REPLICATED: Duration = Duration::from_secs(5);

/// How many replicas a write needs on one store.
pub(crate) struct Replicas {
    /// Asked for (`LockClientBuilder::replica_acks`); 0: acknowledgement off.
    wanted: u32,
    /// How long `WAIT` waits.
    pub(crate) timeout: Duration,
    /// A count in the background is under way.
    counting: AtomicBool,
    /// What is known of each shard's master; a shard not in it is counted at its first write.
    shards: Mutex<Shards>,
    /// Per shared connection (one server): the `WAIT` in flight on it, and the writes answered
    /// meanwhile that the next one will cover.
    rounds: Mutex<HashMap<u64, Round>>,
}

/// Group commit on one connection. `WAIT` answers for every write its connection sent before
/// it, so one in flight at a time serves every grant and renewal whose write was answered
/// meanwhile: one `WAIT` blocks the shared connection per round, not one per write.
#[derive(Default)]
struct Round {
    /// Those waiting for the next `WAIT`: the acks each needs, and where to answer.
    next: Vec<(u32, Acked)>,
}

/// Where a round's answer goes: `WAIT`'s count, or why it has none.
pub(crate) type Acked = oneshot::Sender<Result<u32, StoreError>>;

/// A write's part in its connection's rounds.
pub(crate) enum Turn {
    /// No `WAIT` is in flight there: send one now (it covers this write) and then run the
    /// rounds that gathered meanwhile ([`Replicas::next_round`]).
    Lead,
    /// One is in flight: the next round answers here.
    Follow(oneshot::Receiver<Result<u32, StoreError>>),
}

/// A master's `INFO replication`, and on a cluster the slots it serves (its own `CLUSTER
/// SLOTS`; none on one server, or when it refused to say).
pub(crate) struct Replication {
    pub(crate) info: String,
    pub(crate) served: Vec<RangeInclusive<u16>>,
}

/// The shards counted. A shard is named by a slot: `None` on one server; on a cluster the first
/// slot its master serves (or the key's own slot, until its master is counted).
#[derive(Default)]
struct Shards {
    /// Looked up at every acquire (acknowledgement is on by default): a few shards, searched
    /// in order rather than hashed (SipHash of the slot cost more than the search).
    known: BTreeMap<Option<u16>, Shard>,
    /// Cluster: the slot ranges of the masters counted, by first slot: their last slot and the
    /// shard they belong to.
    ranges: BTreeMap<u16, (u16, u16)>,
}

impl Shards {
    /// The shard of a key in `slot`.
    fn of(&self, slot: Option<u16>) -> Option<u16> {
        let slot = slot?;
        match self.ranges.range(..=slot).next_back() {
            Some((_, &(last, shard))) if slot <= last => Some(shard),
            _ => Some(slot),
        }
    }

    /// `served`, the slots of the master that answered for `slot`, form one shard now (a
    /// range it no longer serves in part is forgotten, its slots counted again at their next
    /// write); the shard's name.
    fn regroup(&mut self, slot: Option<u16>, served: &[RangeInclusive<u16>]) -> Option<u16> {
        let Some(first) = served.iter().map(|range| *range.start()).min() else {
            return slot;
        };
        for range in served {
            let overlapping: Vec<u16> = self
                .ranges
                .range(..=*range.end())
                .filter(|(_, (last, _))| last >= range.start())
                .map(|(start, _)| *start)
                .collect();
            for start in overlapping {
                self.ranges.remove(&start);
            }
            self.ranges.insert(*range.start(), (*range.end(), first));
        }
        Some(first)
    }
}

/// What is known of one shard's master.
struct Shard {
    /// Its `master_replid`: a failover changes it.
    replid: String,
    /// What a write there needs now: the most replicas it was counted with lately (fewer only
    /// once they have been gone for [`SILENT_AFTER`]).
    replicas: u32,
    /// When it had `replicas`: counted so, or a write there acknowledged since.
    seen_at: u64,
    counted_at: u64,
    /// When it is counted again while short of replicas: [`RECOUNT`], or
    /// [`RECOUNT_NEVER_REPLICATED`] for a master that never had a replica.
    recount: u64,
}

/// What a write needs now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Needed {
    /// No acknowledgement: off, or no replica counted.
    Nothing,
    /// This many replicas must acknowledge.
    Acks(u32),
    /// Count the replicas first.
    Count,
}

impl Replicas {
    pub(crate) fn new(wanted: u32, timeout: Duration) -> Self {
        Self {
            wanted,
            timeout: timeout.max(Duration::from_millis(1)),
            counting: AtomicBool::new(false),
            shards: Mutex::new(Shards::default()),
            rounds: Mutex::new(HashMap::new()),
        }
    }

    fn shards(&self) -> std::sync::MutexGuard<'_, Shards> {
        self.shards
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// What a write on `shard` needs now, and whether a count is due in the background (fewer
    /// replicas than asked were counted a while ago: one may have come back, or a failover
    /// brought more).
    pub(crate) fn needed(&self, slot: Option<u16>) -> (Needed, bool) {
        self.needed_at(slot, clock::now())
    }

    /// [`Self::needed`] at `now`.
    fn needed_at(&self, slot: Option<u16>, now: u64) -> (Needed, bool) {
        if self.wanted == 0 {
            return (Needed::Nothing, false);
        }
        let Some((required, counted_at, recount)) = ({
            let shards = self.shards();
            let known = shards.known.get(&shards.of(slot));
            known.map(|known| (known.replicas, known.counted_at, known.recount))
        }) else {
            return (Needed::Count, false);
        };
        let needed = match required {
            0 => Needed::Nothing,
            n => Needed::Acks(n),
        };
        let stale = required < self.wanted
            && now.saturating_sub(counted_at) > recount
            && !self.counting.swap(true, Ordering::AcqRel);
        (needed, stale)
    }

    /// Records a count of `replication` on the master of `slot`: the acks a write there needs
    /// now.
    pub(crate) fn counted(&self, slot: Option<u16>, replication: &Replication) -> u32 {
        let info = &replication.info;
        if field(info, "role:").is_some_and(|role| role != "master") {
            // A replica answered: the client's map of the cluster is behind a failover. That is
            // no count; what was known stands (or all that was asked for, until counted).
            self.counting.store(false, Ordering::Release);
            let shards = self.shards();
            return shards
                .known
                .get(&shards.of(slot))
                .map_or(self.wanted, |known| known.replicas);
        }
        let live = self.wanted.min(live_replicas(info));
        let replid = field(info, "master_replid:").unwrap_or_default();
        // Only a master that says so never had a replica: a refused `INFO`, or one without the
        // field, is counted every second.
        let recount = if field(info, "repl_backlog_active:") == Some("0") {
            RECOUNT_NEVER_REPLICATED
        } else {
            RECOUNT
        };
        let shard = self.shards().regroup(slot, &replication.served);
        let required = self.remembered(shard, replid, live, recount, clock::now());
        self.counting.store(false, Ordering::Release);
        required
    }

    /// `live` replicas counted on `shard`'s master `replid` at `now`, or more when that same
    /// master had more within [`SILENT_AFTER`]; a new master (a failover) is taken at its count.
    /// While short of replicas, the shard is counted again after `recount`.
    fn remembered(
        &self,
        shard: Option<u16>,
        replid: &str,
        live: u32,
        recount: Duration,
        now: u64,
    ) -> u32 {
        let mut shards = self.shards();
        if let Some(known) = shards.known.get_mut(&shard)
            && known.replid == replid
            && live < known.replicas
            && now.saturating_sub(known.seen_at) <= nanos(SILENT_AFTER)
        {
            known.counted_at = now;
            known.recount = nanos(recount);
            return known.replicas;
        }
        shards.known.insert(
            shard,
            Shard {
                replid: replid.to_owned(),
                replicas: live,
                seen_at: now,
                counted_at: now,
                recount: nanos(recount),
            },
        );
        live
    }

    /// A write on `shard` was acknowledged: its master's replicas were there just now. Whether
    /// to count them again in the background: the master may have changed (a failover that
    /// kept up), and a replica it loses later keeps counting only if that master was counted.
    pub(crate) fn confirmed(&self, slot: Option<u16>) -> bool {
        let now = clock::now();
        let mut shards = self.shards();
        let shard = shards.of(slot);
        let due = match shards.known.get_mut(&shard) {
            Some(known) => {
                known.seen_at = now;
                now.saturating_sub(known.counted_at) > nanos(RECOUNT)
            }
            None => true,
        };
        due && !self.counting.swap(true, Ordering::AcqRel)
    }

    /// A count that could not be made: try again at the next write.
    pub(crate) fn count_failed(&self) {
        self.counting.store(false, Ordering::Release);
    }

    fn rounds(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Round>> {
        self.rounds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Before a write on `connection` is sent: whether it leads a round (none is in flight
    /// there), pipelining its `WAIT` behind the write. Otherwise it follows, once answered.
    pub(crate) fn lead(&self, connection: u64) -> bool {
        let mut rounds = self.rounds();
        if rounds.contains_key(&connection) {
            return false;
        }
        rounds.insert(connection, Round::default());
        true
    }

    /// After a write on `connection` that needs `acks` was answered: follow the round in flight
    /// (its next `WAIT` covers the write), or lead one if it ended meanwhile.
    pub(crate) fn follow(&self, connection: u64, acks: u32) -> Turn {
        let mut rounds = self.rounds();
        match rounds.get_mut(&connection) {
            None => {
                rounds.insert(connection, Round::default());
                Turn::Lead
            }
            Some(round) => {
                let (answer, answered) = oneshot::channel();
                round.next.push((acks, answer));
                Turn::Follow(answered)
            }
        }
    }

    /// A round on `connection` is over: those who gathered for the next one, with the most
    /// acks any of them needs, or `None` (no `WAIT` is in flight there any more).
    pub(crate) fn next_round(&self, connection: u64) -> Option<(u32, Vec<Acked>)> {
        let mut rounds = self.rounds();
        let round = rounds.get_mut(&connection)?;
        if round.next.is_empty() {
            rounds.remove(&connection);
            return None;
        }
        let next = std::mem::take(&mut round.next);
        let acks = next.iter().map(|(acks, _)| *acks).max().unwrap_or(1);
        Some((acks, next.into_iter().map(|(_, answer)| answer).collect()))
    }

    /// Ends `connection`'s rounds, answered or not.
    pub(crate) fn end_rounds(&self, connection: u64) {
        self.rounds().remove(&connection);
    }

    /// The `WAIT` for `acks` replicas.
    pub(crate) fn wait_cmd(&self, acks: u32) -> redis::Cmd {
        let millis = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(acks).arg(millis.max(1));
        cmd
    }
}

/// The replicas `INFO replication` shows `online` and heard from within [`SILENT_AFTER`]; none
/// when the server is no master.
fn live_replicas(info: &str) -> u32 {
    if field(info, "role:") != Some("master") {
        return 0;
    }
    let live = info
        .lines()
        .filter(|line| {
            line.strip_prefix("slave")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .filter(|line| {
            let entry = |name: &str| {
                line.split([':', ','])
                    .find_map(|part| part.trim().strip_prefix(name))
            };
            entry("state=") == Some("online")
                && entry("lag=")
                    .and_then(|lag| lag.parse::<u64>().ok())
                    .is_some_and(|lag| lag <= SILENT_AFTER.as_secs())
        })
        .count();
    u32::try_from(live).unwrap_or(u32::MAX)
}

/// A grant or renewal fewer replicas acknowledged than it needs.
#[derive(Debug, thiserror::Error)]
#[error(
    "no replica acknowledged the lock `{key}` in time: `WAIT {needed} {timeout_ms}` answered \
     {acked} of {needed}{cause}, so it does not count (a grant is undone, a renewal retried). Check the master's replicas \
     (`INFO replication` on the master: `state=online`, a small `lag`) and the link to them, or \
     set `LockClientBuilder::replica_acks` lower (0 turns acknowledgement off) or \
     `replica_ack_timeout` higher"
)]
pub(crate) struct NotAcknowledged {
    pub(crate) key: String,
    pub(crate) acked: u32,
    pub(crate) needed: u32,
    pub(crate) timeout_ms: u128,
    /// Why `WAIT` got no answer, when it got none.
    pub(crate) cause: String,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{
        Needed, RECOUNT, RECOUNT_NEVER_REPLICATED, Replicas, Replication, SILENT_AFTER,
        live_replicas,
    };
    use crate::clock::nanos;

    #[test]
    fn counts_online_replicas_heard_from_lately() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
                    slave0:ip=127.0.0.1,port=7001,state=online,offset=10,lag=0\r\n\
                    slave1:ip=127.0.0.1,port=7002,state=online,offset=9,lag=12\r\n\
                    slave2:ip=127.0.0.1,port=7003,state=wait_bgsave,offset=0,lag=0\r\n\
                    master_repl_offset:10\r\n";
        assert_eq!(live_replicas(info), 1);
        assert_eq!(live_replicas("role:slave\r\nmaster_host:x\r\n"), 0);
        assert_eq!(live_replicas("role:master\r\nconnected_slaves:0\r\n"), 0);
    }

    #[test]
    fn a_replica_that_went_missing_counts_until_silent_long_enough() {
        let replicas = Replicas::new(1, Duration::from_millis(500));
        let silent = nanos(SILENT_AFTER);
        let remembered = |replid, live, now| replicas.remembered(None, replid, live, RECOUNT, now);
        assert_eq!(remembered("a", 1, 10), 1);
        // The link broke: the master lists no replica, but it may be promoted yet.
        assert_eq!(remembered("a", 0, 10 + silent), 1);
        assert_eq!(remembered("a", 0, 11 + silent), 0);
        // A failover: the new master is taken at its count at once.
        assert_eq!(remembered("a", 1, 12 + silent), 1);
        assert_eq!(remembered("b", 0, 13 + silent), 0);
    }

    #[test]
    fn a_replica_answering_for_its_master_is_no_count() {
        let replicas = Replicas::new(1, Duration::from_millis(500));
        let master = "role:master\r\nmaster_replid:a\r\n\
                      slave0:ip=127.0.0.1,port=7001,state=online,offset=10,lag=0\r\n";
        assert_eq!(replicas.counted(None, &on_a_server(master)), 1);
        let replica = on_a_server("role:slave\r\nmaster_replid:a\r\n");
        assert_eq!(replicas.counted(None, &replica), 1);
        let fresh = Replicas::new(1, Duration::from_millis(500));
        assert_eq!(fresh.counted(None, &replica), 1);
    }

    #[test]
    fn one_count_covers_every_slot_its_master_serves() {
        let replicas = Replicas::new(1, Duration::from_millis(500));
        assert_eq!(replicas.needed(Some(7)).0, Needed::Count);
        let served = Replication {
            info: "role:master\r\nmaster_replid:a\r\n\
                   slave0:ip=127.0.0.1,port=7001,state=online,offset=10,lag=0\r\n"
                .to_owned(),
            served: vec![0..=5460, 10923..=10930],
        };
        assert_eq!(replicas.counted(Some(7), &served), 1);
        for slot in [0, 7, 5460, 10923, 10930] {
            assert_eq!(replicas.needed(Some(slot)).0, Needed::Acks(1), "{slot}");
        }
        for slot in [5461, 10922, 10931] {
            assert_eq!(replicas.needed(Some(slot)).0, Needed::Count, "{slot}");
        }
        // A master without replicas took some of those slots over: only they change.
        let other = Replication {
            info: "role:master\r\nmaster_replid:b\r\n".to_owned(),
            served: vec![5000..=5461],
        };
        assert_eq!(replicas.counted(Some(5461), &other), 0);
        assert_eq!(replicas.needed(Some(5000)).0, Needed::Nothing);
        assert_eq!(replicas.needed(Some(5461)).0, Needed::Nothing);
        assert_eq!(replicas.needed(Some(10925)).0, Needed::Acks(1));
        // The rest of the range the first master lost is counted again.
        assert_eq!(replicas.needed(Some(7)).0, Needed::Count);
    }

    #[test]
    fn a_master_that_never_had_a_replica_is_counted_less_often() {
        let second = nanos(Duration::from_secs(1));
        let recount_of = |info: &str| {
            let replicas = Replicas::new(1, Duration::from_millis(500));
            replicas.counted(None, &on_a_server(info));
            let shards = replicas.shards();
            shards.known[&None].recount
        };
        let never = "role:master\r\nconnected_slaves:0\r\nmaster_replid:a\r\n\
                     repl_backlog_active:0\r\n";
        let lost_one = "role:master\r\nconnected_slaves:0\r\nmaster_replid:a\r\n\
                        repl_backlog_active:1\r\n";
        assert_eq!(recount_of(never), nanos(RECOUNT_NEVER_REPLICATED));
        assert_eq!(recount_of(lost_one), nanos(RECOUNT));
        // A refused `INFO` (an ACL), or one without the field: every second, as before.
        assert_eq!(recount_of(""), nanos(RECOUNT));
        assert_eq!(
            recount_of("role:master\r\nmaster_replid:a\r\n"),
            nanos(RECOUNT)
        );

        // Due after its interval only, and once at a time.
        let stale = |recount: Duration, after: u64| {
            let replicas = Replicas::new(1, Duration::from_millis(500));
            replicas.remembered(None, "a", 0, recount, 10);
            let (needed, stale) = replicas.needed_at(None, 10 + after);
            assert_eq!(needed, Needed::Nothing);
            if stale {
                assert!(
                    !replicas.needed_at(None, 10 + after).1,
                    "one count at a time"
                );
            }
            stale
        };
        assert!(!stale(RECOUNT_NEVER_REPLICATED, 2 * second));
        assert!(!stale(RECOUNT_NEVER_REPLICATED, 5 * second));
        assert!(stale(RECOUNT_NEVER_REPLICATED, 5 * second + 1));
        assert!(!stale(RECOUNT, second));
        assert!(stale(RECOUNT, second + 1));
    }

    /// The simulated Redis's `INFO replication` (`sim::redis`) read as a real server's.
    #[cfg(feature = "sim")]
    #[test]
    fn reads_the_simulated_masters_replicas() {
        use crate::sim::redis::Node;

        let info = |node: &mut Node| match node.command(&["INFO", "replication"]) {
            redis::Value::BulkString(text) => on_a_server(&String::from_utf8(text).unwrap()),
            other => panic!("INFO answered {other:?}"),
        };
        let count = |node: &mut Node| {
            let replicas = Replicas::new(3, Duration::from_millis(500));
            let counted = replicas.counted(None, &info(node));
            let recount = replicas.shards().known[&None].recount;
            (counted, recount)
        };
        let mut node = Node::new(1);
        assert_eq!(count(&mut node), (0, nanos(RECOUNT_NEVER_REPLICATED)));
        let first = node.add_replica(Duration::ZERO);
        let second = node.add_replica(Duration::from_millis(100));
        node.command(&["SET", "k", "v"]);
        assert_eq!(count(&mut node), (2, nanos(RECOUNT)));
        node.cut_off(second);
        assert_eq!(count(&mut node), (1, nanos(RECOUNT)));
        // The same master within `SILENT_AFTER` keeps its count; a failover is a new master.
        let replicas = Replicas::new(3, Duration::from_millis(500));
        node.reconnect(second);
        assert_eq!(replicas.counted(None, &info(&mut node)), 2);
        node.fail_over(first);
        assert_eq!(replicas.counted(None, &info(&mut node)), 1);
    }

    fn on_a_server(info: &str) -> Replication {
        Replication {
            info: info.to_owned(),
            served: Vec::new(),
        }
    }
}
