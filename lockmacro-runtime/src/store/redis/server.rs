//! One Redis master: the transport behind `redis://`, `rediss://` and `valkey://` URLs, and,
//! found through Sentinel, behind `redis+sentinel://` ([`sentinel`](super::sentinel)).
//!
//! One multiplexed connection per tokio runtime, reopened when it proves broken; a `READONLY`
//! reply (a failover demoted the server) drops them all and asks the sentinels again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind};

use super::connections::{Lent, PerRuntime};
use super::sentinel::SentinelSource;
use super::{RedisStore, Request, SendError, Transport, feed, unanswered};
use crate::clock::{self, Backoff};
use crate::health::{Health, NodeHealth, NodeRole};
use crate::store::scripts;
use crate::store::{BoxFuture, LeaseRef, ReleaseFeed, Settings, StoreError, TimedOut, Unreachable};

/// Where the master is.
#[allow(clippy::large_enum_variant)] // one per client
pub(crate) enum Source {
    /// At a fixed address.
    Direct(redis::Client),
    /// Wherever the sentinels say it is now.
    Sentinel(SentinelSource),
}

impl Source {
    async fn master(&self) -> Result<redis::Client, StoreError> {
        match self {
            Self::Direct(client) => Ok(client.clone()),
            Self::Sentinel(sentinel) => sentinel.master().await,
        }
    }

    /// How the server at `address` is named in messages.
    pub(crate) fn named(&self, address: &redis::ConnectionAddr) -> String {
        match self {
            Self::Direct(_) => address.to_string(),
            Self::Sentinel(sentinel) => sentinel.master_named(address),
        }
    }

    /// The master we knew may be gone or demoted: ask the sentinels again next time.
    fn forget_master(&self) {
        if let Self::Sentinel(sentinel) = self {
            sentinel.forget_master();
        }
    }
}

/// One Redis server.
pub(crate) struct Server {
    source: Source,
    config: AsyncConnectionConfig,
    settings: Settings,
    connections: PerRuntime<MultiplexedConnection>,
    /// The server process last connected to (`INFO server`'s `run_id`), and when a connection
    /// found another (nanos on [`crate::clock`], 0: never): a restart, which may have lost
    /// every key.
    run: Mutex<Option<String>>,
    restarted_at: AtomicU64,
}

impl RedisStore<Server> {
    /// The lock on the master `source` names; one found through Sentinel is followed across
    /// failovers for as long as the store lives.
    pub(crate) fn server(source: Source, settings: Settings) -> Self {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(settings.connect_timeout))
            .set_response_timeout(Some(settings.response_timeout));
        let server = Arc::new(Server {
            source,
            config,
            connections: PerRuntime::new(),
            settings,
            run: Mutex::new(None),
            restarted_at: AtomicU64::new(0),
        });
        if let Source::Sentinel(sentinel) = &server.source {
            follow_switches(&server, sentinel.service().to_owned());
        }
        Self::new(server)
    }
}

impl RedisStore<Server> {
    /// Takes `lease`'s key for its value where the key is missing (a plain `SET NX PX`): a
    /// Redlock lease held on a majority spreading to a master that lost it or never had it.
    /// `true` when taken.
    pub(crate) async fn take_if_missing(&self, lease: LeaseRef<'_>) -> Result<bool, StoreError> {
        let cmd = scripts::set_nx(lease.key, lease.value, lease.ttl);
        let mut connection = self.transport.connection().await?;
        let budget = self.transport.settings.response_timeout;
        self.send(&mut connection, lease.key, Request::Cmd(&cmd), budget)
            .await
            .map(|super::SetNx(taken)| taken)
            .map_err(SendError::into_store_error)
    }

    /// Whether a connection found this server restarted within the last `span` (see
    /// [`Server::connected_to`]).
    pub(crate) fn restarted_within(&self, span: Duration) -> bool {
        let at = self.transport.restarted_at.load(Ordering::Acquire);
        at != 0 && clock::now().saturating_sub(at) < clock::nanos(span)
    }

    /// A probe heard this server answer: callers on every runtime may connect again at once.
    pub(crate) fn answers_again(&self) {
        self.transport.connections.retry_now();
    }

    /// This server as [`Health`] shows it, in `role`.
    pub(crate) async fn node_health(&self, role: NodeRole) -> NodeHealth {
        self.transport.node_health(role).await
    }
}

impl Server {
    /// Notes the process a new connection reached (`info`: `INFO server`).
    fn connected_to(&self, server: &str, info: &str) {
        let Some(run_id) = super::info_field(info, "run_id:") else {
            return;
        };
        let mut run = self
            .run
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if run.as_deref().is_some_and(|known| known != run_id) {
            self.restarted_at
                .store(clock::now().max(1), Ordering::Release);
            tracing::info!(server, "a server restarted: it may have lost its keys");
        }
        *run = Some(run_id.to_owned());
    }

    /// This server as [`Health`] shows it: the time a `PING` took on its connection (opened
    /// first when there is none, which is not timed), all bounded by the connect and response
    /// timeouts. On Sentinel, the master the sentinels name now.
    async fn node_health(&self, role: NodeRole) -> NodeHealth {
        let bound = self.settings.connect_timeout + self.settings.response_timeout;
        let unknown = || match &self.source {
            Source::Direct(client) => client.get_connection_info().addr().to_string(),
            Source::Sentinel(sentinel) => sentinel.master_named("?"),
        };
        let probe = async {
            let master = self
                .source
                .master()
                .await
                .map_err(|error| (unknown(), error))?;
            let address = master.get_connection_info().addr().to_string();
            let ping = redis::cmd("PING");
            let budget = self.settings.response_timeout;
            // Twice at most: a connection found broken is opened again, so that a server that
            // went away is reported as unreachable, not as the old connection's broken pipe.
            let mut last = StoreError::unavailable("no answer");
            for _ in 0..2 {
                let mut lent = self
                    .connection()
                    .await
                    .map_err(|error| (address.clone(), error))?;
                let started = tokio::time::Instant::now();
                let sent = self.send_once::<redis::Value>(&mut lent, Request::Cmd(&ping), budget);
                match sent.await {
                    Ok(_) => return Ok((address, started.elapsed())),
                    Err(SendError::Unknown(error)) => last = error,
                    Err(answered) => return Err((address, answered.into_store_error())),
                }
            }
            Err((address, last))
        };
        match tokio::time::timeout(bound, probe).await {
            Ok(Ok((address, latency))) => NodeHealth::answered(address, role, latency),
            Ok(Err((address, error))) => error.node_health(address, role),
            Err(_) => NodeHealth::silent(unknown(), role, TimedOut(bound)),
        }
    }

    /// Drops every connection: the master changed. A pause after a failed connect ends too:
    /// its error (no master named, the old one refusing) is about the master that went, and
    /// callers sitting it out (up to a second) would miss the new master's first moments.
    fn master_switched(&self) {
        self.source.forget_master();
        self.connections.invalidate_all();
        self.connections.retry_now();
    }

    /// Whether a failed request may have run, dropping the connection when it proved broken.
    fn classify(&self, generation: u64, err: RedisError) -> SendError {
        let broken = unanswered(&err);
        if err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
            // A replica now: a failover demoted this server. Every connection goes.
            self.master_switched();
        } else if broken {
            self.connections.invalidate(generation);
            self.source.forget_master();
        }
        SendError::new(err, broken)
    }
}

impl Transport for Server {
    type Connection = Lent<MultiplexedConnection>;

    const LAYOUT: super::Layout = super::Layout::Server;

    fn settings(&self) -> &Settings {
        &self.settings
    }

    async fn connection(&self) -> Result<Self::Connection, StoreError> {
        self.connections
            .lend(|| async {
                let master = self.source.master().await?;
                let address = master.get_connection_info().addr().clone();
                let tls = matches!(address, redis::ConnectionAddr::TcpTls { .. });
                let server = self.source.named(&address);
                let budget = self.settings.connect_timeout;
                let open = async {
                    let mut connection = master
                        .get_multiplexed_async_connection_with_config(&self.config)
                        .await?;
                    scripts::load_all().exec_async(&mut connection).await?;
                    // Refused (an ACL): no restart is ever seen, as before.
                    let info: Result<String, _> = redis::cmd("INFO")
                        .arg("server")
                        .query_async(&mut connection)
                        .await;
                    if let Ok(info) = info {
                        self.connected_to(&server, &info);
                    }
                    Ok::<_, RedisError>(connection)
                };
                match tokio::time::timeout(budget, open).await {
                    Ok(Ok(connection)) => Ok(connection),
                    Ok(Err(err)) => Err(Unreachable::connecting(server, tls, err)),
                    Err(_) => Err(Unreachable::error(server, tls, TimedOut(budget))),
                }
            })
            .await
    }

    async fn send_once<R: redis::FromRedisValue + Send>(
        &self,
        lent: &mut Self::Connection,
        request: Request<'_>,
        budget: Duration,
    ) -> Result<R, SendError> {
        // The connection's own response timer, cut to `budget`, bounds the request: one timer
        // a request, not a second one of ours around it.
        let response_timeout = self.settings.response_timeout;
        lent.connection
            .set_response_timeout(budget.min(response_timeout));
        let connection = &mut lent.connection;
        let reply = match request {
            Request::Cmd(cmd) => cmd.query_async(connection).await,
            Request::Pipeline(pipe) => pipe.query_async(connection).await,
        };
        match reply {
            Ok(value) => Ok(value),
            Err(err) if err.is_timeout() && budget < response_timeout => {
                // The budget ran out. The request keeps its place in the connection's reply
                // queue: if its reply comes late, that place would take the next request's
                // reply. Never lend it again.
                self.connections.invalidate(lent.generation);
                Err(SendError::Unknown(StoreError::unavailable(TimedOut(
                    budget,
                ))))
            }
            Err(err) => Err(self.classify(lent.generation, err)),
        }
    }

    async fn wait_replicas(
        &self,
        lent: &mut Self::Connection,
        _key: &str,
        wait: &redis::Cmd,
        timeout: Duration,
    ) -> Result<u32, SendError> {
        // `WAIT` answers after up to `timeout`: its reply timer allows for that.
        lent.connection
            .set_response_timeout(timeout + self.settings.response_timeout);
        match wait.query_async(&mut lent.connection).await {
            Ok(acked) => Ok(acked),
            Err(err) => Err(self.classify(lent.generation, err)),
        }
    }

    fn shared(lent: &Self::Connection) -> Option<u64> {
        // `u64::MAX`: lent for one call, shared by no one.
        (lent.generation != u64::MAX).then_some(lent.generation)
    }

    fn release_feed(&self) -> BoxFuture<'_, Result<Box<dyn ReleaseFeed>, StoreError>> {
        Box::pin(async move {
            let master = self.source.master().await?;
            let feed = feed::PubSubFeed::open(
                &master,
                self.settings.names.clone(),
                self.settings.connect_timeout,
                self.settings.response_timeout,
            )
            .await?;
            Ok(Box::new(feed) as Box<dyn ReleaseFeed>)
        })
    }

    fn health(&self) -> BoxFuture<'_, Health> {
        Box::pin(async move {
            let (deployment, role) = match &self.source {
                Source::Direct(_) => ("redis".to_owned(), NodeRole::Server),
                Source::Sentinel(sentinel) => (
                    format!("sentinel `{}`", sentinel.service()),
                    NodeRole::Master,
                ),
            };
            let node = self.node_health(role).await;
            let (ready, verdict) = match (node.answers(), role) {
                (true, NodeRole::Master) => (true, "the master the sentinels name answers"),
                (false, NodeRole::Master) => (false, "no master the sentinels name answers"),
                (true, _) => (true, "the server answers"),
                (false, _) => (false, "the server does not answer"),
            };
            Health::new(deployment, ready, verdict, vec![node])
        })
    }

    fn masters(&self) -> BoxFuture<'_, Result<Vec<String>, StoreError>> {
        Box::pin(async { Ok(vec![String::new()]) })
    }

    fn on_master<'a>(
        &'a self,
        _master: &'a str,
        request: Request<'a>,
    ) -> BoxFuture<'a, Result<redis::Value, StoreError>> {
        Box::pin(async move {
            let mut connection = self.connection().await?;
            let budget = self.settings.response_timeout;
            self.send_once(&mut connection, request, budget)
                .await
                .map_err(SendError::into_store_error)
        })
    }
}

/// Listens for `+switch-master` on a sentinel, for as long as `server` lives, and drops its
/// connections to the old master as soon as one is announced for `service`.
fn follow_switches(server: &Arc<Server>, service: String) {
    let weak = Arc::downgrade(server);
    let connect_timeout = server.settings.connect_timeout;
    server.settings.background.spawn(async move {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        loop {
            let Some(server) = weak.upgrade() else { return };
            let Source::Sentinel(sentinel) = &server.source else {
                return;
            };
            let subscribed = sentinel.announcements(connect_timeout).await;
            drop(server);
            match subscribed {
                Ok(mut announcements) => {
                    backoff.reset();
                    while let Some(message) = announcements.next().await {
                        let Some(server) = weak.upgrade() else { return };
                        let payload: String = message.get_payload().unwrap_or_default();
                        if payload.split(' ').next() == Some(service.as_str()) {
                            tracing::info!(service = %service, switch = %payload, "sentinels switched the master");
                            server.master_switched();
                        }
                    }
                }
                Err(error) => {
                    tracing::debug!(service = %service, error = %error, "cannot follow +switch-master");
                }
            }
            tokio::time::sleep(backoff.next_delay()).await;
        }
    });
}
