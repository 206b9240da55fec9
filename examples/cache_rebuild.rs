//! Seed 001's read-write lock: a cache entry rebuilt under `mode = write` while readers share it
//! under `mode = read`.
//!
//! Run with `REDIS_URL=redis://127.0.0.1:6379 cargo run --example cache_rebuild`. It prints a
//! timeline: three readers inside at once; a rebuild that waits for them to leave, and, once it
//! waits, keeps new readers out; the readers that came meanwhile going in together when it is
//! done, and reading the new value.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockmacro_runtime::{LockClient, LockError, redis_lock};
use tokio::sync::RwLock;

/// The cache: an entry that may be stale, kept where every task sees it.
struct Catalogue {
    locks: LockClient,
    entry: RwLock<String>,
    started: Instant,
}

impl Catalogue {
    /// Reads the entry under a read lock: readers share the key `catalogue:books`.
    #[redis_lock(prefix = "catalogue", key = "books", mode = read, wait = "10s", client = self.locks)]
    async fn read(&self, reader: u32) -> Result<String, LockError> {
        self.say(&format!("reader {reader} in"));
        tokio::time::sleep(Duration::from_millis(300)).await;
        let entry = self.entry.read().await.clone();
        self.say(&format!("reader {reader} out, read {entry:?}"));
        Ok(entry)
    }

    /// Rebuilds the entry under the write lock: alone, once every reader has left.
    #[redis_lock(prefix = "catalogue", key = "books", mode = write, wait = "10s", client = self.locks)]
    async fn rebuild(&self) -> Result<(), LockError> {
        self.say("rebuild in: no reader inside");
        tokio::time::sleep(Duration::from_millis(500)).await;
        *self.entry.write().await = "books v2".into();
        self.say("rebuild out");
        Ok(())
    }

    fn say(&self, line: &str) {
        println!("[{:>5.2}s] {line}", self.started.elapsed().as_secs_f64());
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let catalogue = Arc::new(Catalogue {
        locks: LockClient::connect(&url).await?,
        entry: RwLock::new("books v1".into()),
        started: Instant::now(),
    });
    let mut tasks = tokio::task::JoinSet::new();
    for reader in 1..=3 {
        let catalogue = catalogue.clone();
        tasks.spawn(async move { catalogue.read(reader).await.map(drop) });
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    catalogue.say("rebuild asks for the write lock");
    let rebuilding = catalogue.clone();
    tasks.spawn(async move { rebuilding.rebuild().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    for reader in 4..=5 {
        catalogue.say(&format!("reader {reader} arrives while the rebuild waits"));
        let catalogue = catalogue.clone();
        tasks.spawn(async move { catalogue.read(reader).await.map(drop) });
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    catalogue.say("done");
    Ok(())
}
