//! What the contract promises under each fault, next to the checker that holds it to it.
//!
//! A figure is either *promised* to be zero for a deployment and fault (the runner fails when it
//! is not) or only *documented* (measured and printed: the table in docs/safety.md says how
//! large it came out). The split follows the README's "What it cannot do" and the deployments
//! table of the design:
//!
//! - With fencing, no stale write is accepted and no update is lost, anywhere fencing is
//!   offered (every deployment but Redlock), whatever the fault: that is what fencing is for.
//! - Two holders of one key never overlap, and so no unfenced update is lost, when no data the
//!   lock lives on is lost and no holder is frozen: no fault; a server frozen (`SIGSTOP`) while
//!   its sentinels keep it master; a slow or blackholed network; a planned failover (the replica
//!   catches up before it takes over); Redlock masters, a minority or a majority, down for
//!   longer than the ttl (every lease on them has expired by the time they return empty: the
//!   Redlock paper's delayed restart).
//! - Overlap is only documented where the lock's own data is lost or its holder frozen: a
//!   restart without persistence, a failover of an unreplicated write (Sentinel, Cluster, and a
//!   cluster master frozen past its node timeout, which is a failover), Redlock masters
//!   restarted empty at once — a majority, and a minority too: a lease held on a bare majority
//!   (the other masters were busy, slow or down when it was taken) that loses one master to the
//!   restart is a minority lease, and another client takes the key (the counterexample of the
//!   Redis documentation's Redlock page, which is why it asks for delayed restarts) — and a
//!   holder paused past its ttl (Kleppmann's example: only fencing makes that safe).
//! - A waiter is woken when the key it waits for becomes free ("no waiter sleeps while the lock
//!   it waits for is free"): once the deployment has recovered — outside the fault and the
//!   [`RECOVERY_GRACE`] after its heal, in which clients reconnect and resubscribe (the recovery
//!   column measures that time) — no key stands free for longer than [`WAKE_UP_BOUND`] while
//!   someone waits for it, on every deployment. The bound is far above a loopback round trip
//!   so that a loaded machine's scheduling does not count as a breach.
//! - A caller that asked to wait rides out a failover ("Failovers are waits" in the design):
//!   where the deployment recovers inside the wait — a Sentinel or Cluster failover, planned,
//!   forced onto a lagging replica or after a master's death, and a replica lost and resynced,
//!   each over in a few seconds against the waiting workers' 10 s — no waiting call fails.
//!   Fail-fast calls (no `wait`) fail there by design; their failures are only counted.

use std::fmt;
use std::time::Duration;

/// How long a key may stand free while someone waits for it, once the deployment recovered.
pub const WAKE_UP_BOUND: Duration = Duration::from_millis(300);

/// How long after a fault's heal clients may take to reconnect and resubscribe before the
/// wake-up promise applies again (see [`recovery_grace`]).
pub const RECOVERY_GRACE: Duration = Duration::from_secs(1);

/// The lease ttl of the campaign's workers.
pub const WORKER_TTL: Duration = Duration::from_secs(1);

/// How long after `fault`'s heal on `deployment` the wake-up promise is suspended:
/// [`RECOVERY_GRACE`], and a lease ttl more where Redlock masters came back empty, whose takes
/// do not count toward a new lease for a ttl (the delayed restart that keeps the leases they
/// forgot): the key is not free for the taking then.
pub fn recovery_grace(deployment: Deployment, fault: Fault) -> Duration {
    let masters_back_empty = matches!(
        fault,
        Fault::MinorityRestart
            | Fault::MinorityDown
            | Fault::MajorityDown
            | Fault::MajorityRestart
            | Fault::BareMajorityRestart
    );
    match deployment {
        Deployment::Redlock(_) if masters_back_empty => RECOVERY_GRACE + WORKER_TTL,
        _ => RECOVERY_GRACE,
    }
}

/// Where the locks live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deployment {
    /// One `redis-server`.
    Single,
    /// A master and a replica behind three sentinels.
    Sentinel,
    /// Three masters with a replica each.
    Cluster,
    /// Redlock over this many independent masters.
    Redlock(usize),
}

impl Deployment {
    /// Whether it hands out fencing tokens (Redlock refuses them by design).
    pub fn offers_fencing(self) -> bool {
        !matches!(self, Deployment::Redlock(_))
    }
}

impl fmt::Display for Deployment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Deployment::Single => f.write_str("one Redis"),
            Deployment::Sentinel => f.write_str("Sentinel"),
            Deployment::Cluster => f.write_str("Cluster 3x2"),
            Deployment::Redlock(masters) => write!(f, "Redlock/{masters}"),
        }
    }
}

/// What the nemesis does in one phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Nothing: the baseline.
    None,
    /// `kill -9` the server (the master, for Sentinel) and restart it at once, empty.
    KillRestart,
    /// `SIGSTOP` the (master) server for longer than the ttl, then `SIGCONT`.
    StopServer,
    /// Add latency to every packet through the fault proxy.
    Delay,
    /// Swallow all traffic through the fault proxy for longer than the ttl.
    Blackhole,
    /// `kill -9` the master of a lock key and wait for a replica to take over; restart the old
    /// master as a replica.
    Failover,
    /// The replica of a lock key's master cut off from it (its link broken, its login refused)
    /// while it answers everyone else, so the writes that follow reach no replica; past the ttl,
    /// a failover forced while the master runs (`SENTINEL FAILOVER`, `CLUSTER FAILOVER
    /// TAKEOVER`) promotes the lagging replica. Replica acknowledgement keeps every lock its
    /// holder believes in.
    LaggingFailover,
    /// `CLUSTER FAILOVER`: a replica takes over once it has caught up.
    PlannedFailover,
    /// The replica of a lock key's master killed (`SIGKILL`) for longer than the ttl, then
    /// restarted empty, so it syncs in full: grants that need its acknowledgement cannot be
    /// granted meanwhile, nor for a moment after the sync. No lock data is lost.
    ReplicaResync,
    /// Redlock: a minority of the masters killed and restarted empty at once.
    MinorityRestart,
    /// Redlock: a minority of the masters down for longer than the ttl.
    MinorityDown,
    /// Redlock: a majority of the masters down for longer than the ttl, then back empty.
    MajorityDown,
    /// Redlock: a majority of the masters killed and restarted empty at once.
    MajorityRestart,
    /// Redlock: a minority of the masters down for longer than the ttl (the leases taken
    /// meanwhile are held on a bare majority), back empty, and once a renewal passed, another
    /// minority (masters those leases were taken on) restarted empty.
    BareMajorityRestart,
    /// `SIGSTOP` a worker inside its body for longer than the ttl, then `SIGCONT`.
    PausedHolder,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fault::None => "none",
            Fault::KillRestart => "kill -9, restart empty",
            Fault::StopServer => "server SIGSTOP > ttl",
            Fault::Delay => "200 ms delay",
            Fault::Blackhole => "blackhole > ttl",
            Fault::Failover => "kill master, failover",
            Fault::LaggingFailover => "failover to a lagging replica",
            Fault::PlannedFailover => "CLUSTER FAILOVER",
            Fault::ReplicaResync => "replica lost, then resynced",
            Fault::MinorityRestart => "minority restart empty",
            Fault::MinorityDown => "minority down > ttl",
            Fault::MajorityDown => "majority down > ttl",
            Fault::MajorityRestart => "majority restart empty",
            Fault::BareMajorityRestart => "bare-majority lease, restart empty",
            Fault::PausedHolder => "holder SIGSTOP > ttl",
        })
    }
}

/// Which of a row's figures the contract promises to be zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Promise {
    /// No two holders of a key overlap, and no unfenced update is lost.
    pub exclusive: bool,
    /// No stale fenced write is accepted and no fenced update is lost.
    pub fenced: bool,
    /// No key stands free longer than [`WAKE_UP_BOUND`] while someone waits for it.
    pub woken: bool,
    /// No waiting call fails: the fault heals inside their wait.
    pub rides_out: bool,
}

/// What the contract promises for `fault` on `deployment`.
pub fn promise(deployment: Deployment, fault: Fault) -> Promise {
    let exclusive = match fault {
        Fault::None
        | Fault::Delay
        | Fault::Blackhole
        | Fault::PlannedFailover
        | Fault::LaggingFailover
        | Fault::ReplicaResync
        | Fault::MinorityDown
        | Fault::MajorityDown => true,
        // A lease spreads to every live master soon after it is taken (and at each renewal),
        // but a master restarted within that moment still leaves it on a bare majority.
        Fault::BareMajorityRestart => false,
        // A frozen cluster master past its node timeout is failed over.
        Fault::StopServer => deployment != Deployment::Cluster,
        Fault::KillRestart
        | Fault::Failover
        | Fault::MinorityRestart
        | Fault::MajorityRestart
        | Fault::PausedHolder => false,
    };
    let failover_or_resync = matches!(
        fault,
        Fault::Failover | Fault::PlannedFailover | Fault::LaggingFailover | Fault::ReplicaResync
    );
    let replicated = matches!(deployment, Deployment::Sentinel | Deployment::Cluster);
    Promise {
        exclusive,
        fenced: deployment.offers_fencing(),
        woken: true,
        rides_out: replicated && failover_or_resync,
    }
}

/// A promise the runtime is known to break under `fault` on `deployment`, with what is known of
/// it: printed with the table, but it does not fail the run. Each entry is a defect reported to
/// the runtime's owners, with its reproduction; remove it once fixed.
pub fn known_defect(deployment: Deployment, fault: Fault, promise: &str) -> Option<&'static str> {
    // Redlock's missed wake-ups after a master restart were fixed (a lost master's
    // subscription is reopened, and echoes are told from new releases per master).
    // A waiting call's look-again pause deaf to releases, and a grant confirmed past its
    // lease's deadline ending `Lost` before its body ran, were fixed (engine/wait.rs: the pause
    // ends on a release heard, and a late grant looks again within the wait).
    let _ = (deployment, fault, promise);
    None
}

/// The name of the wake-up promise in [`known_defect`] and the checker's findings.
pub const WAKE_UP: &str = "longest free while waited";

/// The name of the promise that waiting calls ride out a failover, as [`WAKE_UP`].
pub const RIDES_OUT: &str = "failed waiting calls";
