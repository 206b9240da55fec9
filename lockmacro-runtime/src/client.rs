//! `LockClient`: where locks are taken, and how a client is configured for a deployment.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::builder::{LockClientBuilder, Parts};
use crate::context;
use crate::engine::Engine;
use crate::error::LockError;
use crate::health::Health;
use crate::key::{check_key, key_list};
use crate::lease::{self, Lease};
use crate::metrics::End;
use crate::options::LockOptions;
use crate::store::Deployment;

/// A handle to one Redis deployment for taking locks. Cheap to clone: clones share connections
/// and one watchdog thread, which ends when the last clone (and the last lease) is dropped.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockmacro_runtime::LockError> {
/// use lockmacro_runtime::{LockClient, LockOptions};
///
/// let locks = LockClient::connect("redis://127.0.0.1:6379").await?;
/// let total = locks
///     .run_locked("invoices:2026-11", LockOptions::new(), async { 40 + 2 })
///     .await?;
/// assert_eq!(total, 42);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    pub(crate) engine: Arc<Engine>,
    pub(crate) describe: Arc<Description>,
    /// The store of an in-memory client, for its test hooks.
    #[cfg(feature = "test-util")]
    pub(crate) memory: Option<crate::store::memory::MemoryStore>,
}

/// What `Debug` shows of a client: never a password.
#[derive(Debug)]
pub(crate) struct Description {
    pub(crate) deployment: String,
    pub(crate) scan_interval: Duration,
    pub(crate) response_timeout: Duration,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("deployment", &self.describe.deployment)
            .field("scan_interval", &self.describe.scan_interval)
            .field("response_timeout", &self.describe.response_timeout)
            .finish_non_exhaustive()
    }
}

impl LockClient {
    /// Connects with the default settings.
    ///
    /// # Errors
    /// As [`LockClientBuilder::build`].
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder(url).build().await
    }

    /// Starts configuring a client for `url`:
    ///
    /// - one server: `redis://[user[:password]@]host[:port][/db]`, `rediss://` for TLS
    ///   (`valkey://` and `valkeys://` too);
    /// - a master found through Sentinel:
    ///   `redis+sentinel://[user[:password]@]host:26379[,host:26379...]/service[/db]`, or
    ///   `rediss+sentinel://` for TLS. The user and password are the master's; the sentinels
    ///   are asked in the order given.
    pub fn builder(url: &str) -> LockClientBuilder {
        LockClientBuilder::new(Deployment::Url(url.to_owned()))
    }

    /// Starts configuring a client for the one server a redis-rs 1.x client the application
    /// already has points at (its address, credentials, database and TLS settings are used as
    /// they are; the TLS root set on the builder does not apply).
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// use lockmacro_runtime::{LockClient, redis};
    ///
    /// // `lockmacro_runtime::redis` is the redis-rs this crate is built on, whatever version of
    /// // `redis` the application itself depends on.
    /// let redis = redis::Client::open("redis://127.0.0.1:6379")?;
    /// let locks = LockClient::builder_from_client(redis.clone()).build().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder_from_client(client: redis::Client) -> LockClientBuilder {
        LockClientBuilder::new(Deployment::from(client))
    }

    /// Starts configuring a client for a Redis Cluster, given some of its nodes (`redis://` or
    /// `rediss://` URLs, with the user and password every node shares). The client learns the
    /// rest of the cluster from them.
    pub fn cluster_builder(seeds: impl IntoIterator<Item = impl AsRef<str>>) -> LockClientBuilder {
        LockClientBuilder::new(Deployment::Cluster(urls(seeds)))
    }

    /// Starts configuring a client for a Redlock quorum: one lock held on a majority of
    /// `masters`, an odd number (3 or more) of independent Redis servers (`redis://` or
    /// `rediss://` URLs; anything else is a [`LockError::Config`] at build).
    ///
    /// A lock is taken when a majority took it with time to spare (validity = ttl − elapsed −
    /// drift), renewed while a majority confirms it, and released on every master. `Busy` means a
    /// majority names another holder; when no majority answers alike the call fails with
    /// [`LockError::NoQuorum`] (never `Busy`, never taken). Fencing tokens are refused
    /// ([`LockError::InvalidOptions`]): the largest counter of a quorum need not grow from one
    /// holder to the next.
    pub fn redlock_builder(
        masters: impl IntoIterator<Item = impl AsRef<str>>,
    ) -> LockClientBuilder {
        LockClientBuilder::new(Deployment::Redlock(urls(masters)))
    }

    /// A client whose locks live in this process: for tests of code that takes locks, with no
    /// Redis running. Clones share its locks; two `in_memory()` clients are two independent
    /// stores, as two Redis servers would be.
    ///
    /// It keeps Redis's semantics (leases expire, the watchdog renews them, `max_renewals`,
    /// `Busy`, `Lost`, waiting woken on release, fencing, reentrancy, release on drop), and its
    /// watchdog runs on the runtime that uses it, so under `#[tokio::test(start_paused = true)]`
    /// a test crosses a 30 s lease in milliseconds (`start_paused` is tokio's: it needs tokio's
    /// own `test-util` feature in your `[dev-dependencies]`). [`memory_hooks`](Self::memory_hooks)
    /// provokes the rare paths.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread", start_paused = true)] async fn main() {
    /// let locks = LockClient::in_memory();
    /// let options = LockOptions::new().ttl(Duration::from_secs(30)).max_renewals(3);
    /// let outcome = locks
    ///     .run_locked("reports:nightly", options, std::future::pending::<()>())
    ///     .await;
    /// // Four leases of 30 s each, in no time at all.
    /// assert!(matches!(outcome, Err(LockError::RenewalsExhausted { renewals: 3, .. })));
    /// # }
    /// ```
    #[cfg(feature = "test-util")]
    pub fn in_memory() -> Self {
        Self::over_memory(crate::store::memory::MemoryStore::default())
    }

    /// A client of its own over an in-memory `store`.
    #[cfg(feature = "test-util")]
    pub(crate) fn over_memory(store: crate::store::memory::MemoryStore) -> Self {
        Self::over_memory_as(
            store,
            crate::protocol::Origin::of_this_process(None),
            crate::clock::Wall::default(),
        )
    }

    /// Simulated process `n` of the deterministic simulator (feature `sim`), over `store` (an
    /// in-memory store's hooks, a link of the simulated network to one, or to the simulated
    /// Redis): runs on the caller's runtime, names itself `sim-n` (`pid` `n`, app `sim`) in its
    /// lock values, and reads a wall clock `wall_skew_ms` off the simulation's. Not an API for
    /// applications.
    #[cfg(feature = "sim")]
    #[doc(hidden)]
    pub fn simulated(store: impl Into<crate::sim::Backing>, n: u32, wall_skew_ms: i64) -> Self {
        let backing = store.into();
        Self::over_store_as(
            backing.store,
            backing.memory,
            crate::protocol::Origin::new(&format!("sim-{n}"), n, "sim"),
            crate::clock::Wall::skewed(wall_skew_ms),
        )
    }

    #[cfg(feature = "test-util")]
    fn over_memory_as(
        store: crate::store::memory::MemoryStore,
        origin: crate::protocol::Origin,
        wall: crate::clock::Wall,
    ) -> Self {
        Self::over_store_as(Arc::new(store.clone()), Some(store), origin, wall)
    }

    /// A client over `store`, in front of the in-memory `memory` (its test hooks'), if any.
    #[cfg(feature = "test-util")]
    fn over_store_as(
        store: Arc<dyn crate::store::Store>,
        memory: Option<crate::store::memory::MemoryStore>,
        origin: crate::protocol::Origin,
        wall: crate::clock::Wall,
    ) -> Self {
        let client = Self::assemble(Parts {
            store,
            background: crate::background::Background::on_callers_runtime(),
            timing: crate::engine::Timing {
                scan_interval: Duration::from_secs(2),
                response_timeout: Duration::from_secs(1),
                shutdown_timeout: crate::builder::DEFAULT_SHUTDOWN_TIMEOUT,
                wall,
            },
            deployment: "in memory".to_owned(),
            origin,
        });
        Self { memory, ..client }
    }

    /// The one place a client is put together, whatever its deployment.
    fn assemble(parts: Parts) -> Self {
        let describe = Description {
            deployment: parts.deployment,
            scan_interval: parts.timing.scan_interval,
            response_timeout: parts.timing.response_timeout,
        };
        Self {
            engine: Arc::new(Engine::new(
                parts.store,
                parts.background,
                parts.timing,
                parts.origin,
            )),
            describe: Arc::new(describe),
            #[cfg(feature = "test-util")]
            memory: None,
        }
    }

    /// Without the `test-util` feature there is no in-memory client: this stand-in only turns a
    /// call into a compile error that says which feature to enable.
    ///
    #[cfg_attr(
        not(feature = "test-util"),
        doc = "```compile_fail\nlet locks = lockmacro_runtime::LockClient::in_memory();\n```"
    )]
    #[cfg(not(feature = "test-util"))]
    #[doc(hidden)]
    pub fn in_memory() -> Self
    where
        for<'a> &'a (): NeedsTestUtil,
    {
        unreachable!("`NeedsTestUtil` has no implementation")
    }

    /// The test hooks of an in-memory client ([`in_memory`](Self::in_memory)); `None` for others.
    #[cfg(feature = "test-util")]
    pub fn memory_hooks(&self) -> Option<crate::MemoryHooks> {
        self.memory.as_ref().map(|store| store.hooks())
    }

    /// Runs `work` while holding the lock `key`, the programmatic twin of `#[redis_lock]`:
    /// acquire, register with the watchdog, run (cancelled when the lease ends), release.
    ///
    /// A call made while the current task already holds `key` through this client re-enters:
    /// it runs `work` without a second acquisition and leaves the release to the outer call.
    /// It re-enters when the lock held includes the one asked for: an exclusive lock includes
    /// every kind (a writer may read), a read lock includes reads, permits include permits. A
    /// reader asking for the exclusive lock of its own key would wait for itself forever: that
    /// is an [`LockError::InvalidOptions`] at once.
    ///
    /// # Errors
    /// [`LockError::Busy`] when another owner holds the key (after `wait`, if set),
    /// [`LockError::Redis`] when Redis fails while acquiring (the work never ran),
    /// [`LockError::RenewalsExhausted`] or [`LockError::Lost`] when the work was cut short,
    /// [`LockError::InvalidKey`] for an empty or over-long key, [`LockError::InvalidOptions`]
    /// for options a lock cannot be taken with (see [`LockOptions`]'s validation), both before
    /// any I/O.
    ///
    /// # Panics
    /// When called on a tokio runtime built without timers or IO (tokio's own panic names the
    /// builder call to add: `enable_time`, `enable_io`, or `enable_all`). Outside any tokio
    /// runtime it is a [`LockError::Config`] instead.
    ///
    /// # Cancellation safety
    /// Dropping the future at any point releases the lock (in the background) if it was taken.
    pub async fn run_locked<F: Future>(
        &self,
        key: impl Into<String>,
        options: LockOptions,
        work: F,
    ) -> Result<F::Output, LockError> {
        self.run_locked_judged(key, options, work, |_| false).await
    }

    /// [`run_locked`](Self::run_locked), with `failed` telling which outputs count as errors in
    /// the metrics (`end = err`).
    pub(crate) async fn run_locked_judged<F: Future>(
        &self,
        key: impl Into<String>,
        options: LockOptions,
        work: F,
        failed: impl FnOnce(&F::Output) -> bool,
    ) -> Result<F::Output, LockError> {
        let key = check_key(key.into())?;
        options.validate()?;
        if let Some(held) = context::held(self.engine.id, &key) {
            return if held.grants(options.kind) {
                Ok(work.await)
            } else {
                Err(LockError::InvalidOptions {
                    message: format!(
                        "`{key}` is held by this task as a {} lock, which does not include a {} lock; \
                         release it before taking the other (a reader cannot become its key's writer)",
                        held.name(),
                        options.kind.name()
                    ),
                })
            };
        }
        // The span wraps the acquire and the release as well as the work: every event of the
        // call (taken, waited, released, lost) says which lock it is about. Two arms rather
        // than a helper taking the call: a wrapper future holding both forms doubled the
        // state of nested calls (a nested test overflowed its stack).
        match lease::lock_span(&key) {
            Some(span) => {
                let locked = async {
                    let lease = self.acquire_checked(key, options).await?;
                    run_and_release(lease, work, failed).await
                };
                locked.instrument(span).await
            }
            None => {
                let lease = self.acquire_checked(key, options).await?;
                run_and_release(lease, work, failed).await
            }
        }
    }

    /// Takes the lock `key` and returns its [`Lease`], renewed by the watchdog until released
    /// or dropped. Use [`Lease::run`] to have work cancelled when the lease ends.
    ///
    /// With [`LockOptions::wait`], a busy lock is waited for: the waiter wakes when the holder
    /// releases (announced through Redis pub/sub), or at the latest when the holder's lease
    /// would end (a holder that died announces nothing).
    ///
    /// # Errors
    /// As [`run_locked`](Self::run_locked) for acquiring.
    ///
    /// # Panics
    /// As [`run_locked`](Self::run_locked): on a tokio runtime without timers or IO.
    ///
    /// # Cancellation safety
    /// If dropped while the `SET` is in flight, the key (if it was set) is released in the
    /// background, after the `SET` on the same connection.
    pub async fn acquire(
        &self,
        key: impl Into<String>,
        options: LockOptions,
    ) -> Result<Lease, LockError> {
        self.acquire_checked(check_key(key.into())?, options).await
    }

    /// Runs `work` while holding every lock of `keys` at once, the programmatic twin of
    /// `#[redis_lock(key = [...])]`: a transfer holding both accounts, a job holding the set of
    /// resources it touches.
    ///
    /// All or none: the keys are taken in one atomic attempt (one script call on one Redis or
    /// Sentinel; slot by slot in slot order on a Cluster, with the slots taken undone when
    /// one is busy; the whole set on each Redlock master), so `[a, b]` and `[b, a]` exclude each
    /// other and never deadlock. Equal keys count once; at most [`MAX_KEYS`](crate::MAX_KEYS)
    /// distinct keys. The locks are exclusive: `read`, `permits`, `fencing` and `fair` options
    /// are refused. One lease covers every key: renewed together, lost when any key is lost,
    /// released together (each release announced to its waiters). With
    /// [`LockOptions::wait`], a busy set is waited for, woken by the release of the key that
    /// kept it out. [`LockContext::keys`](crate::LockContext::keys) lists the keys inside.
    ///
    /// A list of one key (after repeats are dropped) is [`run_locked`](Self::run_locked) on it.
    /// A call made while the current task already holds every one of `keys` through this
    /// client (in one lock or several) re-enters; holding only some of them is an
    /// [`LockError::InvalidOptions`], since taking the rest while holding those is how
    /// deadlocks start: take the whole set in one call.
    ///
    /// ```no_run
    /// # async fn demo(locks: lockmacro_runtime::LockClient) -> Result<(), lockmacro_runtime::LockError> {
    /// use lockmacro_runtime::LockOptions;
    ///
    /// locks
    ///     .run_locked_many(["accounts:17", "accounts:4"], LockOptions::new(), async {
    ///         // move money between accounts 17 and 4
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`run_locked`](Self::run_locked); [`LockError::Busy`] names the first busy key found;
    /// [`LockError::InvalidKey`] for an empty list, an empty or over-long key, or more than
    /// [`MAX_KEYS`](crate::MAX_KEYS) distinct keys, before any I/O.
    ///
    /// # Cancellation safety
    /// As [`run_locked`](Self::run_locked): dropping the future releases every key taken.
    pub async fn run_locked_many<F: Future>(
        &self,
        keys: impl IntoIterator<Item = impl Into<String>>,
        options: LockOptions,
        work: F,
    ) -> Result<F::Output, LockError> {
        let keys = key_list(keys.into_iter().map(Into::into))?;
        self.run_locked_many_judged(keys, options, work, |_| false)
            .await
    }

    /// [`run_locked_many`](Self::run_locked_many) over checked, distinct `keys`, with `failed`
    /// telling which outputs count as errors in the metrics.
    pub(crate) async fn run_locked_many_judged<F: Future>(
        &self,
        mut keys: Vec<String>,
        options: LockOptions,
        work: F,
        failed: impl FnOnce(&F::Output) -> bool,
    ) -> Result<F::Output, LockError> {
        if keys.len() == 1 {
            let key = keys.swap_remove(0);
            return self.run_locked_judged(key, options, work, failed).await;
        }
        options.validate()?;
        let held: Vec<_> = keys
            .iter()
            .map(|key| context::held(self.engine.id, key))
            .collect();
        if held.iter().any(Option::is_some) {
            return match held.iter().position(Option::is_none) {
                None if held.iter().flatten().all(|kind| kind.grants(options.kind)) => {
                    Ok(work.await)
                }
                None => Err(LockError::InvalidOptions {
                    message: format!(
                        "some of {keys:?} are held by this task as locks that do not include an \
                         exclusive lock; release them before taking the set"
                    ),
                }),
                Some(missing) => Err(LockError::InvalidOptions {
                    message: format!(
                        "this task holds some of {keys:?} but not `{}`: taking the rest while \
                         holding some is how deadlocks start; take the whole set in one call",
                        keys[missing]
                    ),
                }),
            };
        }
        match lease::lock_span(&keys[0]) {
            Some(span) => {
                let locked = async {
                    let lease = self.acquire_many_checked(keys, options).await?;
                    run_and_release(lease, work, failed).await
                };
                locked.instrument(span).await
            }
            None => {
                let lease = self.acquire_many_checked(keys, options).await?;
                run_and_release(lease, work, failed).await
            }
        }
    }

    /// Takes every lock of `keys` at once and returns the one [`Lease`] that covers them, as
    /// [`run_locked_many`](Self::run_locked_many) does; [`Lease::keys`] lists them.
    ///
    /// # Errors
    /// As [`run_locked_many`](Self::run_locked_many) for acquiring.
    ///
    /// # Cancellation safety
    /// If dropped while the attempt is in flight, every key it may have taken is released in
    /// the background.
    pub async fn acquire_many(
        &self,
        keys: impl IntoIterator<Item = impl Into<String>>,
        options: LockOptions,
    ) -> Result<Lease, LockError> {
        let keys = key_list(keys.into_iter().map(Into::into))?;
        self.acquire_many_checked(keys, options).await
    }

    async fn acquire_many_checked(
        &self,
        mut keys: Vec<String>,
        options: LockOptions,
    ) -> Result<Lease, LockError> {
        if keys.len() == 1 {
            return self.acquire_checked(keys.swap_remove(0), options).await;
        }
        let state = self.engine.acquire_many(keys, &options).await?;
        Ok(Lease::new(state, self.engine.clone()))
    }

    async fn acquire_checked(&self, key: String, options: LockOptions) -> Result<Lease, LockError> {
        let state = self.engine.acquire(key, &options).await?;
        Ok(Lease::new(state, self.engine.clone()))
    }

    /// Shuts the client down, for a graceful exit: no lock is taken through it (or its clones)
    /// any more; work held under its leases is cancelled at its next `.await` and returns
    /// [`LockError::ShutDown`], as do calls waiting for a lock; every lease is released and the
    /// releases confirmed, bounded by the shutdown timeout (10 s unless
    /// [`LockClientBuilder::shutdown_timeout`] says otherwise). A second call does nothing.
    ///
    /// Without it, a process that exits leaves its locks to expire with their leases (30 s by
    /// default); with it, the next owner takes them at once. Wire it to your server's graceful
    /// shutdown, as `examples/axum_handler.rs` does with axum's `with_graceful_shutdown`.
    ///
    /// # Errors
    /// [`LockError::Redis`] when some releases were not confirmed in time: they are retried in
    /// the background, and expire with their leases at the latest.
    pub async fn shutdown(&self) -> Result<(), LockError> {
        self.engine.shutdown().await
    }

    /// Whether the deployment answers, server by server, and how fast: a `PING` to the server
    /// (one Redis; on Sentinel, the master the sentinels name now), to each Redlock master, or
    /// to each node `CLUSTER NODES` lists. [`Health::is_ready`] says whether locks can be taken:
    /// the server answers, a majority of the masters answer (Redlock), every slot's master
    /// answers (Cluster). Never an error: a server that does not answer is shown with why.
    /// Bounded by the connect and response timeouts; works on a client built with
    /// [`build_lazy`](LockClientBuilder::build_lazy) while Redis is down, which makes it a
    /// readiness probe.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), lockmacro_runtime::LockError> {
    /// use lockmacro_runtime::LockClient;
    ///
    /// let locks = LockClient::redlock_builder(["redis://a:6379", "redis://b:6379", "redis://c:6379"])
    ///     .build_lazy()?;
    /// let health = locks.health().await;
    /// println!("{health}");
    /// // redlock: ready, 2 of 3 masters answer (2 needed)
    /// //   a:6379  master  answers in 0.21 ms
    /// //   ...
    /// if !health.is_ready() {
    ///     std::process::exit(1);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancellation safety
    /// Cancel-safe: it only reads.
    pub async fn health(&self) -> Health {
        self.engine.store().health().await
    }

    /// How many leases this client's watchdog is keeping alive right now.
    pub fn held_leases(&self) -> usize {
        self.engine.held_leases()
    }

    /// How many callers of this client (and its clones) are parked waiting for a release of
    /// `key` right now: they found it busy and sleep until it is released, announced or not,
    /// or until its holder's lease would have run out.
    pub fn waiting(&self, key: &str) -> usize {
        self.engine.parked_waiters(key)
    }
}

/// Here rather than beside the other hooks: the store knows no client.
#[cfg(feature = "test-util")]
impl crate::MemoryHooks {
    /// Another client over the same store, as another process would have: its own watchdog,
    /// waiters and reentrancy (clones of one client share those).
    pub fn client(&self) -> LockClient {
        LockClient::over_memory(self.store.clone())
    }
}

impl LockClientBuilder {
    /// Builds the client, opens its connections (the caller's, the watchdog's and the release
    /// subscriber's) and checks that Redis answers.
    ///
    /// # Errors
    /// [`LockError::Config`] for a malformed URL, [`LockError::Redis`] when Redis cannot be reached
    /// or rejects the credentials within the timeouts.
    ///
    /// # Panics
    /// On a tokio runtime built without timers or IO: tokio's own panic names the builder call
    /// to add (`enable_all`).
    pub async fn build(self) -> Result<LockClient, LockError> {
        let client = self.build_lazy()?;
        client.engine.connect().await?;
        Ok(client)
    }

    /// Builds the client without any I/O; connections open on first use. An application
    /// built this way starts while Redis is down: its locked calls fail with
    /// [`LockError::Redis`] (503 with the `axum` feature) until Redis answers again.
    ///
    /// # Errors
    /// [`LockError::Config`] for a malformed URL or when the watchdog thread cannot start.
    pub fn build_lazy(self) -> Result<LockClient, LockError> {
        Ok(LockClient::assemble(self.parts()?))
    }
}

/// Bounds `LockClient::in_memory` when the `test-util` feature is off, so that a call is a
/// compile error saying which feature to enable. Nothing implements it.
#[diagnostic::on_unimplemented(
    message = "`LockClient::in_memory()` needs the `test-util` feature of `lockmacro-runtime`",
    label = "in-memory locks are only built with the `test-util` feature",
    note = "add `features = [\"test-util\"]` to the `lockmacro-runtime` line under `[dev-dependencies]` in Cargo.toml"
)]
pub trait NeedsTestUtil {}

fn urls(urls: impl IntoIterator<Item = impl AsRef<str>>) -> Vec<String> {
    urls.into_iter()
        .map(|url| url.as_ref().to_owned())
        .collect()
}

/// Runs `work` under `lease`, records how it ended (`failed` tells an output that counts as an
/// error), and releases the lease, confirmed or retried in the background.
async fn run_and_release<F: Future>(
    lease: Lease,
    work: F,
    failed: impl FnOnce(&F::Output) -> bool,
) -> Result<F::Output, LockError> {
    let outcome = lease.run_unspanned(work).await;
    if let Ok(output) = &outcome {
        lease.record_end(if failed(output) { End::Err } else { End::Ok });
    }
    if let Err(err) = lease.release().await {
        tracing::warn!(error = %err, "lock release not confirmed; retrying in the background");
    }
    outcome
}
