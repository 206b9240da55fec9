//! The Lua scripts every Redis deployment runs, and how their calls are built.
//!
//! Scripts never build a key or channel name themselves: every name arrives in `KEYS`/`ARGV`,
//! chosen in Rust by the deployment, so a cluster can keep them in the lock key's slot.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::protocol::FENCING_COUNTER_LIFE;
use super::{AcquireNames, AcquireRequest, Acquired, AcquiredMany, LeaseRef};
use crate::clock::millis;
use crate::options::LockKind;

/// `script` with the shared lock's helpers (holders.lua, their one home) in front.
macro_rules! with_holders {
    ($script:literal) => {
        concat!(include_str!("scripts/holders.lua"), include_str!($script))
    };
}

pub(crate) const ACQUIRE_LUA: &str = with_holders!("scripts/acquire.lua");
/// The helpers come after the exclusive paths here: those return first, and a release of an
/// exclusive lock, the common one, pays nothing for helpers it does not call (defining them
/// made every release cost Redis about a tenth more).
pub(crate) const RELEASE_LUA: &str = concat!(
    include_str!("scripts/release.lua"),
    include_str!("scripts/holders.lua"),
    include_str!("scripts/release_shared.lua")
);
pub(crate) const EXTEND_LUA: &str = with_holders!("scripts/extend.lua");
pub(crate) const HAND_OVER_LUA: &str = include_str!("scripts/hand_over.lua");
pub(crate) const INSPECT_LUA: &str = include_str!("scripts/inspect.lua");
pub(crate) const FORCE_RELEASE_LUA: &str = include_str!("scripts/force_release.lua");
pub(crate) const ACQUIRE_MANY_LUA: &str = include_str!("scripts/acquire_many.lua");
pub(crate) const RELEASE_MANY_LUA: &str = include_str!("scripts/release_many.lua");

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));
pub(crate) static HAND_OVER: LazyLock<Script> = LazyLock::new(|| Script::new(HAND_OVER_LUA));
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));
pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(FORCE_RELEASE_LUA));
pub(crate) static ACQUIRE_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_MANY_LUA));
pub(crate) static RELEASE_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_MANY_LUA));

/// Every script, for loading them up front on a new connection.
pub(crate) const ALL: [&str; 8] = [
    ACQUIRE_LUA,
    RELEASE_LUA,
    EXTEND_LUA,
    HAND_OVER_LUA,
    INSPECT_LUA,
    FORCE_RELEASE_LUA,
    ACQUIRE_MANY_LUA,
    RELEASE_MANY_LUA,
];

/// Keys per extend-script call: bounds how long one script blocks Redis (about 0.2 ms per 500).
pub(crate) const EXTEND_CHUNK: usize = 500;

/// `SET key token NX PX ttl`: the exclusive fast path, one command.
pub(crate) fn set_nx(key: &str, token: &str, ttl: Duration) -> redis::Cmd {
    // Room for `GET` too, so neither form grows its buffers while it is built.
    let mut cmd = redis::Cmd::with_capacity(7, key.len() + token.len() + 32);
    cmd.arg("SET")
        .arg(key)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(millis(ttl));
    cmd
}

/// `SET key token NX PX ttl GET` (Redis 7): as [`set_nx`], but the reply tells a retried `SET`
/// that already landed (our own token comes back) from another holder's key.
pub(crate) fn set_nx_get(key: &str, token: &str, ttl: Duration) -> redis::Cmd {
    let mut cmd = set_nx(key, token, ttl);
    cmd.arg("GET");
    cmd
}

/// `PTTL key`: how long until a busy key may be free (`protocol::remaining`).
pub(crate) fn remaining(key: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("PTTL");
    cmd.arg(key);
    cmd
}

/// The acquire script: any kind of lock, with a fencing token, a fair queue or a writer's claim
/// against new readers, as `request` asks.
pub(crate) fn acquire(request: &AcquireRequest<'_>, names: &AcquireNames) -> redis::Cmd {
    let names_len = names.fencing_counter.len()
        + names.queue.len()
        + names.queue_expiry.len()
        + names.writers.len();
    let mut cmd = evalsha(
        &ACQUIRE,
        5,
        13,
        request.key.len() + names_len + request.token.len() + 64,
    );
    cmd.arg(request.key)
        .arg(&names.fencing_counter)
        .arg(&names.queue)
        .arg(&names.queue_expiry)
        .arg(&names.writers);
    let (kind, permits) = match request.kind {
        LockKind::Exclusive => ("x", 0),
        LockKind::Read => ("r", 0),
        LockKind::Permits(permits) => ("p", permits),
    };
    let flag = |on: bool| if on { "1" } else { "0" };
    cmd.arg(request.token)
        .arg(millis(request.ttl))
        .arg(if request.fencing {
            millis(FENCING_COUNTER_LIFE)
        } else {
            0
        })
        .arg(kind)
        .arg(permits)
        .arg(flag(request.fair))
        .arg(flag(request.waiting))
        .arg(millis(request.queue_place()));
    cmd
}

/// The acquire script for several keys at once (all in one slot on a cluster): `keys`, for
/// `token`, all or none.
pub(crate) fn acquire_many(keys: &[&str], token: &str, ttl: Duration, waiting: bool) -> redis::Cmd {
    let bytes: usize = keys.iter().map(|key| key.len()).sum();
    let mut cmd = evalsha(
        &ACQUIRE_MANY,
        keys.len(),
        keys.len() + 3,
        bytes + token.len() + 24,
    );
    for key in keys {
        cmd.arg(*key);
    }
    cmd.arg(token)
        .arg(millis(ttl))
        .arg(if waiting { "1" } else { "0" });
    cmd
}

/// What the multi-key acquire script's reply means: `{1}` taken; `{0, i, ms}` busy at the
/// `i`-th key (1-based in Lua, 0-based here).
pub(crate) fn acquired_many(reply: &[i64]) -> Option<AcquiredMany> {
    match reply {
        [1] => Some(AcquiredMany::Taken),
        [0, key, remaining] => Some(AcquiredMany::Busy {
            key: usize::try_from(*key).ok()?.checked_sub(1)?,
            remaining: u64::try_from(*remaining).ok().map(Duration::from_millis),
        }),
        _ => None,
    }
}

/// The multi-key release script: `keys` (all in one slot on a cluster), each announced on its
/// channel of `channels` when a waiter marked it or someone listens; each kept for `kept`
/// instead while a `hold_at_least` runs.
pub(crate) fn release_many(
    keys: &[&str],
    channels: &[String],
    token: &str,
    announce: Announce,
    kept: Option<Duration>,
    undone: bool,
) -> redis::Cmd {
    let bytes: usize = keys.iter().map(|key| key.len()).sum::<usize>()
        + channels.iter().map(String::len).sum::<usize>();
    let mut cmd = evalsha(
        &RELEASE_MANY,
        2 * keys.len(),
        2 * keys.len() + 3,
        bytes + token.len() + 27,
    );
    for key in keys {
        cmd.arg(*key);
    }
    for channel in channels {
        cmd.arg(channel);
    }
    cmd.arg(token);
    announce.mark_release(&mut cmd, kept, undone);
    cmd
}

/// How a release is announced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announce {
    /// `PUBLISH`: every subscriber of the server hears it.
    Publish,
    /// `SPUBLISH`: a sharded channel, heard on the cluster node that owns its slot.
    ShardedPublish,
}

impl Announce {
    /// The scripts' last argument: `sharded` for a sharded channel, nothing otherwise.
    fn mark(self, cmd: &mut redis::Cmd) {
        if self == Self::ShardedPublish {
            cmd.arg("sharded");
        }
    }

    /// A release script's last arguments: as [`mark`](Self::mark) for a plain release (one
    /// argument fewer on every release of a single server); else the mark always given (`''`
    /// for none), the time `kept` left of a `hold_at_least` (`''` for none) and `undo` for an
    /// attempt `undone` (announced as "look again").
    fn mark_release(self, cmd: &mut redis::Cmd, kept: Option<Duration>, undone: bool) {
        if kept.is_none() && !undone {
            return self.mark(cmd);
        }
        let sharded = if self == Self::ShardedPublish {
            "sharded"
        } else {
            ""
        };
        cmd.arg(sharded);
        match kept {
            Some(kept) => cmd.arg(millis(kept)),
            None => cmd.arg(""),
        };
        if undone {
            cmd.arg("undo");
        }
    }
}

/// What the acquire script's `{taken, value}` reply means: taken, with the fencing token when
/// asked for; or busy, with the time until the key may be free when the script knows it.
pub(crate) fn acquired(request: &AcquireRequest<'_>, (taken, value): (i64, i64)) -> Acquired {
    if taken == 1 {
        Acquired::Taken {
            fencing_token: request.fencing.then_some(value.max(0) as u64),
        }
    } else {
        Acquired::Busy {
            remaining: u64::try_from(value).ok().map(Duration::from_millis),
        }
    }
}

/// The compare-and-delete script, announcing the release on `channel`; while the lease's
/// `hold_at_least` runs, the script keeps the key for what is left of it instead (an argument
/// more, only then: a release without a hold costs what it did).
pub(crate) fn release(lease: LeaseRef<'_>, channel: &str, announce: Announce) -> redis::Cmd {
    let mut cmd = evalsha(
        &RELEASE,
        2,
        5,
        lease.key.len() + lease.token.len() + channel.len() + 27,
    );
    cmd.arg(lease.key).arg(channel).arg(lease.token);
    announce.mark_release(&mut cmd, lease.kept_for(), lease.undone);
    cmd
}

/// The hand-over script: `lease`'s key passes to `next` (same key), unless another client
/// waits for it too; then it is released and announced on `channel` as [`release`] does.
pub(crate) fn hand_over(
    lease: LeaseRef<'_>,
    next: LeaseRef<'_>,
    channel: &str,
    announce: Announce,
) -> redis::Cmd {
    let mut cmd = evalsha(
        &HAND_OVER,
        2,
        6,
        lease.key.len() + lease.token.len() + next.token.len() + channel.len() + 27,
    );
    cmd.arg(lease.key)
        .arg(channel)
        .arg(lease.token)
        .arg(next.token)
        .arg(millis(next.ttl));
    announce.mark(&mut cmd);
    cmd
}

/// One extend-script call per chunk of leases, pipelined: one round trip for all of them.
pub(crate) fn extend(leases: &[LeaseRef<'_>]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for chunk in leases.chunks(EXTEND_CHUNK) {
        let cmd = pipe.cmd("EVALSHA").arg(EXTEND.get_hash()).arg(chunk.len());
        for lease in chunk {
            cmd.arg(lease.key);
        }
        for lease in chunk {
            cmd.arg(lease.token).arg(millis(lease.ttl));
        }
    }
    pipe
}

/// The inspect script, to be followed by its 3 keys and 3 arguments (`store::inspect`).
pub(crate) fn evalsha_inspect() -> redis::Cmd {
    evalsha(&INSPECT, 3, 6, 128)
}

/// The force-release script, to be followed by its 2 keys and 3 arguments (`store::inspect`).
pub(crate) fn evalsha_force_release() -> redis::Cmd {
    evalsha(&FORCE_RELEASE, 2, 5, 128)
}

/// `SCRIPT LOAD` of every script, ignoring the replies: sent once per new connection, so a
/// crowd of first callers does not each meet `NOSCRIPT`.
pub(crate) fn load_all() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for source in ALL {
        pipe.cmd("SCRIPT").arg("LOAD").arg(source).ignore();
    }
    pipe
}

/// `EVALSHA sha numkeys`, to be followed by `more_args` keys and arguments of about
/// `more_bytes` bytes in all.
fn evalsha(script: &Script, keys: usize, more_args: usize, more_bytes: usize) -> redis::Cmd {
    // Room for every argument up front: growing one argument at a time reallocates several
    // times per command.
    let mut cmd = redis::Cmd::with_capacity(3 + more_args, 7 + 40 + 4 + more_bytes);
    cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
    cmd
}
