//! Where a client's locks live, and the store for it: the builder hands over plain settings
//! (URLs, timeouts, names, a TLS root) and the redis clients are made here, where `redis` is
//! used.

use std::sync::Arc;

use redis::IntoConnectionInfo;

use super::redis::RedisStore;
use super::redis::cluster::Configure;
use super::redis::sentinel::{SentinelSource, is_sentinel_url};
use super::redis::server::Source;
use super::redlock::RedlockStore;
use super::{Settings, Store, tls};
use crate::error::LockError;

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

impl From<redis::Client> for Deployment {
    fn from(client: redis::Client) -> Self {
        Self::Client(Box::new(client))
    }
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
    pub(crate) fn describe(&self) -> String {
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

    /// The store for this deployment, without any I/O; `tls_root` (PEM) is trusted instead of
    /// the system's roots for `rediss://` URLs.
    pub(crate) fn store(
        &self,
        settings: Settings,
        tls_root: Option<Vec<u8>>,
    ) -> Result<Arc<dyn Store>, LockError> {
        if !cfg!(feature = "tls-insecure")
            && let Some(url) = self.urls().iter().find(|url| url.ends_with("#insecure"))
        {
            return Err(invalid(
                url,
                "`#insecure` (TLS without certificate verification) needs the `tls-insecure` \
                 feature of lockmacro-runtime; for a private CA, keep verification on with \
                 `LockClientBuilder::tls_root_certificate`"
                    .into(),
            ));
        }
        if self.wants_tls() {
            tls::ensure_crypto_provider();
        }
        Ok(match self {
            Self::Url(url) => Arc::new(RedisStore::server(source(url, tls_root)?, settings)),
            Self::Client(client) => Arc::new(RedisStore::server(
                Source::Direct((**client).clone()),
                settings,
            )),
            Self::Cluster(seeds) => {
                let shown = seeds.iter().map(|url| redact(url)).collect::<Vec<_>>();
                let tls = seeds.iter().any(|url| tls::wants_tls(url));
                let configure = cluster(seeds, tls_root)?;
                Arc::new(
                    RedisStore::cluster(shown.join(", "), tls, configure, settings)
                        .map_err(|err| invalid(&seeds.join(","), err.to_string()))?,
                )
            }
            Self::Redlock(urls) => {
                let clients = urls
                    .iter()
                    .map(|url| redis_client(url, tls_root.clone()))
                    .collect::<Result<Vec<_>, LockError>>()?;
                refuse_repeated_masters(urls, &clients)?;
                let masters = clients
                    .into_iter()
                    .map(|client| RedisStore::server(Source::Direct(client), settings.clone()))
                    .collect();
                Arc::new(
                    RedlockStore::new(masters, settings)
                        .map_err(|message| LockError::Config { message })?,
                )
            }
        })
    }
}

/// Redlock's masters must be independent: the same server (address and database) given twice
/// would count as two votes, and one lock taken there as two masters' (a free key then read as
/// `Busy`).
fn refuse_repeated_masters(urls: &[String], clients: &[redis::Client]) -> Result<(), LockError> {
    let server = |client: &redis::Client| {
        let info = client.get_connection_info();
        format!("{}/{}", info.addr(), info.redis_settings().db())
    };
    for (at, client) in clients.iter().enumerate() {
        if let Some(first) = clients[..at]
            .iter()
            .position(|earlier| server(earlier) == server(client))
        {
            return Err(LockError::Config {
                message: format!(
                    "Redlock needs independent masters, but `{}` and `{}` are the same server \
                     ({}); give each master once",
                    redact(&urls[first]),
                    redact(&urls[at]),
                    server(client)
                ),
            });
        }
    }
    Ok(())
}

/// Where the master is: at `url`, or wherever the sentinels `url` names say.
fn source(url: &str, tls_root: Option<Vec<u8>>) -> Result<Source, LockError> {
    if is_sentinel_url(url) {
        return SentinelSource::new(url, tls_root)
            .map(Source::Sentinel)
            .map_err(|why| invalid(url, why));
    }
    redis_client(url, tls_root).map(Source::Direct)
}

/// How to make a cluster client for `seeds`, trusting `tls_root`.
fn cluster(seeds: &[String], tls_root: Option<Vec<u8>>) -> Result<Configure, LockError> {
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
    Ok(Box::new(move || {
        let builder = redis::cluster::ClusterClientBuilder::new(nodes.clone());
        match &tls_root {
            #[cfg(feature = "tls")]
            Some(root) => builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root.clone()),
            }),
            _ => builder,
        }
    }))
}

/// A redis-rs client for one server's `url`, trusting `tls_root`.
fn redis_client(url: &str, tls_root: Option<Vec<u8>>) -> Result<redis::Client, LockError> {
    let opened = match tls_root {
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

/// A configuration error about `url`, shown without its password.
fn invalid(url: &str, why: String) -> LockError {
    LockError::Config {
        message: format!("cannot use `{}`: {why}", redact(url)),
    }
}

/// The URL with any password replaced by `***`, safe to print. A URL `url` cannot read (the
/// hosts list of a Sentinel URL, `h1:26379,h2:26379`) is shown as given, its user part cut at
/// the last `@` before the path and its password redacted there.
fn redact(url: &str) -> String {
    if let Ok(mut parsed) = url::Url::parse(url) {
        if parsed.password().is_some() {
            let _ = parsed.set_password(Some("***"));
        }
        return parsed.to_string();
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<malformed url>".to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => {
            let user = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => userinfo.to_owned(),
            };
            format!("{scheme}://{user}@{hosts}{path}")
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redacts_passwords_also_in_urls_of_several_hosts() {
        assert_eq!(
            redact("redis://me:secret@h1:6379/2"),
            "redis://me:***@h1:6379/2"
        );
        assert_eq!(
            redact("redis+sentinel://:s%40cret@h1:26379,h2:26379/service"),
            "redis+sentinel://:***@h1:26379,h2:26379/service"
        );
        assert_eq!(
            redact("redis+sentinel://h1:26379,h2:26379/service/1"),
            "redis+sentinel://h1:26379,h2:26379/service/1"
        );
        assert_eq!(redact("nonsense"), "<malformed url>");
    }
}
