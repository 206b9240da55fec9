//! The simulated Redis node (tier two of the simulator) against a real `redis-server` (or
//! Valkey, with `REDIS_SERVER_BIN`): histories generated from a seed — the store's scripts
//! (acquire, extend, release, hand-over, leave, watch, inspect, ...) and the commands it sends
//! itself, on a few keys, with random tokens, kinds and ttls, time passing, foreign values and a
//! restart — run step by step on both, and every reply, every message published and the whole
//! keyspace (keys, types, values, expiries) compared after each step.
//!
//! The real server's clock cannot be set, so the node follows it: each step runs on the server
//! inside `MULTI` between two `TIME`s, and the node runs it at the first. What a script computes
//! from the clock may then differ by the few µs between them (a millisecond boundary crossed),
//! so clock readings and times derived from them (a fencing token from the clock, an expiry, a
//! `PTTL`) are compared within a slack: a few ms, plus twice the longest a step of the history
//! took from the `TIME` read before it to the one after (the server may take its time from any
//! moment between; a loaded machine widens it). Flags, counts, values and messages are compared
//! exactly. Nothing is let race an expiry: a step waits until no deadline of the keyspace is
//! within the slack, and a step that ran near one anyway ends its history there (counted, not
//! failed), as does a step slower than [`SLOWEST_STEP_MS`].
//!
//! Replication has a test of its own, on a real master with a real replica: `WAIT` per
//! connection (answered at once, caught up, timed out with the replica cut off), the
//! replica's copy of a script's writes (expiries absolute), no script on the replica, and
//! `INFO replication` and `server` line by line as the store reads them.
//!
//! `LOCKMACRO_SIM_REDIS_HISTORIES=n` runs more histories; `LOCKMACRO_SIM_REDIS_SEED=s` runs the
//! one history of seed `s` (a failure names it).

use std::collections::BTreeMap;
use std::io::{BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use lockmacro_runtime::__sim::Stream;
use lockmacro_runtime::__sim::redis_node::{Answer, Entry, Node, Published, Stored, store_scripts};
use redis::Value;
use testkit::RedisServer;

/// Histories run by default: a few seconds in all.
const HISTORIES: u64 = 24;
const STEPS: usize = 40;
/// How far a clock-derived number may be from the server's (ms; µs for a fencing token), plus
/// twice the longest step.
const SLACK_MS: i64 = 3;
/// A step that took longer than this (ms) cannot be judged against a clock.
const SLOWEST_STEP_MS: i64 = 25;
const KEYS: usize = 3;
const TOKENS: usize = 4;
/// The time a lease's value says it was acquired at: given by the caller, the same on both.
const ACQUIRED_MS: u64 = 1_767_225_600_000;

/// One step of a history.
#[derive(Debug, Clone)]
enum Step {
    /// A script of the store, by name, with its keys and arguments.
    Script {
        name: &'static str,
        keys: Vec<String>,
        args: Vec<String>,
        compare: Compare,
    },
    /// A command the store sends itself (or a foreign application's write).
    Command { args: Vec<String>, compare: Compare },
    /// Every key that matches, through `SCAN` to its end (the order is the server's own).
    ScanAll { pattern: String },
    /// Time passes (the real server's, slept; the node follows).
    Advance(Duration),
    /// The server restarts empty, its scripts forgotten.
    Restart,
    /// Every script loaded again, as the store does after `NOSCRIPT`.
    LoadScripts,
}

/// How a reply is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compare {
    Exact,
    /// The first `exact` elements exactly, numbers after them within the slack (times).
    Timed {
        exact: usize,
    },
}

/// The names the store keeps beside lock key `k` (as `protocol::Names` has them, shortened).
struct Names {
    key: String,
    fence: String,
    queue: String,
    places: String,
    writers: String,
    waiters: String,
    channel: String,
}

fn names(k: usize) -> Names {
    Names {
        key: format!("lock:{k}"),
        fence: format!("fence:{k}"),
        queue: format!("queue:{k}"),
        places: format!("places:{k}"),
        writers: format!("writers:{k}"),
        waiters: format!("waiters:{k}"),
        channel: format!("channel:{k}"),
    }
}

/// A history's callers: a token each and the lease value that carries it.
fn token(t: usize) -> String {
    format!("{:032x}", 0x5eed_0000 + t as u128 * 0x1_0001)
}

fn value(t: usize) -> String {
    format!("{};{ACQUIRED_MS};7;host;app", token(t))
}

/// The value of caller `t`'s attempt: mostly its first, sometimes its next (a ms later), so that
/// an attempt lands after its call's next one took the key (acquire.lua's `later_attempt`).
fn attempt(draw: &mut Stream, t: usize) -> String {
    match draw.percent(25) {
        true => format!("{};{};7;host;app", token(t), ACQUIRED_MS + 1),
        false => value(t),
    }
}

/// A ttl: mostly short (expiries happen within a history), sometimes a minute.
fn ttl(draw: &mut Stream) -> String {
    if draw.percent(20) {
        "60000".into()
    } else {
        draw.between(60, 400).to_string()
    }
}

fn sharded(draw: &mut Stream) -> &'static str {
    if draw.percent(30) { "sharded" } else { "" }
}

/// The steps of history `seed`.
fn history(seed: u64) -> Vec<Step> {
    let mut draw = Stream::of(seed, &[]);
    let mut steps = vec![Step::LoadScripts];
    while steps.len() < STEPS {
        let k = draw.below(KEYS as u64) as usize;
        let n = names(k);
        let t = draw.below(TOKENS as u64) as usize;
        let script = |name, keys: Vec<&String>, args: Vec<String>, compare| Step::Script {
            name,
            keys: keys.into_iter().cloned().collect(),
            args,
            compare,
        };
        let step = match draw.below(100) {
            0..=29 => {
                let kind = ["x", "x", "r", "p"][draw.below(4) as usize];
                let reserving = if draw.percent(20) {
                    format!("{}/{}/1", ACQUIRED_MS + t as u64, ttl(&mut draw))
                } else {
                    String::new()
                };
                let fencing = if draw.percent(40) { "60000" } else { "0" };
                let args = vec![
                    attempt(&mut draw, t),
                    ttl(&mut draw),
                    fencing.into(),
                    kind.into(),
                    draw.between(1, 3).to_string(),
                    flag(draw.percent(25)),
                    flag(draw.percent(50)),
                    draw.between(100, 600).to_string(),
                    reserving,
                ];
                let keys = vec![
                    &n.key, &n.fence, &n.queue, &n.places, &n.writers, &n.waiters,
                ];
                script("acquire", keys, args, Compare::Timed { exact: 1 })
            }
            30..=34 => {
                let all: Vec<Names> = distinct(&mut draw).into_iter().map(names).collect();
                let mut keys: Vec<&String> = all.iter().map(|n| &n.key).collect();
                keys.extend(all.iter().map(|n| &n.waiters));
                let reserving = if draw.percent(20) {
                    format!(
                        "{}/{}/{}",
                        ACQUIRED_MS + t as u64,
                        ttl(&mut draw),
                        all.len()
                    )
                } else {
                    String::new()
                };
                let args = vec![
                    attempt(&mut draw, t),
                    ttl(&mut draw),
                    flag(draw.percent(50)),
                    draw.between(100, 600).to_string(),
                    reserving,
                ];
                script("acquire_many", keys, args, Compare::Timed { exact: 2 })
            }
            35..=42 => {
                let all: Vec<Names> = distinct(&mut draw).into_iter().map(names).collect();
                let keys = all.iter().map(|n| &n.key).collect();
                let args = all
                    .iter()
                    .flat_map(|_| {
                        let t = draw.below(TOKENS as u64) as usize;
                        [attempt(&mut draw, t), ttl(&mut draw)]
                    })
                    .collect();
                script("extend", keys, args, Compare::Exact)
            }
            43..=56 => {
                let mut args = vec![attempt(&mut draw, t)];
                if draw.percent(50) {
                    let kept = if draw.percent(30) {
                        ttl(&mut draw)
                    } else {
                        String::new()
                    };
                    let undo = if draw.percent(30) { "undo" } else { "" };
                    args.extend([sharded(&mut draw).into(), kept, undo.into()]);
                }
                script("release", vec![&n.key, &n.channel], args, Compare::Exact)
            }
            57..=60 => {
                let all: Vec<Names> = distinct(&mut draw).into_iter().map(names).collect();
                let mut keys: Vec<&String> = all.iter().map(|n| &n.key).collect();
                keys.extend(all.iter().map(|n| &n.channel));
                let kept = if draw.percent(30) {
                    ttl(&mut draw)
                } else {
                    String::new()
                };
                let undo = if draw.percent(30) { "undo" } else { "" };
                let args = vec![
                    attempt(&mut draw, t),
                    sharded(&mut draw).into(),
                    kept,
                    undo.into(),
                ];
                script("release_many", keys, args, Compare::Exact)
            }
            61..=65 => {
                let next = draw.below(TOKENS as u64) as usize;
                let mut args = vec![value(t), value(next), ttl(&mut draw)];
                if draw.percent(30) {
                    args.push("sharded".into());
                }
                let keys = vec![&n.key, &n.channel, &n.waiters, &n.writers];
                script("hand_over", keys, args, Compare::Exact)
            }
            66..=70 => {
                let keys = vec![
                    &n.key, &n.channel, &n.waiters, &n.writers, &n.queue, &n.places,
                ];
                let args = vec![token(t), sharded(&mut draw).into()];
                script("leave", keys, args, Compare::Exact)
            }
            71..=73 => {
                let args = vec![draw.between(100, 600).to_string()];
                script("watch", vec![&n.key, &n.channel], args, Compare::Exact)
            }
            74..=76 => script(
                "inspect",
                vec![&n.key, &n.fence, &n.waiters],
                vec![],
                Compare::Timed { exact: 1 },
            ),
            77..=78 => {
                let kind = ["x", "read", "permits:2"][draw.below(3) as usize];
                let args = vec![sharded(&mut draw).into(), kind.into(), token(t)];
                script(
                    "force_release",
                    vec![&n.key, &n.channel],
                    args,
                    Compare::Exact,
                )
            }
            79..=82 => script(
                "release_plain",
                vec![&n.key],
                vec![value(t)],
                Compare::Exact,
            ),
            83..=86 => {
                let mut args = strings(&["SET", &n.key, &value(t), "NX", "PX", &ttl(&mut draw)]);
                if draw.percent(50) {
                    args.push("GET".into());
                }
                Step::Command {
                    args,
                    compare: Compare::Exact,
                }
            }
            87..=89 => {
                let read = match draw.below(6) {
                    0 => strings(&["PTTL", &n.key]),
                    1 => strings(&["GETRANGE", &n.key, "0", "39"]),
                    2 => strings(&["HGET", &n.key, "kind"]),
                    3 => strings(&["TYPE", &n.key]),
                    4 => strings(&["HMGET", &n.waiters, "served", "reserved", "nobody"]),
                    _ => strings(&["MGET", &n.key, &n.channel, &n.fence]),
                };
                let compare = match read[0].as_str() {
                    "PTTL" => Compare::Timed { exact: 0 },
                    // The fencing counter, last, counts from the clock.
                    "MGET" => Compare::Timed { exact: 2 },
                    _ => Compare::Exact,
                };
                Step::Command {
                    args: read,
                    compare,
                }
            }
            90 => Step::ScanAll {
                pattern: ["lock:*", "*", "[lw]*:[0-1]"][draw.below(3) as usize].into(),
            },
            91 => Step::Command {
                // Another application's value under a lock's name: not a lock, left alone.
                args: match draw.below(3) {
                    0 => strings(&["SET", &n.key, "not a lock"]),
                    1 => strings(&["RPUSH", &n.key, "item"]),
                    _ => strings(&["HSET", &n.key, "field", "1"]),
                },
                compare: Compare::Exact,
            },
            92..=97 => Step::Advance(Duration::from_millis(draw.between(5, 80))),
            98 if draw.percent(25) => Step::Restart,
            _ => Step::LoadScripts,
        };
        steps.push(step);
    }
    steps
}

fn flag(on: bool) -> String {
    if on { "1" } else { "0" }.into()
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|arg| (*arg).to_owned()).collect()
}

/// One to three distinct keys.
fn distinct(draw: &mut Stream) -> Vec<usize> {
    let mut keys: Vec<usize> = (0..KEYS).collect();
    let count = draw.between(1, KEYS as u64) as usize;
    for i in 0..count {
        let j = i + draw.below((KEYS - i) as u64) as usize;
        keys.swap(i, j);
    }
    keys.truncate(count);
    keys
}

/// A connection to the real server that reads replies as they come, error replies included.
struct Wire {
    writer: TcpStream,
    reader: BufReader<TcpStream>,
    parser: redis::Parser,
}

impl Wire {
    fn open(server: &RedisServer) -> Self {
        let writer = TcpStream::connect(server.addr()).expect("connect to the test server");
        writer.set_nodelay(true).ok();
        writer
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let reader = BufReader::new(writer.try_clone().unwrap());
        Self {
            writer,
            reader,
            parser: redis::Parser::new(),
        }
    }

    fn send(&mut self, args: &[String]) {
        let mut cmd = redis::cmd(&args[0]);
        for arg in &args[1..] {
            cmd.arg(arg);
        }
        self.writer.write_all(&cmd.get_packed_command()).unwrap();
    }

    fn read(&mut self) -> redis::RedisResult<Value> {
        self.parser.parse_value(&mut self.reader)
    }

    fn call(&mut self, args: &[String]) -> Value {
        self.send(args);
        self.read().expect("a reply from the test server")
    }

    /// `args` inside `MULTI`, between two `TIME`s: its reply and the µs it ran between.
    fn timed(&mut self, args: &[String]) -> (Value, u64, u64) {
        for command in [
            &strings(&["MULTI"]),
            &strings(&["TIME"]),
            args,
            &strings(&["TIME"]),
        ] {
            self.send(command);
        }
        self.send(&strings(&["EXEC"]));
        for _ in 0..4 {
            self.read().expect("MULTI's acknowledgements");
        }
        match self.read().expect("EXEC's reply") {
            Value::Array(mut replies) if replies.len() == 3 => {
                let after = micros(&replies[2]);
                let reply = replies.swap_remove(1);
                (reply, micros(&replies[0]), after)
            }
            other => panic!("EXEC answered {other:?}"),
        }
    }

    fn now_micros(&mut self) -> u64 {
        micros(&self.call(&strings(&["TIME"])))
    }
}

fn micros(time: &Value) -> u64 {
    match time {
        Value::Array(parts) => {
            let part = |at: usize| match &parts[at] {
                Value::BulkString(digits) => std::str::from_utf8(digits).unwrap().parse::<u64>(),
                other => panic!("TIME answered {other:?}"),
            };
            part(0).unwrap() * 1_000_000 + part(1).unwrap()
        }
        other => panic!("TIME answered {other:?}"),
    }
}

/// Hears every channel of the history on the real server, plain and sharded.
struct Listener(Wire);

impl Listener {
    fn open(server: &RedisServer, node: &mut Node) -> Self {
        let mut wire = Wire::open(server);
        let channels: Vec<String> = (0..KEYS).map(|k| names(k).channel).collect();
        for (command, sharded) in [("SUBSCRIBE", false), ("SSUBSCRIBE", true)] {
            let mut args = vec![command.to_owned()];
            args.extend(channels.iter().cloned());
            wire.send(&args);
            for channel in &channels {
                wire.read().expect("a subscription's acknowledgement");
                node.subscribe(0, channel.as_bytes(), sharded);
            }
        }
        Self(wire)
    }

    /// The next `count` messages, as the node records them.
    fn take(&mut self, count: usize) -> Vec<Published> {
        (0..count)
            .map(
                |_| match self.0.read().expect("a message the node published") {
                    Value::Array(parts) if parts.len() == 3 => Published {
                        sharded: parts[0] == Value::BulkString(b"smessage".to_vec()),
                        channel: bytes(&parts[1]),
                        message: bytes(&parts[2]),
                    },
                    other => panic!("the subscription heard {other:?}"),
                },
            )
            .collect()
    }

    /// Whether nothing more comes within a moment.
    fn silent(&mut self) -> bool {
        let timeout = |wait| self.0.writer.set_read_timeout(Some(wait)).unwrap();
        timeout(Duration::from_millis(30));
        let heard = self.0.read();
        self.0
            .writer
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        heard.is_err()
    }
}

fn bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::BulkString(bytes) => bytes.clone(),
        other => panic!("not a bulk string: {other:?}"),
    }
}

/// Reads the whole keyspace in one step, as the node's `keys` shows it: what each key holds and
/// when it expires (ms).
const DUMP: &str = r#"
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local out = {time[1], time[2]}
for _, key in ipairs(redis.call('KEYS', '*')) do
  local kind = redis.call('TYPE', key)['ok']
  local value
  if kind == 'string' then value = {redis.call('GET', key)}
  elseif kind == 'hash' then value = redis.call('HGETALL', key)
  elseif kind == 'list' then value = redis.call('LRANGE', key, 0, -1)
  elseif kind == 'zset' then value = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  else value = {} end
  local ttl = redis.call('PTTL', key)
  local expires = ttl >= 0 and tostring(now + ttl) or ''
  out[#out + 1] = {key, kind, expires, value}
end
return out
"#;

/// A keyspace as both sides are compared: key → (type, expiry ms, contents as text).
type Keyspace = BTreeMap<String, (String, Option<i64>, Vec<String>)>;

/// The real server's keyspace, and when it was read (µs).
fn real_keyspace(wire: &mut Wire) -> (Keyspace, u64) {
    let Value::Array(mut entries) = wire.call(&strings(&["EVAL", DUMP, "0"])) else {
        panic!("the dump script failed");
    };
    let read_at = micros(&Value::Array(entries.drain(..2).collect()));
    let keyspace = entries
        .into_iter()
        .map(|entry| {
            let Value::Array(parts) = entry else {
                panic!("{entry:?}")
            };
            let text = |value: &Value| String::from_utf8_lossy(&bytes(value)).into_owned();
            let Value::Array(contents) = &parts[3] else {
                panic!("{parts:?}")
            };
            let kind = text(&parts[1]);
            let mut contents: Vec<String> = contents.iter().map(text).collect();
            if kind == "hash" {
                contents = sorted_pairs(contents);
            }
            if kind == "zset" {
                // Scores as the node keeps them: whole numbers without a fraction.
                for at in (1..contents.len()).step_by(2) {
                    contents[at] = format!("{}", contents[at].parse::<f64>().unwrap());
                }
            }
            let expires = text(&parts[2]).parse().ok();
            (text(&parts[0]), (kind, expires, contents))
        })
        .collect();
    (keyspace, read_at)
}

fn node_keyspace(node: &Node) -> Keyspace {
    as_compared(node.keys())
}

/// A node's keys (its master's, or a replica's) as they are compared.
fn as_compared(keys: Vec<(Vec<u8>, Entry)>) -> Keyspace {
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    keys.into_iter()
        .map(|(key, entry)| {
            let contents = match &entry.value {
                Stored::String(value) => vec![text(value)],
                Stored::Hash(fields) => sorted_pairs(
                    fields
                        .iter()
                        .flat_map(|(field, value)| [text(field), text(value)])
                        .collect(),
                ),
                Stored::List(items) => items.iter().map(|item| text(item)).collect(),
                Stored::SortedSet(members) => members
                    .iter()
                    .flat_map(|(score, member)| [text(member), format!("{score}")])
                    .collect(),
            };
            let expires = entry.expires_at_ms.map(|at| at as i64);
            let kind = entry.value.type_name().to_owned();
            (text(&key), (kind, expires, contents))
        })
        .collect()
}

/// A hash's fields and values, by field: their order is the server's own.
fn sorted_pairs(flat: Vec<String>) -> Vec<String> {
    let mut pairs: Vec<(String, String)> = flat
        .chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect();
    pairs.sort();
    pairs.into_iter().flat_map(|(f, v)| [f, v]).collect()
}

/// Judges the node against the server within a history's slack for clock readings.
struct Judge {
    /// [`SLACK_MS`] plus twice the longest step so far.
    slack_ms: i64,
}

impl Judge {
    /// Takes in how long a step ran on the server, from the `TIME` before it to the one after
    /// (µs); `false` when too long to judge.
    fn step_took(&mut self, from: u64, to: u64) -> bool {
        let took = to.saturating_sub(from).div_ceil(1000) as i64;
        self.slack_ms = self.slack_ms.max(SLACK_MS + 2 * took);
        took <= SLOWEST_STEP_MS
    }

    /// Whether two numbers read from a clock (or counted from one) agree: ms, or µs from 10^14 on.
    fn close(&self, a: i64, b: i64) -> bool {
        let slack = if a.max(b) >= 100_000_000_000_000 {
            self.slack_ms * 1000
        } else {
            self.slack_ms
        };
        a == b || (a >= 0 && b >= 0 && (a - b).abs() <= slack)
    }

    /// Two texts that agree, their numbers (`;`-separated fields) within the slack when `timed`.
    fn texts_agree(&self, a: &str, b: &str, timed: bool) -> bool {
        if !timed {
            return a == b;
        }
        let (a, b): (Vec<&str>, Vec<&str>) = (a.split(';').collect(), b.split(';').collect());
        a.len() == b.len()
            && a.iter().zip(&b).all(|(x, y)| match (x.parse(), y.parse()) {
                (Ok(x), Ok(y)) => self.close(x, y),
                _ => x == y,
            })
    }

    fn replies_agree(&self, real: &Value, simulated: &Value, compare: Compare) -> bool {
        let timed = |depth_exact: bool| !depth_exact && matches!(compare, Compare::Timed { .. });
        match (real, simulated, compare) {
            (Value::Array(a), Value::Array(b), Compare::Timed { exact }) => {
                a.len() == b.len()
                    && a.iter().zip(b).enumerate().all(|(at, (a, b))| {
                        let compare = if at < exact {
                            Compare::Exact
                        } else {
                            Compare::Timed { exact: 0 }
                        };
                        self.replies_agree(a, b, compare)
                    })
            }
            (Value::Int(a), Value::Int(b), _) => a == b || (timed(false) && self.close(*a, *b)),
            (Value::BulkString(a), Value::BulkString(b), _) => self.texts_agree(
                &String::from_utf8_lossy(a),
                &String::from_utf8_lossy(b),
                timed(false),
            ),
            // Errors by their code: messages differ in details (a script's name and line).
            (Value::ServerError(a), Value::ServerError(b), _) => a.code() == b.code(),
            (Value::Array(a), Value::Array(b), Compare::Exact) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .all(|(a, b)| self.replies_agree(a, b, compare))
            }
            _ => real == simulated,
        }
    }

    /// Where two keyspaces differ, if they do.
    fn keyspace_difference(&self, real: &Keyspace, simulated: &Keyspace) -> Option<String> {
        let names: Vec<&String> = real.keys().chain(simulated.keys()).collect();
        for key in names {
            let (Some(a), Some(b)) = (real.get(key), simulated.get(key)) else {
                return Some(format!(
                    "key {key}: real {:?}, simulated {:?}",
                    real.get(key),
                    simulated.get(key)
                ));
            };
            let expiries = match (a.1, b.1) {
                (None, None) => true,
                (Some(x), Some(y)) => (x - y).abs() <= self.slack_ms,
                _ => false,
            };
            // Times are in a fencing counter, a shared lock's and a waiters' hash fields, a queue's
            // places and a sorted set's scores: never in a lock's string or a hash's `kind`.
            let timed_string = key.starts_with("fence:");
            let contents = a.0 == b.0
                && a.2.len() == b.2.len()
                && a.2.iter().zip(&b.2).enumerate().all(|(at, (x, y))| {
                    let timed = match a.0.as_str() {
                        "string" => timed_string,
                        "hash" => at % 2 == 1 && a.2[at - 1] != "kind",
                        "zset" => at % 2 == 1,
                        _ => false,
                    };
                    self.texts_agree(x, y, timed)
                });
            if !(expiries && contents) {
                return Some(format!("key {key}: real {a:?}, simulated {b:?}"));
            }
        }
        None
    }
}

/// The deadlines of `keyspace` (ms): expiries, and the times stored in hashes and sorted sets
/// that scripts compare with the clock (a holder's end, a waiter's, a place's, a claim's).
fn deadlines(keyspace: &Keyspace) -> Vec<i64> {
    let mut found = Vec::new();
    for (kind, expires, contents) in keyspace.values() {
        found.extend(*expires);
        if kind == "hash" || kind == "zset" {
            for text in contents.iter().skip(1).step_by(2) {
                let first = text.split(';').next().unwrap_or_default();
                if let Ok(at) = first.parse::<f64>()
                    && at > 1e12
                    && at < 1e14
                {
                    found.push(at as i64);
                }
            }
        }
    }
    found
}

/// Waits until no deadline of the node's keyspace is near the server's clock: those deadlines,
/// and the server's clock then (µs).
fn off_deadlines(wire: &mut Wire, node: &Node, judge: &Judge) -> (Vec<i64>, u64) {
    let near_ms = judge.slack_ms.unsigned_abs() + 10;
    let near = deadlines(&node_keyspace(node));
    let started = Instant::now();
    loop {
        let now_us = wire.now_micros();
        let now = (now_us / 1000) as i64;
        let Some(next) = near
            .iter()
            .filter(|at| (**at - now).unsigned_abs() <= near_ms)
            .max()
        else {
            return (near, now_us);
        };
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "deadlines keep coming"
        );
        let past = (next - now + near_ms as i64 + 1).max(1) as u64;
        std::thread::sleep(Duration::from_millis(past));
    }
}

/// Whether a deadline fell within the slack of `from..=to` (µs): too near to judge.
fn near_any(deadlines: &[i64], from: u64, to: u64, judge: &Judge) -> bool {
    let (from, to) = ((from / 1000) as i64, (to / 1000) as i64);
    deadlines
        .iter()
        .any(|at| *at >= from - judge.slack_ms && *at <= to + judge.slack_ms)
}

/// How a history ended.
enum Ended {
    Whole,
    /// A step ran too near a deadline to judge: the history ends there.
    CutShort,
}

/// Runs history `seed` on the real server and a new node, comparing at every step.
fn run(server: &mut RedisServer, seed: u64) -> Ended {
    let steps = history(seed);
    let mut node = Node::new(seed);
    let mut wire = Wire::open(server);
    assert_eq!(wire.call(&strings(&["FLUSHALL"])), Value::Okay);
    let mut listener = Listener::open(server, &mut node);
    let mut judge = Judge { slack_ms: SLACK_MS };
    let scripts: BTreeMap<&str, &str> = store_scripts().into_iter().collect();
    let sha = |name: &str| redis::Script::new(scripts[name]).get_hash().to_owned();
    let fail = |at: usize, what: String| -> ! {
        panic!(
            "history of seed {seed} (LOCKMACRO_SIM_REDIS_SEED={seed}), step {at} {:?}: {what}\n\
             steps: {:#?}",
            steps[at],
            &steps[..=at]
        )
    };
    for (at, step) in steps.iter().enumerate() {
        let args: Vec<String> = match step {
            Step::Script {
                name, keys, args, ..
            } => {
                let mut all = vec!["EVALSHA".into(), sha(name), keys.len().to_string()];
                all.extend(keys.iter().cloned());
                all.extend(args.iter().cloned());
                all
            }
            Step::Command { args, .. } => args.clone(),
            Step::ScanAll { pattern } => {
                let real = scan_all(|cursor| {
                    wire.call(&strings(&["SCAN", cursor, "MATCH", pattern, "COUNT", "3"]))
                });
                node.set_clock(wire.now_micros());
                let simulated = scan_all(|cursor| {
                    node.command(&["SCAN", cursor, "MATCH", pattern, "COUNT", "3"])
                });
                if real != simulated {
                    fail(at, format!("real {real:?}, simulated {simulated:?}"));
                }
                continue;
            }
            Step::Advance(by) => {
                std::thread::sleep(*by);
                continue;
            }
            Step::Restart => {
                server.restart();
                node.restart();
                wire = Wire::open(server);
                listener = Listener::open(server, &mut node);
                continue;
            }
            Step::LoadScripts => {
                for source in scripts.values() {
                    let load = strings(&["SCRIPT", "LOAD", source]);
                    let (real, simulated) = (wire.call(&load), node.command(&load));
                    if real != simulated {
                        fail(at, format!("real {real:?}, simulated {simulated:?}"));
                    }
                }
                continue;
            }
        };
        let compare = match step {
            Step::Script { compare, .. } | Step::Command { compare, .. } => *compare,
            _ => unreachable!("the others went on above"),
        };
        let (near, before) = off_deadlines(&mut wire, &node, &judge);
        let (real, from, to) = wire.timed(&args);
        if !judge.step_took(before, to) || near_any(&near, before, to, &judge) {
            return Ended::CutShort;
        }
        node.set_clock(from);
        let simulated = node.command(&args);
        if !judge.replies_agree(&real, &simulated, compare) {
            fail(
                at,
                format!("replies differ: real {real:?}, simulated {simulated:?}"),
            );
        }
        let published = node.take_published();
        let heard = listener.take(published.len());
        if heard != published {
            fail(
                at,
                format!("published: real {heard:?}, simulated {published:?}"),
            );
        }
        // The keyspace read off deadlines too, the node's clock at the read.
        let (near, _) = off_deadlines(&mut wire, &node, &judge);
        let (real, read_at) = real_keyspace(&mut wire);
        if near_any(&near, read_at, read_at, &judge) {
            return Ended::CutShort;
        }
        node.set_clock(read_at);
        if let Some(difference) = judge.keyspace_difference(&real, &node_keyspace(&node)) {
            fail(at, difference);
        }
    }
    assert!(
        listener.silent(),
        "seed {seed}: the real server published more than the node"
    );
    Ended::Whole
}

/// The keys a scan to its end returns, sorted and without repeats.
fn scan_all(mut page: impl FnMut(&str) -> Value) -> Vec<Vec<u8>> {
    let mut cursor = "0".to_owned();
    let mut found = Vec::new();
    loop {
        let Value::Array(reply) = page(&cursor) else {
            panic!("SCAN failed")
        };
        let Value::Array(keys) = &reply[1] else {
            panic!("{reply:?}")
        };
        found.extend(keys.iter().map(bytes));
        cursor = String::from_utf8(bytes(&reply[0])).unwrap();
        if cursor == "0" {
            break;
        }
    }
    found.sort();
    found.dedup();
    found
}

fn env_number(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|value| {
        value
            .parse()
            .unwrap_or_else(|_| panic!("{name} is not a number"))
    })
}

/// One test at a time: the histories judge the node's clock readings against the server's,
/// which a replica's sync (a fork) beside them would delay.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn alone() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[test]
fn the_simulated_redis_answers_as_a_real_one() {
    let _alone = alone();
    let mut server = RedisServer::start();
    let seeds: Vec<u64> = match env_number("LOCKMACRO_SIM_REDIS_SEED") {
        Some(seed) => vec![seed],
        None => (1..=env_number("LOCKMACRO_SIM_REDIS_HISTORIES").unwrap_or(HISTORIES)).collect(),
    };
    let version = match server.command(&["INFO", "server"]) {
        Value::BulkString(info) => String::from_utf8_lossy(&info)
            .lines()
            .find(|line| line.starts_with("redis_version:") || line.starts_with("valkey_version:"))
            .map(str::to_owned)
            .unwrap_or_default(),
        _ => String::new(),
    };
    let started = Instant::now();
    // A history cut short by a slow step (a loaded machine) runs again, up to three times in all:
    // the guard is judged on the histories that never ran whole.
    let (mut cut_short, mut runs) = (0, 0);
    for seed in &seeds {
        let whole = (0..3).any(|_| {
            runs += 1;
            matches!(run(&mut server, *seed), Ended::Whole)
        });
        cut_short += usize::from(!whole);
    }
    eprintln!(
        "{} histories of {STEPS} steps compared against {version} in {:?} ({runs} runs), \
         {cut_short} cut short near a deadline or by a slow step three times",
        seeds.len(),
        started.elapsed()
    );
    assert!(
        cut_short * 4 <= seeds.len(),
        "{cut_short} of {} histories ran into a deadline: the guard does not keep steps off them",
        seeds.len()
    );
}

/// The lines of an `INFO` reply, `name:value`, as pairs.
fn info_lines(reply: &Value) -> Vec<(String, String)> {
    let Value::BulkString(text) = reply else {
        panic!("INFO answered {reply:?}")
    };
    String::from_utf8_lossy(text)
        .lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect()
}

/// Whether every line the node prints, by name, is one the server prints, in the same order;
/// the values the store reads (role, replicas and their state, whether the backlog is active)
/// the same, and ids of 40 hex digits. A replica's line (`slaveN`) is compared by its fields.
fn infos_agree(real: &Value, simulated: &Value) -> Result<(), String> {
    let (real, simulated) = (info_lines(real), info_lines(simulated));
    let mut names = real.iter().map(|(name, _)| name);
    for (name, value) in &simulated {
        if !names.any(|real_name| real_name == name) {
            return Err(format!("`{name}` missing or out of order: real {real:?}"));
        }
        let real_value = &real.iter().find(|(n, _)| n == name).unwrap().1;
        let agree = match name.as_str() {
            "role" | "connected_slaves" | "repl_backlog_active" | "redis_mode" => {
                real_value == value
            }
            "run_id" | "master_replid" | "master_replid2" => {
                value.len() == 40 && value.chars().all(|c| c.is_ascii_hexdigit())
            }
            replica if replica.starts_with("slave") => {
                let fields = |line: &str| -> Vec<(String, String)> {
                    line.split(',')
                        .filter_map(|field| field.split_once('='))
                        .map(|(n, v)| (n.to_owned(), v.to_owned()))
                        .collect()
                };
                let (a, b) = (fields(real_value), fields(value));
                let names = |fields: &[(String, String)]| -> Vec<String> {
                    fields.iter().map(|(n, _)| n.clone()).collect()
                };
                let state = |fields: &[(String, String)]| fields[2].1.clone();
                names(&a) == names(&b) && state(&a) == state(&b)
            }
            _ => true,
        };
        if !agree {
            return Err(format!("`{name}`: real {real_value}, simulated {value}"));
        }
    }
    Ok(())
}

/// Polls `server` (for up to 10 s) until its `INFO replication` has `line`.
fn until_info_has(server: &RedisServer, line: &str) {
    let started = Instant::now();
    while !info_lines(&server.command(&["INFO", "replication"]))
        .iter()
        .any(|(name, value)| format!("{name}:{value}").contains(line))
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no `{line}` in INFO replication"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `args` on `wire` and on `node`'s `on`, the node's clock at the server's (read on a
/// connection of its own: Redis 7.0's `WAIT` counts from a connection's last command, a `TIME`
/// too), the replies compared; `timed_out`: a `WAIT` the node hands back is answered as at its
/// timeout.
fn both(
    (node, clock): (&mut Node, &mut Wire),
    wire: &mut Wire,
    on: u64,
    args: &[&str],
    timed_out: bool,
) -> Value {
    let args = strings(args);
    node.set_clock(clock.now_micros());
    let real = wire.call(&args);
    let simulated = match node.send_command(on, &args) {
        Answer::Reply(reply) => reply,
        Answer::Waiting(wait) if timed_out => match node.wait_timed_out(&wait) {
            Answer::Reply(reply) => reply,
            other => panic!("{args:?} timed out as {other:?}"),
        },
        other => panic!("{args:?} answered {other:?}"),
    };
    assert_eq!(real, simulated, "{args:?}");
    real
}

#[test]
fn wait_and_info_replication_answer_as_a_real_masters() {
    let _alone = alone();
    let started = Instant::now();
    // A replica's first sync at once, not after Redis 7's 5 s for others to join it.
    let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    until_info_has(&master, "state=online");
    let synced = started.elapsed();
    let mut node = Node::new(7);
    let simulated_replica = node.add_replica(Duration::ZERO);
    let (mut writer, mut reader) = (Wire::open(&master), Wire::open(&master));
    let mut clock = Wire::open(&master);
    let (node_writer, node_reader) = (1, 2);
    let judge = Judge { slack_ms: SLACK_MS };
    // No write on the connection yet: every replica has what it wrote.
    both(
        (&mut node, &mut clock),
        &mut reader,
        node_reader,
        &["WAIT", "1", "0"],
        false,
    );
    let write = "redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', 60000) \
                 redis.call('PEXPIRE', KEYS[1], 50000) \
                 redis.call('HSET', KEYS[2], 'holder', ARGV[1]) \
                 redis.call('PEXPIRE', KEYS[2], 40000) return 1";
    let sha = both(
        (&mut node, &mut clock),
        &mut writer,
        node_writer,
        &["SCRIPT", "LOAD", write],
        false,
    );
    let sha = String::from_utf8(bytes(&sha)).unwrap();
    both(
        (&mut node, &mut clock),
        &mut writer,
        node_writer,
        &["EVALSHA", &sha, "2", "lock", "waiters", "me"],
        false,
    );
    // Caught up: the one replica acknowledged the write; two never come, and the timeout says 1.
    // (A real `WAIT` that blocked has the master ask its replicas for an acknowledgement, in the
    // stream: Redis 7.0 then has a `WAIT` of a connection that sent a command since wait for
    // its answer, a round trip away, so such a `WAIT` asks for a replica that answers.)
    both(
        (&mut node, &mut clock),
        &mut writer,
        node_writer,
        &["WAIT", "1", "5000"],
        false,
    );
    both(
        (&mut node, &mut clock),
        &mut writer,
        node_writer,
        &["WAIT", "2", "100"],
        true,
    );
    both(
        (&mut node, &mut clock),
        &mut reader,
        node_reader,
        &["WAIT", "1", "5000"],
        false,
    );
    // The replica has the script's writes, their expiries as the master set them, not the
    // script: a promoted replica answers `NOSCRIPT`.
    let (real_copy, _) = real_keyspace(&mut Wire::open(&replica));
    let (real_original, _) = real_keyspace(&mut writer);
    let copied = as_compared(node.replica_keys(simulated_replica));
    for (real, simulated) in [(&real_original, &real_copy), (&real_copy, &copied)] {
        if let Some(difference) = judge.keyspace_difference(real, simulated) {
            panic!("the replica's copy: {difference}");
        }
    }
    assert_eq!(
        replica.command(&["SCRIPT", "EXISTS", &sha]),
        Value::Array(vec![Value::Int(0)]),
        "Redis propagates no script to a replica"
    );
    let info = |wire: &mut Wire, node: &mut Node, section: &str| {
        let args = strings(&["INFO", section]);
        let (real, simulated) = (wire.call(&args), node.command(&args));
        if let Err(difference) = infos_agree(&real, &simulated) {
            panic!("INFO {section}: {difference}");
        }
    };
    info(&mut reader, &mut node, "replication");
    info(&mut reader, &mut node, "server");

    // The replica cut off: the master lists it no more and a write waits for it in vain.
    {
        let _cut = replica.cut_off_from(&master);
        node.cut_off(simulated_replica);
        until_info_has(&master, "connected_slaves:0");
        both(
            (&mut node, &mut clock),
            &mut writer,
            node_writer,
            &["EVALSHA", &sha, "2", "lock:2", "w:2", "me"],
            false,
        );
        both(
            (&mut node, &mut clock),
            &mut writer,
            node_writer,
            &["WAIT", "1", "100"],
            true,
        );
        info(&mut reader, &mut node, "replication");
    }
    // Back, it resyncs and acknowledges the write it missed.
    let back = Instant::now();
    node.reconnect(simulated_replica);
    both(
        (&mut node, &mut clock),
        &mut writer,
        node_writer,
        &["WAIT", "1", "10000"],
        false,
    );
    until_info_has(&master, "state=online");
    info(&mut reader, &mut node, "replication");
    eprintln!(
        "replication compared in {:?}: the replica synced in {synced:?}, back from its cut in {:?}",
        started.elapsed(),
        back.elapsed()
    );
}
