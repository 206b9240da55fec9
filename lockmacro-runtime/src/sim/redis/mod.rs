//! A simulated Redis node, the ground tier two of the simulator stands on: the commands the Lua
//! scripts and the Redis store send, answered as Redis 7 answers them, in process and on one
//! thread, on a clock the simulation sets. The real scripts run in an embedded Lua 5.1, whole,
//! as Redis runs them.
//!
//! It is kept honest by the differential test (`tests/sim_redis.rs`), which runs the same
//! histories here and on a real `redis-server` and compares every reply and the keyspace.
//!
//! Every command comes on a connection (an id): subscriptions belong to one, and `WAIT` will
//! count per connection once the node has replicas. Connections, their latencies and faults,
//! and the delivery of what is published to subscribers are the simulated transport's
//! ([`SimRedis`]), which puts the real `RedisStore` over a node.
//!
//! Left out, with what covers them meanwhile: replicas (`WAIT` answers as a master without
//! replicas) and failovers (the real-server tests `tests/replicas.rs`, `tests/failover.rs`),
//! Cluster slots and `MOVED` (`tests/cluster.rs`), options of commands the code never sends
//! (`PEXPIRE NX`, `ZADD CH`, ...: an error naming them), active expiry (keys go when looked at,
//! which is all a client can tell), memory limits and eviction.

use std::time::Duration;

use ::redis::Value as Reply;

use self::keyspace::Keyspace;
pub use self::keyspace::{Entry, Published, Stored};
use self::reply::Args;
use self::scripting::Scripting;
pub use self::transport::{RedisLink, SimRedis};
use super::Stream;

mod keyspace;
mod reply;
mod scripting;
pub(crate) mod transport;

/// One simulated Redis server.
pub struct Node {
    keyspace: Keyspace,
    scripting: Scripting,
    /// Where run ids come from: a restart draws a new one, as a real restart does.
    ids: Stream,
    run_id: String,
    replication_id: String,
}

impl Node {
    /// A node with no keys and no scripts, its ids drawn from `seed`, its clock at 0 until set.
    pub fn new(seed: u64) -> Self {
        let mut ids = Stream::of(seed, &[u64::from_be_bytes(*b"simredis")]);
        let (run_id, replication_id) = (hex_id(&mut ids), hex_id(&mut ids));
        Self {
            keyspace: Keyspace::default(),
            scripting: Scripting::new(),
            ids,
            run_id,
            replication_id,
        }
    }

    /// Runs one command (its name first), as a client of the node would send it (on
    /// connection 0).
    pub fn command<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        let args = Args::new(args.iter().map(|arg| arg.as_ref().to_vec()).collect());
        self.execute(0, &args)
    }

    /// Runs a command built with redis-rs, as the store builds them (on connection 0).
    pub fn cmd(&mut self, cmd: &::redis::Cmd) -> Reply {
        self.cmd_on(0, cmd)
    }

    /// Runs a command built with redis-rs that came on `connection`.
    pub fn cmd_on(&mut self, connection: u64, cmd: &::redis::Cmd) -> Reply {
        let args = cmd
            .args_iter()
            .map(|arg| match arg {
                ::redis::Arg::Simple(bytes) => bytes.to_vec(),
                // A cursor argument (the only other kind): a scan from its start.
                _ => b"0".to_vec(),
            })
            .collect();
        self.execute(connection, &Args::new(args))
    }

    fn execute(&mut self, connection: u64, args: &Args) -> Reply {
        match args.name().as_str() {
            "EVAL" => self.eval(args, false),
            "EVALSHA" => self.eval(args, true),
            "SCRIPT" => self.script(args),
            "INFO" => self.info(args),
            "WAIT" => self.wait(connection, args),
            "SUBSCRIBE" | "SSUBSCRIBE" | "UNSUBSCRIBE" | "SUNSUBSCRIBE" => {
                self.subscription(connection, args)
            }
            _ => self.keyspace.execute(args),
        }
    }

    /// `SUBSCRIBE channel...` and its kin, on `connection`: the confirmation of the last channel
    /// (Redis sends one per channel), with how many channels of that kind it listens to.
    fn subscription(&mut self, connection: u64, args: &Args) -> Reply {
        if let Err(message) = args.at_least(2) {
            return reply::error(&message);
        }
        let name = args.name();
        let sharded = matches!(name.as_str(), "SSUBSCRIBE" | "SUNSUBSCRIBE");
        let subscribing = !name.contains("UNSUB");
        for channel in args.from(1) {
            match subscribing {
                true => self.subscribe(connection, channel, sharded),
                false => self.unsubscribe(connection, channel, sharded),
            }
        }
        let listening = self
            .keyspace
            .subscribers
            .iter()
            .filter(|((kind, _), ids)| *kind == sharded && ids.contains(&connection))
            .count();
        Reply::Array(vec![
            Reply::BulkString(name.to_lowercase().into_bytes()),
            Reply::BulkString(args.bytes(args.len() - 1).to_vec()),
            Reply::Int(listening as i64),
        ])
    }

    /// `WAIT numreplicas timeout`: how many replicas have every write `connection` sent. None
    /// here (no replicas yet); a caller that asked for more is answered once its timeout ran
    /// out, which is the transport's to time.
    fn wait(&mut self, connection: u64, args: &Args) -> Reply {
        let _ = connection;
        if let Err(message) = args.exactly(3) {
            return reply::error(&message);
        }
        match (args.integer(1), args.integer(2)) {
            (Some(wanted), Some(timeout)) if wanted >= 0 && timeout >= 0 => Reply::Int(0),
            _ => reply::error("ERR value is not an integer or out of range"),
        }
    }

    /// `EVAL script numkeys key... arg...` (the script kept, as Redis 7 keeps it) and `EVALSHA`.
    fn eval(&mut self, args: &Args, by_sha: bool) -> Reply {
        if args.len() < 3 {
            return reply::error(&reply::arity(&args.name()));
        }
        let Some(count) = args.integer(2) else {
            return reply::error("ERR value is not an integer or out of range");
        };
        let given = args.from(3);
        let Ok(count) = usize::try_from(count) else {
            return reply::error("ERR Number of keys can't be negative");
        };
        if count > given.len() {
            return reply::error("ERR Number of keys can't be greater than number of args");
        }
        let sha = if by_sha {
            String::from_utf8_lossy(args.bytes(1)).into_owned()
        } else {
            match self.scripting.load(args.bytes(1)) {
                Ok(sha) => sha,
                Err(error) => return error,
            }
        };
        let (keys, argv) = given.split_at(count);
        self.scripting.run(&sha, keys, argv, &mut self.keyspace)
    }

    /// `SCRIPT LOAD`, `SCRIPT EXISTS` and `SCRIPT FLUSH`.
    fn script(&mut self, args: &Args) -> Reply {
        match (args.upper(1).as_str(), args.len()) {
            ("LOAD", 3) => match self.scripting.load(args.bytes(2)) {
                Ok(sha) => Reply::BulkString(sha.into_bytes()),
                Err(error) => error,
            },
            ("EXISTS", 3..) => Reply::Array(
                args.from(2)
                    .iter()
                    .map(|sha| {
                        let known = self.scripting.exists(&String::from_utf8_lossy(sha));
                        Reply::Int(known.into())
                    })
                    .collect(),
            ),
            ("FLUSH", 2..=3) => {
                self.scripting.flush();
                Reply::Okay
            }
            _ => reply::error(&reply::not_simulated(&format!("SCRIPT {}", args.upper(1)))),
        }
    }

    /// `INFO` with the sections the store reads: `server` (its `run_id` tells a restart),
    /// `replication` (a master without replicas, for now) and `cluster` (not a cluster node).
    fn info(&self, args: &Args) -> Reply {
        let server = format!(
            "# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\nrun_id:{}\r\n",
            self.run_id
        );
        let replication = format!(
            "# Replication\r\nrole:master\r\nconnected_slaves:0\r\nmaster_replid:{}\r\n\
             master_repl_offset:0\r\n",
            self.replication_id
        );
        let cluster = "# Cluster\r\ncluster_enabled:0\r\n".to_owned();
        let sections: Vec<String> = match args.len() {
            1 => vec!["DEFAULT".into()],
            _ => (1..args.len()).map(|at| args.upper(at)).collect(),
        };
        let wanted = |name: &str| {
            sections.iter().any(|section| {
                section == name || ["DEFAULT", "ALL", "EVERYTHING"].contains(&section.as_str())
            })
        };
        let text: Vec<String> = [
            ("SERVER", server),
            ("REPLICATION", replication),
            ("CLUSTER", cluster),
        ]
        .into_iter()
        .filter(|(name, _)| wanted(name))
        .map(|(_, text)| text)
        .collect();
        Reply::BulkString(text.join("\r\n").into_bytes())
    }

    /// The node's clock, µs since the Unix epoch.
    pub fn now_micros(&self) -> u64 {
        self.keyspace.now_us
    }

    /// Sets the node's clock (µs since the Unix epoch): `TIME`, and the expiries it judges by.
    pub fn set_clock(&mut self, micros: u64) {
        self.keyspace.now_us = micros;
    }

    /// Moves the node's clock on by `by`.
    pub fn advance(&mut self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.keyspace.now_us = self.keyspace.now_us.saturating_add(by);
    }

    /// The node's `run_id`, as `INFO server` gives it.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// A restart without persistence: no keys, no scripts (an `EVALSHA` answers `NOSCRIPT`), no
    /// subscribers, and a new run id and replication id. The clock runs on.
    pub fn restart(&mut self) {
        self.keyspace.clear();
        self.scripting.flush();
        self.run_id = hex_id(&mut self.ids);
        self.replication_id = hex_id(&mut self.ids);
    }

    /// Subscribes `connection` to `channel` (`SSUBSCRIBE` when `sharded`): it hears what is
    /// published there, and a `PUBLISH` counts it.
    pub fn subscribe(&mut self, connection: u64, channel: &[u8], sharded: bool) {
        let subscribers = &mut self.keyspace.subscribers;
        let listening = subscribers.entry((sharded, channel.to_vec())).or_default();
        listening.insert(connection);
    }

    /// Ends `connection`'s subscription to `channel`.
    pub fn unsubscribe(&mut self, connection: u64, channel: &[u8], sharded: bool) {
        let subscribers = &mut self.keyspace.subscribers;
        let key = (sharded, channel.to_vec());
        if let Some(listening) = subscribers.get_mut(&key) {
            listening.remove(&connection);
            if listening.is_empty() {
                subscribers.remove(&key);
            }
        }
    }

    /// `connection` closed: its subscriptions end.
    pub fn disconnect(&mut self, connection: u64) {
        let subscribers = &mut self.keyspace.subscribers;
        subscribers.retain(|_, listening| {
            listening.remove(&connection);
            !listening.is_empty()
        });
    }

    /// The connections that hear `published`, in id order.
    pub fn listeners(&self, published: &Published) -> Vec<u64> {
        let key = (published.sharded, published.channel.clone());
        let listening = self.keyspace.subscribers.get(&key);
        listening.map_or_else(Vec::new, |ids| ids.iter().copied().collect())
    }

    /// What was published since the last call, in order.
    pub fn take_published(&mut self) -> Vec<Published> {
        std::mem::take(&mut self.keyspace.published)
    }

    /// Every live key and what it holds, in key order.
    pub fn keys(&self) -> Vec<(Vec<u8>, Entry)> {
        self.keyspace
            .live()
            .map(|(key, entry)| (key.clone(), entry.clone()))
            .collect()
    }
}

/// The scripts the Redis store sends, by name, as it sends them (helpers in front): what a
/// differential test runs on a node and on a real server.
pub fn store_scripts() -> [(&'static str, &'static str); 11] {
    use crate::store::scripts::*;
    [
        ("acquire", ACQUIRE_LUA),
        ("release", RELEASE_LUA),
        ("extend", EXTEND_LUA),
        ("hand_over", HAND_OVER_LUA),
        ("inspect", INSPECT_LUA),
        ("force_release", FORCE_RELEASE_LUA),
        ("acquire_many", ACQUIRE_MANY_LUA),
        ("release_many", RELEASE_MANY_LUA),
        ("leave", LEAVE_LUA),
        ("release_plain", RELEASE_PLAIN_LUA),
        ("watch", WATCH_LUA),
    ]
}

/// 40 hex digits, as Redis's run and replication ids.
fn hex_id(ids: &mut Stream) -> String {
    let (a, b, c) = (ids.number(), ids.number(), ids.number());
    format!("{a:016x}{b:016x}{:08x}", c >> 32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts;

    fn text(reply: &Reply) -> String {
        match reply {
            Reply::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            other => format!("{other:?}"),
        }
    }

    fn code(reply: &Reply) -> &str {
        match reply {
            Reply::ServerError(error) => error.code(),
            other => panic!("not an error: {other:?}"),
        }
    }

    #[test]
    fn a_key_lives_until_the_clock_is_past_its_expiry() {
        let mut node = Node::new(1);
        node.set_clock(1_000_000_000);
        assert_eq!(
            node.command(&["SET", "k", "v", "NX", "PX", "100"]),
            Reply::Okay
        );
        assert_eq!(
            node.command(&["SET", "k", "w", "NX", "PX", "100"]),
            Reply::Nil
        );
        node.advance(Duration::from_millis(100));
        assert_eq!(node.command(&["PTTL", "k"]), Reply::Int(0));
        assert_eq!(text(&node.command(&["GET", "k"])), "v");
        node.advance(Duration::from_millis(1));
        assert_eq!(node.command(&["GET", "k"]), Reply::Nil);
        assert_eq!(node.command(&["PTTL", "k"]), Reply::Int(-2));
    }

    #[test]
    fn lua_values_become_replies_as_redis_converts_them() {
        let mut node = Node::new(1);
        let eval = |node: &mut Node, script: &str| node.command(&["EVAL", script, "0"]);
        assert_eq!(eval(&mut node, "return 3.99"), Reply::Int(3));
        assert_eq!(
            eval(&mut node, "return {1, 'a', false, true, nil, 2}"),
            Reply::Array(vec![
                Reply::Int(1),
                Reply::BulkString(b"a".to_vec()),
                Reply::Nil,
                Reply::Int(1),
            ])
        );
        assert_eq!(
            eval(&mut node, "return redis.status_reply('OK')"),
            Reply::Okay
        );
        assert_eq!(
            code(&eval(&mut node, "return redis.error_reply('MINE x')")),
            "MINE"
        );
        node.command(&["HSET", "h", "f", "1"]);
        assert_eq!(
            code(&eval(&mut node, "return redis.call('GET', 'h')")),
            "WRONGTYPE"
        );
        assert_eq!(
            text(&eval(&mut node, "return redis.pcall('GET', 'h')['err']")),
            "WRONGTYPE Operation against a key holding the wrong kind of value"
        );
        assert_eq!(
            eval(&mut node, "return redis.call('GET', 'none')"),
            Reply::Nil
        );
        assert_eq!(
            text(&eval(&mut node, "return redis.call('TYPE', 'h')['ok']")),
            "hash"
        );
        assert_eq!(code(&eval(&mut node, "x = 1")), "ERR");
        let unknown = eval(&mut node, "return redis.call('SADD', 's', 'm')");
        assert!(format!("{unknown:?}").contains("SADD"), "{unknown:?}");
    }

    #[test]
    fn every_script_of_the_store_compiles_and_a_restart_forgets_them() {
        let mut node = Node::new(1);
        for (_, source) in store_scripts() {
            assert!(matches!(
                node.command(&["SCRIPT", "LOAD", source]),
                Reply::BulkString(_)
            ));
        }
        let sha = scripts::RELEASE_PLAIN.get_hash().to_owned();
        let release = |node: &mut Node| node.command(&["EVALSHA", &sha, "1", "k", "token"]);
        assert_eq!(release(&mut node), Reply::Int(0));
        let run_id = node.run_id().to_owned();
        node.restart();
        assert_ne!(node.run_id(), run_id);
        assert_eq!(code(&release(&mut node)), "NOSCRIPT");
    }

    #[test]
    fn an_unknown_command_is_an_error_naming_it() {
        let mut node = Node::new(1);
        let reply = node.command(&["WATCH", "k"]);
        assert_eq!(code(&reply), "ERR");
        assert!(format!("{reply:?}").contains("WATCH"), "{reply:?}");
    }
}
