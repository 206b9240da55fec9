//! A real Sentinel deployment on loopback: a master, its replica, and three sentinels watching
//! them under one service name.

use std::thread;
use std::time::{Duration, Instant};

use crate::RedisServer;

/// How long the deployment may take to form, or to fail over.
const SETTLE_BUDGET: Duration = Duration::from_secs(30);

/// The service name the sentinels monitor.
pub const SERVICE: &str = "locks";

/// A master, a replica and three sentinels. Everything is killed on drop.
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
             sentinel monitor {SERVICE} 127.0.0.1 {} 2\n\
             sentinel down-after-milliseconds {SERVICE} 2000\n\
             sentinel failover-timeout {SERVICE} 3000\n\
             sentinel parallel-syncs {SERVICE} 1\n",
            master.port()
        );
        let sentinels = (0..3)
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
            sentinels,
        };
        deployment.wait_until(
            "the sentinels know the master, the replica and each other",
            |d| {
                d.sentinels.iter().all(|sentinel| {
                    d.master_named_by(sentinel) == Some(d.data[0].port())
                        && count(sentinel, "replicas") == 1
                        && count(sentinel, "sentinels") == 2
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
        let port = self
            .sentinels
            .iter()
            .filter(|sentinel| sentinel.is_running())
            .find_map(|sentinel| self.master_named_by(sentinel))
            .expect("a sentinel names a master");
        self.data
            .iter()
            .find(|node| node.port() == port)
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
        let old = self.master().port();
        let index = self
            .data
            .iter()
            .position(|node| node.port() == old)
            .expect("ours");
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
            d.data[1 - killed].command(&["SET", "lockmacro-testkit:probe", "1"])
                == redis::Value::Okay
        });
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
            .all(|node| match node.command(&["INFO", "replication"]) {
                redis::Value::BulkString(info) => {
                    String::from_utf8_lossy(&info).contains("master_link_status:up")
                }
                redis::Value::VerbatimString { text, .. } => text.contains("master_link_status:up"),
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
