//! `LockClient`: where locks are taken, and what owns the connections and the watchdog.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::backend::millis;
use crate::backend::{AcquireRequest, Acquired, Backend};
use crate::context;
use crate::error::LockError;
use crate::key::check_key;
use crate::lease::{Lease, LeaseState, drift};
use crate::options::LockOptions;
use crate::renewal::RenewalQueue;
use crate::waiters::WaitQueue;

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
    inner: Arc<Inner>,
}

struct Inner {
    id: u64,
    redacted_url: String,
    scan_interval: Duration,
    backend: Arc<Backend>,
    renewals: RenewalQueue,
    waits: WaitQueue,
}

impl std::fmt::Debug for LockClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClient")
            .field("url", &self.inner.redacted_url)
            .field("scan_interval", &self.inner.scan_interval)
            .field("response_timeout", &self.inner.backend.response_timeout())
            .finish_non_exhaustive()
    }
}

/// Configures a [`LockClient`]; from [`LockClient::builder`].
#[derive(Clone)]
#[must_use]
pub struct LockClientBuilder {
    url: String,
    scan_interval: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    #[cfg(feature = "tls")]
    tls_root_certificate: Option<Vec<u8>>,
}

impl std::fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("url", &redact(&self.url))
            .field("scan_interval", &self.scan_interval)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

impl LockClientBuilder {
    /// How often the watchdog scans for leases to extend (default 2 s). Leases too short for
    /// this period get wake-ups of their own, so it only trades round trips for latency.
    pub fn scan_interval(mut self, interval: Duration) -> Self {
        self.scan_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// The longest a connection attempt may take (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The longest any one command may wait for its reply (default 1 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Trusts this root certificate (PEM) instead of the system's roots for `rediss://` URLs,
    /// e.g. a private CA. Verification stays on; to turn it off (tests only), end the URL with
    /// `#insecure`.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_certificate = Some(pem.into());
        self
    }

    /// Builds the client and checks that Redis answers.
    ///
    /// # Errors
    /// [`LockError::Config`] for a malformed URL, [`LockError::Redis`] when Redis cannot be reached
    /// or rejects the credentials within the timeouts.
    pub async fn build(self) -> Result<LockClient, LockError> {
        let client = self.build_lazy()?;
        client.ping().await?;
        Ok(client)
    }

    /// Builds the client without any I/O; connections open on first use.
    ///
    /// # Errors
    /// [`LockError::Config`] for a malformed URL or when the watchdog thread cannot start.
    pub fn build_lazy(self) -> Result<LockClient, LockError> {
        let redacted_url = redact(&self.url);
        let redis = self.redis_client().map_err(|err| LockError::Config {
            message: format!("cannot use `{redacted_url}`: {err}"),
        })?;
        if redis.get_connection_info().redis.db < 0 {
            return Err(LockError::Config {
                message: format!("cannot use `{redacted_url}`: a database index is never negative"),
            });
        }
        let backend = Arc::new(Backend::new(
            redis,
            self.connect_timeout,
            self.response_timeout,
        ));
        let renewals = RenewalQueue::start(backend.clone(), self.scan_interval).map_err(|err| {
            LockError::Config {
                message: format!("cannot start the watchdog thread: {err}"),
            }
        })?;
        let waits = WaitQueue::start(backend.clone(), renewals.background());
        static IDS: AtomicU64 = AtomicU64::new(1);
        Ok(LockClient {
            inner: Arc::new(Inner {
                id: IDS.fetch_add(1, Ordering::Relaxed),
                redacted_url,
                scan_interval: self.scan_interval,
                backend,
                renewals,
                waits,
            }),
        })
    }
}

impl LockClientBuilder {
    fn redis_client(&self) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(root) = &self.tls_root_certificate {
            let certificates = redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root.clone()),
            };
            return redis::Client::build_with_tls(self.url.as_str(), certificates);
        }
        redis::Client::open(self.url.as_str())
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

    /// Starts configuring a client for `url`: `redis://[user[:password]@]host[:port][/db]`,
    /// or `rediss://` for TLS.
    pub fn builder(url: &str) -> LockClientBuilder {
        LockClientBuilder {
            url: url.to_owned(),
            scan_interval: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(1),
            #[cfg(feature = "tls")]
            tls_root_certificate: None,
        }
    }

    /// Runs `work` while holding the lock `key`, the programmatic twin of `#[redis_lock]`:
    /// acquire, register with the watchdog, run (cancelled when the lease ends), release.
    ///
    /// A call made while the current task already holds `key` through this client re-enters:
    /// it runs `work` without a second acquisition and leaves the release to the outer call.
    ///
    /// # Errors
    /// [`LockError::Busy`] when another owner holds the key (after `wait`, if set),
    /// [`LockError::Redis`] when Redis fails while acquiring (the work never ran),
    /// [`LockError::RenewalsExhausted`] or [`LockError::Lost`] when the work was cut short,
    /// [`LockError::InvalidKey`] for an empty or over-long key.
    ///
    /// # Cancellation safety
    /// Dropping the future at any point releases the lock (in the background) if it was taken.
    pub async fn run_locked<F: Future>(
        &self,
        key: impl Into<String>,
        options: LockOptions,
        work: F,
    ) -> Result<F::Output, LockError> {
        let key = check_key(key.into())?;
        if context::holds(self.inner.id, &key) {
            return Ok(work.await);
        }
        let lease = self.acquire_checked(key, options).await?;
        let outcome = lease.run(work).await;
        if let Err(err) = lease.release().await {
            tracing::warn!(error = %err, "lock release not confirmed; retrying in the background");
        }
        outcome
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
    /// # Cancellation safety
    /// If dropped while the `SET` is in flight, the key (if it was set) is released in the background.
    pub async fn acquire(
        &self,
        key: impl Into<String>,
        options: LockOptions,
    ) -> Result<Lease, LockError> {
        self.acquire_checked(check_key(key.into())?, options).await
    }

    /// [`acquire`](Self::acquire) for a key already checked.
    async fn acquire_checked(
        &self,
        mut key: String,
        options: LockOptions,
    ) -> Result<Lease, LockError> {
        let Some(wait) = options.wait else {
            return match self.try_acquire(key, &options).await? {
                Attempt::Taken(lease) => Ok(lease),
                Attempt::Busy { key, .. } => Err(LockError::Busy { key }),
            };
        };
        let give_up = Instant::now() + wait;
        let mut ticket = None;
        loop {
            let remaining = match self.try_acquire(key, &options).await? {
                Attempt::Taken(lease) => return Ok(lease),
                Attempt::Busy {
                    key: busy,
                    remaining,
                } => {
                    key = busy;
                    remaining
                }
            };
            let now = Instant::now();
            if now >= give_up {
                tracing::debug!(key = %key, "lock still busy when the wait ran out");
                return Err(LockError::Busy { key });
            }
            match &ticket {
                None => {
                    // Once subscribed, no release can slip by unheard: look again right away.
                    tracing::debug!(key = %key, "lock busy; waiting");
                    let joined = self.inner.waits.join(&key);
                    joined.subscribed(give_up - now).await;
                    ticket = Some(joined);
                }
                Some(ticket) => {
                    let fallback = remaining
                        .map(jittered)
                        .unwrap_or(Duration::from_millis(100))
                        .min(give_up - now);
                    ticket.released_or(fallback).await;
                }
            }
        }
    }

    /// One attempt to take `key`.
    async fn try_acquire(&self, key: String, options: &LockOptions) -> Result<Attempt, LockError> {
        let token = uuid::Uuid::new_v4().simple().to_string();
        let ttl = options.ttl;
        // A reply later than the lease itself is worthless: the lock may have lapsed already.
        let budget = self
            .inner
            .backend
            .response_timeout()
            .min(ttl.saturating_sub(drift(ttl)).max(Duration::from_millis(1)));
        let mut pending = PendingAcquire {
            client: self,
            key,
            token,
            ttl,
            armed: true,
        };
        let sent_at = Instant::now();
        let request = AcquireRequest {
            key: &pending.key,
            token: &pending.token,
            ttl,
            fencing: options.fencing,
            want_remaining: options.wait.is_some(),
        };
        match self.inner.backend.acquire(request, budget).await {
            Ok(Acquired::Taken { fencing_token }) => {
                let (key, token) = pending.disarm();
                static IDS: AtomicU64 = AtomicU64::new(1);
                let state = Arc::new(LeaseState::new(
                    IDS.fetch_add(1, Ordering::Relaxed),
                    self.inner.id,
                    key,
                    token,
                    options,
                    fencing_token,
                    sent_at,
                ));
                self.inner.renewals.register(state.clone());
                tracing::debug!(key = %state.key, ttl_ms = millis(ttl), fencing_token, "lock acquired");
                Ok(Attempt::Taken(Lease::new(state, self.clone())))
            }
            Ok(Acquired::Busy { remaining }) => {
                let (key, _) = pending.disarm();
                tracing::debug!(key = %key, "lock busy");
                Ok(Attempt::Busy { key, remaining })
            }
            Err(failure) => {
                // The command may have landed with no answer back: then PendingAcquire's drop
                // releases the key in the background.
                pending.armed = failure.may_have_landed();
                Err(failure.into_lock_error(Some(&pending.key)))
            }
        }
    }

    /// Sends `PING`, to check that Redis answers.
    async fn ping(&self) -> Result<(), LockError> {
        self.inner
            .backend
            .ping()
            .await
            .map_err(|failure| failure.into_lock_error(None))
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.inner.backend
    }

    pub(crate) fn renewals(&self) -> &RenewalQueue {
        &self.inner.renewals
    }

    /// How many leases this client's watchdog is keeping alive right now.
    pub fn held_leases(&self) -> usize {
        self.inner.renewals.len()
    }
}

enum Attempt {
    Taken(Lease),
    Busy {
        key: String,
        remaining: Option<Duration>,
    },
}

/// A holder's remaining lease plus up to 10 %, so waiters whose holder died do not all retry at once.
fn jittered(remaining: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let spread = remaining / 10 + Duration::from_millis(1);
    remaining + Duration::from_nanos(random % (spread.as_nanos() as u64).max(1))
}

/// An acquire in flight: if dropped armed (the caller gave up, or the reply was lost), the `SET`
/// may have landed without our hearing of it, so the key is released in the background.
struct PendingAcquire<'a> {
    client: &'a LockClient,
    key: String,
    token: String,
    ttl: Duration,
    armed: bool,
}

impl PendingAcquire<'_> {
    fn disarm(&mut self) -> (String, String) {
        self.armed = false;
        (
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.token),
        )
    }
}

impl Drop for PendingAcquire<'_> {
    fn drop(&mut self) {
        if self.armed {
            let (key, token) = self.disarm();
            (self.client.inner.renewals).release_in_background(key, token, self.ttl);
        }
    }
}

/// The URL with any password replaced by `***`, safe to print.
pub(crate) fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => "<malformed url>".to_owned(),
    }
}
