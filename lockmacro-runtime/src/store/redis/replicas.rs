//! Replica acknowledgement (Sentinel, Cluster): a grant, and each renewal, counts only once
//! `WAIT` says enough replicas have it, so that a failover to a replica keeps every lock its
//! holder believes in.
//!
//! How many replicas a write needs is counted from the master's `INFO replication` (replicas
//! `online` whose last acknowledgement is at most [`SILENT_AFTER`] old): at the first write,
//! again when `WAIT` answers fewer than needed, and every [`SILENT_AFTER`] while fewer than
//! asked are counted. So one Redis without replicas sends no `WAIT`, a frozen replica fails
//! grants (each undone) until it has been silent for [`SILENT_AFTER`], and a replica lost for
//! longer no longer holds locks up: they are granted with what is left.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::clock::{self, nanos};

/// A replica whose last acknowledgement is older than this no longer counts: the master lost it.
pub(crate) const SILENT_AFTER: Duration = Duration::from_secs(5);

/// Replicas not counted yet.
const UNKNOWN: u32 = u32::MAX;

/// How many replicas a write needs on one store.
pub(crate) struct Replicas {
    /// Asked for (`LockClientBuilder::replica_acks`); 0: acknowledgement off.
    wanted: u32,
    /// How long `WAIT` waits.
    pub(crate) timeout: Duration,
    /// `wanted`, or fewer when fewer replicas were counted; [`UNKNOWN`] before the first count.
    required: AtomicU32,
    /// When the last count was made (nanos on [`crate::clock`]).
    counted_at: AtomicU64,
    /// A count in the background is under way.
    counting: AtomicBool,
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
            required: AtomicU32::new(if wanted == 0 { 0 } else { UNKNOWN }),
            counted_at: AtomicU64::new(0),
            counting: AtomicBool::new(false),
        }
    }

    /// What a write needs now, and whether a count is due in the background (fewer replicas
    /// than asked were counted a while ago: one may have come back, or a failover brought more).
    pub(crate) fn needed(&self) -> (Needed, bool) {
        if self.wanted == 0 {
            return (Needed::Nothing, false);
        }
        let required = self.required.load(Ordering::Acquire);
        let needed = match required {
            UNKNOWN => return (Needed::Count, false),
            0 => Needed::Nothing,
            n => Needed::Acks(n),
        };
        let stale = required < self.wanted
            && clock::now().saturating_sub(self.counted_at.load(Ordering::Acquire))
                > nanos(SILENT_AFTER)
            && !self.counting.swap(true, Ordering::AcqRel);
        (needed, stale)
    }

    /// Records a count of `info` (`INFO replication`): the acks a write needs now.
    pub(crate) fn counted(&self, info: &str) -> u32 {
        let required = self.wanted.min(live_replicas(info));
        self.required.store(required, Ordering::Release);
        self.counted_at.store(clock::now(), Ordering::Release);
        self.counting.store(false, Ordering::Release);
        required
    }

    /// A count that could not be made: try again at the next write.
    pub(crate) fn count_failed(&self) {
        self.counting.store(false, Ordering::Release);
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
    if !info.lines().any(|line| line.trim() == "role:master") {
        return 0;
    }
    let live = info
        .lines()
        .filter(|line| {
            line.strip_prefix("slave")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .filter(|line| {
            let field = |name: &str| {
                line.split([':', ','])
                    .find_map(|part| part.trim().strip_prefix(name))
            };
            field("state=") == Some("online")
                && field("lag=")
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
    use super::live_replicas;

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
}
