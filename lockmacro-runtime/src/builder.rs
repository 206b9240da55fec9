//! Configuring a [`LockClient`]: the deployment, timeouts and names, then building it.

use std::sync::Arc;
use std::time::Duration;

use crate::background::Background;
use crate::client::{Description, LockClient, redact};
use crate::engine::{Engine, Timing};
use crate::error::LockError;
use crate::store::cluster::{ClusterStore, Configure};
use crate::store::redis::sentinel::{SentinelSource, is_sentinel_url};
use crate::store::redis::{RedisStore, Settings, Source};
use crate::store::redlock::RedlockStore;
use crate::store::{Names, Store, tls};

/// Where locks live.
#[derive(Debug, Clone)]
pub(crate) enum Deployment {
    /// One server, or a master found through Sentinel.
    Url(String),
    /// A Redis Cluster, from some of its nodes.
    Cluster(Vec<String>),
    /// A Redlock quorum of independent masters.
    Redlock(Vec<String>),
    /// One server, through a redis-rs client the application built itself.
    Client(Box<redis::Client>),
}

impl Deployment {
    fn urls(&self) -> &[String] {
        match self {
            Self::Url(url) => std::slice::from_ref(url),
            Self::Cluster(urls) | Self::Redlock(urls) => urls,
            Self::Client(_) => &[],
        }
    }

    fn wants_tls(&self) -> bool {
        match self {
            Self::Client(client) => matches!(
                client.get_connection_info().addr(),
                redis::ConnectionAddr::TcpTls { .. }
            ),
            _ => self.urls().iter().any(|url| tls::wants_tls(url)),
        }
    }

    /// How it is shown: every URL with its password redacted.
    fn describe(&self) -> String {
        let list = |urls: &[String]| {
            urls.iter()
                .map(|url| redact(url))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Self::Url(url) => redact(url),
            Self::Cluster(seeds) => format!("cluster [{}]", list(seeds)),
            Self::Redlock(masters) => format!("redlock [{}]", list(masters)),
            // The address alone: no user or password.
            Self::Client(client) => client.get_connection_info().addr().to_string(),
        }
    }
}

/// Configures a [`LockClient`]; from [`LockClient::builder`].
#[derive(Clone)]
#[must_use]
pub struct LockClientBuilder {
    deployment: Deployment,
    scan_interval: Duration,
    connect_timeout: Duration,
    response_timeout: Duration,
    shutdown_timeout: Duration,
    namespace: String,
    #[cfg(feature = "tls")]
    tls_root_certificate: Option<Vec<u8>>,
}

/// How long [`LockClient::shutdown`] waits for its releases unless told otherwise.
pub(crate) const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

impl std::fmt::Debug for LockClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockClientBuilder")
            .field("deployment", &self.deployment.describe())
            .field("scan_interval", &self.scan_interval)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .field("namespace", &self.namespace)
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

    /// How long [`LockClient::shutdown`] may wait for its releases to be confirmed (default 10 s).
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

    /// Trusts this root certificate (PEM) instead of the system's roots for `rediss://` URLs,
    /// e.g. a private CA. Verification stays on; to turn it off (tests only), end the URL with
    /// `#insecure`, which needs the `tls-insecure` feature.
    #[cfg(feature = "tls")]
    pub fn tls_root_certificate(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root_certificate = Some(pem.into());
        self
    }

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
        let deployment = self.deployment.describe();
        if self.namespace.is_empty() || self.namespace.contains(['{', '}']) {
            return Err(LockError::Config {
                message: format!(
                    "the namespace `{}` must be non-empty and hold no braces",
                    self.namespace
                ),
            });
        }
        if !cfg!(feature = "tls-insecure")
            && let Some(url) = self
                .deployment
                .urls()
                .iter()
                .find(|url| url.ends_with("#insecure"))
        {
            return Err(invalid(
                url,
                "`#insecure` (TLS without certificate verification) needs the `tls-insecure` \
                 feature of lockmacro-runtime; for a private CA, keep verification on with \
                 `LockClientBuilder::tls_root_certificate`"
                    .into(),
            ));
        }
        if self.deployment.wants_tls() {
            tls::ensure_crypto_provider();
        }
        let (background, handle) = Background::thread().map_err(|err| LockError::Config {
            message: format!("cannot start the watchdog thread: {err}"),
        })?;
        let settings = Settings {
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            names: Names::new(&self.namespace),
            background: handle,
        };
        let store: Arc<dyn Store> = match &self.deployment {
            Deployment::Url(url) => Arc::new(RedisStore::new(self.source(url)?, settings)),
            Deployment::Client(client) => Arc::new(RedisStore::new(
                Source::Direct((**client).clone()),
                settings,
            )),
            Deployment::Cluster(seeds) => {
                let shown = seeds.iter().map(|url| redact(url)).collect::<Vec<_>>();
                let tls = seeds.iter().any(|url| tls::wants_tls(url));
                Arc::new(
                    ClusterStore::new(shown.join(", "), tls, self.cluster(seeds)?, settings)
                        .map_err(|err| invalid(&seeds.join(","), err.to_string()))?,
                )
            }
            Deployment::Redlock(urls) => {
                let masters = urls
                    .iter()
                    .map(|url| {
                        let client = self.redis_client(url)?;
                        Ok(RedisStore::new(Source::Direct(client), settings.clone()))
                    })
                    .collect::<Result<Vec<_>, LockError>>()?;
                Arc::new(
                    RedlockStore::new(masters, settings)
                        .map_err(|message| LockError::Config { message })?,
                )
            }
        };
        let engine = Engine::new(
            store,
            background,
            Timing {
                scan_interval: self.scan_interval,
                response_timeout: self.response_timeout,
                shutdown_timeout: self.shutdown_timeout,
            },
        );
        Ok(LockClient {
            engine: Arc::new(engine),
            describe: Arc::new(Description {
                deployment,
                scan_interval: self.scan_interval,
                response_timeout: self.response_timeout,
            }),
            #[cfg(feature = "test-util")]
            memory: None,
        })
    }

    /// Where the master is: at `url`, or wherever the sentinels `url` names say.
    fn source(&self, url: &str) -> Result<Source, LockError> {
        if is_sentinel_url(url) {
            return SentinelSource::new(url, self.tls_root())
                .map(Source::Sentinel)
                .map_err(|why| invalid(url, why));
        }
        self.redis_client(url).map(Source::Direct)
    }

    /// How to make a cluster client for `seeds`, with the builder's TLS root.
    fn cluster(&self, seeds: &[String]) -> Result<Configure, LockError> {
        use redis::IntoConnectionInfo;
        if seeds.is_empty() {
            return Err(LockError::Config {
                message: "a cluster client needs at least one node's URL to start from".into(),
            });
        }
        let nodes = seeds
            .iter()
            .map(|url| {
                url.as_str()
                    .into_connection_info()
                    .map_err(|err| invalid(url, err.to_string()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let root = self.tls_root();
        Ok(Box::new(move || {
            let builder = redis::cluster::ClusterClientBuilder::new(nodes.clone());
            match &root {
                #[cfg(feature = "tls")]
                Some(root) => builder.certs(redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root.clone()),
                }),
                _ => builder,
            }
        }))
    }

    /// A redis-rs client for one server's `url`, trusting the builder's TLS root.
    pub(crate) fn redis_client(&self, url: &str) -> Result<redis::Client, LockError> {
        let opened = match self.tls_root() {
            #[cfg(feature = "tls")]
            Some(root) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root),
                },
            ),
            _ => redis::Client::open(url),
        };
        let client = opened.map_err(|err| invalid(url, err.to_string()))?;
        if client.get_connection_info().redis_settings().db() < 0 {
            return Err(invalid(url, "a database index is never negative".into()));
        }
        Ok(client)
    }

    fn tls_root(&self) -> Option<Vec<u8>> {
        #[cfg(feature = "tls")]
        return self.tls_root_certificate.clone();
        #[cfg(not(feature = "tls"))]
        None
    }
}

/// A configuration error about `url`, shown without its password.
fn invalid(url: &str, why: String) -> LockError {
    LockError::Config {
        message: format!("cannot use `{}`: {why}", redact(url)),
    }
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
