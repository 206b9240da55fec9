//! Test kit: real `redis-server` processes on free loopback ports, and a TCP fault proxy.
//!
//! Lock behaviour depends on what Redis and the network do, so the integration tests run against
//! real servers rather than mocks: [`RedisServer`] owns one `redis-server` child process (which can
//! be killed, restarted on the same port, or frozen with `SIGSTOP`), and [`FaultProxy`] sits between
//! a client and a server to delay, swallow or blackhole traffic, or reset every connection.
//!
//! Both are test support: they panic with a message saying what went wrong instead of returning
//! errors, and both clean up after themselves on drop so that no process or socket outlives a test.
//!
//! ```no_run
//! # async fn demo() {
//! use std::time::Duration;
//! use testkit::{Fault, FaultProxy, RedisServer};
//!
//! let server = RedisServer::start();
//! let proxy = FaultProxy::start(server.addr()).await;
//! // Point the code under test at `proxy.url()`, then break the network:
//! proxy.set(Fault::Delay(Duration::from_millis(200)));
//! proxy.set(Fault::Blackhole);
//! proxy.heal();
//! # }
//! ```

mod cluster;
mod deployment;
mod fenced_storage;
mod proxy;
pub mod safety;
mod sentinel;
mod server;
mod tls;
pub mod turns;

pub use cluster::{Migration, RedisCluster};
pub use deployment::{Cluster, Deployment, Foreign, InMemory, Redlock, Sentinel, SingleRedis};
pub use fenced_storage::{applied_writes, fenced_read, fenced_write};
pub use proxy::{Fault, FaultProxy};
pub use sentinel::{RedisSentinel, SERVICE as SENTINEL_SERVICE};
pub use server::{RedisServer, ReplicaCut};
pub use tls::{TlsCertificates, tls_server};

/// `CLOCK_MONOTONIC` in nanoseconds: the one clock a test, its worker processes and a safety
/// campaign share, so intervals recorded in different processes compare directly.
pub fn monotonic_ns() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec to write into.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}
