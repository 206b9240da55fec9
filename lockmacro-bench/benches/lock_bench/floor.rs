//! W0, the floor: a lock cycle done by hand, with nothing around it. One cycle is
//! `SET key token NX PX ttl` and then the classic compare-and-delete script by `EVALSHA`: the
//! two round trips no Redis lock can do without. Two floors: [`RawConnection`] speaks RESP on a
//! connection of its own (the limit any client approaches), and [`Floor`] sends the same two
//! commands through one shared redis-rs multiplexed connection ("redis-rs alone", the client
//! every library here sits on). [`ClusterFloor`] is the floor of a Redis Cluster: the same two
//! commands through redis-rs's own cluster connection, routed by key; [`RedlockFloor`] that of a
//! Redlock: each command sent to every master at once, a majority of replies required.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};

use futures_util::future::join_all;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The classic compare-and-delete (as in the Redis docs and rslock).
pub const COMPARE_AND_DELETE: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
"#;

/// Cycles per pipelined batch: the throughput ceiling of one connection.
pub const PIPELINE_DEPTH: usize = 16;

/// The lock's two commands through one redis-rs connection, the compare-and-delete script
/// loaded: a multiplexed connection ("redis-rs alone"), or redis-rs's cluster connection routed
/// by key ([`ClusterFloor`]), whose `SET` asks for the value it replaces (`GET`), as the lock's
/// does on a cluster, where a `SET` may be sent again after it landed.
#[derive(Clone)]
pub struct Floor<C = MultiplexedConnection> {
    connection: C,
    pub release_sha: String,
    asks_replaced: bool,
}

/// The floor of a Redis Cluster.
pub type ClusterFloor = Floor<ClusterConnection>;

impl Floor {
    pub async fn new(connection: MultiplexedConnection) -> Self {
        Self::loaded(connection, false).await
    }
}

impl ClusterFloor {
    /// The floor over `connection`, with the compare-and-delete script loaded on every node.
    pub async fn cluster(connection: ClusterConnection) -> Self {
        Self::loaded(connection, true).await
    }
}

impl<C: ConnectionLike + Send> Floor<C> {
    async fn loaded(mut connection: C, asks_replaced: bool) -> Self {
        let release_sha = load_compare_and_delete(&mut connection).await;
        Self {
            connection,
            release_sha,
            asks_replaced,
        }
    }

    /// One lock cycle on `key`: take it, release it. Two round trips (on a cluster, to the
    /// key's master).
    pub async fn cycle(&mut self, key: &str) {
        let token = fresh_token();
        let mut set = set_nx(key, &token);
        if self.asks_replaced {
            set.arg("GET");
        }
        // `OK` when taken; with `GET`, the value replaced: none.
        let answer: Option<String> = set
            .query_async(&mut self.connection)
            .await
            .expect("SET NX PX");
        assert_eq!(
            answer.is_none(),
            self.asks_replaced,
            "floor key {key} was busy"
        );
        let deleted: i64 = compare_and_delete(&self.release_sha, key, &token)
            .query_async(&mut self.connection)
            .await
            .expect("EVALSHA compare-and-delete");
        assert_eq!(deleted, 1, "floor key {key} was not ours at release");
    }
}

impl Floor {
    /// [`PIPELINE_DEPTH`] lock cycles, on keys `{prefix}:0..`, in one round trip.
    pub async fn pipelined_cycles(&mut self, prefix: &str) {
        let mut pipe = redis::pipe();
        for i in 0..PIPELINE_DEPTH {
            let key = format!("{prefix}:{i}");
            let token = fresh_token();
            pipe.cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(3000)
                .ignore();
            pipe.cmd("EVALSHA")
                .arg(&self.release_sha)
                .arg(1)
                .arg(&key)
                .arg(&token)
                .ignore();
        }
        let () = pipe
            .query_async(&mut self.connection)
            .await
            .expect("pipelined cycles");
    }
}

/// `SET key token NX PX 3000`: the floor's acquire.
pub fn set_nx(key: &str, token: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg(token).arg("NX").arg("PX").arg(3000);
    cmd
}

/// The floor's release: [`COMPARE_AND_DELETE`] by its hash.
pub fn compare_and_delete(release_sha: &str, key: &str, token: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(release_sha).arg(1).arg(key).arg(token);
    cmd
}

/// Loads [`COMPARE_AND_DELETE`] through `connection` (on a cluster, on every node); its hash.
async fn load_compare_and_delete(connection: &mut impl ConnectionLike) -> String {
    redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(COMPARE_AND_DELETE)
        .query_async(connection)
        .await
        .expect("SCRIPT LOAD")
}

/// The floor of a Redlock: one redis-rs multiplexed connection per master, each of the lock's
/// two commands sent to every master at once and decided by a majority of replies.
#[derive(Clone)]
pub struct RedlockFloor {
    masters: Vec<MultiplexedConnection>,
    release_sha: String,
}

impl RedlockFloor {
    /// The floor over `masters`, with the compare-and-delete script loaded on each.
    pub async fn new(mut masters: Vec<MultiplexedConnection>) -> Self {
        let mut release_sha = String::new();
        for master in &mut masters {
            release_sha = load_compare_and_delete(master).await;
        }
        Self {
            masters,
            release_sha,
        }
    }

    /// One lock cycle on `key`: `SET NX PX` on every master, then the compare-and-delete.
    pub async fn cycle(&mut self, key: &str) {
        let token = fresh_token();
        let quorum = self.masters.len() / 2 + 1;
        let set = set_nx(key, &token);
        let taken = join_all(self.masters.iter_mut().map(|master| {
            let set = &set;
            async move { set.query_async::<Option<String>>(master).await }
        }))
        .await;
        let taken = taken.iter().filter(|t| matches!(t, Ok(Some(_)))).count();
        assert!(taken >= quorum, "Redlock floor key {key} was busy");
        let del = compare_and_delete(&self.release_sha, key, &token);
        let deleted = join_all(self.masters.iter_mut().map(|master| {
            let del = &del;
            async move { del.query_async::<i64>(master).await }
        }))
        .await;
        let deleted = deleted.iter().filter(|d| matches!(d, Ok(1))).count();
        assert!(deleted >= quorum, "Redlock floor key {key} was not ours");
    }
}

/// The raw floor: RESP written and read by hand on one TCP connection, no client library.
pub struct RawConnection {
    stream: BufReader<TcpStream>,
    release_sha: String,
    request: Vec<u8>,
    reply: Vec<u8>,
}

impl RawConnection {
    pub async fn connect(server: SocketAddr, release_sha: &str) -> Self {
        let stream = TcpStream::connect(server).await.expect("raw connection");
        stream.set_nodelay(true).expect("TCP_NODELAY");
        Self {
            stream: BufReader::new(stream),
            release_sha: release_sha.to_owned(),
            request: Vec::with_capacity(256),
            reply: Vec::with_capacity(64),
        }
    }

    /// One lock cycle on `key`: take it, release it. Two round trips.
    pub async fn cycle(&mut self, key: &str) {
        let token = fresh_token();
        let sha = std::mem::take(&mut self.release_sha);
        let taken = self
            .call(&[
                b"SET",
                key.as_bytes(),
                token.as_bytes(),
                b"NX",
                b"PX",
                b"3000",
            ])
            .await;
        assert_eq!(taken, b"+OK\r\n", "raw floor key {key} was busy");
        let deleted = self
            .call(&[
                b"EVALSHA",
                sha.as_bytes(),
                b"1",
                key.as_bytes(),
                token.as_bytes(),
            ])
            .await;
        assert_eq!(
            deleted, b":1\r\n",
            "raw floor key {key} was not ours at release"
        );
        self.release_sha = sha;
    }

    /// Sends one command and reads its one-line reply (every reply here is one line).
    async fn call(&mut self, args: &[&[u8]]) -> &[u8] {
        self.request.clear();
        write!(self.request, "*{}\r\n", args.len()).expect("write to a Vec");
        for arg in args {
            write!(self.request, "${}\r\n", arg.len()).expect("write to a Vec");
            self.request.extend_from_slice(arg);
            self.request.extend_from_slice(b"\r\n");
        }
        self.stream
            .get_mut()
            .write_all(&self.request)
            .await
            .expect("raw write");
        self.reply.clear();
        self.stream
            .read_until(b'\n', &mut self.reply)
            .await
            .expect("raw read");
        &self.reply
    }
}

/// A distinct 32-hex-digit token, the size of a UUID: cheap, since the floor should cost only
/// what Redis and the wire cost.
pub fn fresh_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    format!(
        "{:032x}",
        u128::from(NEXT.fetch_add(1, Ordering::Relaxed)) << 17
    )
}
