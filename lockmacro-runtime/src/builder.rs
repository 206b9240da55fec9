//! Configuring a client: the deployment, timeouts and names, and the parts a client is made of.

use std::sync::Arc;
use std::time::Duration;

use crate::background::Background;
use crate::engine::Timing;
use crate::error::LockError;
use crate::store::protocol::Origin;
use crate::store::{Deployment, Names, Settings, Store};

/// Configures a [`LockClient`](crate::LockClient); from
/// [`LockClient::builder`](crate::LockClient::builder).
#[derive(Clone)]
#[must_use]
pub struct LockClientBuilder {
    deployment: Deployment,
    scan_interval: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    shutdown_timeout: Duration,
    namespace: String,
    app_name: Option<String>,
    replica_acks: u32,
    replica_ack_timeout: Duration,
    #[cfg(feature = "tls")]
    tls_root_certificate: Option<Vec<u8>>,
}

/// How long a grant waits for its replicas unless told otherwise: half the default response
/// timeout, since on a Cluster the node's reply timer bounds the `WAIT` too.
pub(crate) const DEFAULT_REPLICA_ACK_TIMEOUT: Duration = Duration::from_millis(500);

/// How long [`LockClient::shutdown`](crate::LockClient::shutdown) waits for its releases
/// unless told otherwise.
pub(crate) const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("deployment", &self.deployment.describe())
            .field("scan_interval", &self.scan_interval)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("namespace", &self.namespace)
            .field("app_name", &self.app_name)
            .field("replica_acks", &self.replica_acks)
            .field("replica_ack_timeout", &self.replica_ack_timeout)
            .finish_non_exhaustive()
    }
}

impl LockClientBuilder {
    pub(crate) fn new(deployment: Deployment) -> Self {
        Self {
            deployment,
            scan_interval: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(1),
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            namespace: "lockmacro".to_owned(),
            app_name: None,
            replica_acks: 1,
            replica_ack_timeout: DEFAULT_REPLICA_ACK_TIMEOUT,
            #[cfg(feature = "tls")]
            tls_root_certificate: None,
        }
    }

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

    /// How long [`LockClient::shutdown`](crate::LockClient::shutdown) may wait for its releases
    /// to be confirmed (default 10 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// The prefix of the keys and channels the library keeps besides lock keys: fencing counters
    /// (`{namespace}:fence:{key}`) and release announcements (`{namespace}:released:{key}`).
    /// Default `lockmacro`; set it to live inside an ACL such as `~myapp:*` (`"myapp:lockmacro"`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The application name written into every lock this client takes, beside its host and
    /// process id, so that `inspect`, `list`, `watch` and the command-line tool say who holds a
    /// lock ([`Holder::app`](crate::Holder::app)). Default: the executable's name. Kept to
    /// `[A-Za-z0-9._-]` (anything else becomes `_`), at most 64 characters.
    pub fn app_name(mut self, name: impl Into<String>) -> Self {
        self.app_name = Some(name.into());
        self
    }

    /// How many replicas must acknowledge a lock, and each renewal, before it counts (Sentinel,
    /// Cluster; default 1). `WAIT` is sent behind the write, on its connection: no extra round
    /// trip while the replicas keep up. At most as many as the master has are asked for (one
    /// Redis without replicas sends no `WAIT`); a replica silent for more than 5 s no longer
    /// counts. A grant fewer replicas acknowledged within
    /// [`replica_ack_timeout`](Self::replica_ack_timeout) is undone and fails with
    /// [`LockError::Redis`](crate::LockError::Redis); a renewal that is not acknowledged does
    /// not move the lease's deadline (it is retried). 0 turns acknowledgement off: a failover to
    /// a replica the lock had not reached yet can then let a second holder in.
    pub fn replica_acks(mut self, replicas: u32) -> Self {
        self.replica_acks = replicas;
        self
    }

    /// How long a grant or renewal waits for its replicas' acknowledgement (default 500 ms). On
    /// a Cluster it is cut to three quarters of the response timeout, which bounds the `WAIT`'s
    /// reply too.
    pub fn replica_ack_timeout(mut self, timeout: Duration) -> Self {
        self.replica_ack_timeout = timeout;
        self
    }

    /// Trusts this root certificate (PEM) instead of the system's roots for `rediss://` URLs,
    /// e.g. a private CA. Verification stays on; to turn it off (tests only), end the URL with
    /// `#insecure`, which needs the `tls-insecure` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_certificate = Some(pem.into());
        self
    }

    /// What the client is made of, without any I/O: its store, its watchdog thread, its timing.
    pub(crate) fn parts(self) -> Result<Parts, LockError> {
        if self.namespace.is_empty() || self.namespace.contains(['{', '}']) {
            return Err(LockError::Config {
                message: format!(
                    "the namespace `{}` must be non-empty and hold no braces",
                    self.namespace
                ),
            });
        }
        let (background, handle) = Background::thread().map_err(|err| LockError::Config {
            message: format!("cannot start the watchdog thread: {err}"),
        })?;
        let settings = Settings {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            names: Names::new(&self.namespace),
            replica_acks: self.replica_acks,
            replica_ack_timeout: self.replica_ack_timeout,
            background: handle,
        };
        let store = self.deployment.store(settings, self.tls_root())?;
        Ok(Parts {
            store,
            background,
            timing: Timing {
                scan_interval: self.scan_interval,
                response_timeout: self.response_timeout,
                shutdown_timeout: self.shutdown_timeout,
                wall: crate::clock::Wall::default(),
            },
            deployment: self.deployment.describe(),
            origin: Origin::of_this_process(self.app_name.as_deref()),
        })
    }

    fn tls_root(&self) -> Option<Vec<u8>> {
        #[cfg(feature = "tls")]
        return self.tls_root_certificate.clone();
        #[cfg(not(feature = "tls"))]
        None
    }
}

/// What a client is made of.
pub(crate) struct Parts {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) background: Background,
    pub(crate) timing: Timing,
    /// How the deployment is shown: never a password.
    pub(crate) deployment: String,
    /// Who takes its locks: written into every lock value.
    pub(crate) origin: Origin,
}

/// Without `tls-insecure`, `#insecure` is refused when building, with the feature named, rather
/// than failing at the first connection.
#[cfg(all(test, not(feature = "tls-insecure")))]
mod tests {
    use crate::{LockClient, LockError};

    #[test]
    fn insecure_tls_without_its_feature_is_a_config_error_naming_the_feature() {
        let error = LockClient::builder("rediss://127.0.0.1:6380/#insecure")
            .build_lazy()
            .expect_err("refused");
        assert!(
            matches!(&error, LockError::Config { message } if message.contains("`tls-insecure`")),
            "{error}"
        );
    }
}
