//! A master's replication as Redis 7 runs it, reduced to what a client can tell: the master
//! appends the effects of each write to its replication stream (a script's writes as one entry,
//! as `MULTI`/`EXEC` wraps them), its offset counting the bytes sent; each replica applies the
//! entries a lag after they were written, unless cut off, and acknowledges at once what it
//! applied.
//!
//! Offsets count the stream's bytes as Redis counts them, less the `SELECT` and the master's
//! periodic `PING` (every 10 s) that a real stream also carries: they grow as a real master's,
//! not to the same numbers.

use std::collections::VecDeque;
use std::time::Duration;

use super::keyspace::Keyspace;
use super::reply::Args;

/// A master's replication stream: its id, its offset, and what some replica still needs.
pub(crate) struct Log {
    /// `master_replid`: a new one after a failover or a restart.
    pub(crate) id: String,
    /// `master_replid2`, the id this master's history continued (its old master's, after a
    /// failover), and `second_repl_offset`.
    pub(crate) previous: Option<(String, u64)>,
    /// `master_repl_offset`: the bytes written so far.
    pub(crate) offset: u64,
    /// The offset the backlog began after: `None` until a replica first attached.
    pub(crate) backlog_from: Option<u64>,
    /// Entries some replica following this stream has not applied yet.
    entries: VecDeque<Written>,
}

/// One entry of the stream: the effects of one command, when it ran, and the offset after it.
struct Written {
    end: u64,
    at_us: u64,
    commands: Vec<Vec<Vec<u8>>>,
}

impl Log {
    pub(crate) fn new(id: String, offset: u64) -> Self {
        Self {
            id,
            previous: None,
            offset,
            backlog_from: None,
            entries: VecDeque::new(),
        }
    }

    /// Appends the effects of one command run at `at_us` (nothing for none).
    pub(crate) fn append(&mut self, at_us: u64, commands: Vec<Vec<Vec<u8>>>) {
        if commands.is_empty() {
            return;
        }
        let wrapped = if commands.len() > 1 {
            resp_len(&[b"MULTI".to_vec()]) + resp_len(&[b"EXEC".to_vec()])
        } else {
            0
        };
        self.offset += wrapped + commands.iter().map(|c| resp_len(c)).sum::<u64>();
        self.entries.push_back(Written {
            end: self.offset,
            at_us,
            commands,
        });
    }

    /// Forgets the entries every replica following the stream has applied (`applied`, the least
    /// of their offsets; `None` when none follows it).
    pub(crate) fn trim(&mut self, applied: Option<u64>) {
        let applied = applied.unwrap_or(self.offset);
        while self
            .entries
            .front()
            .is_some_and(|entry| entry.end <= applied)
        {
            self.entries.pop_front();
        }
    }

    /// `repl_backlog_histlen`: the bytes the backlog holds (its 1 MB cap never reached here).
    pub(crate) fn backlog_length(&self) -> u64 {
        self.backlog_from.map_or(0, |from| self.offset - from)
    }
}

/// One replica: its own keyspace and what it applied of its master's stream.
pub(crate) struct Replica {
    pub(crate) keyspace: Keyspace,
    pub(crate) run_id: String,
    /// The stream it follows (its master's `master_replid`) and its offset there: what it
    /// applied, and acknowledged.
    pub(crate) following: String,
    pub(crate) applied: u64,
    /// How long after a write the replica has it.
    pub(crate) lag: Duration,
    /// Cut off: it receives nothing, and its master no longer lists it.
    pub(crate) cut_off: bool,
}

impl Replica {
    /// A replica fully synced with `master` (its data as of `log`'s offset).
    pub(crate) fn synced(master: &Keyspace, log: &Log, run_id: String, lag: Duration) -> Self {
        Self {
            keyspace: master.copy(),
            run_id,
            following: log.id.clone(),
            applied: log.offset,
            lag,
            cut_off: false,
        }
    }

    /// A full resync with `master`: its data replaced by the master's.
    pub(crate) fn resync(&mut self, master: &Keyspace, log: &Log) {
        self.keyspace = master.copy();
        self.following = log.id.clone();
        self.applied = log.offset;
    }

    /// Applies what `log` holds that is `lag` old at `now_us`. Each entry is applied on the
    /// clock of its writing: a replica never expires a key its master still had.
    pub(crate) fn catch_up(&mut self, log: &Log, now_us: u64) {
        if self.cut_off || self.following != log.id {
            return;
        }
        let lag = u64::try_from(self.lag.as_micros()).unwrap_or(u64::MAX);
        for entry in &log.entries {
            if entry.end <= self.applied {
                continue;
            }
            if entry.at_us.saturating_add(lag) > now_us {
                break;
            }
            self.keyspace.now_us = entry.at_us;
            for command in &entry.commands {
                self.keyspace.execute(&Args::new(command.clone()));
            }
            self.applied = entry.end;
        }
        self.keyspace.now_us = now_us;
        // What applying propagated or published goes nowhere: no replica of a replica here.
        self.keyspace.effects.clear();
        self.keyspace.published.clear();
    }
}

/// The bytes a command takes in the stream (RESP): `*n`, then each argument as `$len` and its
/// bytes, each part ended by CRLF.
fn resp_len(command: &[Vec<u8>]) -> u64 {
    let header = |n: usize| 1 + n.to_string().len() as u64 + 2;
    header(command.len())
        + command
            .iter()
            .map(|arg| header(arg.len()) + arg.len() as u64 + 2)
            .sum::<u64>()
}

#[cfg(test)]
mod tests {
    use super::resp_len;

    #[test]
    fn a_command_takes_its_resp_length() {
        // *1\r\n$4\r\nPING\r\n
        assert_eq!(resp_len(&[b"PING".to_vec()]), 14);
        // *2\r\n$3\r\nDEL\r\n$10\r\n0123456789\r\n
        assert_eq!(resp_len(&[b"DEL".to_vec(), b"0123456789".to_vec()]), 30);
    }
}
