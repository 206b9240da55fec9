//! A real Sentinel deployment on loopback: a master, its replica, and three sentinels (or as
//! many as asked) watching them under one service name.

use std::thread;
use std::time::{Duration, Instant};

use crate::RedisServer;

/// How long the deployment may take to form, or to fail over.
const SETTLE_BUDGET: Duration = Duration::from_secs(30);

/// The service name the sentinels monitor.
pub const SERVICE: &str = "locks";

/// A master, a replica and their sentinels. Everything is killed on drop.
#[derive(Debug)]
pub struct RedisSentinel {
    /// The data nodes: the master and its replica (which is which changes with failovers).
    pub data: Vec<RedisServer>,
    /// The sentinels.
    pub sentinels: Vec<RedisServer>,
}

impl RedisSentinel {
    /// Starts the deployment and waits until every sentinel names the master, knows the replica
    /// and the other sentinels (so a failover can be voted).
    ///
    /// # Panics
    ///
    /// If a process does not start, or the sentinels do not settle within 30 s.
    pub fn start() -> Self {
        Self::start_with(3, Duration::from_secs(2))
    }

    /// As [`start`](Self::start), with `sentinels` sentinels (a majority of them the quorum)
    /// that call the master down after `down_after` without an answer: one sentinel and 1 s is
    /// the smallest deployment users run, and the quickest to fail over.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start), and if `sentinels` is 0.
    pub fn start_with(sentinels: usize, down_after: Duration) -> Self {
        assert!(sentinels > 0, "a Sentinel deployment needs a sentinel");
        // Replicas sync at once, and a restarted one takes the master's data rather than its own
        // stale dump.
        let fast_sync = [
            "--repl-diskless-sync-delay",
            "0",
            "--repl-diskless-load",
            "swapdb",
        ];
        let master = RedisServer::start_with(&fast_sync);
        let master_port = master.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &master_port];
        replica_args.extend(fast_sync);
        let replica = RedisServer::start_with(&replica_args);
        let config = format!(
            "sentinel resolve-hostnames no\n\
             sentinel monitor {SERVICE} 127.0.0.1 {} {}\n\
             sentinel down-after-milliseconds {SERVICE} {}\n\
             sentinel failover-timeout {SERVICE} 3000\n\
             sentinel parallel-syncs {SERVICE} 1\n",
            master.port(),
            sentinels / 2 + 1,
            down_after.as_millis()
        );
        let sentinels_started = (0..sentinels)
            .map(|_| {
                let config = config.clone();
                thread::spawn(move || RedisServer::start_sentinel(&config))
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|start| start.join().expect("a sentinel starts"))
            .collect();
        let deployment = Self {
            data: vec![master, replica],
            sentinels: sentinels_started,
        };
        deployment.wait_until(
            "the sentinels know the master, the replica and each other",
            |d| {
                d.sentinels.iter().all(|sentinel| {
                    d.master_named_by(sentinel) == Some(d.data[0].port())
                        && count(sentinel, "replicas") == 1
                        && count(sentinel, "sentinels") == sentinels - 1
                })
            },
        );
        deployment.wait_until("the replica is in sync", |d| d.replica_in_sync());
        deployment
    }

    /// `redis+sentinel://127.0.0.1:s1,127.0.0.1:s2,127.0.0.1:s3/locks`.
    pub fn url(&self) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|sentinel| format!("127.0.0.1:{}", sentinel.port()))
            .collect();
        format!("redis+sentinel://{}/{SERVICE}", sentinels.join(","))
    }

    /// The data node the sentinels name as master now.
    pub fn master(&self) -> &RedisServer {
        &self.data[self.master_index()]
    }

    /// The data node that is not the master now: the replica, or a node down.
    pub fn replica(&self) -> &RedisServer {
        &self.data[1 - self.master_index()]
    }

    /// The index in [`data`](Self::data) of the node the sentinels name as master now.
    fn master_index(&self) -> usize {
        let port = self
            .sentinels
            .iter()
            .filter(|sentinel| sentinel.is_running())
            .find_map(|sentinel| self.master_named_by(sentinel))
            .expect("a sentinel names a master");
        self.data
            .iter()
            .position(|node| node.port() == port)
            .expect("the master is one of ours")
    }

    /// Kills the master (as a crash would), waits until every sentinel names the replica and
    /// the new master accepts writes; returns the killed node's index in [`data`](Self::data).
    ///
    /// # Panics
    ///
    /// If the failover does not happen within 30 s.
    pub fn kill_master(&mut self) -> usize {
        let index = self.kill_master_now();
        self.wait_for_failover(index);
        index
    }

    /// Kills the master and returns at once with its index in [`data`](Self::data); see
    /// [`wait_for_failover`](Self::wait_for_failover).
    pub fn kill_master_now(&mut self) -> usize {
        let index = self.master_index();
        self.data[index].kill();
        index
    }

    /// Waits until every sentinel names the data node other than `killed` (an index in
    /// [`data`](Self::data)) and it accepts writes.
    ///
    /// # Panics
    ///
    /// If the failover does not happen within 30 s.
    pub fn wait_for_failover(&self, killed: usize) {
        let new = self.data[1 - killed].port();
        self.wait_until("the sentinels switched to the replica", |d| {
            d.sentinels
                .iter()
                .filter(|sentinel| sentinel.is_running())
                .all(|sentinel| d.master_named_by(sentinel) == Some(new))
        });
        self.wait_until("the new master accepts writes", |d| {
            d.data[1 - killed]
                .try_command(&["SET", "lockmacro-testkit:probe", "1"])
                .is_ok_and(|reply| reply == redis::Value::Okay)
        });
    }

    /// Kills the replica (as a crash would) and returns at once with its index in
    /// [`data`](Self::data); [`restart_as_replica`](Self::restart_as_replica) brings it back
    /// empty, to a full resync.
    pub fn kill_replica_now(&mut self) -> usize {
        let index = 1 - self.master_index();
        self.data[index].kill();
        index
    }

    /// A failover asked of the sentinels (`SENTINEL FAILOVER`) while the master runs: the replica
    /// takes over at once, whatever it has, and the old master is made its replica (dropping what
    /// it had and the replica had not). Waits until the switch is done and the old master in sync;
    /// returns the old master's index in [`data`](Self::data).
    ///
    /// # Panics
    ///
    /// If the sentinels refuse, or the failover does not happen within 30 s.
    pub fn fail_over(&self) -> usize {
        let index = self.master_index();
        let sentinel = self
            .sentinels
            .iter()
            .find(|sentinel| sentinel.is_running())
            .expect("a sentinel runs");
        let reply = sentinel.command(&["SENTINEL", "FAILOVER", SERVICE]);
        assert_eq!(
            reply,
            redis::Value::Okay,
            "SENTINEL FAILOVER answered {reply:?}"
        );
        self.wait_for_failover(index);
        self.wait_until("the old master is a replica in sync", |d| {
            d.replica_in_sync()
        });
        index
    }

    /// Restarts the killed data node `index` (empty, as after a crash without persistence) as a
    /// replica of the current master, as the sentinels would reconfigure it, and waits until it
    /// is in sync.
    ///
    /// # Panics
    ///
    /// If it does not come back or sync within 30 s.
    pub fn restart_as_replica(&mut self, index: usize) {
        self.data[index].restart();
        let master = self.master().port().to_string();
        let reply = self.data[index].command(&["REPLICAOF", "127.0.0.1", &master]);
        assert!(
            matches!(reply, redis::Value::Okay | redis::Value::SimpleString(_)),
            "REPLICAOF answered {reply:?}"
        );
        self.wait_until("the restarted node is a replica in sync", |d| {
            d.replica_in_sync()
        });
    }

    fn replica_in_sync(&self) -> bool {
        let master = self.master().port();
        self.data
            .iter()
            .filter(|node| node.is_running() && node.port() != master)
            .all(|node| match node.try_command(&["INFO", "replication"]) {
                Ok(redis::Value::BulkString(info)) => {
                    String::from_utf8_lossy(&info).contains("master_link_status:up")
                }
                Ok(redis::Value::VerbatimString { text, .. }) => {
                    text.contains("master_link_status:up")
                }
                // A node the sentinels just reconfigured drops its clients: not in sync yet.
                _ => false,
            })
    }

    fn master_named_by(&self, sentinel: &RedisServer) -> Option<u16> {
        let reply = sentinel.command(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE]);
        let (_, port): (String, String) = redis::from_redis_value(reply).ok()?;
        port.parse().ok()
    }

    fn wait_until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + SETTLE_BUDGET;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "sentinel: not within {SETTLE_BUDGET:?}: {what}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// How many `SENTINEL REPLICAS` / `SENTINEL SENTINELS` a sentinel lists for the service.
fn count(sentinel: &RedisServer, what: &str) -> usize {
    match sentinel.command(&["SENTINEL", what, SERVICE]) {
        redis::Value::Array(items) => items.len(),
        _ => 0,
    }
}
