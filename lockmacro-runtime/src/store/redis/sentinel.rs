//! Finding the master through Redis Sentinel: `redis+sentinel://[user:pass@]h1:26379,h2:26379/service[/db]`
//! (`rediss+sentinel://` for TLS to the sentinels and the master).
//!
//! The sentinels are asked in the order given and the first valid answer wins (redis-rs's
//! `SentinelClient`, which also checks that the named server calls itself a master). The master
//! is asked for again after a dropped connection or a `READONLY` reply, and as soon as the
//! sentinels announce `+switch-master`, so no lock is written to a demoted master for longer
//! than the announcement takes.

use std::sync::Mutex;
use std::time::Duration;

use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{ConnectionAddr, TlsMode};

use super::bounded;
use crate::store::StoreError;

/// Where the sentinels are, and what they last said of the master.
pub(crate) struct SentinelSource {
    service: String,
    /// The sentinels' addresses, for messages.
    shown: String,
    sentinels: tokio::sync::Mutex<SentinelClient>,
    master: Mutex<Option<redis::Client>>,
}

/// No sentinel named a master: which were asked, for what.
#[derive(Debug, thiserror::Error)]
#[error("no sentinel of {sentinels} named a master for `{service}`: {source}")]
struct NoMaster {
    sentinels: String,
    service: String,
    #[source]
    source: redis::RedisError,
}

/// The parts of a sentinel URL.
#[derive(Debug, PartialEq)]
struct SentinelUrl {
    tls: Option<TlsMode>,
    sentinels: Vec<(String, u16)>,
    service: String,
    db: i64,
    username: Option<String>,
    password: Option<String>,
}

/// Whether `url` names a sentinel deployment.
pub(crate) fn is_sentinel_url(url: &str) -> bool {
    let scheme = url.split("://").next().unwrap_or_default();
    scheme.ends_with("+sentinel")
}

impl SentinelSource {
    /// Reads a sentinel URL; the error says what is wrong with it.
    pub(crate) fn new(url: &str, tls_root: Option<Vec<u8>>) -> Result<Self, String> {
        let parsed = parse(url)?;
        let addresses = parsed
            .sentinels
            .iter()
            .map(|(host, port)| match parsed.tls {
                Some(mode) => ConnectionAddr::TcpTls {
                    host: host.clone(),
                    port: *port,
                    insecure: mode == TlsMode::Insecure,
                    tls_params: None,
                },
                None => ConnectionAddr::Tcp(host.clone(), *port),
            });
        let mut builder =
            SentinelClientBuilder::new(addresses, &parsed.service, SentinelServerType::Master)
                .map_err(|err| err.to_string())?
                .set_client_to_redis_db(parsed.db);
        if let Some(username) = &parsed.username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &parsed.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(mode) = parsed.tls {
            builder = builder
                .set_client_to_redis_tls_mode(mode)
                .set_client_to_sentinel_tls_mode(mode);
        }
        #[cfg(feature = "tls")]
        if let Some(root) = tls_root {
            let certificates = || redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root.clone()),
            };
            builder = builder
                .set_client_to_redis_certificates(certificates())
                .set_client_to_sentinel_certificates(certificates());
        }
        #[cfg(not(feature = "tls"))]
        let _ = tls_root;
        let sentinels = builder.build().map_err(|err| err.to_string())?;
        let shown = parsed
            .sentinels
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect::<Vec<_>>()
            .join(", ");
        Ok(Self {
            shown,
            service: parsed.service,
            sentinels: tokio::sync::Mutex::new(sentinels),
            master: Mutex::new(None),
        })
    }

    /// The service the sentinels watch.
    pub(crate) fn service(&self) -> &str {
        &self.service
    }

    /// How the master at `address` is named in messages: with the service it serves.
    pub(crate) fn master_named(&self, address: impl std::fmt::Display) -> String {
        format!(
            "{address} (the master of `{}` named by the sentinels {})",
            self.service, self.shown
        )
    }

    /// The current master, asking the sentinels when it is not known.
    pub(crate) async fn master(&self) -> Result<redis::Client, StoreError> {
        if let Some(master) = self.known() {
            return Ok(master);
        }
        let found = self
            .sentinels
            .lock()
            .await
            .async_get_client()
            .await
            .map_err(|source| {
                StoreError::unavailable(NoMaster {
                    sentinels: self.shown.clone(),
                    service: self.service.clone(),
                    source,
                })
            })?;
        tracing::debug!(service = %self.service, master = %found.get_connection_info().addr(), "sentinels named the master");
        *self.master.lock().unwrap_or_else(|e| e.into_inner()) = Some(found.clone());
        Ok(found)
    }

    pub(crate) fn forget_master(&self) {
        *self.master.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn known(&self) -> Option<redis::Client> {
        self.master
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A subscription to `+switch-master` on the first sentinel that answers.
    pub(crate) async fn announcements(
        &self,
        connect_timeout: Duration,
    ) -> Result<redis::aio::PubSubStream, StoreError> {
        let subscribe = async {
            let sentinel = self
                .sentinels
                .lock()
                .await
                .async_get_sentinel_client()
                .await?;
            let mut pubsub = sentinel.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            Ok::<_, redis::RedisError>(pubsub.into_on_message())
        };
        bounded(connect_timeout, subscribe).await
    }
}

/// Reads `redis+sentinel://[user[:password]@]host[:port][,host[:port]...]/service[/db][#insecure]`.
fn parse(url: &str) -> Result<SentinelUrl, String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or("a sentinel URL starts with `redis+sentinel://`")?;
    let tls = match scheme {
        "redis+sentinel" | "valkey+sentinel" => None,
        "rediss+sentinel" | "valkeys+sentinel" => Some(TlsMode::Secure),
        other => return Err(format!("unknown scheme `{other}`")),
    };
    let (rest, insecure) = match rest.split_once('#') {
        Some((rest, "insecure")) => (rest, true),
        Some((_, fragment)) => return Err(format!("unknown fragment `#{fragment}`")),
        None => (rest, false),
    };
    let tls = match (tls, insecure) {
        (Some(_), true) => Some(TlsMode::Insecure),
        (None, true) => return Err("`#insecure` only applies to `rediss+sentinel://`".into()),
        (tls, false) => tls,
    };
    let (authority, path) = rest
        .split_once('/')
        .ok_or("name the service after the sentinels: `redis+sentinel://host:26379/mymaster`")?;
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (Some(userinfo), hosts),
        None => (None, authority),
    };
    let (username, password) = match userinfo {
        Some(userinfo) => credentials(userinfo)?,
        None => (None, None),
    };
    let sentinels = hosts
        .split(',')
        .map(|host| {
            let (name, port) = match host.rsplit_once(':') {
                Some((name, port)) => (
                    name,
                    port.parse::<u16>()
                        .map_err(|_| format!("`{port}` is not a port"))?,
                ),
                None => (host, 26379),
            };
            if name.is_empty() {
                return Err("a sentinel address has no host".to_owned());
            }
            Ok((name.trim_matches(['[', ']']).to_owned(), port))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mut segments = path.split('/');
    let service = segments.next().unwrap_or_default().to_owned();
    if service.is_empty() {
        return Err("the service name is missing: `redis+sentinel://host:26379/mymaster`".into());
    }
    let db = match segments.next() {
        None | Some("") => 0,
        Some(db) => db
            .parse::<i64>()
            .ok()
            .filter(|db| *db >= 0)
            .ok_or_else(|| format!("`{db}` is not a database index"))?,
    };
    if segments.next().is_some() {
        return Err("expected `/service` or `/service/db` after the sentinels".into());
    }
    Ok(SentinelUrl {
        tls,
        sentinels,
        service,
        db,
        username,
        password,
    })
}

/// `user:password`, `:password` or `user`, percent-decoded as in `redis://` URLs.
fn credentials(userinfo: &str) -> Result<(Option<String>, Option<String>), String> {
    let decode = |part: &str| {
        percent_encoding::percent_decode_str(part)
            .decode_utf8()
            .map(|decoded| Some(decoded.into_owned()).filter(|part| !part.is_empty()))
            .map_err(|_| "the user and password must be UTF-8 once percent-decoded".to_owned())
    };
    match userinfo.split_once(':') {
        Some((username, password)) => Ok((decode(username)?, decode(password)?)),
        None => Ok((decode(userinfo)?, None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_hosts_service_db_and_credentials() {
        let parsed = parse("redis+sentinel://me:s%40cret@h1:26379,h2/orders/3").unwrap();
        assert_eq!(
            parsed,
            SentinelUrl {
                tls: None,
                sentinels: vec![("h1".into(), 26379), ("h2".into(), 26379)],
                service: "orders".into(),
                db: 3,
                username: Some("me".into()),
                password: Some("s@cret".into()),
            }
        );
        let tls = parse("rediss+sentinel://h1:1/m#insecure").unwrap();
        assert_eq!(tls.tls, Some(TlsMode::Insecure));
        assert_eq!(
            parse("redis+sentinel://:pw@h/m")
                .unwrap()
                .password
                .as_deref(),
            Some("pw")
        );
    }

    #[test]
    fn says_what_is_wrong() {
        for (url, says) in [
            ("redis+sentinel://h1:26379", "service"),
            ("redis+sentinel://h1:26379/", "service"),
            ("redis+sentinel://h1:port/m", "port"),
            ("redis+sentinel://h1/m/x", "database"),
            ("redis+sentinel://h1/m/0/x", "/service"),
            ("redis+sentinel://h1/m#insecure", "insecure"),
            ("redis+sentinel://,h1/m", "host"),
        ] {
            let error = parse(url).unwrap_err();
            assert!(error.contains(says), "{url}: {error}");
        }
    }
}
