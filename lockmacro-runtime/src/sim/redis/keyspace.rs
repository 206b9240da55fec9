//! The simulated node's data and the commands over it, as Redis 7 answers them: strings, hashes,
//! lists and sorted sets with absolute expiries on the node's clock, read lazily (a key whose
//! expiry passed is gone the moment it is looked at, as Redis's lazy expiry makes it look).
//!
//! Only the commands the Lua scripts and the Redis store send are here; any other is an error
//! reply naming it, so a script or store that starts using one fails loudly rather than being
//! answered by a guess.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ::redis::Value as Reply;

use super::reply::{self, Args};

/// What a key holds.
#[derive(Debug, Clone, PartialEq)]
pub enum Stored {
    /// A string.
    String(Vec<u8>),
    /// A hash, its fields in the order they were first set (as a small Redis hash keeps them).
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
    /// A list.
    List(VecDeque<Vec<u8>>),
    /// A sorted set, ordered by score, then member.
    SortedSet(Vec<(f64, Vec<u8>)>),
}

impl Stored {
    /// The name `TYPE` gives it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Self::String(_) => "string",
            Self::Hash(_) => "hash",
            Self::List(_) => "list",
            Self::SortedSet(_) => "zset",
        }
    }

    /// Redis deletes a container once its last element goes.
    fn is_empty(&self) -> bool {
        match self {
            Self::String(_) => false,
            Self::Hash(fields) => fields.is_empty(),
            Self::List(items) => items.is_empty(),
            Self::SortedSet(members) => members.is_empty(),
        }
    }
}

/// A key's value and when it expires (ms on the node's clock).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// What it holds.
    pub value: Stored,
    /// Its absolute expiry, ms; `None` lives forever.
    pub expires_at_ms: Option<u64>,
}

/// A message sent by `PUBLISH` (or `SPUBLISH`, `sharded`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// `SPUBLISH` rather than `PUBLISH`.
    pub sharded: bool,
    /// The channel.
    pub channel: Vec<u8>,
    /// The message.
    pub message: Vec<u8>,
}

/// Everything a command (and a script's `redis.call`) reads and changes: the keys, the clock,
/// what was published and who listens.
#[derive(Debug, Default)]
pub(crate) struct Keyspace {
    entries: BTreeMap<Vec<u8>, Entry>,
    /// The node's clock, µs since the Unix epoch: `TIME`, expiries.
    pub(crate) now_us: u64,
    pub(crate) published: Vec<Published>,
    /// The connections subscribed to each (sharded, channel): what `PUBLISH` counts and who
    /// hears it.
    pub(crate) subscribers: BTreeMap<(bool, Vec<u8>), BTreeSet<u64>>,
    /// The writes made since last taken, as a Redis 7 master sends them to its replicas: each
    /// write that changed something, a relative expiry made absolute (`SET ... PXAT`,
    /// `PEXPIREAT`, or `DEL` for one already past), and a `DEL` for each key found expired.
    pub(crate) effects: Vec<Vec<Vec<u8>>>,
}

type Outcome = Result<Reply, String>;

const WRONG_TYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";
const SYNTAX: &str = "ERR syntax error";

impl Keyspace {
    fn now_ms(&self) -> u64 {
        self.now_us / 1000
    }

    /// The live keys, expired ones left out, in key order.
    pub(crate) fn live(&self) -> impl Iterator<Item = (&Vec<u8>, &Entry)> {
        let now = self.now_ms();
        self.entries
            .iter()
            .filter(move |(_, entry)| !expired(entry, now))
    }

    /// Its data and clock, as a full sync gives them to a replica: no subscriber, nothing
    /// published or to propagate.
    pub(crate) fn copy(&self) -> Self {
        Self {
            entries: self.entries.clone(),
            now_us: self.now_us,
            ..Self::default()
        }
    }

    /// Runs one command that is not about scripts or the server, noting its effects.
    pub(crate) fn execute(&mut self, args: &Args) -> Reply {
        let name = args.name();
        let Some(keys) = written_keys(&name, args) else {
            return self.run(&name, args);
        };
        let before: Vec<Option<Entry>> = keys.iter().map(|key| self.live_entry(key)).collect();
        let reply = self.run(&name, args);
        if matches!(reply, Reply::ServerError(_)) {
            return reply;
        }
        let after: Vec<Option<Entry>> = keys.iter().map(|key| self.live_entry(key)).collect();
        // Redis propagates a command that made the server dirty: `HSET`, `RPUSH`, `PUBLISH` and a
        // `SET` its condition let through do even when the value stays the same.
        let dirty = match name.as_str() {
            "HSET" | "RPUSH" | "PUBLISH" | "SPUBLISH" => true,
            "SET" => {
                let given = |option: &str| (3..args.len()).any(|at| args.upper(at) == option);
                !(given("NX") && before[0].is_some() || given("XX") && before[0].is_none())
            }
            _ => before != after,
        };
        if dirty {
            let effect = self.propagated(&name, args, after.first().cloned().flatten());
            self.effects.push(effect);
        }
        reply
    }

    /// A write as a Redis 7 master propagates it (`propagate` and `setGenericCommand`,
    /// `expireGenericCommand`): expiries absolute, the rest as sent. `entry` is the first key's
    /// after the write.
    fn propagated(&self, name: &str, args: &Args, entry: Option<Entry>) -> Vec<Vec<u8>> {
        let key = args.bytes(1).to_vec();
        let expiry = entry.and_then(|entry| entry.expires_at_ms);
        let relative =
            (3..args.len()).any(|at| matches!(args.upper(at).as_str(), "EX" | "PX" | "EXAT"));
        match (name, expiry) {
            ("SET", Some(at)) if relative => vec![
                b"SET".to_vec(),
                key,
                args.bytes(2).to_vec(),
                b"PXAT".to_vec(),
                at.to_string().into_bytes(),
            ],
            ("PEXPIRE", Some(at)) => vec![b"PEXPIREAT".to_vec(), key, at.to_string().into_bytes()],
            ("PEXPIRE", None) => vec![b"DEL".to_vec(), key],
            _ => args.from(0).to_vec(),
        }
    }

    /// `key`'s entry when live, without deleting an expired one.
    fn live_entry(&self, key: &[u8]) -> Option<Entry> {
        let now = self.now_ms();
        self.entries
            .get(key)
            .filter(|entry| !expired(entry, now))
            .cloned()
    }

    fn run(&mut self, name: &str, args: &Args) -> Reply {
        let outcome = match name {
            "PING" => Ok(match args.len() {
                1 => Reply::SimpleString("PONG".into()),
                _ => Reply::BulkString(args.bytes(1).to_vec()),
            }),
            "TIME" => args.exactly(1).map(|()| self.time()),
            "GET" => args.exactly(2).and_then(|()| self.get(args.bytes(1))),
            "SET" => self.set(args),
            "MGET" => args.at_least(2).map(|()| self.mget(args)),
            "GETRANGE" => args.exactly(4).and_then(|()| self.getrange(args)),
            "DEL" => args.at_least(2).map(|()| self.del(args)),
            "EXISTS" => args.at_least(2).map(|()| self.exists(args)),
            "TYPE" => args.exactly(2).map(|()| self.type_of(args.bytes(1))),
            "PEXPIRE" => args.exactly(3).and_then(|()| self.pexpire(args, false)),
            "PEXPIREAT" => args.exactly(3).and_then(|()| self.pexpire(args, true)),
            "PTTL" => args.exactly(2).map(|()| self.pttl(args.bytes(1))),
            "HSET" => self.hset(args),
            "HGET" => args.exactly(3).and_then(|()| self.hget(args)),
            "HMGET" => args.at_least(3).and_then(|()| self.hmget(args)),
            "HDEL" => args.at_least(3).and_then(|()| self.hdel(args)),
            "HEXISTS" => args.exactly(3).and_then(|()| self.hexists(args)),
            "HLEN" => args.exactly(2).and_then(|()| self.hlen(args)),
            "HGETALL" => args.exactly(2).and_then(|()| self.hgetall(args)),
            "RPUSH" => args.at_least(3).and_then(|()| self.rpush(args)),
            "LPOP" => self.lpop(args),
            "LINDEX" => args.exactly(3).and_then(|()| self.lindex(args)),
            "LREM" => args.exactly(4).and_then(|()| self.lrem(args)),
            "LLEN" => args.exactly(2).and_then(|()| self.llen(args)),
            "ZADD" => self.zadd(args),
            "ZREM" => args.at_least(3).and_then(|()| self.zrem(args)),
            "ZCARD" => args.exactly(2).and_then(|()| self.zcard(args)),
            "ZREMRANGEBYSCORE" => args.exactly(4).and_then(|()| self.zremrangebyscore(args)),
            "PUBLISH" => args.exactly(3).map(|()| self.publish(args, false)),
            "SPUBLISH" => args.exactly(3).map(|()| self.publish(args, true)),
            "SCAN" => self.scan(args),
            _ => Err(reply::not_simulated(name)),
        };
        outcome.unwrap_or_else(|message| reply::error(&message))
    }

    /// The live entry of `key`, an expired one deleted first.
    fn entry(&mut self, key: &[u8]) -> Option<&mut Entry> {
        let now = self.now_ms();
        if self
            .entries
            .get(key)
            .is_some_and(|entry| expired(entry, now))
        {
            self.entries.remove(key);
            self.effects.push(vec![b"DEL".to_vec(), key.to_vec()]);
        }
        self.entries.get_mut(key)
    }

    /// `key`'s value, with `Err(WRONGTYPE)` when it is not of the type `pick` takes.
    fn value<T>(
        &mut self,
        key: &[u8],
        pick: impl FnOnce(&mut Stored) -> Option<&mut T>,
    ) -> Result<Option<&mut T>, String> {
        match self.entry(key) {
            None => Ok(None),
            Some(entry) => pick(&mut entry.value).map(Some).ok_or(WRONG_TYPE.into()),
        }
    }

    /// `key`'s value, created empty by `make` when missing; `Err(WRONGTYPE)` for another type.
    fn value_or_new<T>(
        &mut self,
        key: &[u8],
        make: impl FnOnce() -> Stored,
        pick: impl Fn(&mut Stored) -> Option<&mut T>,
    ) -> Result<&mut T, String> {
        if self.entry(key).is_none() {
            self.entries.insert(
                key.to_vec(),
                Entry {
                    value: make(),
                    expires_at_ms: None,
                },
            );
        }
        let entry = self.entries.get_mut(key).expect("just made");
        pick(&mut entry.value).ok_or(WRONG_TYPE.into())
    }

    /// Deletes `key` when its container became empty.
    fn drop_if_empty(&mut self, key: &[u8]) {
        if self.entries.get(key).is_some_and(|e| e.value.is_empty()) {
            self.entries.remove(key);
        }
    }

    fn time(&self) -> Reply {
        Reply::Array(vec![
            reply::bulk_number(self.now_us / 1_000_000),
            reply::bulk_number(self.now_us % 1_000_000),
        ])
    }

    fn get(&mut self, key: &[u8]) -> Outcome {
        Ok(match self.value(key, string)? {
            Some(value) => Reply::BulkString(value.clone()),
            None => Reply::Nil,
        })
    }

    /// `SET key value [NX|XX] [GET] [EX s|PX ms|EXAT s|PXAT ms|KEEPTTL]`.
    fn set(&mut self, args: &Args) -> Outcome {
        args.at_least(3)?;
        let (key, value) = (args.bytes(1), args.bytes(2));
        let (mut only_if, mut get, mut keep_ttl, mut expires_at) = (None, false, false, None);
        let mut at = 3;
        while at < args.len() {
            let option = args.upper(at);
            match option.as_str() {
                "NX" | "XX" if only_if.is_none() => only_if = Some(option == "NX"),
                "GET" => get = true,
                "KEEPTTL" if expires_at.is_none() => keep_ttl = true,
                "EX" | "PX" | "EXAT" | "PXAT" if !keep_ttl && expires_at.is_none() => {
                    at += 1;
                    let amount = args.integer(at).ok_or(NOT_AN_INTEGER)?;
                    if amount <= 0 {
                        return Err("ERR invalid expire time in 'set' command".into());
                    }
                    let amount = amount as u64;
                    expires_at = Some(match option.as_str() {
                        "EX" => self.now_ms() + amount * 1000,
                        "PX" => self.now_ms() + amount,
                        "EXAT" => amount * 1000,
                        _ => amount,
                    });
                }
                _ => return Err(SYNTAX.into()),
            }
            at += 1;
        }
        let old = self.entry(key).map(|entry| entry.clone());
        let old_value = match &old {
            Some(Entry {
                value: Stored::String(value),
                ..
            }) => Reply::BulkString(value.clone()),
            Some(_) if get => return Err(WRONG_TYPE.into()),
            _ => Reply::Nil,
        };
        if only_if.is_some_and(|nx| nx == old.is_some()) {
            return Ok(if get { old_value } else { Reply::Nil });
        }
        let expires_at_ms = match (keep_ttl, &old) {
            (true, Some(old)) => old.expires_at_ms,
            _ => expires_at,
        };
        self.entries.insert(
            key.to_vec(),
            Entry {
                value: Stored::String(value.to_vec()),
                expires_at_ms,
            },
        );
        Ok(if get { old_value } else { Reply::Okay })
    }

    fn mget(&mut self, args: &Args) -> Reply {
        let values = (1..args.len())
            .map(|at| match self.entry(args.bytes(at)) {
                Some(Entry {
                    value: Stored::String(value),
                    ..
                }) => Reply::BulkString(value.clone()),
                _ => Reply::Nil,
            })
            .collect();
        Reply::Array(values)
    }

    fn getrange(&mut self, args: &Args) -> Outcome {
        let (start, end) = (args.integer(2), args.integer(3));
        let (Some(mut start), Some(mut end)) = (start, end) else {
            return Err(NOT_AN_INTEGER.into());
        };
        let value = self
            .value(args.bytes(1), string)?
            .cloned()
            .unwrap_or_default();
        let len = value.len() as i64;
        if start < 0 {
            start += len;
        }
        if end < 0 {
            end += len;
        }
        start = start.max(0);
        end = end.max(0).min(len - 1);
        if len == 0 || start > end {
            return Ok(Reply::BulkString(Vec::new()));
        }
        Ok(Reply::BulkString(
            value[start as usize..=end as usize].to_vec(),
        ))
    }

    fn del(&mut self, args: &Args) -> Reply {
        let deleted = (1..args.len())
            .filter(|&at| {
                let key = args.bytes(at);
                self.entry(key).is_some() && self.entries.remove(key).is_some()
            })
            .count();
        Reply::Int(deleted as i64)
    }

    fn exists(&mut self, args: &Args) -> Reply {
        let found = (1..args.len())
            .filter(|&at| self.entry(args.bytes(at)).is_some())
            .count();
        Reply::Int(found as i64)
    }

    fn type_of(&mut self, key: &[u8]) -> Reply {
        let name = self.entry(key).map_or("none", |e| e.value.type_name());
        Reply::SimpleString(name.into())
    }

    /// `PEXPIRE key ms` (`PEXPIREAT key at` when `absolute`, as a replica receives it); a time
    /// already past deletes the key. Their options (`NX`, `GT`, ...) are not simulated: the arity
    /// check refuses them.
    fn pexpire(&mut self, args: &Args, absolute: bool) -> Outcome {
        let ms = args.integer(2).ok_or(NOT_AN_INTEGER)?;
        let now = self.now_ms();
        let key = args.bytes(1);
        let Some(entry) = self.entry(key) else {
            return Ok(Reply::Int(0));
        };
        let when = if absolute { ms } else { now as i64 + ms };
        if when <= now as i64 {
            self.entries.remove(key);
        } else {
            entry.expires_at_ms = Some(when as u64);
        }
        Ok(Reply::Int(1))
    }

    fn pttl(&mut self, key: &[u8]) -> Reply {
        let now = self.now_ms();
        Reply::Int(match self.entry(key) {
            None => -2,
            Some(Entry {
                expires_at_ms: None,
                ..
            }) => -1,
            Some(Entry {
                expires_at_ms: Some(at),
                ..
            }) => at.saturating_sub(now) as i64,
        })
    }

    fn hset(&mut self, args: &Args) -> Outcome {
        if args.len() < 4 || !args.len().is_multiple_of(2) {
            return Err(reply::arity("hset"));
        }
        let fields = self.value_or_new(args.bytes(1), || Stored::Hash(Vec::new()), hash)?;
        let mut added = 0;
        for at in (2..args.len()).step_by(2) {
            let (field, value) = (args.bytes(at), args.bytes(at + 1));
            match fields.iter_mut().find(|(name, _)| name == field) {
                Some((_, old)) => *old = value.to_vec(),
                None => {
                    fields.push((field.to_vec(), value.to_vec()));
                    added += 1;
                }
            }
        }
        Ok(Reply::Int(added))
    }

    fn hget(&mut self, args: &Args) -> Outcome {
        let fields = self.value(args.bytes(1), hash)?;
        let found = fields.and_then(|fields| field(fields, args.bytes(2)));
        Ok(found.map_or(Reply::Nil, |value| Reply::BulkString(value.clone())))
    }

    fn hmget(&mut self, args: &Args) -> Outcome {
        let fields = self.value(args.bytes(1), hash)?;
        let found = (2..args.len()).map(|at| {
            let found = fields
                .as_deref()
                .and_then(|fields| field(fields, args.bytes(at)));
            found.map_or(Reply::Nil, |value| Reply::BulkString(value.clone()))
        });
        Ok(Reply::Array(found.collect()))
    }

    fn hdel(&mut self, args: &Args) -> Outcome {
        let key = args.bytes(1);
        let Some(fields) = self.value(key, hash)? else {
            return Ok(Reply::Int(0));
        };
        let before = fields.len();
        fields.retain(|(name, _)| !(2..args.len()).any(|at| args.bytes(at) == name));
        let removed = before - fields.len();
        self.drop_if_empty(key);
        Ok(Reply::Int(removed as i64))
    }

    fn hexists(&mut self, args: &Args) -> Outcome {
        let fields = self.value(args.bytes(1), hash)?;
        let found = fields.is_some_and(|fields| field(fields, args.bytes(2)).is_some());
        Ok(Reply::Int(found.into()))
    }

    fn hlen(&mut self, args: &Args) -> Outcome {
        let fields = self.value(args.bytes(1), hash)?;
        Ok(Reply::Int(fields.map_or(0, |fields| fields.len() as i64)))
    }

    fn hgetall(&mut self, args: &Args) -> Outcome {
        let fields = self.value(args.bytes(1), hash)?;
        let flat = fields.into_iter().flatten().flat_map(|(name, value)| {
            [
                Reply::BulkString(name.clone()),
                Reply::BulkString(value.clone()),
            ]
        });
        Ok(Reply::Array(flat.collect()))
    }

    fn rpush(&mut self, args: &Args) -> Outcome {
        let items = self.value_or_new(args.bytes(1), || Stored::List(VecDeque::new()), list)?;
        items.extend((2..args.len()).map(|at| args.bytes(at).to_vec()));
        Ok(Reply::Int(items.len() as i64))
    }

    /// `LPOP key [count]`.
    fn lpop(&mut self, args: &Args) -> Outcome {
        if !(2..=3).contains(&args.len()) {
            return Err(reply::arity("lpop"));
        }
        let count = match args.len() {
            3 => Some(
                args.integer(2)
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or("ERR value is out of range, must be positive")?,
            ),
            _ => None,
        };
        let key = args.bytes(1);
        let Some(items) = self.value(key, list)? else {
            return Ok(Reply::Nil);
        };
        let popped: Vec<Reply> = (0..count.unwrap_or(1))
            .map_while(|_| items.pop_front().map(Reply::BulkString))
            .collect();
        self.drop_if_empty(key);
        Ok(match count {
            Some(_) => Reply::Array(popped),
            None => popped.into_iter().next().unwrap_or(Reply::Nil),
        })
    }

    fn lindex(&mut self, args: &Args) -> Outcome {
        let index = args.integer(2).ok_or(NOT_AN_INTEGER)?;
        let Some(items) = self.value(args.bytes(1), list)? else {
            return Ok(Reply::Nil);
        };
        let index = if index < 0 {
            items.len() as i64 + index
        } else {
            index
        };
        let found = usize::try_from(index).ok().and_then(|at| items.get(at));
        Ok(found.map_or(Reply::Nil, |item| Reply::BulkString(item.clone())))
    }

    fn lrem(&mut self, args: &Args) -> Outcome {
        let count = args.integer(2).ok_or(NOT_AN_INTEGER)?;
        let (key, item) = (args.bytes(1), args.bytes(3));
        let Some(items) = self.value(key, list)? else {
            return Ok(Reply::Int(0));
        };
        let limit = if count == 0 {
            usize::MAX
        } else {
            count.unsigned_abs() as usize
        };
        let mut removed = 0;
        let mut kept: VecDeque<Vec<u8>> = VecDeque::with_capacity(items.len());
        if count >= 0 {
            for candidate in items.drain(..) {
                if removed < limit && candidate == item {
                    removed += 1;
                } else {
                    kept.push_back(candidate);
                }
            }
        } else {
            for candidate in items.drain(..).rev() {
                if removed < limit && candidate == item {
                    removed += 1;
                } else {
                    kept.push_front(candidate);
                }
            }
        }
        *items = kept;
        self.drop_if_empty(key);
        Ok(Reply::Int(removed as i64))
    }

    fn llen(&mut self, args: &Args) -> Outcome {
        let items = self.value(args.bytes(1), list)?;
        Ok(Reply::Int(items.map_or(0, |items| items.len() as i64)))
    }

    /// `ZADD key score member [score member ...]`; its flags (`NX`, `CH`, `INCR`, ...) are not
    /// simulated and answered as an error naming them.
    fn zadd(&mut self, args: &Args) -> Outcome {
        if args.len() >= 3 && score(args.bytes(2)).is_none() {
            let flag = args.upper(2);
            if matches!(flag.as_str(), "NX" | "XX" | "GT" | "LT" | "CH" | "INCR") {
                return Err(reply::not_simulated(&format!("ZADD {flag}")));
            }
        }
        if args.len() < 4 || !args.len().is_multiple_of(2) {
            return Err(reply::arity("zadd"));
        }
        let pairs: Option<Vec<(f64, &[u8])>> = (2..args.len())
            .step_by(2)
            .map(|at| Some((score(args.bytes(at))?, args.bytes(at + 1))))
            .collect();
        let pairs = pairs.ok_or("ERR value is not a valid float")?;
        let members = self.value_or_new(args.bytes(1), || Stored::SortedSet(Vec::new()), zset)?;
        let mut added = 0;
        for (score, member) in pairs {
            let before = members.len();
            members.retain(|(_, name)| name != member);
            added += i64::from(members.len() == before);
            members.push((score, member.to_vec()));
        }
        members.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        Ok(Reply::Int(added))
    }

    fn zrem(&mut self, args: &Args) -> Outcome {
        let key = args.bytes(1);
        let Some(members) = self.value(key, zset)? else {
            return Ok(Reply::Int(0));
        };
        let before = members.len();
        members.retain(|(_, name)| !(2..args.len()).any(|at| args.bytes(at) == name));
        let removed = before - members.len();
        self.drop_if_empty(key);
        Ok(Reply::Int(removed as i64))
    }

    fn zcard(&mut self, args: &Args) -> Outcome {
        let members = self.value(args.bytes(1), zset)?;
        Ok(Reply::Int(
            members.map_or(0, |members| members.len() as i64),
        ))
    }

    fn zremrangebyscore(&mut self, args: &Args) -> Outcome {
        let (min, max) = (bound(args.bytes(2)), bound(args.bytes(3)));
        let (Some(min), Some(max)) = (min, max) else {
            return Err("ERR min or max is not a float".into());
        };
        let key = args.bytes(1);
        let Some(members) = self.value(key, zset)? else {
            return Ok(Reply::Int(0));
        };
        let before = members.len();
        members.retain(|(score, _)| !(min.below(*score) && max.above(*score)));
        let removed = before - members.len();
        self.drop_if_empty(key);
        Ok(Reply::Int(removed as i64))
    }

    fn publish(&mut self, args: &Args, sharded: bool) -> Reply {
        let channel = args.bytes(1).to_vec();
        let listeners = self
            .subscribers
            .get(&(sharded, channel.clone()))
            .map_or(0, BTreeSet::len);
        self.published.push(Published {
            sharded,
            channel,
            message: args.bytes(2).to_vec(),
        });
        Reply::Int(listeners as i64)
    }

    /// `SCAN cursor [MATCH pattern] [COUNT n] [TYPE t]`. The cursor is a position in an order
    /// that keys keep while others come and go (a hash of the key), so a key present for a
    /// whole scan is returned, as Redis promises; `COUNT` keys are looked at per call, and
    /// `MATCH` and `TYPE` filter those.
    fn scan(&mut self, args: &Args) -> Outcome {
        args.at_least(2)?;
        let cursor = args.integer(1).ok_or("ERR invalid cursor")?;
        let (mut pattern, mut count, mut type_name) = (None, 10usize, None);
        let mut at = 2;
        while at < args.len() {
            let value = (at + 1 < args.len()).then(|| args.bytes(at + 1));
            match (args.upper(at).as_str(), value) {
                ("MATCH", Some(value)) => pattern = Some(value),
                ("COUNT", Some(_)) => {
                    count = args
                        .integer(at + 1)
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|&n| n > 0)
                        .ok_or(SYNTAX)?;
                }
                ("TYPE", Some(value)) => {
                    type_name = Some(String::from_utf8_lossy(value).to_lowercase())
                }
                _ => return Err(SYNTAX.into()),
            }
            at += 2;
        }
        let now = self.now_ms();
        let gone: Vec<Vec<u8>> = self
            .entries
            .iter()
            .filter(|(_, entry)| expired(entry, now))
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            self.entries.remove(&key);
            self.effects.push(vec![b"DEL".to_vec(), key]);
        }
        let mut order: Vec<(u64, &Vec<u8>)> = self
            .entries
            .keys()
            .map(|key| (scan_position(key), key))
            .filter(|(position, _)| *position >= cursor as u64)
            .collect();
        order.sort();
        let next = order.get(count).map_or(0, |(position, _)| *position);
        let keys = order
            .iter()
            .take(count)
            .filter(|(_, key)| pattern.is_none_or(|pattern| glob(pattern, key)))
            .filter(|(_, key)| {
                type_name
                    .as_deref()
                    .is_none_or(|name| self.entries[*key].value.type_name() == name)
            })
            .map(|(_, key)| Reply::BulkString((*key).clone()))
            .collect();
        Ok(Reply::Array(vec![
            reply::bulk_number(next),
            Reply::Array(keys),
        ]))
    }
}

/// The keys a write command changes, `None` for a command that writes nothing (`PUBLISH`
/// changes no key but is propagated).
fn written_keys(name: &str, args: &Args) -> Option<Vec<Vec<u8>>> {
    match name {
        "DEL" => Some(args.from(1).to_vec()),
        "SET" | "PEXPIRE" | "PEXPIREAT" | "HSET" | "HDEL" | "RPUSH" | "LPOP" | "LREM" | "ZADD"
        | "ZREM" | "ZREMRANGEBYSCORE" => Some(vec![args.bytes(1).to_vec()]),
        "PUBLISH" | "SPUBLISH" => Some(Vec::new()),
        _ => None,
    }
}

fn expired(entry: &Entry, now_ms: u64) -> bool {
    // Redis: a key is expired once the time is past its expiry, not at it.
    entry.expires_at_ms.is_some_and(|at| now_ms > at)
}

fn string(value: &mut Stored) -> Option<&mut Vec<u8>> {
    match value {
        Stored::String(value) => Some(value),
        _ => None,
    }
}

fn hash(value: &mut Stored) -> Option<&mut Vec<(Vec<u8>, Vec<u8>)>> {
    match value {
        Stored::Hash(fields) => Some(fields),
        _ => None,
    }
}

fn list(value: &mut Stored) -> Option<&mut VecDeque<Vec<u8>>> {
    match value {
        Stored::List(items) => Some(items),
        _ => None,
    }
}

fn zset(value: &mut Stored) -> Option<&mut Vec<(f64, Vec<u8>)>> {
    match value {
        Stored::SortedSet(members) => Some(members),
        _ => None,
    }
}

fn field<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], name: &[u8]) -> Option<&'a Vec<u8>> {
    fields
        .iter()
        .find(|(field, _)| field == name)
        .map(|(_, value)| value)
}

/// A score as `ZADD` reads it: a float, `inf`, `+inf` or `-inf`; never NaN.
fn score(text: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(text).ok()?;
    let score = match text.to_ascii_lowercase().as_str() {
        "inf" | "+inf" => f64::INFINITY,
        "-inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    (!score.is_nan()).then_some(score)
}

/// One end of a score range: a score, `(` in front for an open end.
#[derive(Clone, Copy)]
struct Bound {
    score: f64,
    open: bool,
}

impl Bound {
    /// Whether `score` is past this lower end.
    fn below(self, score: f64) -> bool {
        if self.open {
            self.score < score
        } else {
            self.score <= score
        }
    }

    /// Whether `score` is before this upper end.
    fn above(self, score: f64) -> bool {
        if self.open {
            score < self.score
        } else {
            score <= self.score
        }
    }
}

fn bound(text: &[u8]) -> Option<Bound> {
    match text.strip_prefix(b"(") {
        Some(rest) => Some(Bound {
            score: score(rest)?,
            open: true,
        }),
        None => Some(Bound {
            score: score(text)?,
            open: false,
        }),
    }
}

/// Where `key` stands in a scan: a hash of it (FNV-1a), never 0, which ends a scan.
fn scan_position(key: &[u8]) -> u64 {
    let hash = key.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash >> 1) + 1
}

/// Redis's glob: `*`, `?`, `[...]` (with `^` and ranges) and `\` escapes.
pub(crate) fn glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|skip| glob(rest, &text[skip..])),
        Some((b'?', rest)) => !text.is_empty() && glob(rest, &text[1..]),
        Some((b'[', rest)) => {
            let Some((&first, after)) = text.split_first() else {
                return false;
            };
            let (negated, mut class) = match rest.split_first() {
                Some((b'^', class)) => (true, class),
                _ => (false, rest),
            };
            let mut matched = false;
            loop {
                match class {
                    [] => return false,
                    [b']', tail @ ..] => {
                        class = tail;
                        break;
                    }
                    [b'\\', c, tail @ ..] => {
                        matched |= *c == first;
                        class = tail;
                    }
                    [low, b'-', high, tail @ ..] if *high != b']' => {
                        let (low, high) = if low <= high {
                            (low, high)
                        } else {
                            (high, low)
                        };
                        matched |= (*low..=*high).contains(&first);
                        class = tail;
                    }
                    [c, tail @ ..] => {
                        matched |= *c == first;
                        class = tail;
                    }
                }
            }
            matched != negated && glob(class, after)
        }
        Some((b'\\', [c, rest @ ..])) => text.first() == Some(c) && glob(rest, &text[1..]),
        Some((c, rest)) => text.first() == Some(c) && glob(rest, &text[1..]),
    }
}
