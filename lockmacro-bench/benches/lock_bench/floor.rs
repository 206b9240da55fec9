//! W0, the floor: a lock cycle done by hand on raw redis-rs, with nothing around it. One cycle is
//! `SET key token NX PX ttl` and then the classic compare-and-delete script by `EVALSHA`: the
//! two round trips no Redis lock can do without.

use std::sync::atomic::{AtomicU64, Ordering};

use redis::aio::MultiplexedConnection;

/// The classic compare-and-delete (as in the Redis docs and rslock).
const COMPARE_AND_DELETE: &str = r#"
if redis.call("GET", KEYS[1]) == ARGV[1] then
  return redis.call("DEL", KEYS[1])
end
return 0
"#;

/// Cycles per pipelined batch: the throughput ceiling of one connection.
pub const PIPELINE_DEPTH: usize = 16;

/// A connection with the compare-and-delete script loaded.
#[derive(Clone)]
pub struct Floor {
    connection: MultiplexedConnection,
    release_sha: String,
}

impl Floor {
    pub async fn new(mut connection: MultiplexedConnection) -> Self {
        let release_sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(COMPARE_AND_DELETE)
            .query_async(&mut connection)
            .await
            .expect("SCRIPT LOAD");
        Self {
            connection,
            release_sha,
        }
    }

    /// One lock cycle on `key`: take it, release it. Two round trips.
    pub async fn cycle(&mut self, key: &str) {
        let token = fresh_token();
        let taken: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(3000)
            .query_async(&mut self.connection)
            .await
            .expect("SET NX PX");
        assert!(taken.is_some(), "floor key {key} was busy");
        let deleted: i64 = redis::cmd("EVALSHA")
            .arg(&self.release_sha)
            .arg(1)
            .arg(key)
            .arg(&token)
            .query_async(&mut self.connection)
            .await
            .expect("EVALSHA compare-and-delete");
        assert_eq!(deleted, 1, "floor key {key} was not ours at release");
    }

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

/// A distinct 32-hex-digit token, the size of a UUID: cheap, since the floor should cost only
/// what Redis and the wire cost.
fn fresh_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    format!(
        "{:032x}",
        u128::from(NEXT.fetch_add(1, Ordering::Relaxed)) << 17
    )
}
