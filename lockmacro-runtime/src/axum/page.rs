//! The live locks page: its options, routes and handlers (the module docs of `axum` describe
//! it for users; `render` writes its HTML, `csrf` guards its one POST).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{OriginalUri, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream::{self, Stream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, timeout, timeout_at};

use super::csrf;
use super::escape::json_string;
use super::render::{self, Listing, PageView, TableView};
use crate::key::check_key;
use crate::{Holder, LockClient, LockEvent, LockInfo, LockStream};

/// The page's script and style, served from the crate: no build step, no framework.
const SCRIPT: &str = include_str!("page.js");
const STYLE: &str = include_str!("page.css");

/// Only the page's own files run or load: a key that slipped past escaping could still not run
/// a script. No framing (a forced release is one click), no form posted elsewhere.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// How often a live view with nothing to report says it is still there, so that proxies keep
/// the stream open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// The live locks page over `client`, read-only, listing every lock of the client, at most 100
/// at a time. Nest [`router`](LocksPage::router) under the application's own admin path and
/// auth layer with `nest_service`, which serves the path with and without a trailing slash
/// (axum 0.8's `nest` serves only the path as written); the page itself checks no credentials.
///
/// ```
/// use axum::Router;
/// use axum::extract::Request;
/// use axum::http::StatusCode;
/// use axum::middleware::{self, Next};
/// use axum::response::Response;
/// use lockmacro_runtime::LockClient;
/// use lockmacro_runtime::axum::locks_page;
///
/// /// The application's own check (a session, a bearer token, a VPN header...).
/// async fn admins_only(request: Request, next: Next) -> Result<Response, StatusCode> {
///     match request.headers().get("x-admin") {
///         Some(_) => Ok(next.run(request).await),
///         None => Err(StatusCode::UNAUTHORIZED),
///     }
/// }
///
/// # #[tokio::main] async fn main() -> Result<(), lockmacro_runtime::LockError> {
/// let locks = LockClient::builder("redis://127.0.0.1:6379").build_lazy()?;
/// let admin = Router::new()
///     // Only the `borrow` and `exports` locks, and a forced release asks for confirmation.
///     .nest_service(
///         "/locks",
///         locks_page(locks.clone())
///             .prefixes(["borrow", "exports"])
///             .force_release(true)
///             .router(),
///     )
///     .layer(middleware::from_fn(admins_only));
/// let app: Router = Router::new().nest("/admin", admin);
/// # let _ = app; Ok(()) }
/// ```
pub fn locks_page(client: LockClient) -> LocksPage {
    LocksPage {
        client,
        scope: Vec::new(),
        limit: 100,
        refresh: Duration::from_secs(3),
        list_budget: Duration::from_millis(500),
        live_views: 8,
        force_release: false,
    }
}

/// The options of a [`locks_page`]; [`router`](Self::router) builds it.
#[derive(Debug, Clone)]
pub struct LocksPage {
    client: LockClient,
    scope: Vec<String>,
    limit: usize,
    refresh: Duration,
    list_budget: Duration,
    live_views: usize,
    force_release: bool,
}

impl LocksPage {
    /// Limits the page to the locks under these prefixes (keys `"{prefix}:…"`): it lists,
    /// follows and releases no other key, whatever a request asks. Default: every lock of the
    /// client (never one of its internal keys); a `""` among them means every lock too.
    pub fn prefixes<P: Into<String>>(mut self, prefixes: impl IntoIterator<Item = P>) -> Self {
        self.scope = prefixes.into_iter().map(Into::into).collect();
        if self.scope.iter().any(String::is_empty) {
            self.scope.clear();
        }
        self
    }

    /// At most this many locks in the table (default 100, at least 1). The counts above it are
    /// of every lock the scan finds (within [`list_budget`](Self::list_budget)); the page says
    /// when it lists only some, and a prefix narrows the list.
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit.max(1);
        self
    }

    /// How often an open page refreshes its table and counts (default 3 s, at least 500 ms);
    /// a page in a hidden tab does not.
    pub fn refresh_every(mut self, every: Duration) -> Self {
        self.refresh = every.max(Duration::from_millis(500));
        self
    }

    /// How long one listing may scan (default 500 ms): over a large keyspace, or with many
    /// locks to count, the page shows what it found by then, says it stopped, and its counts
    /// read "at least N".
    pub fn list_budget(mut self, budget: Duration) -> Self {
        self.list_budget = budget;
        self
    }

    /// At most this many live views open at once across every browser (default 8): each is
    /// a watch with a subscribed Redis connection of its own. One more is answered 503.
    pub fn live_views(mut self, max: usize) -> Self {
        self.live_views = max;
        self
    }

    /// Lets the page force-release a lock (default: read-only, and the route does not exist).
    /// The page then asks for confirmation naming the holder, and refuses a request that is
    /// not from the page itself (its origin and a token bound to the browser's cookie) or
    /// whose confirmed holder no longer holds the key. [`LockClient::force_release`] says
    /// what happens to the holder's work.
    pub fn force_release(mut self, enabled: bool) -> Self {
        self.force_release = enabled;
        self
    }

    /// The page's routes, to nest under the application's admin path and auth layer:
    /// `nest_service("/locks", page.router())` serves `…/locks` and `…/locks/` alike (links
    /// inside the page work from either); `nest` serves only the path as written.
    pub fn router<S: Clone + Send + Sync + 'static>(self) -> Router<S> {
        let force_release = self.force_release;
        let page = Arc::new(Page {
            live_views: Arc::new(Semaphore::new(self.live_views)),
            options: self,
        });
        let router = Router::new()
            .route("/", get(index))
            .route("/table", get(table))
            .route("/events", get(events))
            .route(
                "/page.js",
                get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }),
            )
            .route(
                "/page.css",
                get(|| async { asset("text/css; charset=utf-8", STYLE) }),
            );
        let router = if force_release {
            router.route("/release", post(release))
        } else {
            router
        };
        // Gzipped for a browser that accepts it: a table of 5 000 locks is ~1.8 MB of HTML.
        // The live view's events (`text/event-stream`) and answers under 32 bytes go as they are.
        router
            .layer(tower_http::compression::CompressionLayer::new())
            .with_state(page)
    }
}

struct Page {
    options: LocksPage,
    live_views: Arc<Semaphore>,
}

impl Page {
    /// Whether `name` (a key, or a prefix of keys) lies under one of the page's prefixes.
    fn under_scope(&self, name: &str) -> bool {
        let scope = &self.options.scope;
        scope.is_empty()
            || scope.iter().any(|allowed| {
                name.strip_prefix(allowed.as_str())
                    .is_some_and(|rest| rest.starts_with(':'))
            })
    }

    /// Why the page does not list the locks under `prefix`, if it does not: outside its scope,
    /// or too long. `""` is the whole scope.
    fn refuse_prefix(&self, prefix: &str) -> Option<String> {
        if prefix.is_empty() {
            return None;
        }
        if !self.options.scope.iter().any(|allowed| allowed == prefix) && !self.under_scope(prefix)
        {
            return Some(format!(
                "the prefix `{prefix}` is outside this page's scope"
            ));
        }
        check_key(prefix.to_owned())
            .err()
            .map(|error| error.to_string())
    }

    /// Why the page does not follow or release `key`, if it does not.
    fn refuse_key(&self, key: &str) -> Option<String> {
        if let Err(error) = check_key(key.to_owned()) {
            return Some(error.to_string());
        }
        (!self.under_scope(key)).then(|| format!("the key `{key}` is outside this page's scope"))
    }

    /// The locks under `prefix` (every prefix of the scope when empty): the first `limit`
    /// found, in key order, and every one counted, as far as the scan gets within the
    /// listing's budget.
    async fn list(&self, prefix: &str) -> Listing {
        let mut listing = Listing::default();
        let prefixes: Vec<&str> = if !prefix.is_empty() || self.options.scope.is_empty() {
            vec![prefix]
        } else {
            self.options.scope.iter().map(String::as_str).collect()
        };
        let began = Instant::now();
        let deadline = began + self.options.list_budget;
        'prefixes: for prefix in prefixes {
            let mut found: LockStream<LockInfo> = self.options.client.list(prefix);
            loop {
                match timeout_at(deadline, found.next()).await {
                    Err(_) => {
                        listing.cut_short = true;
                        break 'prefixes;
                    }
                    Ok(None) => break,
                    Ok(Some(Ok(lock))) => {
                        listing.counted.add(&lock);
                        if listing.locks.len() < self.options.limit {
                            listing.locks.push(lock);
                        }
                    }
                    Ok(Some(Err(error))) => {
                        listing.error = Some(error.to_string());
                        break 'prefixes;
                    }
                }
            }
        }
        listing.locks.sort_by(|a, b| a.key().cmp(b.key()));
        listing.took = began.elapsed();
        listing
    }

    fn table_view<'a>(&self, prefix: &'a str) -> TableView<'a> {
        TableView {
            prefix,
            budget: self.options.list_budget,
            force_release: self.options.force_release,
        }
    }
}

/// A query string or a form body, decoded.
struct Params(Vec<(String, String)>);

impl Params {
    fn parse(encoded: &[u8]) -> Self {
        Self(url::form_urlencoded::parse(encoded).into_owned().collect())
    }

    fn of_query(query: Option<String>) -> Self {
        Self::parse(query.unwrap_or_default().as_bytes())
    }

    fn get(&self, name: &str) -> &str {
        self.0
            .iter()
            .find(|(key, _)| key == name)
            .map_or("", |(_, value)| value)
    }
}

async fn index(
    State(page): State<Arc<Page>>,
    OriginalUri(uri): OriginalUri,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    let params = Params::of_query(query);
    let prefix = params.get("prefix");
    let listing = match page.refuse_prefix(prefix) {
        Some(reason) => Listing {
            error: Some(reason),
            ..Listing::default()
        },
        None => page.list(prefix).await,
    };
    let watch = Some(params.get("watch")).filter(|key| !key.is_empty());
    let watch_refused = watch.and_then(|key| page.refuse_key(key));
    let (csrf, set_cookie) = if page.options.force_release {
        let (token, set_cookie) = csrf::token_for(&headers);
        (Some(token), set_cookie)
    } else {
        (None, None)
    };
    // Relative to the page: `/admin/locks` reaches its routes as `locks/…`.
    let path = uri.path();
    let base = if path.ends_with('/') {
        String::new()
    } else {
        format!("{}/", path.rsplit('/').next().unwrap_or_default())
    };
    let view = PageView {
        base: &base,
        table: page.table_view(prefix),
        watch: watch.map(|key| match &watch_refused {
            Some(reason) => Err(reason.as_str()),
            None => Ok(key),
        }),
        csrf: csrf.as_deref(),
        refresh: page.options.refresh,
        scope: &page.options.scope,
    };
    let mut response = html(StatusCode::OK, render::page(&view, &listing));
    if let Some(set_cookie) = set_cookie {
        response
            .headers_mut()
            .insert(header::SET_COOKIE, set_cookie);
    }
    response
}

async fn table(State(page): State<Arc<Page>>, RawQuery(query): RawQuery) -> Response {
    let params = Params::of_query(query);
    let prefix = params.get("prefix");
    if let Some(reason) = page.refuse_prefix(prefix) {
        return text(StatusCode::FORBIDDEN, reason);
    }
    let listing = page.list(prefix).await;
    html(
        StatusCode::OK,
        render::table(&page.table_view(prefix), &listing),
    )
}

async fn events(State(page): State<Arc<Page>>, RawQuery(query): RawQuery) -> Response {
    let params = Params::of_query(query);
    let key = params.get("key");
    if let Some(reason) = page.refuse_key(key) {
        return text(StatusCode::FORBIDDEN, reason);
    }
    let Ok(permit) = page.live_views.clone().try_acquire_owned() else {
        let mut response = text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "{} live views are open already; close one",
                page.options.live_views
            ),
        );
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(10));
        return response;
    };
    let mut response = Sse::new(live(page.options.client.watch(key), permit)).into_response();
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    response
}

/// A watch as Server-Sent Events: `acquired` (`{"holder":"ab12","who":"billing (pid 7) on web-1"}`), `released`, `trouble`
/// when Redis does not answer (the watch goes on), and a comment every [`KEEP_ALIVE`] of
/// silence. The permit is held while the stream lives.
fn live(
    watch: LockStream<LockEvent>,
    permit: OwnedSemaphorePermit,
) -> impl Stream<Item = Result<Event, Infallible>> {
    stream::unfold((watch, permit), |(mut watch, permit)| async move {
        let event = match timeout(KEEP_ALIVE, watch.next()).await {
            Err(_) => Event::default().comment("still watching"),
            Ok(None) => return None,
            Ok(Some(Ok(LockEvent::Acquired { token_hint, holder }))) => {
                let who = render::identity(&holder).unwrap_or_default();
                Event::default().event("acquired").data(format!(
                    r#"{{"holder":{},"who":{}}}"#,
                    json_string(&token_hint),
                    json_string(&who)
                ))
            }
            Ok(Some(Ok(LockEvent::Released))) => Event::default().event("released").data("{}"),
            Ok(Some(Err(error))) => Event::default().event("trouble").data(format!(
                r#"{{"error":{}}}"#,
                json_string(&error.to_string())
            )),
        };
        Some((Ok(event), (watch, permit)))
    })
}

/// A forced release, confirmed in the page for the holders it names in `holders`.
async fn release(State(page): State<Arc<Page>>, headers: HeaderMap, body: Bytes) -> Response {
    let form = Params::parse(&body);
    if let Some(reason) = csrf::refusal(&headers, form.get("csrf")) {
        return text(StatusCode::FORBIDDEN, reason.to_owned());
    }
    let key = form.get("key");
    if let Some(reason) = page.refuse_key(key) {
        return text(StatusCode::FORBIDDEN, reason);
    }
    let client = &page.options.client;
    let lock = match client.inspect(key).await {
        Ok(Some(lock)) => lock,
        Ok(None) => {
            return text(
                StatusCode::CONFLICT,
                format!("`{key}` is not held any more; nothing released"),
            );
        }
        Err(error) => return text(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
    };
    // As sets: the order of a shared lock's holders changes as their leases are renewed.
    let mut holders: Vec<&str> = lock.holders().iter().map(Holder::token_hint).collect();
    let mut confirmed: Vec<&str> = form.get("holders").split(',').collect();
    holders.sort_unstable();
    confirmed.sort_unstable();
    let named: Vec<String> = lock.holders().iter().map(render::holder_label).collect();
    let named = named.join("; ");
    if holders != confirmed {
        return text(
            StatusCode::CONFLICT,
            format!(
                "`{key}` is held by {named} now, not by the holder you confirmed; nothing released"
            ),
        );
    }
    match client.force_release(key).await {
        Ok(true) => {
            tracing::warn!(key, holders = %named, "lock force-released from the locks page");
            text(
                StatusCode::OK,
                format!("released `{key}` (held by {named})"),
            )
        }
        Ok(false) => text(
            StatusCode::CONFLICT,
            format!("`{key}` is not held any more; nothing released"),
        ),
        Err(error) => text(StatusCode::SERVICE_UNAVAILABLE, error.to_string()),
    }
}

/// A page or fragment: never cached, never framed, only the page's own scripts.
fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "same-origin"),
        ],
        body,
    )
        .into_response()
}

/// An answer the page's script shows as text.
fn text(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CACHE_CONTROL, "no-store"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        body,
    )
        .into_response()
}
