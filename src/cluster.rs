//! A real Redis Cluster on loopback: masters and replicas, each a [`RedisServer`].
//!
//! Built the way `redis-cli --cluster create` does it, but without its one-second polls: slots
//! assigned with `CLUSTER ADDSLOTSRANGE`, nodes introduced with `CLUSTER MEET`, replicas
//! attached with `CLUSTER REPLICATE`, then ready once every node reports `cluster_state:ok` and
//! agrees on who owns every slot.

use std::thread;
use std::time::{Duration, Instant};

use crate::RedisServer;
use crate::server::expect_ok;

/// How long the cluster may take to form, or to recover after a failover.
const FORM_BUDGET: Duration = Duration::from_secs(30);
/// Slots in a Redis Cluster.
const SLOTS: u16 = 16_384;

/// A running cluster. Nodes are killed and their directories removed on drop.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeInfo {
    id: String,
    port: u16,
    master: bool,
    failed: bool,
    /// Slot ranges served, for masters.
    slots: Vec<(u16, u16)>,
    /// The master's id, for replicas.
    replicates: Option<String>,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each, and waits until the cluster is
    /// ready (every slot served, every node in agreement, every replica in sync).
    ///
    /// # Panics
    ///
    /// If a node does not start, or the cluster does not form within 30 s.
    pub fn start(masters: usize, replicas: usize) -> Self {
        assert!(masters >= 1, "a cluster needs a master");
        Self::form(start_nodes(masters * (1 + replicas)), masters)
    }

    /// Makes a cluster of fresh `nodes`: the first `masters` serve the slots, the rest replicate
    /// them in turn.
    fn form(nodes: Vec<RedisServer>, masters: usize) -> Self {
        let cluster = Self::with_slots(nodes, masters);
        cluster.introduce();
        for (index, replica) in cluster.nodes[masters..].iter().enumerate() {
            let master = node_id(&cluster.nodes[index % masters]);
            expect_ok(replica.command(&["CLUSTER", "REPLICATE", &master]));
        }
        cluster.wait_until_ready();
        cluster
    }

    /// Fresh `nodes`, each with its own config epoch, the first `masters` serving the slots.
    fn with_slots(nodes: Vec<RedisServer>, masters: usize) -> Self {
        for (index, node) in nodes.iter().enumerate() {
            expect_ok(node.command(&["CLUSTER", "SET-CONFIG-EPOCH", &(index + 1).to_string()]));
        }
        for (index, node) in nodes[..masters].iter().enumerate() {
            let first = SLOTS as usize * index / masters;
            let last = SLOTS as usize * (index + 1) / masters - 1;
            expect_ok(node.command(&[
                "CLUSTER",
                "ADDSLOTSRANGE",
                &first.to_string(),
                &last.to_string(),
            ]));
        }
        Self { nodes }
    }

    /// Introduces every node to the first, and waits until every node knows every other.
    fn introduce(&self) {
        for node in &self.nodes[1..] {
            self.meet(&self.nodes[0], node);
        }
        // A handshake not finished within the node timeout (a loaded machine) is dropped for
        // good, and gossip never brings that node in: whoever a node still lacks after a while
        // it meets again.
        let met = std::cell::Cell::new(Instant::now());
        self.wait_until("every node knows every other", |cluster| {
            let unknown = cluster.unknown_pairs();
            if !unknown.is_empty() && met.get().elapsed() > Duration::from_secs(2) {
                for &(node, other) in &unknown {
                    cluster.meet(&cluster.nodes[node], &cluster.nodes[other]);
                }
                met.set(Instant::now());
            }
            unknown.is_empty()
        });
    }

    /// A URL of every node, to seed a client with.
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Every node, masters and replicas, killed ones included.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The master serving `key` now.
    ///
    /// # Panics
    ///
    /// If no live node claims its slot.
    pub fn master_of(&self, key: &str) -> &RedisServer {
        let slot = self.slot_of(key);
        let owner = self
            .topology()
            .into_iter()
            .find(|info| info.master && !info.failed && serves(info, slot))
            .unwrap_or_else(|| panic!("no master serves slot {slot}"));
        self.by_port(owner.port)
    }

    /// The slot of `key`, as the cluster computes it (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let node = self
            .nodes
            .iter()
            .find(|node| node.is_running())
            .expect("a live node");
        redis::from_redis_value(node.command(&["CLUSTER", "KEYSLOT", key])).expect("a slot")
    }

    /// The masters serving slots now.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.topology()
            .into_iter()
            .filter(|info| info.master && !info.failed && !info.slots.is_empty())
            .map(|info| self.by_port(info.port))
            .collect()
    }

    /// Kills the master serving `key` (as a crash would), waits until one of its replicas took
    /// over and the cluster is ready again, and returns the killed node's port.
    ///
    /// # Panics
    ///
    /// If no replica takes over within 30 s.
    pub fn kill_master_of(&mut self, key: &str) -> u16 {
        let port = self.kill_master_now(key);
        self.wait_for_failover(key, port);
        port
    }

    /// Kills the master serving `key` and returns at once with its port; see
    /// [`wait_for_failover`](Self::wait_for_failover).
    pub fn kill_master_now(&mut self, key: &str) -> u16 {
        let port = self.master_of(key).port();
        let index = self.index_of(port);
        self.nodes[index].kill();
        port
    }

    /// Waits until a node other than `killed` serves `key` and the cluster is ready again.
    ///
    /// # Panics
    ///
    /// If no replica takes over within 30 s.
    pub fn wait_for_failover(&self, key: &str, killed: u16) {
        let port = killed;
        let slot = self.slot_of(key);
        self.wait_until("a replica took over the killed master's slots", |cluster| {
            cluster
                .topology()
                .iter()
                .any(|info| info.master && !info.failed && info.port != port && serves(info, slot))
        });
        self.wait_until_ready();
    }

    /// Restarts the killed node on `port`, empty but with its cluster configuration, so it
    /// rejoins (as a replica of whoever took its slots); waits until the cluster is ready.
    ///
    /// # Panics
    ///
    /// If the node does not come back, or the cluster is not ready within 30 s.
    pub fn restart_node(&mut self, port: u16) {
        let index = self.index_of(port);
        self.nodes[index].restart();
        self.wait_until_ready();
    }

    /// Kills a replica of the master serving `key` (as a crash would) and returns at once with
    /// its port; [`restart_node`](Self::restart_node) brings it back empty, to a full resync.
    ///
    /// # Panics
    ///
    /// If that master has no live replica.
    pub fn kill_replica_now(&mut self, key: &str) -> u16 {
        let port = self.replica_of(key).port();
        let index = self.index_of(port);
        self.nodes[index].kill();
        port
    }

    /// A live replica of the master serving `key`.
    ///
    /// # Panics
    ///
    /// If that master has none.
    pub fn replica_of(&self, key: &str) -> &RedisServer {
        let master = self.master_of(key).port();
        let topology = self.topology();
        let master_id = topology
            .iter()
            .find(|info| info.port == master)
            .map(|info| info.id.clone())
            .expect("the master is known");
        let replica = topology
            .iter()
            .find(|info| info.replicates.as_deref() == Some(&master_id) && !info.failed)
            .unwrap_or_else(|| panic!("master on {master} has no live replica"))
            .port;
        self.by_port(replica)
    }

    /// A planned failover: a replica of `key`'s master takes over with `CLUSTER FAILOVER`, and the
    /// cluster is ready again. Returns the new master's port.
    pub fn fail_over(&self, key: &str) -> u16 {
        self.fail_over_with(key, &[])
    }

    /// A failover a replica of `key`'s master forces with `CLUSTER FAILOVER TAKEOVER`: it takes
    /// over at once, whatever it has, and the old master becomes its replica (dropping what it
    /// had and the replica had not). Waits until the cluster is ready; returns the new master's
    /// port.
    pub fn take_over(&self, key: &str) -> u16 {
        self.fail_over_with(key, &["TAKEOVER"])
    }

    fn fail_over_with(&self, key: &str, how: &[&str]) -> u16 {
        let replica = self.replica_of(key).port();
        let command = [&["CLUSTER", "FAILOVER"], how].concat();
        expect_ok(self.by_port(replica).command(&command));
        self.wait_until("the replica became master", |cluster| {
            cluster.master_of(key).port() == replica
        });
        self.wait_until_ready();
        replica
    }

    /// Starts moving `slot` to the master on `to`: the slot is marked migrating/importing and its
    /// keys moved, so requests for it get `ASK` redirects until [`Migration::finish`].
    pub fn begin_migration(&self, slot: u16, to: u16) -> Migration<'_> {
        let topology = self.topology();
        let id_of = |port: u16| {
            topology
                .iter()
                .find(|info| info.port == port)
                .map(|info| info.id.clone())
                .expect("a known node")
        };
        let from = topology
            .iter()
            .find(|info| info.master && !info.failed && serves(info, slot))
            .map(|info| info.port)
            .expect("someone serves the slot");
        assert_ne!(from, to, "slot {slot} is already served by {to}");
        let (from_id, to_id) = (id_of(from), id_of(to));
        let slot_arg = slot.to_string();
        expect_ok(self.by_port(to).command(&[
            "CLUSTER",
            "SETSLOT",
            &slot_arg,
            "IMPORTING",
            &from_id,
        ]));
        expect_ok(self.by_port(from).command(&[
            "CLUSTER",
            "SETSLOT",
            &slot_arg,
            "MIGRATING",
            &to_id,
        ]));
        loop {
            let keys =
                match self
                    .by_port(from)
                    .command(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"])
                {
                    redis::Value::Array(keys) => keys,
                    other => panic!("CLUSTER GETKEYSINSLOT answered {other:?}"),
                };
            if keys.is_empty() {
                break;
            }
            let keys: Vec<String> = keys
                .into_iter()
                .map(|key| redis::from_redis_value(key).expect("a key name"))
                .collect();
            let mut migrate = vec!["MIGRATE", "127.0.0.1"];
            let to_port = to.to_string();
            migrate.extend([to_port.as_str(), "", "0", "5000", "KEYS"]);
            migrate.extend(keys.iter().map(String::as_str));
            expect_ok(self.by_port(from).command(&migrate));
        }
        Migration {
            cluster: self,
            slot,
            to_id,
        }
    }

    /// Waits until every live node reports `cluster_state:ok`, all agree on who serves every
    /// slot, and every replica is in sync with its master.
    pub fn wait_until_ready(&self) {
        self.wait_until("the cluster is ready", |cluster| {
            let live: Vec<&RedisServer> = cluster
                .nodes
                .iter()
                .filter(|node| node.is_running())
                .collect();
            let states_ok = live
                .iter()
                .all(|node| info_text(node, &["CLUSTER", "INFO"]).contains("cluster_state:ok"));
            let maps: Vec<Vec<(u16, u16, u16)>> = live.iter().map(|node| slot_map(node)).collect();
            let agreed = maps.windows(2).all(|pair| pair[0] == pair[1])
                && maps.first().is_some_and(|map| {
                    map.iter()
                        .map(|(first, last, _)| u32::from(last - first) + 1)
                        .sum::<u32>()
                        == u32::from(SLOTS)
                });
            let synced = live.iter().all(|node| {
                let replication = info_text(node, &["INFO", "replication"]);
                !replication.contains("role:slave") || replication.contains("master_link_status:up")
            });
            states_ok && agreed && synced
        });
    }

    fn meet(&self, node: &RedisServer, other: &RedisServer) {
        let bus_port = other.bus_port().expect("a cluster node has a bus port");
        expect_ok(node.command(&[
            "CLUSTER",
            "MEET",
            "127.0.0.1",
            &other.port().to_string(),
            &bus_port.to_string(),
        ]));
    }

    /// (node, other) for each node that does not know the other yet, past its handshake.
    fn unknown_pairs(&self) -> Vec<(usize, usize)> {
        let mut unknown = Vec::new();
        for (index, node) in self.nodes.iter().enumerate() {
            let known = nodes_of(node);
            for (other_index, other) in self.nodes.iter().enumerate() {
                if !known
                    .iter()
                    .any(|info| info.port == other.port() && !info.failed && !info.id.is_empty())
                {
                    unknown.push((index, other_index));
                }
            }
        }
        unknown
    }

    fn topology(&self) -> Vec<NodeInfo> {
        let node = self
            .nodes
            .iter()
            .find(|node| node.is_running())
            .expect("a live node");
        nodes_of(node)
    }

    fn by_port(&self, port: u16) -> &RedisServer {
        &self.nodes[self.index_of(port)]
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|node| node.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    fn wait_until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + FORM_BUDGET;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "cluster: not within {FORM_BUDGET:?}: {what}"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A slot being moved; [`finish`](Self::finish) hands it over for good.
#[derive(Debug)]
pub struct Migration<'a> {
    cluster: &'a RedisCluster,
    slot: u16,
    to_id: String,
}

impl Migration<'_> {
    /// Assigns the slot to its new master on every node (from then on: `MOVED`), and waits until
    /// the cluster agrees.
    pub fn finish(self) {
        let slot = self.slot.to_string();
        for master in self.cluster.masters() {
            expect_ok(master.command(&["CLUSTER", "SETSLOT", &slot, "NODE", &self.to_id]));
        }
        self.cluster.wait_until_ready();
    }
}

/// `total` cluster-enabled nodes, started side by side.
fn start_nodes(total: usize) -> Vec<RedisServer> {
    (0..total)
        .map(|_| {
            thread::spawn(|| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "1000",
                    "--cluster-replica-no-failover",
                    "no",
                    // Replicas sync at once instead of waiting 5 s for company.
                    "--repl-diskless-sync-delay",
                    "0",
                ])
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|start| start.join().expect("a cluster node starts"))
        .collect()
}

fn serves(info: &NodeInfo, slot: u16) -> bool {
    info.slots
        .iter()
        .any(|(first, last)| (*first..=*last).contains(&slot))
}

fn node_id(node: &RedisServer) -> String {
    redis::from_redis_value(node.command(&["CLUSTER", "MYID"])).expect("CLUSTER MYID")
}

fn info_text(node: &RedisServer, command: &[&str]) -> String {
    match node.command(command) {
        redis::Value::BulkString(text) => String::from_utf8_lossy(&text).into_owned(),
        redis::Value::VerbatimString { text, .. } => text,
        other => panic!("`{}` answered {other:?}", command.join(" ")),
    }
}

/// `CLUSTER NODES`, parsed.
fn nodes_of(node: &RedisServer) -> Vec<NodeInfo> {
    info_text(node, &["CLUSTER", "NODES"])
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (id, address, flags, master) = (
                fields.first()?,
                fields.get(1)?,
                fields.get(2)?,
                fields.get(3)?,
            );
            let port = address
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let slots = fields[8.min(fields.len())..]
                .iter()
                .filter(|range| !range.starts_with('['))
                .filter_map(|range| match range.split_once('-') {
                    Some((first, last)) => Some((first.parse().ok()?, last.parse().ok()?)),
                    None => range.parse().ok().map(|slot| (slot, slot)),
                })
                .collect();
            Some(NodeInfo {
                id: (*id).to_owned(),
                port,
                master: flags.contains("master"),
                failed: flags.contains("fail")
                    || flags.contains("handshake")
                    || flags.contains("noaddr"),
                slots,
                replicates: (*master != "-").then(|| (*master).to_owned()),
            })
        })
        .collect()
}

/// `CLUSTER SLOTS` as (first, last, master port), sorted.
fn slot_map(node: &RedisServer) -> Vec<(u16, u16, u16)> {
    let redis::Value::Array(ranges) = node.command(&["CLUSTER", "SLOTS"]) else {
        return Vec::new();
    };
    let mut map: Vec<(u16, u16, u16)> = ranges
        .into_iter()
        .filter_map(|range| {
            let redis::Value::Array(parts) = range else {
                return None;
            };
            let first: u16 = redis::from_redis_value(parts.first()?.clone()).ok()?;
            let last: u16 = redis::from_redis_value(parts.get(1)?.clone()).ok()?;
            let redis::Value::Array(master) = parts.get(2)?.clone() else {
                return None;
            };
            let port: u16 = redis::from_redis_value(master.get(1)?.clone()).ok()?;
            Some((first, last, port))
        })
        .collect();
    map.sort_unstable();
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node that answers no handshake for longer than the node timeout, as on a loaded
    /// machine, is dropped by the node that met it; it is met again and the cluster forms.
    #[test]
    fn a_cluster_forms_though_a_handshake_timed_out() {
        let cluster = RedisCluster::with_slots(start_nodes(3), 3);
        let late = cluster.nodes[2].pid();
        cluster.nodes[2].pause();
        let resumed = thread::spawn(move || {
            // Twice the node timeout: the handshake started by `MEET` is given up meanwhile.
            thread::sleep(Duration::from_secs(2));
            // SAFETY: `kill` has no memory effects; `late` is the paused node's pid.
            let sent = unsafe { libc::kill(late as libc::pid_t, libc::SIGCONT) };
            assert_eq!(sent, 0, "SIGCONT to the paused node");
        });
        let started = Instant::now();
        cluster.introduce();
        resumed.join().expect("the node is resumed");
        cluster.wait_until_ready();
        eprintln!("formed in {:?} with a node paused 2 s", started.elapsed());
        assert_eq!(cluster.masters().len(), 3);
        assert!(cluster.unknown_pairs().is_empty());
    }
}
