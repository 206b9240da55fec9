//! What lockmacro stores in Redis: the one owner of its names, values and marks.
//!
//! The Lua scripts (`store/scripts/*.lua`) write this format and this module is the only Rust
//! that spells it: the deployments, the in-memory store, the inspection API, the command-line
//! tool and the test kit all read and name keys through it.
//!
//! - **An exclusive lock** is a string key `"{prefix}:{key}"` holding its holder's token,
//!   followed by [`WAITED_MARK`] once a caller waits for it, so that such a release is
//!   announced. [`holder_token`] reads the token back.
//! - **A shared lock** (readers, permits) is a hash: field [`KIND_FIELD`] says which
//!   ([`shared_kind_tag`]), and each holder has a field of its own, its token, holding its own
//!   expiry in milliseconds of the server clock. The key expires with its last live holder.
//! - **Internal names** ([`Names`]), under a namespace of their own (`lockmacro` unless the
//!   client sets another, so an ACL can grant exactly them): the fencing counter of a key, the
//!   channel its releases are announced on (the message is the released token, or empty for "look
//!   again": a hold kept the key, or an attempt that did not win was undone), a fair lock's
//!   queue and its places' expiries, and the writers waiting for a key's readers to leave. On a
//!   Cluster each is placed in its key's slot ([`Names::in_slot`]).
//! - **A watched lock**: while a watch follows a lock, a key named as the lock's release channel
//!   exists (`"1"`, renewed at each look for [`WATCH_MARK_LIFE`]), so that every release of the
//!   lock is announced, not only a waited-for one. The release script reads it in the same
//!   `MGET` as the lock's value: a release nobody waits for or watches costs no more.
//! - **A lock kept by `hold_at_least`** after its release is stored as it was held: the same
//!   token (or the same hash field), with the expiry set to the end of the hold.
//! - **Fencing tokens** are never below the server clock in microseconds
//!   ([`fencing_floor`]), so a counter that expired cannot make them go back.

use std::sync::Arc;
use std::time::Duration;

use crate::error::LockError;
use crate::options::LockKind;

/// Appended to an exclusive lock's token once a caller waits for it: its release is announced.
pub const WAITED_MARK: char = '+';

/// How long a watch's mark on a lock lasts (see the module doc): renewed at each of the
/// watch's looks, so only a watch that stopped looking for this long loses it, and a watch
/// that ended costs its lock's releases a `PUBLISH` for at most this long.
pub const WATCH_MARK_LIFE: Duration = Duration::from_secs(10);

/// The field of a shared lock's hash that says which kind it is.
pub const KIND_FIELD: &str = "kind";

/// How long a fencing counter lives after its last use. Tokens never go below the server clock
/// in microseconds, so a counter that expired cannot make them go back; the counter only orders
/// acquisitions faster than the clock, or across a clock that stepped back by less than this.
pub const FENCING_COUNTER_LIFE: Duration = Duration::from_secs(24 * 60 * 60);

/// The value of an exclusive lock held by `token`, marked when someone waits for it.
pub fn exclusive_value(token: &str, waited: bool) -> String {
    if waited {
        format!("{token}{WAITED_MARK}")
    } else {
        token.to_owned()
    }
}

/// The holder's token in an exclusive lock's value, without a waiter's mark.
pub fn holder_token(value: &str) -> &str {
    value.strip_suffix(WAITED_MARK).unwrap_or(value)
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

/// The holder's token when `value` is an exclusive lock of ours (a token, marked or not);
/// `None` for any other string.
pub fn exclusive_holder(value: &str) -> Option<&str> {
    Some(holder_token(value)).filter(|token| is_token(token))
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

/// Whether an exclusive lock's `value` is `token`'s, marked or not.
pub fn holds(value: &str, token: &str) -> bool {
    holder_token(value) == token
}

/// Whether an exclusive lock's `value` carries a waiter's mark.
pub fn is_waited_for(value: &str) -> bool {
    value.ends_with(WAITED_MARK)
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
                    "fence" | "released" | "queue" | "queue-expiry" | "writers"
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
        }
    }

    /// Every name the acquire script needs for `key`, each in `key`'s cluster slot.
    pub(crate) fn for_acquire_in_slot(&self, key: &str) -> Result<AcquireNames, LockError> {
        Ok(AcquireNames {
            fencing_counter: Self::in_slot(key, self.fencing_counter(""))?,
            queue: Self::in_slot(key, self.queue(""))?,
            queue_expiry: Self::in_slot(key, self.queue_expiry(""))?,
            writers: Self::in_slot(key, self.writers(""))?,
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
}

#[cfg(test)]
mod tests {
    use redis::cluster_routing::Slot;

    use super::*;

    #[test]
    fn a_key_holds_its_token_marked_or_not_and_nothing_else() {
        let token = "0123456789abcdef0123456789abcdef";
        assert!(holds(token, token));
        assert!(holds(&exclusive_value(token, true), token));
        assert!(!holds(&format!("{token}++"), token));
        assert!(!holds("0123456789abcdef0123456789abcdee", token));
        assert!(!holds("", token));
        assert!(is_waited_for(&exclusive_value(token, true)));
        assert!(!is_waited_for(token));
    }

    #[test]
    fn only_the_libraries_tokens_are_tokens() {
        for token in [
            "0123456789abcdef0123456789abcdef",
            "67e55044-10b1-426f-9247-bb680e5fe0c8",
            "67E55044-10B1-426F-9247-BB680E5FE0C8",
        ] {
            assert!(is_token(token), "{token}");
            assert_eq!(exclusive_holder(&exclusive_value(token, true)), Some(token));
        }
        for stranger in [
            "",
            "hello",
            "1764057600000000",
            "0123456789ABCDEF0123456789ABCDEF",
            "0123456789abcdef0123456789abcdeg",
            "67e55044-10b1-426f-9247bb680e5fe0c8a",
            "67e5504410b1-426f-9247-bb680e5fe0c8",
        ] {
            assert!(!is_token(stranger), "{stranger}");
        }
        assert_eq!(exclusive_holder("hello+"), None);
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
}
