//! What lockmacro stores in Redis: the one owner of its names, values and marks.
//!
//! The Lua scripts (`store/scripts/*.lua`) write this format and this module is the only Rust
//! that spells it: the deployments, the in-memory store, the inspection API, the command-line
//! tool and the test kit all read and name keys through it.
//!
//! - **An exclusive lock** is a string key `"{prefix}:{key}"` holding its holder's value:
//!   `{token};{acquired_ms};{pid};{host};{app}` ([`lock_value`], read by [`LockValue::parse`]):
//!   the token (32 hex digits), when it was taken (ms since the Unix epoch, the holder's
//!   clock), and who took it ([`Origin`]: host, process id and application name, each of
//!   `[A-Za-z0-9._-]` only). A value of an older version is the bare token, and still reads as
//!   a lock. Once a caller waits for it (or when it is taken while other callers are counted
//!   waiting for the key), [`WAITED_MARK`] follows, so that its release is announced; once a caller has waited longer than [`RESERVE_AFTER`], a reservation for it
//!   follows the mark (`+{since_ms}/{ttl_ms}/{keys}/{its value}`, [`Reservation`]), and the
//!   release hands the key straight to that caller instead of freeing it ([`Stored`]).
//! - **A shared lock** (readers, permits) is a hash: field [`KIND_FIELD`] says which
//!   ([`shared_kind_tag`]), and each holder has a field of its own, its value (as above),
//!   holding its own expiry in milliseconds of the server clock. The key expires with its last
//!   live holder.
//! - **Internal names** ([`Names`]), under a namespace of their own (`lockmacro` unless the
//!   client sets another, so an ACL can grant exactly them): the fencing counter of a key, the
//!   channel its releases are announced on (the message is the released value, empty for "look
//!   again": a hold kept the key, an attempt that did not win was undone, or a fair queue's
//!   head gave up on a key no exclusive holder holds; or
//!   `{released value}>{token}` when the release handed the key to the waiter of that token,
//!   [`Announcement`]), the callers waiting for it (a hash: each waiter's token, holding when
//!   its place lapses, for counting them), a fair lock's queue and its places' expiries, and
//!   the writers waiting for a key's readers to leave. On a Cluster each is placed in its key's
//!   slot ([`Names::in_slot`]).
//! - **A watched lock**: while a watch follows a lock, a key named as the lock's release channel
//!   exists (`"1"`, renewed at each look for [`WATCH_MARK_LIFE`]), and the watch marks the lock
//!   itself at each look: [`WAITED_MARK`] after its holder's value, or the mark alone on a free
//!   key (for as long), which the acquire scripts read as free and replace with the next
//!   holder's value, marked. So every release of the lock is announced, not only a waited-for
//!   one, while the uncontended release (`release_plain.lua`) reads nothing but the lock: a
//!   marked key goes to the full release script, which puts the watch's mark back.
//! - **A lock kept by `hold_at_least`** after its release is stored as it was held: the same
//!   value (or the same hash field), with the expiry set to the end of the hold.
//! - **Fencing tokens** are never below the server clock in microseconds
//!   ([`fencing_floor`]), so a counter that expired cannot make them go back.
//! - **Anything else** under a lock's key (a string that is no lock value, a hash without our
//!   `kind` field, a list…) is not ours: the scripts never write it, and taking it is
//!   [`LockError::NotALock`](crate::LockError::NotALock).

use std::sync::Arc;
use std::time::Duration;

use crate::error::LockError;
use crate::options::LockKind;

/// Follows an exclusive lock's holder value once a caller waits for it: its release is
/// announced (and, with a [`Reservation`] after it, handed over).
pub const WAITED_MARK: char = '+';

/// Separates the fields of a lock value ([`lock_value`]).
pub const FIELD_SEPARATOR: char = ';';

/// Separates the fields of a [`Reservation`].
pub const RESERVATION_SEPARATOR: char = '/';

/// In an announcement, separates the released value from the token of the waiter the key was
/// handed to ([`Announcement`]).
pub const HANDED_TO: char = '>';

/// The name whose release channel announces forced releases (`{namespace}:released::forced`):
/// each message is the key an operator freed, and every client holding a lease listens, so the
/// holder learns it at once rather than at its next renewal. No lock key is this name's
/// business: a lock under it is announced there too, and heard as a forced release of nothing.
pub const FORCED_RELEASES: &str = ":forced";

/// How long a caller may wait before the lock is reserved for it: one that has waited longer (by
/// its own clock) reserves the key at its next look, and the key's next release (or hand-over
/// inside its holder's client) hands it straight to the longest-waiting such caller, wherever it
/// runs. Go's `sync.Mutex` turns to its starvation mode after 1 ms within a process; across
/// processes a look costs a round trip, so the bound is a few of them.
pub const RESERVE_AFTER: Duration = Duration::from_millis(20);

/// How long a fair queue place or a waiter's count entry outlives the look that wrote it, at
/// least: a waiter looks again within the holder's remaining lease (jittered), and its entry
/// lives that long and this much more.
pub const WAITER_ENTRY_SLACK: Duration = Duration::from_secs(2);

/// How long a watch's mark on a lock lasts (see the module doc): renewed at each of the
/// watch's looks, so only a watch that stopped looking for this long loses it, and a watch
/// that ended costs its lock's releases a `PUBLISH` (and its acquisitions the acquire script)
/// for at most this long.
pub const WATCH_MARK_LIFE: Duration = Duration::from_secs(10);

/// The field of a shared lock's hash that says which kind it is.
pub const KIND_FIELD: &str = "kind";

/// The field of a key's waiters hash (see the module doc) that keeps how fast waiters are
/// served: `{last served, ms};{mean interval between two, ms}`, for `Busy`'s `retry_after`.
pub const SERVED_FIELD: &str = "served";

/// What `NotALock` says a key holds when it is a string that is no lock value (the scripts say
/// the same).
pub const FOREIGN_STRING: &str = "a string that is not a lock value";

/// What `NotALock` says a key holds when it is a hash without our `kind` field (the scripts say
/// the same).
pub const FOREIGN_HASH: &str = "a hash without lockmacro's `kind` field";

/// How long a fencing counter lives after its last use. Tokens never go below the server clock
/// in microseconds, so a counter that expired cannot make them go back; the counter only orders
/// acquisitions faster than the clock, or across a clock that stepped back by less than this.
pub const FENCING_COUNTER_LIFE: Duration = Duration::from_secs(24 * 60 * 60);

/// The longest host or application name a lock value keeps (longer ones are cut).
const ORIGIN_FIELD_MAX: usize = 64;

/// Who takes a client's locks: the host, the process and the application, written into every
/// lock value the client writes so that `inspect`, `list`, `watch` and the command-line tool
/// can say who holds a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    host: String,
    pid: u32,
    app: String,
    /// `;{pid};{host};{app}`: the end of every value taken with this origin.
    tail: Arc<str>,
}

impl Origin {
    /// An origin; `host` and `app` keep `[A-Za-z0-9._-]` (anything else becomes `_`), at most
    /// 64 characters each, `-` for an empty one.
    pub fn new(host: &str, pid: u32, app: &str) -> Self {
        let (host, app) = (origin_field(host), origin_field(app));
        let tail = format!(";{pid};{host};{app}").into();
        Self {
            host,
            pid,
            app,
            tail,
        }
    }

    /// This process on this host, under `app` (default: the executable's name).
    pub fn of_this_process(app: Option<&str>) -> Self {
        let executable = std::env::current_exe().ok();
        let executable = executable
            .as_deref()
            .and_then(|path| path.file_stem())
            .and_then(|name| name.to_str());
        Self::new(
            &this_host(),
            std::process::id(),
            app.or(executable).unwrap_or(""),
        )
    }

    /// The host, as written into lock values.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The application name, as written into lock values.
    pub fn app(&self) -> &str {
        &self.app
    }

    /// The value of a lock taken by `token` at `acquired_ms` (ms since the Unix epoch) with
    /// this origin.
    pub fn value(&self, token: &str, acquired_ms: u64) -> String {
        lock_value(token, acquired_ms, &self.tail)
    }
}

/// This host's name: the kernel's (Linux), else `/etc/hostname`, else `$HOSTNAME` or
/// `$COMPUTERNAME`, else `unknown`. Read once per process.
fn this_host() -> String {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(|| {
        ["/proc/sys/kernel/hostname", "/etc/hostname"]
            .iter()
            .find_map(|path| std::fs::read_to_string(path).ok())
            .or_else(|| std::env::var("HOSTNAME").ok())
            .or_else(|| std::env::var("COMPUTERNAME").ok())
            .map(|host| host.trim().to_owned())
            .filter(|host| !host.is_empty())
            .unwrap_or_else(|| "unknown".to_owned())
    })
    .clone()
}

/// `field` with only `[A-Za-z0-9._-]` (anything else becomes `_`), at most
/// [`ORIGIN_FIELD_MAX`] characters, `-` when empty: it never holds a separator or a mark.
fn origin_field(field: &str) -> String {
    let kept: String = field
        .chars()
        .take(ORIGIN_FIELD_MAX)
        .map(|c| match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '.' | '_' | '-' => c,
            _ => '_',
        })
        .collect();
    if kept.is_empty() {
        "-".to_owned()
    } else {
        kept
    }
}

/// The value of a lock taken by `token` at `acquired_ms`, its origin's `tail` after
/// ([`Origin::value`]).
pub fn lock_value(token: &str, acquired_ms: u64, tail: &str) -> String {
    let mut value = String::with_capacity(token.len() + 21 + tail.len());
    value.push_str(token);
    value.push(FIELD_SEPARATOR);
    // Digit by digit, without the formatting machinery: every acquisition writes one.
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    let mut rest = acquired_ms;
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    // ASCII digits: always UTF-8, pushed at once (a char at a time checked capacity and
    // encoded each, 0.5 thousand instructions an acquisition).
    value.push_str(std::str::from_utf8(&digits[at..]).unwrap_or_default());
    value.push_str(tail);
    value
}

/// What a lock value says: its token and, for a value of this version, when it was taken and by
/// whom. A value of an older version is the bare token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockValue<'a> {
    /// The holder's token.
    pub token: &'a str,
    /// When it was taken, ms since the Unix epoch (the holder's clock).
    pub acquired_ms: Option<u64>,
    /// The holder's process id.
    pub pid: Option<u32>,
    /// The holder's host.
    pub host: Option<&'a str>,
    /// The holder's application name.
    pub app: Option<&'a str>,
}

impl<'a> LockValue<'a> {
    /// `value` (a holder's value, without marks) read as a lock value; `None` when it is not
    /// one: no token first, or fields that are not ours.
    pub fn parse(value: &'a str) -> Option<Self> {
        let mut fields = value.split(FIELD_SEPARATOR);
        let token = fields.next().filter(|token| is_token(token))?;
        let Some(acquired) = fields.next() else {
            return Some(Self {
                token,
                acquired_ms: None,
                pid: None,
                host: None,
                app: None,
            });
        };
        let (pid, host, app) = (fields.next()?, fields.next()?, fields.next()?);
        let plain = |field: &str| !field.is_empty() && field.bytes().all(is_origin_byte);
        if fields.next().is_some() || !plain(host) || !plain(app) {
            return None;
        }
        Some(Self {
            token,
            acquired_ms: Some(acquired.parse().ok()?),
            pid: Some(pid.parse().ok()?),
            host: Some(host),
            app: Some(app),
        })
    }
}

fn is_origin_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')
}

/// An exclusive lock's stored value, taken apart: its holder's value, whether a caller waits
/// for it, and the reservation of a caller it is reserved for, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored<'a> {
    /// The holder's value ([`LockValue`]).
    pub holder: &'a str,
    /// A caller waits: the release is announced.
    pub waited: bool,
    /// The caller the release hands the key to.
    pub reserved: Option<Reservation<'a>>,
}

/// A caller that waited longer than [`RESERVE_AFTER`], the lock reserved for it: the key's next
/// release (or hand-over) gives it this caller's value and ttl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation<'a> {
    /// When the caller began waiting (ms since the Unix epoch, its clock): of two, the earlier
    /// keeps the reservation (ties go to the smaller token).
    pub since_ms: u64,
    /// The ttl its lease takes.
    pub ttl_ms: u64,
    /// How many keys it locks at once: one, or a list (then only a release of them all at once
    /// hands them over).
    pub keys: u32,
    /// The value it takes the key with.
    pub value: &'a str,
}

impl Stored<'_> {
    /// Takes `value` apart; `None` when the holder's part is no lock value.
    pub fn parse(value: &str) -> Option<Stored<'_>> {
        let (holder, after) = match value.split_once(WAITED_MARK) {
            Some((holder, after)) => (holder, Some(after)),
            None => (value, None),
        };
        LockValue::parse(holder)?;
        let reserved = match after {
            None | Some("") => None,
            Some(reservation) => Some(Reservation::parse(reservation)?),
        };
        Some(Stored {
            holder,
            waited: after.is_some(),
            reserved,
        })
    }
}

impl Reservation<'_> {
    /// Takes a reservation apart (`{since_ms}/{ttl_ms}/{keys}/{value}`, as after a holder's mark
    /// and in the key's waiters); `None` when it is none.
    pub fn parse(text: &str) -> Option<Reservation<'_>> {
        let mut fields = text.splitn(4, RESERVATION_SEPARATOR);
        let mut number = || fields.next()?.parse::<u64>().ok();
        let (since_ms, ttl_ms, keys) = (number()?, number()?, number()?);
        let value = fields.next()?;
        LockValue::parse(value)?;
        Some(Reservation {
            since_ms,
            ttl_ms,
            keys: u32::try_from(keys).ok()?,
            value,
        })
    }
}

/// What a release announcement says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announcement<'a> {
    /// The released holder's value; empty for "look again" (nothing was freed).
    pub released: &'a str,
    /// The token of the waiter the key was handed to, when it was not freed but handed over.
    pub handed_to: Option<&'a str>,
}

impl Announcement<'_> {
    /// Reads an announcement's message.
    pub fn parse(message: &str) -> Announcement<'_> {
        match message.split_once(HANDED_TO) {
            Some((released, token)) => Announcement {
                released,
                handed_to: Some(token),
            },
            None => Announcement {
                released: message,
                handed_to: None,
            },
        }
    }
}

/// The holder's token in an exclusive lock's value (or a holder value, or an announcement), the
/// marks and everything after the token left out.
pub fn holder_token(value: &str) -> &str {
    // Byte by byte: the three are ASCII, so no UTF-8 sequence contains them (a `char` pattern
    // decoded each character, half a thousand instructions a Redlock cycle).
    const ENDS: [u8; 3] = [FIELD_SEPARATOR as u8, WAITED_MARK as u8, HANDED_TO as u8];
    let end = value
        .bytes()
        .position(|byte| ENDS.contains(&byte))
        .unwrap_or(value.len());
    &value[..end]
}

/// A fresh token, proof that a lease is ours: a UUID v4 (122 random bits from uuid's
/// `fast-rng`, a thread-local CSPRNG, so no system call per token) in its simple form, 32
/// lowercase hex digits without hyphens. In a simulation, drawn from its seed.
pub(crate) fn new_token() -> String {
    #[cfg(feature = "sim")]
    if let Some(token) = crate::world::token() {
        return token;
    }
    let mut hex = [0; uuid::fmt::Simple::LENGTH];
    uuid::Uuid::new_v4()
        .simple()
        .encode_lower(&mut hex)
        .to_owned()
}

/// How many characters of a holder's token inspection shows.
const TOKEN_HINT_CHARS: usize = 4;

/// At most the first 4 characters of `token`: what `inspect`, `watch` and the command-line tool
/// show of a holder, and what the library's log events carry as `token_hint`, so a log line
/// can be matched with what an operator sees.
pub(crate) fn hint(token: &str) -> &str {
    token
        .char_indices()
        .nth(TOKEN_HINT_CHARS)
        .map_or(token, |(end, _)| &token[..end])
}

/// Whether `token` looks like a lock token the library makes: 32 lowercase hex digits (128
/// random bits), or a UUID, hyphenated (`8-4-4-4-12` hex digits) or simple. The one test of
/// "is this string value a lock of ours", so that inspection never takes any string key for
/// a lock.
pub fn is_token(token: &str) -> bool {
    let hex = |part: &str| {
        part.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b.to_ascii_lowercase()))
    };
    match token.len() {
        32 => token
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        36 => {
            let parts: Vec<&str> = token.split('-').collect();
            parts.iter().map(|part| part.len()).eq([8, 4, 4, 4, 12]) && parts.iter().all(|p| hex(p))
        }
        _ => false,
    }
}

/// The holder's token when `value` is an exclusive lock of ours (marked or not); `None` for any
/// other string.
pub fn exclusive_holder(value: &str) -> Option<&str> {
    Stored::parse(value).map(|stored| holder_token(stored.holder))
}

/// The `SCAN MATCH` pattern of every key that starts with `prefix:` (every key for an empty
/// prefix), with the glob characters in `prefix` escaped.
pub fn lock_pattern(prefix: &str) -> String {
    if prefix.is_empty() {
        return "*".to_owned();
    }
    let mut pattern = String::with_capacity(prefix.len() + 4);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern.push_str(":*");
    pattern
}

/// Whether an exclusive lock's stored `value` is held by `ours` (a lease's value, or its
/// token): the same token, whatever marks or reservation follow.
pub fn holds(value: &str, ours: &str) -> bool {
    holder_token(value) == holder_token(ours)
}

/// Whether an exclusive lock's stored `value`, held by the token of `attempt` (a lease's value),
/// was written by a later attempt of that call: taken at a later ms. `attempt` came late, after
/// its call tried again and took the key (its reply had timed out), and changes nothing: a
/// compare-and-delete of its value then deletes nothing (values.lua's `later_attempt`).
pub fn is_later_attempt(value: &str, attempt: &str) -> bool {
    let taken_at = |value: &str| {
        let holder = value.split(WAITED_MARK).next().unwrap_or_default();
        LockValue::parse(holder).and_then(|parsed| parsed.acquired_ms)
    };
    matches!((taken_at(value), taken_at(attempt)), (Some(stored), Some(late)) if stored > late)
}

/// Whether an exclusive lock's `value` carries a waiter's mark.
pub fn is_waited_for(value: &str) -> bool {
    value.contains(WAITED_MARK)
}

/// The [`KIND_FIELD`] of a shared lock of `kind`; `None` for the exclusive kind (a string).
pub fn shared_kind_tag(kind: LockKind) -> Option<String> {
    match kind {
        LockKind::Exclusive => None,
        LockKind::Read => Some("read".to_owned()),
        LockKind::Permits(permits) => Some(format!("permits:{permits}")),
    }
}

/// The kind a shared lock's [`KIND_FIELD`] names; `None` when it is no tag of ours.
pub fn parse_shared_kind(tag: &str) -> Option<LockKind> {
    match tag {
        "read" => Some(LockKind::Read),
        _ => tag
            .strip_prefix("permits:")?
            .parse()
            .ok()
            .filter(|permits| *permits > 0)
            .map(LockKind::Permits),
    }
}

/// The lowest fencing token a lock taken at `server_micros` (the server clock, microseconds
/// since the Unix epoch) may get: tokens follow the clock, and a counter only breaks ties.
pub fn fencing_floor(server_micros: u64) -> u64 {
    server_micros
}

/// What a `PTTL` of a busy lock key means for a caller that would come back: how long until it
/// may be free; `None` when the key never expires (not a lock of ours). A key gone already
/// may be taken now.
pub fn remaining(pttl_ms: i64) -> Option<Duration> {
    match pttl_ms {
        -2 => Some(Duration::ZERO),
        ms => u64::try_from(ms).ok().map(Duration::from_millis),
    }
}

/// The cluster slot of `key` (CRC16/XMODEM of its hash tag, or of the whole key, modulo 16384),
/// as a number: a lock over keys in several slots takes them slot by slot in this order.
pub fn slot_number(key: &str) -> u16 {
    crc16(0, hash_tag(key).unwrap_or(key).as_bytes()) % SLOTS
}

/// Slots in a Redis Cluster.
const SLOTS: u16 = 16_384;

/// CRC16/XMODEM of `bytes`, continued from `crc` (the CRC of the bytes before them, 0 for none).
fn crc16(crc: u16, bytes: &[u8]) -> u16 {
    bytes.iter().fold(crc, |crc, &byte| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ byte)]
    })
}

/// [`crc16`] of each byte alone: one lookup a byte instead of eight shifts.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
};

/// The names a deployment keeps beside a lock key, under its namespace.
#[derive(Debug, Clone)]
pub struct Names {
    namespace: Arc<str>,
    /// `{namespace}:released:`, built once: every release names its channel.
    released: Arc<str>,
    /// [`prefix_hash`] of `released`: on a cluster, every release places its channel in its
    /// key's slot.
    released_hash: Option<u16>,
}

impl Default for Names {
    fn default() -> Self {
        Self::new("lockmacro")
    }
}

impl Names {
    /// The names under `namespace` (`LockClientBuilder::namespace`).
    pub fn new(namespace: &str) -> Self {
        let released = format!("{namespace}:released:");
        Self {
            namespace: namespace.into(),
            released_hash: prefix_hash(&released),
            released: released.into(),
        }
    }

    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The fencing counter of `key`: it outlives the lock.
    pub fn fencing_counter(&self, key: &str) -> String {
        format!("{}:fence:{key}", self.namespace)
    }

    /// The fair queue of `key`: waiting tokens in arrival order.
    pub fn queue(&self, key: &str) -> String {
        format!("{}:queue:{key}", self.namespace)
    }

    /// When each place in the fair queue of `key` lapses.
    pub fn queue_expiry(&self, key: &str) -> String {
        format!("{}:queue-expiry:{key}", self.namespace)
    }

    /// Writers waiting for the readers of `key` to leave.
    pub fn writers(&self, key: &str) -> String {
        format!("{}:writers:{key}", self.namespace)
    }

    /// The callers waiting for `key`: a hash of their tokens, each holding when its entry
    /// lapses (ms, server clock), for counting them; [`SERVED_FIELD`]; and `reserved` and
    /// `reserved_next`, the [`Reservation`]s of the callers of this key alone that waited too
    /// long, in the order they go (the first, then the others), which outlive a lock that frees
    /// itself without a release (see reservations.lua).
    pub fn waiters(&self, key: &str) -> String {
        format!("{}:waiters:{key}", self.namespace)
    }

    /// The channel that announces releases of `key`.
    pub fn release_channel(&self, key: &str) -> String {
        [self.released.as_ref(), key].concat()
    }

    /// The key whose release `channel` announces, if it is one of ours (as named by
    /// [`release_channel`](Self::release_channel); a cluster's placed channel may carry braces
    /// around the key, which the deployment maps back itself).
    pub fn released_key<'c>(&self, channel: &'c str) -> Option<&'c str> {
        channel.strip_prefix(self.released.as_ref())
    }

    /// Whether a Redis key is one of the library's internal names rather than a lock.
    pub fn is_internal(&self, redis_key: &str) -> bool {
        redis_key
            .strip_prefix(self.namespace.as_ref())
            .and_then(|rest| rest.strip_prefix(':'))
            .and_then(|rest| rest.split_once(':'))
            .is_some_and(|(what, _)| {
                matches!(
                    what,
                    "fence" | "released" | "queue" | "queue-expiry" | "writers" | "waiters"
                )
            })
    }

    /// Every name the acquire script needs for `key`, as a single server names them.
    pub(crate) fn for_acquire(&self, key: &str) -> AcquireNames {
        AcquireNames {
            fencing_counter: self.fencing_counter(key),
            queue: self.queue(key),
            queue_expiry: self.queue_expiry(key),
            writers: self.writers(key),
            waiters: self.waiters(key),
        }
    }

    /// Every name the acquire script needs for `key`, each in `key`'s cluster slot.
    pub(crate) fn for_acquire_in_slot(&self, key: &str) -> Result<AcquireNames, LockError> {
        Ok(AcquireNames {
            fencing_counter: Self::in_slot(key, self.fencing_counter(""))?,
            queue: Self::in_slot(key, self.queue(""))?,
            queue_expiry: Self::in_slot(key, self.queue_expiry(""))?,
            writers: Self::in_slot(key, self.writers(""))?,
            waiters: Self::in_slot(key, self.waiters(""))?,
        })
    }

    /// The name `{prefix}{key}` (as the methods above build with an empty key), placed in
    /// `key`'s cluster slot: as it is when its hash tag keeps the slot, else with `key` in
    /// braces. A key whose braces make both impossible is `InvalidKey`.
    pub fn in_slot(key: &str, prefix: String) -> Result<String, LockError> {
        place_in_slot(key, &prefix, prefix_hash(&prefix))
    }

    /// The channel that announces releases of `key` on a cluster, in `key`'s slot
    /// ([`in_slot`](Self::in_slot)).
    pub(crate) fn release_channel_in_slot(&self, key: &str) -> Result<String, LockError> {
        place_in_slot(key, &self.released, self.released_hash)
    }

    /// Refuses, as `InvalidKey`, a key whose release channel cannot be placed in its slot.
    pub(crate) fn check_in_slot(&self, key: &str) -> Result<(), LockError> {
        match braces_keep_slot(key, self.released_hash) {
            true => Ok(()),
            false => self.release_channel_in_slot(key).map(drop),
        }
    }
}

/// The hash a name starting with `prefix` continues from, when its hash tag (if any) cannot start
/// in `prefix`: [`crc16`] of `prefix`, or `None` when it holds a `{`.
fn prefix_hash(prefix: &str) -> Option<u16> {
    (!prefix.contains('{')).then(|| crc16(0, prefix.as_bytes()))
}

/// [`Names::in_slot`], with `prefix`'s [`prefix_hash`]: one allocation, and no hashing of what
/// is known without it (on a cluster, every release names its channel).
fn place_in_slot(key: &str, prefix: &str, prefix_hash: Option<u16>) -> Result<String, LockError> {
    let tag = hash_tag(key);
    let key_slot = || crc16(0, tag.unwrap_or(key).as_bytes()) % SLOTS;
    let mut name = String::with_capacity(prefix.len() + key.len() + 2);
    name.push_str(prefix);
    name.push_str(key);
    let plain_keeps_slot = match (prefix_hash, tag) {
        // The name's hash tag is the key's own.
        (Some(_), Some(_)) => true,
        // Neither has a tag: the name hashes whole, the prefix's part hashed already.
        (Some(hash), None) => crc16(hash, key.as_bytes()) % SLOTS == key_slot(),
        (None, _) => slot_number(&name) == key_slot(),
    };
    if plain_keeps_slot {
        return Ok(name);
    }
    name.insert(prefix.len(), '{');
    name.push('}');
    if braces_keep_slot(key, prefix_hash) || slot_number(&name) == key_slot() {
        return Ok(name);
    }
    Err(LockError::InvalidKey {
        key: key.to_owned(),
        reason: "in a cluster its fencing counter and release channel must share its slot, \
                 and its braces make that impossible; use one `{tag}` or none",
    })
}

/// Whether `{prefix}{{key}}` surely hashes as `key` does: its tag is then the whole key, which
/// has no tag of its own (a non-empty key without `}`, under a prefix without `{`).
fn braces_keep_slot(key: &str, prefix_hash: Option<u16>) -> bool {
    prefix_hash.is_some() && !key.is_empty() && !key.contains('}')
}

/// The part of `key` a cluster hashes when it is not the whole key: between its first `{` and
/// the first `}` after it, if not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let (_, after) = key.split_once('{')?;
    let (tag, _) = after.split_once('}')?;
    (!tag.is_empty()).then_some(tag)
}

/// What the acquire script keeps beside a lock key.
#[derive(Debug, Clone)]
pub(crate) struct AcquireNames {
    pub(crate) fencing_counter: String,
    pub(crate) queue: String,
    pub(crate) queue_expiry: String,
    pub(crate) writers: String,
    pub(crate) waiters: String,
}

#[cfg(test)]
mod tests {
    use redis::cluster_routing::Slot;

    use super::*;

    #[test]
    fn a_key_holds_its_token_marked_or_not_and_nothing_else() {
        let token = "0123456789abcdef0123456789abcdef";
        let value = Origin::new("web-3", 42, "orders").value(token, 1_764_057_600_123);
        assert_eq!(value, format!("{token};1764057600123;42;web-3;orders"));
        for stored in [
            token.to_owned(),
            format!("{token}+"),
            value.clone(),
            format!("{value}+"),
            format!(
                "{value}+12/3000/1/{}",
                Origin::new("h", 1, "a").value(&"f".repeat(32), 9)
            ),
        ] {
            assert!(holds(&stored, token), "{stored}");
            assert!(holds(&stored, &value), "{stored}");
            assert_eq!(exclusive_holder(&stored), Some(token), "{stored}");
        }
        assert!(!holds("0123456789abcdef0123456789abcdee", token));
        assert!(!holds("", token));
        assert!(is_waited_for(&format!("{value}+")));
        assert!(!is_waited_for(&value));
    }

    #[test]
    fn a_value_says_who_took_the_lock_and_when() {
        let token = "0123456789abcdef0123456789abcdef";
        let origin = Origin::new("web 3.example/a", 42, "ördërs;+>/");
        assert_eq!(
            (origin.host(), origin.app()),
            ("web_3.example_a", "_rd_rs____")
        );
        let value = origin.value(token, 7);
        let parsed = LockValue::parse(&value).unwrap();
        assert_eq!(parsed.token, token);
        assert_eq!(parsed.acquired_ms, Some(7));
        assert_eq!(parsed.pid, Some(42));
        assert_eq!(parsed.host, Some("web_3.example_a"));
        assert_eq!(parsed.app, Some("_rd_rs____"));
        let old = LockValue::parse(token).unwrap();
        assert_eq!((old.token, old.acquired_ms, old.host), (token, None, None));
        for stranger in [
            "hello",
            "",
            &format!("{token};x;1;h;a"),
            &format!("{token};1;1;h"),
            &format!("{token};1;1;h;a;b"),
            &format!("{token};1;1;h;"),
        ] {
            assert_eq!(LockValue::parse(stranger), None, "{stranger}");
        }
        assert_eq!(Origin::new("", 1, "").tail.as_ref(), ";1;-;-");
        assert_eq!(lock_value("t", 0, ""), "t;0");
        assert_eq!(
            lock_value("t", u64::MAX, ";1;h;a"),
            format!("t;{};1;h;a", u64::MAX)
        );
    }

    #[test]
    fn an_attempt_that_came_after_its_calls_next_one_is_late() {
        let origin = Origin::new("h", 1, "a");
        let token = "c".repeat(32);
        let (first, second) = (origin.value(&token, 5), origin.value(&token, 9));
        assert!(is_later_attempt(&second, &first));
        assert!(is_later_attempt(&format!("{second}+"), &first));
        assert!(!is_later_attempt(&first, &second));
        assert!(!is_later_attempt(&first, &first));
        // A bare token (an older version) says nothing of when: not later.
        assert!(!is_later_attempt(&token, &first));
    }

    #[test]
    fn a_reservation_names_the_caller_owed_the_lock() {
        let holder = Origin::new("a", 1, "x").value(&"a".repeat(32), 5);
        let waiter = Origin::new("b", 2, "y").value(&"b".repeat(32), 6);
        let stored = format!("{holder}+{}/{}/{}/{waiter}", 100, 3000, 2);
        let parsed = Stored::parse(&stored).unwrap();
        assert_eq!(parsed.holder, holder);
        assert!(parsed.waited);
        let reserved = parsed.reserved.unwrap();
        assert_eq!(
            (
                reserved.since_ms,
                reserved.ttl_ms,
                reserved.keys,
                reserved.value
            ),
            (100, 3000, 2, waiter.as_str())
        );
        assert_eq!(Stored::parse(&format!("{holder}+")).unwrap().reserved, None);
        assert_eq!(Stored::parse(&format!("{holder}+x")), None);
        assert_eq!(Stored::parse("hello+"), None);
        let handed = format!("{holder}>{}", "b".repeat(32));
        let heard = Announcement::parse(&handed);
        assert_eq!(heard.released, holder);
        assert_eq!(heard.handed_to, Some("b".repeat(32).as_str()));
        assert_eq!(holder_token(&handed), "a".repeat(32));
        assert_eq!(Announcement::parse("").released, "");
    }

    #[test]
    fn lock_patterns_escape_globs() {
        assert_eq!(lock_pattern(""), "*");
        assert_eq!(lock_pattern("orders"), "orders:*");
        assert_eq!(lock_pattern("o*d?r[s]\\"), "o\\*d\\?r\\[s\\]\\\\:*");
    }

    #[test]
    fn shared_kinds_round_trip_and_strangers_are_refused() {
        for kind in [LockKind::Read, LockKind::Permits(1), LockKind::Permits(7)] {
            let tag = shared_kind_tag(kind).unwrap();
            assert_eq!(parse_shared_kind(&tag), Some(kind));
        }
        assert_eq!(shared_kind_tag(LockKind::Exclusive), None);
        for stranger in ["", "write", "permits:", "permits:0", "permits:x"] {
            assert_eq!(parse_shared_kind(stranger), None, "{stranger}");
        }
    }

    #[test]
    fn internal_names_are_told_from_locks() {
        let names = Names::new("lm");
        for internal in [
            names.fencing_counter("a:1"),
            names.release_channel("a:1"),
            names.queue("a"),
            names.queue_expiry("a"),
            names.writers("a"),
            names.waiters("a"),
        ] {
            assert!(names.is_internal(&internal), "{internal}");
        }
        for lock in ["a:1", "lm", "lm:orders:1", "lmx:fence:a"] {
            assert!(!names.is_internal(lock), "{lock}");
        }
    }

    #[test]
    fn internal_names_share_the_keys_slot() {
        for key in ["orders:42", "{user1}:orders", "a", "x{y}z", "ünïcode:☃"] {
            let name = Names::in_slot(key, Names::default().fencing_counter("")).unwrap();
            assert_eq!(Slot::for_key(&name), Slot::for_key(key), "{key} -> {name}");
        }
    }

    /// `in_slot` as it was before it skipped hashing: both forms hashed, the plain one first.
    fn in_slot_by_hashing(key: &str, prefix: &str) -> Option<String> {
        let slot = Slot::for_key(key);
        let plain = format!("{prefix}{key}");
        let braced = format!("{prefix}{{{key}}}");
        [plain, braced]
            .into_iter()
            .find(|name| Slot::for_key(name) == slot)
    }

    #[test]
    fn names_in_slot_are_those_hashing_both_forms_finds() {
        let alphabet = ["a", "b", "{", "}", ":", "ü"];
        // Every key of up to five of these characters.
        let (mut keys, mut longest) = (vec![String::new()], vec![String::new()]);
        for _ in 0..5 {
            longest = longest
                .iter()
                .flat_map(|key| alphabet.map(|c| format!("{key}{c}")))
                .collect();
            keys.extend(longest.iter().cloned());
        }
        keys.extend(["orders:42", "{user1}:orders", "x{y}z", "a{}b{c}", "a}b"].map(String::from));
        // A key without a tag whose plain channel falls in its slot all the same: the hash is
        // linear, so under `lockmacro:released:` that is every such key of 12 086 bytes.
        let by_chance = "a".repeat(12_086);
        let plain = Names::default().release_channel(&by_chance);
        assert_eq!(Slot::for_key(&plain), Slot::for_key(&by_chance));
        assert_eq!(
            Names::default().release_channel_in_slot(&by_chance).ok(),
            Some(plain)
        );
        keys.push(by_chance);
        for namespace in ["lockmacro", "", "n{s", "n}s", "{n}", "n{"] {
            let names = Names::new(namespace);
            let prefix = names.release_channel("");
            for key in &keys {
                let placed = names.release_channel_in_slot(key).ok();
                assert_eq!(placed, in_slot_by_hashing(key, &prefix), "{prefix} {key}");
                assert_eq!(Names::in_slot(key, prefix.clone()).ok(), placed);
                assert_eq!(
                    names.check_in_slot(key).is_ok(),
                    placed.is_some(),
                    "{prefix} {key}"
                );
            }
        }
    }

    #[test]
    fn slot_numbers_are_the_clusters_slots() {
        for key in [
            "orders:42",
            "{user1}:orders",
            "a",
            "x{y}z",
            "a{}b",
            "{}",
            "",
            "ünïcode:☃",
        ] {
            assert_eq!(
                Slot::new(slot_number(key)),
                Some(Slot::for_key(key)),
                "{key}"
            );
        }
        assert_eq!(slot_number("foo"), 12182);
    }

    #[test]
    fn keys_whose_braces_cannot_share_a_slot_are_refused() {
        for key in ["a{}b{c}", "a}b"] {
            match Names::in_slot(key, "lockmacro:fence:".to_owned()) {
                Err(error) => assert!(
                    matches!(error, LockError::InvalidKey { .. }),
                    "{key}: {error}"
                ),
                Ok(name) => assert_eq!(Slot::for_key(&name), Slot::for_key(key), "{key} -> {name}"),
            }
        }
    }

    #[test]
    fn a_token_is_a_uuid_v4_in_simple_form_and_fresh_each_time() {
        let token = new_token();
        assert_eq!(token.len(), 32, "{token}");
        assert!(
            token
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{token}"
        );
        let uuid = uuid::Uuid::parse_str(&token).expect("a UUID");
        assert_eq!(uuid.get_version(), Some(uuid::Version::Random), "{token}");
        assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{token}");
        assert_ne!(token, new_token());
    }
}
