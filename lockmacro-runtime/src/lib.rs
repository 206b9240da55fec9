//! Redis distributed locks for async Rust, as one attribute: `#[redis_lock]` takes a lock
//! named after an argument, keeps its lease alive while the function runs, cancels the function
//! when the lease cannot be kept, and releases the lock on every exit path.
//!
//! ```no_run
//! use lockmacro_runtime::{LockError, redis_lock};
//!
//! #[derive(Debug, thiserror::Error)]
//! enum AppError {
//!     #[error(transparent)]
//!     Lock(#[from] LockError), // what `#[redis_lock]` needs: `AppError: From<LockError>`
//! }
//!
//! #[redis_lock(prefix = "Business1", key = user_id, ttl = 3, max_renewals = 3)]
//! async fn charge(user_id: u64) -> Result<u64, AppError> {
//!     // Runs only while this process holds Redis key "Business1:<user_id>".
//!     Ok(user_id)
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), AppError> {
//!     // The default client: `REDIS_URL`, else redis://127.0.0.1:6379.
//!     println!("charged user {}", charge(1024).await?);
//!     Ok(())
//! }
//! ```
//!
//! Users depend on this crate alone: it re-exports the attribute from `lockmacro`. In
//! `Cargo.toml`, from the repository until the crates are on crates.io:
//!
//! ```toml
//! [dependencies]
//! lockmacro-runtime = { git = "https://github.com/lockmacro/lockmacro" }
//! # once published: lockmacro-runtime = "0.1"
//! tokio = { version = "1", features = ["full"] }
//! thiserror = "2"   # for your own error type, as above
//!
//! [dev-dependencies]
//! # In-memory locks for tests, and tokio's paused clock.
//! lockmacro-runtime = { git = "https://github.com/lockmacro/lockmacro", features = ["test-util"] }
//! tokio = { version = "1", features = ["full", "test-util"] }
//! ```
//!
//! | piece | where |
//! |---|---|
//! | the attribute | [`redis_lock`] |
//! | the client: connections and one watchdog thread | [`LockClient`], [`set_default_client`] |
//! | the programmatic API | [`LockClient::run_locked`], [`LockClient::acquire`], [`Lease`]; several keys at once: [`LockClient::run_locked_many`], [`LockClient::acquire_many`] |
//! | inside locked work | [`LockContext`] |
//! | inspecting and managing locks | [`LockClient::inspect`], [`LockClient::list`], [`LockClient::force_release`], [`LockClient::watch`]; a live locks page to mount in an axum app: `axum::locks_page` (feature `axum`) |
//! | operating it | [`LockClient::health`], [`LockClient::shutdown`] |
//! | errors | [`LockError`] |
//!
//! # Features
//!
//! Named on the dependency line: `features = ["axum", "metrics"]`, or `default-features = false`
//! for no rustls at all.
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `tls` | yes | `rediss://` URLs through rustls, beside whichever rustls provider the process uses |
//! | `tls-insecure` | no | `#insecure` at the end of a `rediss://` URL turns certificate verification off (tests only); opt-in, since it turns on redis-rs's `tls-rustls-insecure` for the whole application |
//! | `axum` | no | `IntoResponse` for [`LockError`]: 409 Conflict (with `Retry-After` when known) when busy, 500 for the programmer's errors (`Config`, `InvalidKey`, `InvalidOptions`, `NotALock`), 503 with `Retry-After` otherwise; the same as JSON (`axum::JsonLockError`) or in a body of the app's own (`axum::LockErrorResponse`); the live locks page, a `Router` to mount (`axum::locks_page`) |
//! | `metrics` | no | counters, histograms and gauges through the `metrics` 0.24 facade |
//! | `test-util` | no | `LockClient::in_memory`: locks in the process, for tests, under paused time too (tokio's own `test-util` feature gives `#[tokio::test(start_paused = true)]`) |
//!
//! Without `tls` (`default-features = false`), a `rediss://` URL is a configuration error.
//!
//! # Cancellation
//!
//! Locked work is cancelled by dropping it at its next `.await`. Work that blocks a thread
//! without reaching an `.await` cannot be cancelled and may outrun its lease.
//!
//! # Panics
//!
//! A locked call on a tokio runtime built without timers or IO panics with tokio's own message,
//! which names the builder call to add (`enable_all()`); `#[tokio::main]` and `#[tokio::test]`
//! enable both. The library does not probe the runtime for them (that would mean catching the
//! panic and silencing the process's panic hook, which belongs to the application). Outside
//! any tokio runtime a locked call returns [`LockError::Config`].
#![warn(missing_docs, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

// Each group uses only itself and the groups above it, and no module imports one that imports
// it back, directly or not.
// Bottom: time, what a runtime offers, keys, options, errors.
mod clock;
mod error;
mod health;
mod key;
mod metrics;
mod options;
mod rt;
mod sync;
#[cfg(feature = "sim")]
mod world;
// The seam and the deployments behind it: the only users of `redis`.
mod store;
// The simulator: worlds of processes over a simulated network, to a store or a simulated Redis.
#[cfg(feature = "sim")]
mod sim;
// A lease's shared state, and the right to release it.
mod right;
mod state;
// The watchdog, the waiters and the engine that ties them together.
mod background;
mod engine;
mod renewal;
mod waiters;
// On top: the guard, the task's held leases, the client.
mod builder;
mod client;
mod context;
mod default_client;
mod inspect;
mod lease;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub mod axum;

#[doc(hidden)]
pub mod __private;

/// The deterministic simulator's entry points (feature `sim`): not an API for applications.
#[cfg(feature = "sim")]
#[doc(hidden)]
pub mod __sim {
    pub use crate::sim::net::{Link, Network};
    pub use crate::sim::redis as redis_node;
    pub use crate::sim::{Backing, Stream, draw, run, sometimes, stream, take_coverage};

    /// A new in-memory store, for [`LockClient::simulated`](crate::LockClient::simulated).
    pub fn memory() -> crate::MemoryHooks {
        crate::store::memory::MemoryStore::default().hooks()
    }
}

// Named in the compiler's messages about misuse of the attribute: at the root, so a message
// says `LeaseLength`, not the private module's path.
#[doc(hidden)]
pub use __private::v0_1_0::{IntoError, LeaseLength, LockResult};

pub use builder::LockClientBuilder;
pub use client::LockClient;
pub use context::LockContext;
pub use default_client::{default_client, set_default_client};
pub use error::{LockError, LostReason};
pub use health::{Health, NodeHealth, NodeRole};
pub use inspect::{Holder, LockEvent, LockInfo, LockStream, WATCH_POLL, Waiter};
pub use key::{MAX_KEY_LEN, MAX_KEYS};
pub use lease::Lease;
#[doc(inline)]
pub use lockmacro::redis_lock;
pub use options::{LockKind, LockOptions, MAX_TTL, MIN_TTL};
#[cfg(feature = "test-util")]
pub use store::memory::MemoryHooks;
pub use store::protocol;

/// The redis-rs crate this one is built on (1.x), for [`LockClient::builder_from_client`] and
/// the [`LockError::Redis`] sources: `lockmacro_runtime::redis::Client` is the type those
/// take, whatever version of `redis` the application itself depends on.
pub use redis;

// README.md's examples are built as a new application copied from it, by `tests/readme.rs`.
