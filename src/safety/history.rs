//! What a safety worker saw, one line per locked call, as the checker reads it.
//!
//! Text rather than JSON: the workers and the checker are the only readers, the lines stay
//! greppable in a saved history, and no serialisation crate is needed. Times are nanoseconds
//! on `CLOCK_MONOTONIC`, which every process on the machine shares, so the histories of many
//! workers and the nemesis's own log compare directly.

use std::fmt;
use std::time::Duration;

pub use crate::monotonic_ns;

/// How a locked call ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The body ran to its end and its write took effect.
    Applied,
    /// The body ran to its end, but the fenced storage rejected its read or write as stale.
    Rejected,
    /// `Busy`: the wait ran out.
    Busy,
    /// `Lost`: the lease ended under the body, which was cancelled.
    Lost,
    /// `RenewalsExhausted`.
    Exhausted,
    /// `Redis`: the deployment failed or did not answer.
    Redis,
    /// `NoQuorum` (Redlock).
    NoQuorum,
    /// Any other error.
    Other,
}

impl Outcome {
    const NAMES: [(Outcome, &'static str); 8] = [
        (Outcome::Applied, "applied"),
        (Outcome::Rejected, "rejected"),
        (Outcome::Busy, "busy"),
        (Outcome::Lost, "lost"),
        (Outcome::Exhausted, "exhausted"),
        (Outcome::Redis, "redis"),
        (Outcome::NoQuorum, "noquorum"),
        (Outcome::Other, "other"),
    ];

    fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(outcome, _)| *outcome == self)
            .map_or("other", |(_, name)| name)
    }

    fn parse(name: &str) -> Option<Self> {
        Self::NAMES
            .iter()
            .find(|(_, known)| *known == name)
            .map(|(outcome, _)| *outcome)
    }
}

/// Whether the caller asked to wait: the contract differs, so the checker counts them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// `wait = 10s` ([`WAITING_WAIT`]): a failure that heals is waited out inside the wait, so a
    /// failover the deployment recovers from meanwhile costs such a caller time, not an error.
    Waiting,
    /// No `wait`: the call fails fast, with `Busy` on a held key and an error on a failing
    /// deployment.
    FailFast,
}

/// The wait of a [`Caller::Waiting`] worker: as a user who asked to ride out a failover would
/// set it, several times the few seconds the campaign's failovers take.
pub const WAITING_WAIT: Duration = Duration::from_secs(10);

impl Caller {
    /// The word a worker's command line and its `call` lines use.
    pub fn name(self) -> &'static str {
        match self {
            Caller::Waiting => "waiting",
            Caller::FailFast => "fail-fast",
        }
    }

    /// The caller named by [`name`](Self::name).
    pub fn parse(name: &str) -> Option<Self> {
        [Caller::Waiting, Caller::FailFast]
            .into_iter()
            .find(|caller| caller.name() == name)
    }
}

/// One locked call by one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The worker process.
    pub worker: u32,
    /// Whether it waits for the lock.
    pub caller: Caller,
    /// The call's number within its worker.
    pub seq: u64,
    /// The lock key (`safety:f0`, ...).
    pub key: String,
    /// The fencing token, when the call used fencing and got the lock.
    pub fence: Option<u64>,
    /// When the call began (it may then wait).
    pub called: u64,
    /// The body's run, from its first instruction to its end or cancellation, when it ran.
    pub body: Option<(u64, u64)>,
    /// When the call returned (after the release).
    pub returned: u64,
    /// The counter value the body read, when it read one.
    pub read: Option<u64>,
    /// How it ended.
    pub outcome: Outcome,
}

impl Call {
    /// Whether this call held the lock, i.e. its body ran.
    pub fn held(&self) -> bool {
        self.body.is_some()
    }

    /// Parses a `call` line written by [`Display`](fmt::Display); `None` for any other line.
    pub fn parse(line: &str) -> Option<Self> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [
            "call",
            worker,
            caller,
            seq,
            key,
            fence,
            called,
            start,
            stop,
            returned,
            read,
            outcome,
        ] = fields.as_slice()
        else {
            return None;
        };
        let optional = |field: &str| match field {
            "-" => Some(None),
            number => number.parse().ok().map(Some),
        };
        Some(Call {
            worker: worker.parse().ok()?,
            caller: Caller::parse(caller)?,
            seq: seq.parse().ok()?,
            key: (*key).to_owned(),
            fence: optional(fence)?,
            called: called.parse().ok()?,
            body: optional(start)?.zip(optional(stop)?),
            returned: returned.parse().ok()?,
            read: optional(read)?,
            outcome: Outcome::parse(outcome)?,
        })
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let optional = |value: Option<u64>| value.map_or("-".to_owned(), |v| v.to_string());
        write!(
            f,
            "call {} {} {} {} {} {} {} {} {} {} {}",
            self.worker,
            self.caller.name(),
            self.seq,
            self.key,
            optional(self.fence),
            self.called,
            optional(self.body.map(|(start, _)| start)),
            optional(self.body.map(|(_, stop)| stop)),
            self.returned,
            optional(self.read),
            self.outcome.name()
        )
    }
}

/// The line a worker prints when a body starts, so the nemesis can pause a holder mid-body.
pub fn begin_line(worker: u32, key: &str) -> String {
    format!("begin {worker} {key}")
}

/// The value a fenced body writes: the counter, then who wrote it (`w{worker}c{seq}`), so the
/// storage's own history names each holder.
pub fn fenced_value(counter: u64, worker: u32, seq: u64) -> String {
    format!("{counter} w{worker}c{seq}")
}

/// The counter and the writer in a [`fenced_value`].
pub fn parse_fenced_value(value: &str) -> Option<(u64, &str)> {
    let (counter, writer) = value.split_once(' ')?;
    Some((counter.parse().ok()?, writer))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_lines_round_trip() {
        let call = Call {
            worker: 3,
            caller: Caller::FailFast,
            seq: 17,
            key: "safety:f0".into(),
            fence: Some(1_700_000_000_000_001),
            called: 10,
            body: Some((12, 40)),
            returned: 45,
            read: None,
            outcome: Outcome::Lost,
        };
        assert_eq!(Call::parse(&call.to_string()), Some(call));
        assert_eq!(Call::parse("begin 3 safety:f0"), None);
    }
}
