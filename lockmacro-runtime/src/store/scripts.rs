//! The Lua scripts every Redis deployment runs, and how their calls are built.
//!
//! Scripts never build a key or channel name themselves: every name arrives in `KEYS`/`ARGV`,
//! chosen in Rust by the deployment, so a cluster can keep them in the lock key's slot.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::protocol::FENCING_COUNTER_LIFE;
use super::{AcquireNames, AcquireRequest, Acquired, AcquiredMany, LeaseRef, ManyRequest};
use crate::clock::millis;
use crate::error::LockError;
use crate::options::LockKind;

/// `script` with the shared lock's helpers (holders.lua, their one home) in front.
macro_rules! with_holders {
    ($script:literal) => {
        concat!(include_str!("scripts/holders.lua"), include_str!($script))
    };
}

/// `script` with the helpers of a caller that takes a lock or waits for one in front: what a
/// key holds and its marks (values.lua), and the callers waiting for it (waiters.lua).
macro_rules! with_waiters {
    ($($script:literal),+) => {
        concat!(
            include_str!("scripts/values.lua"),
            include_str!("scripts/reservations.lua"),
            include_str!("scripts/waiters.lua"),
            $(include_str!($script)),+
        )
    };
}

pub(crate) const ACQUIRE_LUA: &str = with_waiters!("scripts/holders.lua", "scripts/acquire.lua");
/// The holders' helpers come after the exclusive paths here: those return first, and a release
/// of an exclusive lock, the common one, pays nothing for helpers it does not call (defining them
/// made every release cost Redis about a tenth more). The reservations' few go first: an undo
/// takes a late attempt's off.
pub(crate) const RELEASE_LUA: &str = concat!(
    include_str!("scripts/reservations.lua"),
    include_str!("scripts/release.lua"),
    include_str!("scripts/holders.lua"),
    include_str!("scripts/release_shared.lua")
);
pub(crate) const EXTEND_LUA: &str = with_holders!("scripts/extend.lua");
/// Only the waiters' helpers: a hand-over serves a waiter, and runs for every turn of a busy
/// client's callers.
pub(crate) const HAND_OVER_LUA: &str = concat!(
    include_str!("scripts/reservations.lua"),
    include_str!("scripts/waiters.lua"),
    include_str!("scripts/hand_over.lua")
);
pub(crate) const INSPECT_LUA: &str = include_str!("scripts/inspect.lua");
pub(crate) const FORCE_RELEASE_LUA: &str = include_str!("scripts/force_release.lua");
pub(crate) const ACQUIRE_MANY_LUA: &str = with_waiters!("scripts/acquire_many.lua");
pub(crate) const RELEASE_MANY_LUA: &str = include_str!("scripts/release_many.lua");
/// With the waiters' helpers: a waiter that leaves gives up its reservation as a served one does.
pub(crate) const LEAVE_LUA: &str = concat!(
    include_str!("scripts/reservations.lua"),
    include_str!("scripts/waiters.lua"),
    include_str!("scripts/leave.lua")
);
/// The uncontended release: a compare-and-delete that reads the lock alone.
pub(crate) const RELEASE_PLAIN_LUA: &str = include_str!("scripts/release_plain.lua");
/// A watch's mark on the lock it follows; what a key holds read as the acquire scripts read it.
pub(crate) const WATCH_LUA: &str = concat!(
    include_str!("scripts/values.lua"),
    include_str!("scripts/watch.lua")
);

pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(&compact(ACQUIRE_LUA)));
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(&compact(RELEASE_LUA)));
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(&compact(EXTEND_LUA)));
pub(crate) static HAND_OVER: LazyLock<Script> =
    LazyLock::new(|| Script::new(&compact(HAND_OVER_LUA)));
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(&compact(INSPECT_LUA)));
pub(crate) static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&compact(FORCE_RELEASE_LUA)));
pub(crate) static ACQUIRE_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(&compact(ACQUIRE_MANY_LUA)));
pub(crate) static RELEASE_MANY: LazyLock<Script> =
    LazyLock::new(|| Script::new(&compact(RELEASE_MANY_LUA)));
pub(crate) static LEAVE: LazyLock<Script> = LazyLock::new(|| Script::new(&compact(LEAVE_LUA)));
pub(crate) static RELEASE_PLAIN: LazyLock<Script> =
    LazyLock::new(|| Script::new(&compact(RELEASE_PLAIN_LUA)));
pub(crate) static WATCH: LazyLock<Script> = LazyLock::new(|| Script::new(&compact(WATCH_LUA)));

/// A script as it is sent: its comment lines left out. They are for readers, and Redis refuses
/// a bulk argument over 16 KiB from a client not yet authenticated: the scripts are loaded with
/// a connection's first requests, so a refused password must come back as one, not as a
/// connection closed under a long `SCRIPT LOAD`.
pub(crate) fn compact(source: &str) -> String {
    let code = source
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"));
    code.collect::<Vec<_>>().join("\n")
}

/// Every script as sent ([`compact`]), in the order of [`ALL`].
pub(crate) static SENT: LazyLock<[String; 11]> = LazyLock::new(|| ALL.map(compact));

/// Every script, for loading them up front on a new connection.
pub(crate) const ALL: [&str; 11] = [
    ACQUIRE_LUA,
    RELEASE_LUA,
    EXTEND_LUA,
    HAND_OVER_LUA,
    INSPECT_LUA,
    FORCE_RELEASE_LUA,
    ACQUIRE_MANY_LUA,
    RELEASE_MANY_LUA,
    LEAVE_LUA,
    RELEASE_PLAIN_LUA,
    WATCH_LUA,
];

/// Keys per extend-script call: bounds how long one script blocks Redis (about 0.2 ms per 500).
pub(crate) const EXTEND_CHUNK: usize = 500;

/// `SET key value NX PX ttl`: the exclusive fast path, one command.
pub(crate) fn set_nx(key: &str, value: &str, ttl: Duration) -> redis::Cmd {
    // Room for `GET` too, so neither form grows its buffers while it is built.
    let mut cmd = redis::Cmd::with_capacity(7, key.len() + value.len() + 32);
    cmd.arg("SET")
        .arg(key)
        .arg(value)
        .arg("NX")
        .arg("PX")
        .arg(millis(ttl));
    cmd
}

/// `SET key value NX PX ttl GET` (Redis 7): as [`set_nx`], but the reply tells a retried `SET`
/// that already landed (our own value comes back) from another holder's key.
pub(crate) fn set_nx_get(key: &str, value: &str, ttl: Duration) -> redis::Cmd {
    let mut cmd = set_nx(key, value, ttl);
    cmd.arg("GET");
    cmd
}

/// The acquire script: any kind of lock, with a fencing token, a fair queue, a writer's claim
/// against new readers or a reservation, as `request` asks.
pub(crate) fn acquire(request: &AcquireRequest<'_>, names: &AcquireNames) -> redis::Cmd {
    let names_len = names.fencing_counter.len()
        + names.queue.len()
        + names.queue_expiry.len()
        + names.writers.len()
        + names.waiters.len();
    let mut cmd = evalsha(
        &ACQUIRE,
        6,
        15,
        request.key.len() + names_len + request.value.len() + 96,
    );
    cmd.arg(request.key)
        .arg(&names.fencing_counter)
        .arg(&names.queue)
        .arg(&names.queue_expiry)
        .arg(&names.writers)
        .arg(&names.waiters);
    let (kind, permits) = match request.kind {
        LockKind::Exclusive => ("x", 0),
        LockKind::Read => ("r", 0),
        LockKind::Permits(permits) => ("p", permits),
    };
    let flag = |on: bool| if on { "1" } else { "0" };
    cmd.arg(request.value)
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
        .arg(millis(request.waiter_place()))
        .arg(reservation(request.reserving_since, request.ttl, 1));
    cmd
}

/// A reservation's fields before its value (`{since_ms}/{ttl_ms}/{keys}`, see
/// `protocol::Reservation`) for a caller waiting since `since` (ms since the Unix epoch);
/// empty while it has not waited too long.
fn reservation(since: Option<u64>, ttl: Duration, keys: usize) -> String {
    since.map_or_else(String::new, |since| {
        format!("{since}/{}/{keys}", millis(ttl))
    })
}

/// What the acquire script's reply means: `{1, fence}` taken, with the fencing token when asked
/// for; `{0, ms, ms}` busy, with the time until the key may be free and the estimated wait when
/// the script knows them; `{-1, what}` no lock (`NotALock`). `None` for a reply of another shape.
pub(crate) fn acquired(
    request: &AcquireRequest<'_>,
    reply: &[redis::Value],
) -> Option<Result<Acquired, LockError>> {
    let number = |at: usize| match reply.get(at)? {
        redis::Value::Int(n) => Some(*n),
        _ => None,
    };
    Some(match number(0)? {
        1 => Ok(Acquired::Taken {
            fencing_token: request.fencing.then_some(number(1)?.max(0) as u64),
        }),
        0 => Ok(Acquired::Busy {
            remaining: known_millis(number(1)?),
            estimate: known_millis(number(2)?),
        }),
        _ => Err(not_a_lock(request.key, reply.get(1)?)),
    })
}

/// A time in ms from a script, `None` when it said -1 (not known).
fn known_millis(ms: i64) -> Option<Duration> {
    u64::try_from(ms).ok().map(Duration::from_millis)
}

/// `NotALock` for `key`, with what a script said the key holds.
fn not_a_lock(key: &str, found: &redis::Value) -> LockError {
    let found = match found {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(text) => text.clone(),
        other => format!("{other:?}"),
    };
    LockError::NotALock {
        key: key.to_owned(),
        found,
    }
}

/// The acquire script for several keys at once (all in one slot on a cluster): `keys`, with the
/// names of their waiters in `waiters`, for `request`'s value, all or none. `whole` when these
/// are all of the request's keys: only then may the caller reserve them.
pub(crate) fn acquire_many(
    keys: &[&str],
    waiters: &[String],
    request: &ManyRequest<'_>,
    whole: bool,
) -> redis::Cmd {
    let bytes: usize = keys.iter().map(|key| key.len()).sum::<usize>()
        + waiters.iter().map(String::len).sum::<usize>();
    let mut cmd = evalsha(
        &ACQUIRE_MANY,
        2 * keys.len(),
        2 * keys.len() + 5,
        bytes + request.value.len() + 64,
    );
    for key in keys {
        cmd.arg(*key);
    }
    for name in waiters {
        cmd.arg(name);
    }
    let since = request.reserving_since.filter(|_| whole);
    cmd.arg(request.value)
        .arg(millis(request.ttl))
        .arg(if request.waiting { "1" } else { "0" })
        .arg(millis(request.waiter_place()))
        .arg(reservation(since, request.ttl, request.keys.len()));
    cmd
}

/// What the multi-key acquire script's reply means: `{1}` taken; `{0, i, ms, ms}` busy at the
/// `i`-th key (1-based in Lua, 0-based here); `{-1, i, what}` the `i`-th key is no lock.
pub(crate) fn acquired_many(
    keys: &[&str],
    reply: &[redis::Value],
) -> Option<Result<AcquiredMany, LockError>> {
    let number = |at: usize| match reply.get(at)? {
        redis::Value::Int(n) => Some(*n),
        _ => None,
    };
    if number(0)? == 1 {
        return Some(Ok(AcquiredMany::Taken));
    }
    let key = usize::try_from(number(1)?).ok()?.checked_sub(1)?;
    Some(match number(0)? {
        0 => Ok(AcquiredMany::Busy {
            key,
            remaining: known_millis(number(2)?),
            estimate: known_millis(number(3)?),
        }),
        _ => Err(not_a_lock(keys.get(key)?, reply.get(2)?)),
    })
}

/// The multi-key release script: `keys` (all in one slot on a cluster), each announced on its
/// channel of `channels` when a waiter marked it or someone listens; each kept for `kept`
/// instead while a `hold_at_least` runs.
pub(crate) fn release_many(
    keys: &[&str],
    channels: &[String],
    value: &str,
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
        bytes + value.len() + 27,
    );
    for key in keys {
        cmd.arg(*key);
    }
    for channel in channels {
        cmd.arg(channel);
    }
    cmd.arg(value);
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

/// What the plain release ([`release_plain`]) answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlainRelease {
    /// Ours, and gone now.
    Released,
    /// Not ours (gone, or another's): nothing changed.
    NotOurs,
    /// Ours but marked (waited for, reserved, watched): nothing changed; [`release`] tells them.
    Marked,
}

impl PlainRelease {
    /// The script's reply read.
    pub(crate) fn of(reply: i64) -> Self {
        match reply {
            1 => Self::Released,
            2 => Self::Marked,
            _ => Self::NotOurs,
        }
    }
}

/// Whether `lease`'s release may be [`release_plain`]: an exclusive lock of one key, freed now
/// (no `hold_at_least` left) by the holder that won it. Anything else is [`release`]'s.
pub(crate) fn releases_plainly(lease: &LeaseRef<'_>) -> bool {
    lease.kind == LockKind::Exclusive
        && lease.keys.is_empty()
        && !lease.undone
        && lease.kept_for().is_none()
}

/// The uncontended release (release_plain.lua): a compare-and-delete of `lease`'s key that
/// reads nothing but the lock, as redis-rs alone's would. A marked key is left as it is,
/// answered [`PlainRelease::Marked`]: whatever a waiter or a watch needs is then
/// [`release`]'s, and paid by the releases they follow, not by every release.
pub(crate) fn release_plain(lease: &LeaseRef<'_>) -> redis::Cmd {
    let mut cmd = evalsha(&RELEASE_PLAIN, 1, 2, lease.key.len() + lease.value.len());
    cmd.arg(lease.key).arg(lease.value);
    cmd
}

/// The watch's mark on `key` (watch.lua): `mark` names it (the key's release channel), for
/// `life`.
pub(crate) fn watch(key: &str, mark: &str, life: Duration) -> redis::Cmd {
    let mut cmd = evalsha(&WATCH, 2, 3, key.len() + mark.len() + 8);
    cmd.arg(key).arg(mark).arg(millis(life));
    cmd
}

/// The compare-and-delete script, announcing the release on `channel`; while the lease's
/// `hold_at_least` runs, the script keeps the key for what is left of it instead (an argument
/// more, only then: a release without a hold costs what it did). `waiters` names the callers
/// waiting for the key, given for a shared lock's holder (the last one out names a writer the
/// key is reserved for) and for an undone attempt (a reservation it made is taken off).
pub(crate) fn release(
    lease: LeaseRef<'_>,
    channel: &str,
    waiters: Option<&str>,
    announce: Announce,
) -> redis::Cmd {
    let mut cmd = evalsha(
        &RELEASE,
        2 + usize::from(waiters.is_some()),
        6,
        lease.key.len() + lease.value.len() + channel.len() + waiters.map_or(0, str::len) + 27,
    );
    cmd.arg(lease.key).arg(channel);
    if let Some(waiters) = waiters {
        cmd.arg(waiters);
    }
    cmd.arg(lease.value);
    announce.mark_release(&mut cmd, lease.kept_for(), lease.undone);
    cmd
}

/// The hand-over script: `lease`'s key passes to `next` (same key), unless a caller elsewhere
/// waited too long and reserved it; then it passes to that caller, announced on `channel`.
/// `[waiters, writers]` name the callers waiting for the key, `next` among them, and the writers
/// among them that keep new readers out (`next` takes its claim off as it takes the key).
pub(crate) fn hand_over(
    lease: LeaseRef<'_>,
    next: LeaseRef<'_>,
    channel: &str,
    [waiters, writers]: &[String; 2],
    announce: Announce,
) -> redis::Cmd {
    let mut cmd = evalsha(
        &HAND_OVER,
        4,
        8,
        lease.key.len()
            + lease.value.len()
            + next.value.len()
            + channel.len()
            + waiters.len()
            + writers.len()
            + 27,
    );
    cmd.arg(lease.key)
        .arg(channel)
        .arg(waiters)
        .arg(writers)
        .arg(lease.value)
        .arg(next.value)
        .arg(millis(next.ttl));
    announce.mark(&mut cmd);
    cmd
}

/// The leave script: the waiter of `token` on `key` leaves without the lock (see leave.lua);
/// `[waiters, writers, queue, queue_expiry]` name the callers waiting for the key, the writers
/// among them that keep new readers out, and the fair queue with its places' expiries.
pub(crate) fn leave(
    key: &str,
    channel: &str,
    [waiters, writers, queue, queue_expiry]: &[String; 4],
    token: &str,
    announce: Announce,
) -> redis::Cmd {
    let mut cmd = evalsha(
        &LEAVE,
        6,
        8,
        key.len()
            + channel.len()
            + waiters.len()
            + writers.len()
            + queue.len()
            + queue_expiry.len()
            + token.len()
            + 8,
    );
    cmd.arg(key)
        .arg(channel)
        .arg(waiters)
        .arg(writers)
        .arg(queue)
        .arg(queue_expiry)
        .arg(token);
    cmd.arg(match announce {
        Announce::Publish => "",
        Announce::ShardedPublish => "sharded",
    });
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
            cmd.arg(lease.value).arg(millis(lease.ttl));
        }
    }
    pipe
}

/// The inspect script, to be followed by its 3 keys (`store::inspect`).
pub(crate) fn evalsha_inspect() -> redis::Cmd {
    evalsha(&INSPECT, 3, 3, 128)
}

/// The force-release script, to be followed by its 2 keys and 3 arguments (`store::inspect`).
pub(crate) fn evalsha_force_release() -> redis::Cmd {
    evalsha(&FORCE_RELEASE, 2, 5, 128)
}

/// `SCRIPT LOAD` of every script, ignoring the replies: sent once per new connection, so a
/// crowd of first callers does not each meet `NOSCRIPT`.
pub(crate) fn load_all() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    for source in SENT.iter() {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis refuses a bulk argument over 16 KiB from a client not yet authenticated
    /// (`Protocol error: unauthenticated bulk length`) and closes the connection, and the
    /// scripts are loaded with a connection's first requests.
    #[test]
    fn every_script_as_sent_fits_what_redis_reads_before_authentication() {
        for source in SENT.iter() {
            assert!(source.len() < 16 * 1024, "{} bytes", source.len());
            assert!(
                !source
                    .lines()
                    .any(|line| line.trim_start().starts_with("--"))
            );
        }
    }
}
