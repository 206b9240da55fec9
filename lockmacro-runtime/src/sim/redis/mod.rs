//! A simulated Redis node, the ground tier two of the simulator stands on: the commands the Lua
//! scripts and the Redis store send, answered as Redis 7 answers them, in process and on one
//! thread, on a clock the simulation sets. The real scripts run in an embedded Lua 5.1, whole,
//! as Redis runs them.
//!
//! A node is one shard: a master and its replicas ([`Node::add_replica`]), each a keyspace of
//! its own. The master sends its replicas the effects of its writes as Redis 7 does (a script's
//! writes, expiries made absolute); each replica has them a lag after they were made, the lag
//! the caller's to draw, and can be cut off. Clients talk to the master on connections (ids
//! their client gives, [`Node::send`]), each remembering its last write for `WAIT`; the node
//! cannot block, so a `WAIT` that must wait is handed back ([`Answer::Waiting`]) for the caller
//! to wait out in simulated time. A failover promotes any replica, a lagging one too ([`Node::fail_over`]).
//!
//! It is kept honest by the differential test (`tests/sim_redis.rs`), which runs the same
//! histories here and on a real `redis-server` and compares every reply and the keyspace, and
//! compares `WAIT` and `INFO replication` with a real master's that has a real replica.
//!
//! Every command comes on a connection (an id): subscriptions belong to one, and `WAIT` counts
//! per connection. Connections, their latencies and faults, and the delivery of what is
//! published to subscribers are the simulated transport's ([`SimRedis`]), which puts the real
//! `RedisStore` over a node.
//!
//! Left out, with what covers them meanwhile: how a failover is decided and announced (the
//! caller picks the replica; Sentinel's switch message; `tests/failover.rs`), an old master
//! demoted to a replica (it is gone: its connections closed), commands sent to a replica
//! (`READONLY`), a replica slow to acknowledge what it applied or silent without being cut off
//! (`lag` is always 0: `tests/replicas.rs` freezes a real one), the stream's `SELECT` and
//! periodic `PING` (offsets grow as a real master's, not to the same numbers), Cluster slots and
//! `MOVED` (`tests/cluster.rs`), `MULTI`, options of commands the code never sends (`PEXPIRE
//! NX`, `ZADD CH`, ...: an error naming them), active expiry (keys go when looked at, which is
//! all a client can tell), memory limits and eviction.

use std::collections::BTreeMap;
use std::time::Duration;

use ::redis::Value as Reply;

use self::keyspace::Keyspace;
pub use self::keyspace::{Entry, Published, Stored};
use self::replication::{Log, Replica};
use self::reply::Args;
use self::scripting::Scripting;
pub use self::transport::{RedisLink, SimRedis};
use super::Stream;

mod keyspace;
mod replication;
mod reply;
mod scripting;
pub(crate) mod transport;

/// One simulated Redis deployment of one shard: a master, the one that answers, and its
/// replicas, each a keyspace of its own in the same world, on the same clock.
pub struct Node {
    master: Master,
    replicas: BTreeMap<ReplicaId, Replica>,
    next_replica: u64,
    /// Open connections, by the id their client gave them: the master they reached (its
    /// incarnation) and their last write.
    connections: BTreeMap<u64, Connected>,
    /// Where run and replication ids come from: a restart or a failover draws new ones.
    ids: Stream,
}

/// The server answering as master.
struct Master {
    keyspace: Keyspace,
    scripting: Scripting,
    run_id: String,
    log: Log,
    /// Counts the masters this node had (failovers, restarts): a connection to an earlier one is
    /// closed.
    incarnation: u64,
}

/// What the node keeps of a connection: as Redis's `client.woff`, the replication offset right
/// after its last command that wrote, which its `WAIT` waits for, as newer Redis keeps it (only
/// a command that propagated moves it). Redis 7.0 (7.0.15 measured) moves it after every
/// command, a read too, so that a `WAIT` there also waits for what others wrote before.
struct Connected {
    incarnation: u64,
    last_write: u64,
}

/// The connection of [`Node::command`] and [`Node::cmd`].
const OWN: u64 = 0;

/// A replica of the node ([`Node::add_replica`]); it keeps its id when another is promoted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReplicaId(u64);

/// What a command sent on a connection gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// Its reply.
    Reply(Reply),
    /// A `WAIT` not satisfied yet: the node cannot block, so the caller waits in simulated time,
    /// asking [`Node::waited`] as the world moves on, and at the timeout (its own to keep) takes
    /// [`Node::wait_timed_out`] as the reply.
    Waiting(Wait),
    /// The connection is closed: its master failed over or restarted (a dead master's
    /// connections break, and Sentinel kills the clients of one it demotes). No reply comes;
    /// the client connects again.
    Closed,
}

/// A `WAIT numreplicas timeout` under way on a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// Where it was sent.
    pub connection: u64,
    /// The offset a replica must have acknowledged: the connection's last write.
    pub offset: u64,
    /// How many replicas must.
    pub replicas: u64,
    /// When to answer anyway; `None` waits for ever (`WAIT n 0`).
    pub timeout: Option<Duration>,
}

impl Node {
    /// A node with no keys, no scripts and no replica, its ids drawn from `seed`, its clock at
    /// 0 until set.
    pub fn new(seed: u64) -> Self {
        let mut ids = Stream::of(seed, &[u64::from_be_bytes(*b"simredis")]);
        let (run_id, replication_id) = (hex_id(&mut ids), hex_id(&mut ids));
        Self {
            master: Master {
                keyspace: Keyspace::default(),
                scripting: Scripting::new(),
                run_id,
                log: Log::new(replication_id, 0),
                incarnation: 0,
            },
            replicas: BTreeMap::new(),
            next_replica: 0,
            connections: BTreeMap::new(),
            ids,
        }
    }

    /// Runs one command (its name first), as a client of the node would send it, on
    /// connection 0 (opened again after a failover or a restart). A `WAIT` answers at once:
    /// what the replicas acknowledged by now.
    pub fn command<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        let args = Args::new(args.iter().map(|arg| arg.as_ref().to_vec()).collect());
        self.on_own(&args)
    }

    /// Runs a command built with redis-rs, as the store builds them, as [`Node::command`].
    pub fn cmd(&mut self, cmd: &::redis::Cmd) -> Reply {
        self.on_own(&cmd_args(cmd))
    }

    fn on_own(&mut self, args: &Args) -> Reply {
        if !self.is_open(OWN) {
            self.connections.remove(&OWN);
        }
        let answer = self.run_on(OWN, args);
        self.reply_now(answer)
    }

    /// Runs a command built with redis-rs on `connection`, the id its client gave it (a
    /// connection's first command opens it, to the master of the time). A `WAIT` answers at
    /// once, as in [`Node::command`]; [`Node::send`] hands one that must wait back.
    pub fn cmd_on(&mut self, connection: u64, cmd: &::redis::Cmd) -> Reply {
        let answer = self.send(connection, cmd);
        self.reply_now(answer)
    }

    /// Runs a command built with redis-rs on `connection`: its answer, a `WAIT` to wait out, or
    /// the news that the connection closed.
    pub fn send(&mut self, connection: u64, cmd: &::redis::Cmd) -> Answer {
        self.run_on(connection, &cmd_args(cmd))
    }

    /// [`Node::send`] of a command given by its arguments.
    pub fn send_command<A: AsRef<[u8]>>(&mut self, connection: u64, args: &[A]) -> Answer {
        let args = Args::new(args.iter().map(|arg| arg.as_ref().to_vec()).collect());
        self.run_on(connection, &args)
    }

    /// Closes `connection` (its client dropped it): its subscriptions end, and its id may be
    /// used again.
    pub fn disconnect(&mut self, connection: u64) {
        self.connections.remove(&connection);
        let subscribers = &mut self.master.keyspace.subscribers;
        subscribers.retain(|_, listening| {
            listening.remove(&connection);
            !listening.is_empty()
        });
    }

    /// An answer as a reply at once: a `WAIT` with the count now, a closed connection as an
    /// error reply.
    fn reply_now(&self, answer: Answer) -> Reply {
        match answer {
            Answer::Reply(reply) => reply,
            Answer::Waiting(wait) => self.acknowledged_reply(&wait),
            Answer::Closed => reply::error(
                "ERR the simulated connection closed (a failover or a restart): Node::send says so",
            ),
        }
    }

    /// Whether `connection` is open, to the master of now (a connection not seen yet opens at
    /// its first command).
    fn is_open(&self, connection: u64) -> bool {
        self.connections
            .get(&connection)
            .is_none_or(|connected| connected.incarnation == self.master.incarnation)
    }

    fn run_on(&mut self, connection: u64, args: &Args) -> Answer {
        if !self.is_open(connection) {
            return Answer::Closed;
        }
        let incarnation = self.master.incarnation;
        self.connections.entry(connection).or_insert(Connected {
            incarnation,
            last_write: 0,
        });
        if args.name() == "WAIT" {
            return self.wait(connection, args);
        }
        let reply = self.execute(connection, args);
        let effects = std::mem::take(&mut self.master.keyspace.effects);
        if !effects.is_empty() {
            self.master.log.append(self.master.keyspace.now_us, effects);
            if let Some(connected) = self.connections.get_mut(&connection) {
                connected.last_write = self.master.log.offset;
            }
            self.replicate();
        }
        Answer::Reply(reply)
    }

    fn execute(&mut self, connection: u64, args: &Args) -> Reply {
        match args.name().as_str() {
            "EVAL" => self.eval(args, false),
            "EVALSHA" => self.eval(args, true),
            "SCRIPT" => self.script(args),
            "INFO" => self.info(args),
            "SUBSCRIBE" | "SSUBSCRIBE" | "UNSUBSCRIBE" | "SUNSUBSCRIBE" => {
                self.subscription(connection, args)
            }
            _ => self.master.keyspace.execute(args),
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
            .master
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

    /// `WAIT numreplicas timeout`, as Redis answers it: at once when enough replicas
    /// acknowledged the connection's last write (or it wrote nothing yet), else once they do
    /// or at the timeout, with the count then.
    fn wait(&mut self, connection: u64, args: &Args) -> Answer {
        if let Err(message) = args.exactly(3) {
            return Answer::Reply(reply::error(&message));
        }
        let Some(replicas) = args.integer(1) else {
            return Answer::Reply(reply::error("ERR value is not an integer or out of range"));
        };
        let timeout = match args.integer(2) {
            None => {
                return Answer::Reply(reply::error(
                    "ERR timeout is not an integer or out of range",
                ));
            }
            Some(ms) if ms < 0 => return Answer::Reply(reply::error("ERR timeout is negative")),
            Some(0) => None,
            Some(ms) => Some(Duration::from_millis(ms as u64)),
        };
        let wait = Wait {
            connection,
            offset: self.connections[&connection].last_write,
            replicas: u64::try_from(replicas).unwrap_or(0),
            timeout,
        };
        self.waited(&wait).unwrap_or(Answer::Waiting(wait))
    }

    /// Whether `wait` is answered now: its reply once enough replicas acknowledged its offset,
    /// [`Answer::Closed`] once its connection closed, `None` while it waits.
    pub fn waited(&self, wait: &Wait) -> Option<Answer> {
        if !self.is_open(wait.connection) {
            return Some(Answer::Closed);
        }
        (self.acknowledging(wait.offset) >= wait.replicas)
            .then(|| Answer::Reply(Reply::Int(self.acknowledging(wait.offset) as i64)))
    }

    /// The reply of `wait` at its timeout: how many replicas acknowledged its offset by then.
    pub fn wait_timed_out(&self, wait: &Wait) -> Answer {
        if !self.is_open(wait.connection) {
            return Answer::Closed;
        }
        Answer::Reply(self.acknowledged_reply(wait))
    }

    fn acknowledged_reply(&self, wait: &Wait) -> Reply {
        Reply::Int(self.acknowledging(wait.offset) as i64)
    }

    /// How many replicas, linked to the master, acknowledged `offset` of its stream.
    fn acknowledging(&self, offset: u64) -> u64 {
        self.linked()
            .filter(|replica| replica.applied >= offset)
            .count() as u64
    }

    /// The replicas the master lists: following its stream, not cut off.
    fn linked(&self) -> impl Iterator<Item = &Replica> {
        self.replicas
            .values()
            .filter(|replica| !replica.cut_off && replica.following == self.master.log.id)
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
        let master = &mut self.master;
        let sha = if by_sha {
            String::from_utf8_lossy(args.bytes(1)).into_owned()
        } else {
            match master.scripting.load(args.bytes(1)) {
                Ok(sha) => sha,
                Err(error) => return error,
            }
        };
        let (keys, argv) = given.split_at(count);
        master.scripting.run(&sha, keys, argv, &mut master.keyspace)
    }

    /// `SCRIPT LOAD`, `SCRIPT EXISTS` and `SCRIPT FLUSH`. Redis 7 propagates none of them: a
    /// replica knows no script.
    fn script(&mut self, args: &Args) -> Reply {
        let scripting = &mut self.master.scripting;
        match (args.upper(1).as_str(), args.len()) {
            ("LOAD", 3) => match scripting.load(args.bytes(2)) {
                Ok(sha) => Reply::BulkString(sha.into_bytes()),
                Err(error) => error,
            },
            ("EXISTS", 3..) => Reply::Array(
                args.from(2)
                    .iter()
                    .map(|sha| {
                        let known = scripting.exists(&String::from_utf8_lossy(sha));
                        Reply::Int(known.into())
                    })
                    .collect(),
            ),
            ("FLUSH", 2..=3) => {
                scripting.flush();
                Reply::Okay
            }
            _ => reply::error(&reply::not_simulated(&format!("SCRIPT {}", args.upper(1)))),
        }
    }

    /// `INFO` with the sections the store reads, each line as Redis 7.0 prints it (fewer lines):
    /// `server` (its `run_id` tells a restart), `replication` (the master's replicas, what they
    /// acknowledged, its replication id) and `cluster` (not a cluster node).
    fn info(&self, args: &Args) -> Reply {
        let server = format!(
            "# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\nrun_id:{}\r\n",
            self.master.run_id
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
            ("REPLICATION", self.info_replication()),
            ("CLUSTER", cluster),
        ]
        .into_iter()
        .filter(|(name, _)| wanted(name))
        .map(|(_, text)| text)
        .collect();
        Reply::BulkString(text.join("\r\n").into_bytes())
    }

    /// `INFO replication` of the master. A replica acknowledges what it applied at once, so its
    /// `lag` (seconds since its last acknowledgement) is 0; one cut off is not listed, as when
    /// its link broke.
    fn info_replication(&self) -> String {
        let log = &self.master.log;
        let mut lines = vec![
            "# Replication".to_owned(),
            "role:master".to_owned(),
            format!("connected_slaves:{}", self.linked().count()),
        ];
        lines.extend(
            self.replicas
                .iter()
                .filter(|(_, r)| !r.cut_off && r.following == log.id)
                .enumerate()
                .map(|(at, (id, replica))| {
                    format!(
                        "slave{at}:ip=127.0.0.1,port={},state=online,offset={},lag=0",
                        id.port(),
                        replica.applied
                    )
                }),
        );
        let (previous, second_offset) = match &log.previous {
            Some((id, offset)) => (id.clone(), (offset + 1).to_string()),
            None => ("0".repeat(40), "-1".to_owned()),
        };
        lines.extend([
            "master_failover_state:no-failover".to_owned(),
            format!("master_replid:{}", log.id),
            format!("master_replid2:{previous}"),
            format!("master_repl_offset:{}", log.offset),
            format!("second_repl_offset:{second_offset}"),
            format!(
                "repl_backlog_active:{}",
                u8::from(log.backlog_from.is_some())
            ),
            "repl_backlog_size:1048576".to_owned(),
            format!(
                "repl_backlog_first_byte_offset:{}",
                log.backlog_from.map_or(0, |from| from + 1)
            ),
            format!("repl_backlog_histlen:{}", log.backlog_length()),
        ]);
        lines.join("\r\n") + "\r\n"
    }

    /// The node's clock, µs since the Unix epoch.
    pub fn now_micros(&self) -> u64 {
        self.master.keyspace.now_us
    }

    /// Sets the node's clock (µs since the Unix epoch): `TIME`, the expiries it judges by, and
    /// the writes each replica has by then.
    pub fn set_clock(&mut self, micros: u64) {
        self.master.keyspace.now_us = micros;
        self.replicate();
    }

    /// Moves the node's clock on by `by`.
    pub fn advance(&mut self, by: Duration) {
        let by = u64::try_from(by.as_micros()).unwrap_or(u64::MAX);
        self.set_clock(self.master.keyspace.now_us.saturating_add(by));
    }

    /// Each replica applies what it has by now; the stream keeps what some replica still needs.
    fn replicate(&mut self) {
        let (log, now) = (&mut self.master.log, self.master.keyspace.now_us);
        for replica in self.replicas.values_mut() {
            replica.catch_up(log, now);
        }
        let applied = self
            .replicas
            .values()
            .filter(|replica| replica.following == log.id)
            .map(|replica| replica.applied)
            .min();
        log.trim(applied);
    }

    /// The master's `run_id`, as `INFO server` gives it.
    pub fn run_id(&self) -> &str {
        &self.master.run_id
    }

    /// The master's `master_repl_offset`: the bytes of writes it sent its replicas.
    pub fn replication_offset(&self) -> u64 {
        self.master.log.offset
    }

    /// A new replica, fully synced with the master, that has each later write `lag` after it
    /// was made (0: at once).
    pub fn add_replica(&mut self, lag: Duration) -> ReplicaId {
        let id = ReplicaId(self.next_replica);
        self.next_replica += 1;
        let log = &mut self.master.log;
        log.backlog_from.get_or_insert(log.offset);
        let run_id = hex_id(&mut self.ids);
        let replica = Replica::synced(&self.master.keyspace, log, run_id, lag);
        self.replicas.insert(id, replica);
        id
    }

    /// The replicas, by id.
    pub fn replicas(&self) -> Vec<ReplicaId> {
        self.replicas.keys().copied().collect()
    }

    /// Sets how long after a write `replica` has it, from now on.
    pub fn set_lag(&mut self, replica: ReplicaId, lag: Duration) {
        self.replica(replica).lag = lag;
        self.replicate();
    }

    /// Cuts `replica` off its master: it receives nothing more, and the master no longer lists
    /// it (its link broke).
    pub fn cut_off(&mut self, replica: ReplicaId) {
        self.replica(replica).cut_off = true;
    }

    /// Links `replica` to the master again: it goes on from where it stopped when it followed
    /// this master (a partial resync), else it syncs in full.
    pub fn reconnect(&mut self, replica: ReplicaId) {
        let master = &self.master;
        let linked = self
            .replicas
            .get_mut(&replica)
            .expect("a replica of this node");
        linked.cut_off = false;
        if linked.following != master.log.id {
            linked.resync(&master.keyspace, &master.log);
        }
        self.replicate();
    }

    /// The offset of the master's stream `replica` applied and acknowledged.
    pub fn acknowledged(&self, replica: ReplicaId) -> u64 {
        self.replicas[&replica].applied
    }

    /// The replica a Sentinel would promote: the one that applied the most.
    pub fn best_replica(&self) -> Option<ReplicaId> {
        self.replicas
            .iter()
            .max_by_key(|(id, replica)| (replica.applied, std::cmp::Reverse(**id)))
            .map(|(id, _)| *id)
    }

    /// Every live key of `replica` and what it holds, in key order.
    pub fn replica_keys(&self, replica: ReplicaId) -> Vec<(Vec<u8>, Entry)> {
        entries(&self.replicas[&replica].keyspace)
    }

    fn replica(&mut self, replica: ReplicaId) -> &mut Replica {
        self.replicas
            .get_mut(&replica)
            .expect("a replica of this node")
    }

    /// Fails over to `replica`, however far behind it is, as a Sentinel or an operator's
    /// `REPLICAOF NO ONE` does: it becomes the master with only what it applied, its own run id,
    /// a new replication id (the old one kept as `master_replid2`) and no script (`EVALSHA`
    /// answers `NOSCRIPT`). The old master is gone with what it alone had, its connections
    /// closed; the other replicas follow the new one, their data replaced by its own.
    pub fn fail_over(&mut self, replica: ReplicaId) {
        let promoted = self
            .replicas
            .remove(&replica)
            .expect("a replica of this node");
        let now = self.master.keyspace.now_us;
        let mut log = Log::new(hex_id(&mut self.ids), promoted.applied);
        log.previous = Some((promoted.following, promoted.applied));
        log.backlog_from = Some(promoted.applied);
        self.master = Master {
            keyspace: promoted.keyspace,
            scripting: Scripting::new(),
            run_id: promoted.run_id,
            log,
            incarnation: self.master.incarnation + 1,
        };
        self.master.keyspace.now_us = now;
        self.resync_replicas();
    }

    /// A restart of the master without persistence: no keys, no scripts (an `EVALSHA` answers
    /// `NOSCRIPT`), no subscribers, a new run id and replication id, every connection closed.
    /// Its replicas sync with it again and lose everything too, as real ones do; a replica
    /// cut off keeps its data. The clock runs on.
    pub fn restart(&mut self) {
        let now = self.master.keyspace.now_us;
        let run_id = hex_id(&mut self.ids);
        let mut log = Log::new(hex_id(&mut self.ids), 0);
        log.backlog_from = (!self.replicas.is_empty()).then_some(0);
        self.master = Master {
            keyspace: Keyspace::default(),
            scripting: Scripting::new(),
            run_id,
            log,
            incarnation: self.master.incarnation + 1,
        };
        self.master.keyspace.now_us = now;
        self.resync_replicas();
    }

    /// A restart of `replica` without persistence: it comes back with a new run id and syncs
    /// with the master in full (it has all the master has, at once), unless cut off.
    pub fn restart_replica(&mut self, replica: ReplicaId) {
        let run_id = hex_id(&mut self.ids);
        let master = &self.master;
        let restarted = self
            .replicas
            .get_mut(&replica)
            .expect("a replica of this node");
        restarted.run_id = run_id;
        restarted.keyspace = Keyspace::default();
        restarted.following = String::new();
        restarted.applied = 0;
        if !restarted.cut_off {
            restarted.resync(&master.keyspace, &master.log);
        }
    }

    /// The linked replicas sync in full with a new master.
    fn resync_replicas(&mut self) {
        let master = &self.master;
        for replica in self
            .replicas
            .values_mut()
            .filter(|replica| !replica.cut_off)
        {
            replica.resync(&master.keyspace, &master.log);
        }
    }

    /// Subscribes `connection` to `channel` (`SSUBSCRIBE` when `sharded`): it hears what is
    /// published there, and a `PUBLISH` counts it.
    pub fn subscribe(&mut self, connection: u64, channel: &[u8], sharded: bool) {
        let subscribers = &mut self.master.keyspace.subscribers;
        let listening = subscribers.entry((sharded, channel.to_vec())).or_default();
        listening.insert(connection);
    }

    /// Ends `connection`'s subscription to `channel`.
    pub fn unsubscribe(&mut self, connection: u64, channel: &[u8], sharded: bool) {
        let subscribers = &mut self.master.keyspace.subscribers;
        let key = (sharded, channel.to_vec());
        if let Some(listening) = subscribers.get_mut(&key) {
            listening.remove(&connection);
            if listening.is_empty() {
                subscribers.remove(&key);
            }
        }
    }

    /// The connections that hear `published`, in id order.
    pub fn listeners(&self, published: &Published) -> Vec<u64> {
        let key = (published.sharded, published.channel.clone());
        let listening = self.master.keyspace.subscribers.get(&key);
        listening.map_or_else(Vec::new, |ids| ids.iter().copied().collect())
    }

    /// What was published since the last call, in order.
    pub fn take_published(&mut self) -> Vec<Published> {
        std::mem::take(&mut self.master.keyspace.published)
    }

    /// Every live key of the master and what it holds, in key order.
    pub fn keys(&self) -> Vec<(Vec<u8>, Entry)> {
        entries(&self.master.keyspace)
    }
}

impl ReplicaId {
    /// The port `INFO replication` lists it at.
    fn port(self) -> u64 {
        6380 + self.0
    }
}

fn entries(keyspace: &Keyspace) -> Vec<(Vec<u8>, Entry)> {
    keyspace
        .live()
        .map(|(key, entry)| (key.clone(), entry.clone()))
        .collect()
}

/// A redis-rs command's arguments as bytes; a cursor argument (the only other kind) is a scan
/// from its start, `0`.
pub(crate) fn arguments(cmd: &::redis::Cmd) -> impl Iterator<Item = &[u8]> {
    cmd.args_iter().map(|arg| match arg {
        ::redis::Arg::Simple(bytes) => bytes,
        _ => b"0".as_slice(),
    })
}

/// A redis-rs command's arguments, as the node reads them.
fn cmd_args(cmd: &::redis::Cmd) -> Args {
    Args::new(arguments(cmd).map(<[u8]>::to_vec).collect())
}

/// The scripts the Redis store sends, by name, as it sends them (helpers in front, comment lines
/// left out): what a differential test runs on a node and on a real server.
pub fn store_scripts() -> [(&'static str, &'static str); 11] {
    use crate::store::scripts::SENT;
    let names = [
        "acquire",
        "release",
        "extend",
        "hand_over",
        "inspect",
        "force_release",
        "acquire_many",
        "release_many",
        "leave",
        "release_plain",
        "watch",
    ];
    std::array::from_fn(|at| (names[at], SENT[at].as_str()))
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

    impl Node {
        fn command_on_reply(&mut self, connection: u64, args: &[&str]) -> Reply {
            match self.send_command(connection, args) {
                Answer::Reply(reply) => reply,
                other => panic!("{args:?} answered {other:?}"),
            }
        }
    }

    fn info_line(node: &mut Node, name: &str) -> String {
        let info = text(&node.command(&["INFO", "replication"]));
        info.lines()
            .find_map(|line| line.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {info}"))
            .to_owned()
    }

    #[test]
    fn wait_counts_the_replicas_that_have_the_connections_last_write() {
        let mut node = Node::new(1);
        node.set_clock(1_000_000_000);
        let quick = node.add_replica(Duration::ZERO);
        let slow = node.add_replica(Duration::from_millis(100));
        let (writer, reader) = (1, 2);
        let wait = |node: &mut Node, on, n: &str| node.send_command(on, &["WAIT", n, "50"]);
        // Nothing written yet on either: every replica has it.
        assert_eq!(wait(&mut node, writer, "2"), Answer::Reply(Reply::Int(2)));
        node.send_command(writer, &["SET", "k", "v", "PX", "5000"]);
        let offset = node.replication_offset();
        assert!(offset > 0);
        assert_eq!(node.acknowledged(quick), offset);
        assert_eq!(node.acknowledged(slow), 0);
        // The reader wrote nothing: its `WAIT` does not wait for the writer's write.
        assert_eq!(wait(&mut node, reader, "2"), Answer::Reply(Reply::Int(2)));
        assert_eq!(wait(&mut node, writer, "1"), Answer::Reply(Reply::Int(1)));
        let Answer::Waiting(pending) = wait(&mut node, writer, "2") else {
            panic!("one replica lags")
        };
        assert_eq!((pending.offset, pending.replicas), (offset, 2));
        assert_eq!(pending.timeout, Some(Duration::from_millis(50)));
        assert_eq!(node.waited(&pending), None);
        assert_eq!(node.wait_timed_out(&pending), Answer::Reply(Reply::Int(1)));
        // The node's own connection answers at once, with the count now.
        assert_eq!(node.command(&["WAIT", "2", "0"]), Reply::Int(2));
        node.advance(Duration::from_millis(99));
        assert_eq!(node.waited(&pending), None);
        node.advance(Duration::from_millis(1));
        assert_eq!(node.waited(&pending), Some(Answer::Reply(Reply::Int(2))));
        // A write of another connection moves the offset, not this connection's.
        node.send_command(reader, &["SET", "other", "v"]);
        assert_eq!(wait(&mut node, writer, "2"), Answer::Reply(Reply::Int(2)));
        assert!(matches!(wait(&mut node, reader, "2"), Answer::Waiting(_)));
        // A replica cut off acknowledges nothing more, and is no longer listed.
        node.cut_off(quick);
        node.advance(Duration::from_millis(100));
        let Answer::Waiting(short) = wait(&mut node, reader, "2") else {
            panic!("one replica is cut off")
        };
        assert_eq!(node.wait_timed_out(&short), Answer::Reply(Reply::Int(1)));
        assert_eq!(info_line(&mut node, "connected_slaves:"), "1");
        let code = |answer| match answer {
            Answer::Reply(reply) => code(&reply).to_owned(),
            other => panic!("{other:?}"),
        };
        assert_eq!(code(node.send_command(reader, &["WAIT", "1", "-1"])), "ERR");
        assert_eq!(code(node.send_command(reader, &["WAIT", "1"])), "ERR");
    }

    #[test]
    fn a_replica_has_a_scripts_writes_with_their_expiries_as_the_master_set_them() {
        let mut node = Node::new(1);
        node.set_clock(1_000_000_000);
        let replica = node.add_replica(Duration::from_millis(300));
        let script = "redis.call('SET', KEYS[1], 'v', 'NX', 'PX', 1000) \
                      redis.call('PEXPIRE', KEYS[1], 2000) \
                      redis.call('HSET', KEYS[2], 'f', redis.call('TIME')[1]) \
                      redis.call('PEXPIRE', KEYS[2], 200) return 1";
        node.command(&["EVAL", script, "2", "k", "h"]);
        // A key the master expires by itself before the replica has its writes.
        node.command(&["SET", "short", "v", "PX", "100"]);
        assert!(node.replica_keys(replica).is_empty());
        node.advance(Duration::from_millis(150));
        assert_eq!(node.command(&["GET", "short"]), Reply::Nil);
        node.advance(Duration::from_millis(150));
        // The hash lives until 200 ms, though the replica had it at 300: it applied each write
        // on the clock it was made at.
        assert_eq!(node.replica_keys(replica), node.keys());
        assert_eq!(node.keys().len(), 1);
        node.advance(Duration::from_millis(300));
        assert_eq!(node.replica_keys(replica), node.keys());
        assert_eq!(
            node.keys()[0].1.expires_at_ms,
            Some(1_000_000 + 2000),
            "PEXPIRE made absolute"
        );
    }

    #[test]
    fn a_failover_to_a_lagging_replica_loses_the_write_it_did_not_acknowledge() {
        let mut node = Node::new(1);
        node.set_clock(1_000_000_000);
        let lagging = node.add_replica(Duration::from_secs(1));
        let keeping = node.add_replica(Duration::ZERO);
        let client = 1;
        let sha = text(&node.command_on_reply(client, &["SCRIPT", "LOAD", "return 1"]));
        node.send_command(client, &["SET", "lock", "mine", "PX", "10000"]);
        assert!(matches!(
            node.send_command(client, &["WAIT", "2", "100"]),
            Answer::Waiting(_)
        ));
        let (run_id, replication_id) = (
            node.run_id().to_owned(),
            info_line(&mut node, "master_replid:"),
        );
        assert_eq!(node.best_replica(), Some(keeping));
        node.fail_over(lagging);
        assert_eq!(node.send_command(client, &["GET", "lock"]), Answer::Closed);
        assert_eq!(code(&node.cmd_on(client, &::redis::cmd("PING"))), "ERR");
        node.disconnect(client);
        assert_eq!(node.command_on_reply(client, &["GET", "lock"]), Reply::Nil);
        assert_eq!(code(&node.command(&["EVALSHA", &sha, "0"])), "NOSCRIPT");
        assert_ne!(node.run_id(), run_id);
        assert_ne!(info_line(&mut node, "master_replid:"), replication_id);
        assert_eq!(info_line(&mut node, "master_replid2:"), replication_id);
        assert_eq!(info_line(&mut node, "master_repl_offset:"), "0");
        // The replica that had the write follows the new master, and lost it too.
        assert_eq!(info_line(&mut node, "connected_slaves:"), "1");
        assert!(node.replica_keys(keeping).is_empty());
        // A lock taken now is the new master's, and its replica's.
        assert_eq!(
            node.command_on_reply(client, &["SET", "lock", "theirs", "NX", "PX", "10000"]),
            Reply::Okay
        );
        assert_eq!(node.replica_keys(keeping), node.keys());
    }

    #[test]
    fn a_failover_to_the_replica_that_has_a_write_keeps_it() {
        let mut node = Node::new(1);
        node.set_clock(1_000_000_000);
        let replica = node.add_replica(Duration::ZERO);
        node.command(&["SET", "lock", "mine", "PX", "10000"]);
        let before = node.keys();
        node.fail_over(replica);
        assert_eq!(node.keys(), before);
        assert!(node.replicas().is_empty());
        assert_eq!(info_line(&mut node, "connected_slaves:"), "0");
        assert_eq!(info_line(&mut node, "repl_backlog_active:"), "1");
    }

    #[test]
    fn a_restarted_master_takes_its_replicas_data_with_it() {
        let mut node = Node::new(1);
        let (linked, cut) = (
            node.add_replica(Duration::ZERO),
            node.add_replica(Duration::ZERO),
        );
        node.command(&["SET", "k", "v"]);
        node.cut_off(cut);
        let client = 1;
        node.send_command(client, &["PING"]);
        node.restart();
        assert_eq!(node.send_command(client, &["PING"]), Answer::Closed);
        assert!(node.replica_keys(linked).is_empty());
        assert_eq!(node.replica_keys(cut).len(), 1);
        // Back, the cut-off replica syncs in full with the master it now follows.
        node.reconnect(cut);
        assert!(node.replica_keys(cut).is_empty());
        node.restart_replica(linked);
        node.command(&["SET", "k", "w"]);
        assert_eq!(node.replica_keys(linked), node.keys());
    }

    #[test]
    fn an_unknown_command_is_an_error_naming_it() {
        let mut node = Node::new(1);
        let reply = node.command(&["WATCH", "k"]);
        assert_eq!(code(&reply), "ERR");
        assert!(format!("{reply:?}").contains("WATCH"), "{reply:?}");
    }
}
