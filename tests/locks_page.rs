//! The `axum` feature over plain HTTP, against a real redis-server: the live locks page
//! (`lockmacro_runtime::axum::locks_page`: what it lists and counts and how it escapes it, what
//! it refuses (keys outside its scope, forced releases unless enabled, forged or stale
//! requests), and the work it bounds), and `LockError`'s responses. The browser test
//! (`tests/locks_page_browser.rs`) drives the same page in headless Chromium.

mod common;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Request, StatusCode, header};
use axum::routing::post;
use common::Log;
use http_body_util::BodyExt;
use lockmacro_runtime::axum::{JsonLockError, LocksPage, locks_page};
use lockmacro_runtime::{LockClient, LockError, LockOptions, redis_lock};
use testkit::{Deployment, RedisServer, SingleRedis};
use tower::ServiceExt;

/// The page nested where an application would put it.
fn mounted(page: LocksPage) -> Router {
    Router::new().nest("/admin/locks", page.router())
}

fn held(ttl_s: u64) -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(ttl_s))
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    Answer {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

async fn get(app: &Router, uri: &str) -> Answer {
    send(app, Request::get(uri).body(Body::empty()).unwrap()).await
}

/// A forced release as the page's script sends it, from the page's origin.
fn release_request(cookie: Option<&str>, form: &[(&str, &str)]) -> Request<Body> {
    let body: String = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form)
        .finish();
    let mut request = Request::post("/admin/locks/release")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .header("sec-fetch-site", "same-origin");
    if let Some(cookie) = cookie {
        request = request.header(header::COOKIE, cookie);
    }
    request.body(Body::from(body)).unwrap()
}

/// The page's token, from the cookie it sets and the attribute it renders (the two agree).
fn token_of(page: &Answer) -> String {
    let set_cookie = page.headers[header::SET_COOKIE].to_str().unwrap();
    let token = set_cookie
        .strip_prefix("lockmacro_locks_csrf=")
        .and_then(|rest| rest.split(';').next())
        .unwrap()
        .to_owned();
    assert!(
        page.body.contains(&format!(r#"data-csrf="{token}""#)),
        "the page renders its cookie's token"
    );
    token
}

#[tokio::test]
async fn lists_the_locks_held_with_kind_holder_time_left_fencing_token_and_counts() {
    let redis = SingleRedis::start();
    let client = redis.client().await;
    let app = mounted(locks_page(client.clone()));
    let first = client
        .acquire("orders:1", held(30).fencing(true))
        .await
        .unwrap();
    let readers = [
        client.acquire("reports:q3", held(30).read()).await.unwrap(),
        client.acquire("reports:q3", held(30).read()).await.unwrap(),
    ];

    let page = get(&app, "/admin/locks").await;
    assert_eq!(page.status, StatusCode::OK);
    assert_eq!(
        page.headers[header::CONTENT_TYPE],
        "text/html; charset=utf-8"
    );
    let fencing = first.fencing_token().unwrap();
    let row = row_of(&page.body, "orders:1");
    assert!(row.contains("<td>exclusive</td>"), "{row}");
    assert!(row.contains(&format!("{}…", &first.token()[..4])), "{row}");
    assert!(row.contains(&format!("<td>{fencing}</td>")), "{row}");
    assert!(row.contains(" s</td>"), "time left: {row}");
    let shared = row_of(&page.body, "reports:q3");
    assert!(shared.contains("<td>read</td>"), "{shared}");
    assert_eq!(shared.matches("<li>").count(), 2, "two readers: {shared}");
    assert!(
        page.body
            .contains(r#"<b id="count-locks">2</b> locks held"#)
    );
    assert!(page.body.contains(r#"<b id="count-holders">3</b> holders"#));
    // Read-only unless enabled: nothing to release, no token.
    assert!(!page.body.contains("Force release"));
    assert!(!page.body.contains("data-csrf"));
    assert!(page.headers.get(header::SET_COOKIE).is_none());

    first.release().await.unwrap();
    let table = get(&app, "/admin/locks/table").await;
    assert!(
        !table.body.contains(r#"data-key="orders:1""#),
        "released: gone"
    );
    assert!(
        table
            .body
            .contains(r#"<b id="count-locks">1</b> lock held"#)
    );
    let filtered = get(&app, "/admin/locks/table?prefix=orders").await;
    assert!(
        filtered
            .body
            .contains("No locks held under <code>orders:</code>.")
    );
    for reader in readers {
        reader.release().await.unwrap();
    }
}

/// The `<tr>` of `key` (which must be plain text) in a rendered table.
fn row_of<'a>(html: &'a str, key: &str) -> &'a str {
    let start = html
        .find(&format!(r#"<tr data-key="{key}">"#))
        .unwrap_or_else(|| panic!("no row for {key} in {html}"));
    let end = start + html[start..].find("</tr>").unwrap();
    &html[start..end]
}

/// A waiter in another client is counted; once it has waited long enough for the lock to be
/// reserved for it (a reservation, which keeps its value), the page says who it is. On Redis and
/// in memory.
#[tokio::test]
async fn a_waiter_in_another_process_is_counted_and_named_once_the_lock_is_reserved_for_it() {
    let redis = SingleRedis::start();
    let client = redis.client().await;
    let other = redis.another_client().await;
    let table = shows_the_waiter(&client, other).await;
    assert!(
        table.contains(r#"<b id="count-waiters">1</b> waiting"#),
        "{table}"
    );
    let in_memory = LockClient::in_memory();
    shows_the_waiter(&in_memory, in_memory.clone()).await;
}

/// Holds `jobs:nightly` with `client` while `other` waits for it, until the page names the
/// waiter; checks that its name is the lease it then gets. Returns the table.
async fn shows_the_waiter(client: &LockClient, other: LockClient) -> String {
    let app = mounted(locks_page(client.clone()));
    let holder = client.acquire("jobs:nightly", held(30)).await.unwrap();
    let waiting = tokio::spawn(async move {
        other
            .acquire("jobs:nightly", held(30).wait(Duration::from_secs(30)))
            .await
    });
    // The waiter reserves the key at a look of its own, 20 ms into its wait: watched for.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let table = loop {
        let table = get(&app, "/admin/locks/table").await.body;
        if row_of(&table, "jobs:nightly").contains("next: ") {
            break table;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the waiter not named within 10 s: {table}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let row = row_of(&table, "jobs:nightly").to_owned();
    assert!(
        row.contains(r#"<td class="waiters"><b class="count">1</b> <span class="next">next: <code class="token">"#),
        "{row}"
    );
    let who = format!("{} (pid {}) on ", app_name(), std::process::id());
    assert!(row.contains(&who), "{row}");
    assert!(row.contains(", waiting "), "{row}");
    let info = client.inspect("jobs:nightly").await.unwrap().unwrap();
    let next = info.reserved_for().expect("reserved for the waiter");
    assert_eq!(next.pid(), Some(std::process::id()));

    holder.release().await.unwrap();
    let lease = waiting.await.unwrap().unwrap();
    assert!(
        row.contains(&format!(
            r#"next: <code class="token">{}…</code>"#,
            &lease.token()[..4]
        )),
        "the waiter named is the one that got the lock: {row}"
    );
    lease.release().await.unwrap();
    table
}

/// Keys are user data: a key holding markup is shown as text everywhere the page shows it,
/// and the page's policy would not run an inline script anyway.
#[tokio::test]
async fn keys_are_escaped_everywhere_the_page_shows_them() {
    let redis = SingleRedis::start();
    let client = redis.client().await;
    let app = mounted(locks_page(client.clone()).force_release(true));
    let key = r#"x:<script>alert("pwned")</script>&'"#;
    let lease = client.acquire(key, held(30)).await.unwrap();
    let escaped = "x:&lt;script&gt;alert(&quot;pwned&quot;)&lt;/script&gt;&amp;&#39;";
    let watch = format!("/admin/locks?prefix=x&watch={}", encode(key));

    let page = get(&app, &watch).await;
    assert!(!page.body.contains("<script>alert"), "{}", page.body);
    assert!(page.body.contains(&format!(r#"<tr data-key="{escaped}">"#)));
    assert!(
        page.body.contains(&format!(">{escaped}</a>")),
        "the key's link text"
    );
    assert!(
        page.body
            .contains(&format!(r#"<section id="live" data-key="{escaped}">"#)),
        "the live view"
    );
    assert!(
        page.body
            .contains(&format!(r#"data-key="{escaped}" data-holders="#)),
        "the release button"
    );
    let filtered = get(&app, &format!("/admin/locks?prefix={}", encode("<b>x"))).await;
    assert!(!filtered.body.contains("<b>x"), "{}", filtered.body);
    assert!(
        filtered.body.contains(r#"value="&lt;b&gt;x""#),
        "the filter's value"
    );
    assert!(
        filtered
            .body
            .contains("No locks held under <code>&lt;b&gt;x:</code>.")
    );
    let policy = page.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    assert!(policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"));
    lease.release().await.unwrap();
}

fn encode(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

#[tokio::test]
async fn read_only_by_default_has_no_release_route() {
    let redis = SingleRedis::start();
    let client = redis.client().await;
    let app = mounted(locks_page(client.clone()));
    let lease = client.acquire("orders:7", held(30)).await.unwrap();
    let page = get(&app, "/admin/locks").await;
    assert!(page.body.contains("read-only"));
    let hint = &lease.token()[..4];
    let cookie = "lockmacro_locks_csrf=0123456789abcdef0123456789abcdef";
    let refused = send(
        &app,
        release_request(
            Some(cookie),
            &[
                ("key", "orders:7"),
                ("holders", hint),
                ("csrf", "0123456789abcdef0123456789abcdef"),
            ],
        ),
    )
    .await;
    assert_eq!(refused.status, StatusCode::NOT_FOUND);
    assert!(
        client.inspect("orders:7").await.unwrap().is_some(),
        "still held"
    );
    lease.release().await.unwrap();
}

#[tokio::test]
async fn forced_release_needs_the_pages_token_its_origin_and_the_confirmed_holder() {
    let redis = SingleRedis::start();
    let client = redis.client().await;
    let app = mounted(locks_page(client.clone()).force_release(true));
    let lease = client.acquire("orders:9", held(30)).await.unwrap();
    let hint = lease.token()[..4].to_owned();

    let page = get(&app, "/admin/locks").await;
    assert!(page.body.contains("forced release enabled"));
    let token = token_of(&page);
    let cookie = format!("lockmacro_locks_csrf={token}");
    let row = row_of(&page.body, "orders:9");
    assert!(
        row.contains(&format!(
            r#"data-holders="{hint}" data-holder-label="token {hint}…, {} (pid {}) on "#,
            app_name(),
            std::process::id()
        )),
        "the confirmation names the holder, its application, process and host: {row}"
    );
    let release = |cookie: Option<&str>, holders: &str, csrf: &str| {
        send(
            &app,
            release_request(
                cookie,
                &[("key", "orders:9"), ("holders", holders), ("csrf", csrf)],
            ),
        )
    };

    // No cookie (another browser, or a forged form): refused.
    let refused = release(None, &hint, &token).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    // The cookie without the page's token, or with another one: refused.
    let refused = release(Some(&cookie), &hint, "").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    let refused = release(Some(&cookie), &hint, "ffffffffffffffffffffffffffffffff").await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    // From another site, even with the right cookie and token: refused.
    for site in ["cross-site", "same-site"] {
        let mut request = release_request(
            Some(&cookie),
            &[("key", "orders:9"), ("holders", &hint), ("csrf", &token)],
        );
        request
            .headers_mut()
            .insert("sec-fetch-site", site.parse().unwrap());
        let refused = send(&app, request).await;
        assert_eq!(refused.status, StatusCode::FORBIDDEN, "{site}");
    }
    // Confirmed for another holder: refused, and the answer says who holds it now.
    let refused = release(Some(&cookie), "zzzz", &token).await;
    assert_eq!(refused.status, StatusCode::CONFLICT);
    assert!(
        refused.body.contains(&format!("held by token {hint}…")),
        "{}",
        refused.body
    );
    assert!(
        client.inspect("orders:9").await.unwrap().is_some(),
        "still held"
    );

    let released = release(Some(&cookie), &hint, &token).await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    assert!(
        released
            .body
            .contains(&format!("released `orders:9` (held by token {hint}…"))
    );
    assert!(client.inspect("orders:9").await.unwrap().is_none());
    let again = release(Some(&cookie), &hint, &token).await;
    assert_eq!(
        again.status,
        StatusCode::CONFLICT,
        "nothing left to release"
    );

    // A shared lock's holders are confirmed as a set: their order changes as they renew.
    let _readers = [
        client.acquire("orders:10", held(30).read()).await.unwrap(),
        client.acquire("orders:10", held(30).read()).await.unwrap(),
    ];
    let shown = client.inspect("orders:10").await.unwrap().unwrap();
    let mut confirmed: Vec<&str> = shown.holders().iter().map(|h| h.token_hint()).collect();
    confirmed.reverse();
    let confirmed = confirmed.join(",");
    let released = send(
        &app,
        release_request(
            Some(&cookie),
            &[
                ("key", "orders:10"),
                ("holders", &confirmed),
                ("csrf", &token),
            ],
        ),
    )
    .await;
    assert_eq!(released.status, StatusCode::OK, "{}", released.body);
    assert!(client.inspect("orders:10").await.unwrap().is_none());
    drop(lease);
}

/// A page limited to some prefixes lists, follows and releases nothing else, whatever the
/// request asks.
#[tokio::test]
async fn never_shows_or_releases_a_key_outside_its_scope() {
    let redis = SingleRedis::start();
    let client = redis.client().await;
    let app = mounted(
        locks_page(client.clone())
            .prefixes(["orders", "tenant:7"])
            .force_release(true),
    );
    let leases = [
        client.acquire("orders:1", held(30)).await.unwrap(),
        client.acquire("tenant:7:report", held(30)).await.unwrap(),
        client.acquire("payroll:1", held(30)).await.unwrap(),
        client.acquire("tenant:77:report", held(30)).await.unwrap(),
        client.acquire("ordersx:1", held(30)).await.unwrap(),
    ];

    let page = get(&app, "/admin/locks").await;
    assert!(page.body.contains(r#"data-key="orders:1""#));
    assert!(page.body.contains(r#"data-key="tenant:7:report""#));
    for outside in ["payroll:1", "tenant:77:report", "ordersx:1"] {
        assert!(!page.body.contains(outside), "{outside} listed");
    }
    assert!(page.body.contains(r#"<b id="count-locks">2</b>"#));

    for prefix in ["payroll", "tenant", "order"] {
        let table = get(&app, &format!("/admin/locks/table?prefix={prefix}")).await;
        assert_eq!(table.status, StatusCode::FORBIDDEN, "{prefix}");
        let page = get(&app, &format!("/admin/locks?prefix={prefix}")).await;
        assert!(
            page.body.contains("outside this page&#39;s scope"),
            "{prefix}"
        );
        assert!(!page.body.contains("payroll:1"), "{prefix}");
    }
    let inside = get(&app, "/admin/locks/table?prefix=tenant:7").await;
    assert!(inside.body.contains(r#"data-key="tenant:7:report""#));

    let events = get(&app, "/admin/locks/events?key=payroll:1").await;
    assert_eq!(events.status, StatusCode::FORBIDDEN);
    let page = get(&app, "/admin/locks?watch=payroll:1").await;
    assert!(!page.body.contains(r#"data-key="payroll:1""#));

    let page = get(&app, "/admin/locks").await;
    let token = token_of(&page);
    let hint = &leases[2].token()[..4];
    let refused = send(
        &app,
        release_request(
            Some(&format!("lockmacro_locks_csrf={token}")),
            &[("key", "payroll:1"), ("holders", hint), ("csrf", &token)],
        ),
    )
    .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    assert!(client.inspect("payroll:1").await.unwrap().is_some());
    for lease in leases {
        lease.release().await.unwrap();
    }
}

/// One refresh shows at most `limit` locks and scans for at most `list_budget`: a page left
/// open over a large keyspace costs Redis a bounded amount per refresh.
#[tokio::test]
async fn a_refresh_is_bounded_by_the_limit_and_the_scan_budget() {
    let redis = SingleRedis::start();
    let client = redis.client().await;
    let mut leases = Vec::new();
    for n in 0..7 {
        leases.push(
            client
                .acquire(&format!("bulk:{n}"), held(30))
                .await
                .unwrap(),
        );
    }
    let limited = mounted(locks_page(client.clone()).limit(5));
    let table = get(&limited, "/admin/locks/table").await;
    assert_eq!(table.body.matches("<tr data-key=").count(), 5);
    assert!(
        table.body.contains("Showing the first 5 of 7 locks found"),
        "{}",
        table.body
    );
    assert!(
        table
            .body
            .contains(r#"<b id="count-locks">7</b> locks held"#),
        "the counts are of every lock held, not of those listed: {}",
        table.body
    );
    let everything = mounted(locks_page(client.clone()));
    let table = get(&everything, "/admin/locks/table").await;
    assert_eq!(table.body.matches("<tr data-key=").count(), 7);
    assert!(!table.body.contains("Showing the first"));
    assert!(!table.body.contains("The scan stopped"));

    // 200 000 keys that are no locks: a scan through them takes 200 SCAN steps.
    let mut connection = redis.server.connection().await;
    for chunk in 0..200 {
        let mut mset = redis::cmd("MSET");
        for n in 0..1000 {
            mset.arg(format!("other:{chunk}:{n}")).arg("x");
        }
        let () = mset.query_async(&mut connection).await.unwrap();
    }
    let budgeted = mounted(
        locks_page(client.clone())
            .prefixes(["bulk"])
            .list_budget(Duration::from_millis(1)),
    );
    let table = get(&budgeted, "/admin/locks/table").await;
    assert!(
        table.body.contains("The scan stopped after 1 ms"),
        "{}",
        table.body
    );
    // What it counted by then is a floor, and says so.
    let counted = count_after(&table.body, r#"at least <b id="count-locks">"#);
    assert!(counted <= 7, "{}", table.body);
    assert!(
        table.body.contains(r#"at least <b id="count-holders">"#),
        "{}",
        table.body
    );
    for lease in leases {
        lease.release().await.unwrap();
    }
}

/// The number after `before` in `html`.
fn count_after(html: &str, before: &str) -> usize {
    let at = html
        .find(before)
        .unwrap_or_else(|| panic!("no `{before}` in {html}"));
    let digits: String = html[at + before.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap()
}

/// Regression: with 5 001 locks held the page said "100 locks held · 100 holders", counting
/// the rows it listed. It counts every lock the scan finds, listing only the first `limit`.
#[tokio::test]
async fn the_counts_are_of_every_lock_held_not_of_the_rows_listed() {
    use futures_util::StreamExt;

    let redis = SingleRedis::start();
    let client = redis.client().await;
    let leases: Vec<_> = futures_util::stream::iter(0..5001)
        .map(|n| {
            let client = client.clone();
            async move { client.acquire(&format!("bulk:{n}"), held(120)).await }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    // Enough budget for the whole scan on loaded cores: what is checked is what is counted.
    let app = mounted(locks_page(client.clone()).list_budget(Duration::from_secs(60)));
    let table = get(&app, "/admin/locks/table").await;
    assert_eq!(table.body.matches("<tr data-key=").count(), 100);
    assert!(
        table.body.contains(
            r#"<b id="count-locks">5001</b> locks held · <b id="count-holders">5001</b> holders · <b id="count-waiters">0</b> waiting"#
        ),
        "{}",
        &table.body[..400]
    );
    assert!(
        table
            .body
            .contains("Showing the first 100 of 5001 locks found"),
        "{}",
        &table.body[..600]
    );
    for lease in leases {
        lease.unwrap().release().await.unwrap();
    }
}

/// Regression: a refresh at a limit of 5 000 was 1.76 MB of HTML, uncompressed. A browser that
/// accepts gzip gets it gzipped; the live view's events are never held back to be compressed.
#[tokio::test]
async fn a_browser_that_accepts_gzip_gets_the_table_gzipped() {
    use std::io::Read;

    let redis = SingleRedis::start();
    let client = redis.client().await;
    let mut leases = Vec::new();
    for n in 0..300 {
        leases.push(
            client
                .acquire(&format!("bulk:{n}"), held(60))
                .await
                .unwrap(),
        );
    }
    let app = mounted(locks_page(client.clone()).limit(300));
    let plain = get(&app, "/admin/locks/table").await;
    assert!(plain.headers.get(header::CONTENT_ENCODING).is_none());
    assert_eq!(plain.body.matches("<tr data-key=").count(), 300);

    let request = Request::get("/admin/locks/table")
        .header(header::ACCEPT_ENCODING, "gzip")
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_ENCODING], "gzip");
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/html; charset=utf-8"
    );
    let gzipped = response.into_body().collect().await.unwrap().to_bytes();
    let mut html = String::new();
    flate2::read::GzDecoder::new(&gzipped[..])
        .read_to_string(&mut html)
        .expect("a gzip body");
    assert_eq!(html.matches("<tr data-key=").count(), 300);
    assert!(
        gzipped.len() * 4 < plain.body.len(),
        "{} bytes gzipped, {} plain",
        gzipped.len(),
        plain.body.len()
    );
    eprintln!(
        "table of 300 locks: {} bytes, {} gzipped",
        plain.body.len(),
        gzipped.len()
    );

    let request = Request::get("/admin/locks/events?key=bulk:0")
        .header(header::ACCEPT_ENCODING, "gzip")
        .body(Body::empty())
        .unwrap();
    let events = app.clone().oneshot(request).await.unwrap();
    assert_eq!(events.headers()[header::CONTENT_TYPE], "text/event-stream");
    assert!(events.headers().get(header::CONTENT_ENCODING).is_none());
    let mut body = events.into_body();
    assert!(next_event(&mut body).await.starts_with("event: acquired\n"));
    for lease in leases {
        lease.release().await.unwrap();
    }
}

/// The live view: `watch` as Server-Sent Events, and at most `live_views` at once.
#[tokio::test]
async fn the_live_view_streams_acquired_and_released() {
    let redis = SingleRedis::start();
    let client = redis.client().await;
    let app = mounted(locks_page(client.clone()).live_views(1));
    let response = open_live_view(&app, "orders:5").await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_TYPE],
        "text/event-stream"
    );
    let mut body = response.into_body();

    let second = get(&app, "/admin/locks/events?key=orders:6").await;
    assert_eq!(
        second.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "one live view at most"
    );
    assert!(second.headers.contains_key(header::RETRY_AFTER));

    let lease = client.acquire("orders:5", held(30)).await.unwrap();
    let acquired = next_event(&mut body).await;
    let expected = format!(
        "event: acquired\ndata: {{\"holder\":\"{}\",\"who\":\"{} (pid {}) on ",
        &lease.token()[..4],
        app_name(),
        std::process::id()
    );
    assert!(
        acquired.starts_with(&expected),
        "the acquired event names the holder and who it is: {acquired}"
    );
    lease.release().await.unwrap();
    assert_eq!(next_event(&mut body).await, "event: released\ndata: {}\n\n");

    // Closing the view (dropping its stream) gives its place back at once.
    drop(body);
    let reopened = open_live_view(&app, "orders:6").await;
    assert_eq!(reopened.status(), StatusCode::OK);
}

/// The live view's stream of events for `key`, as the browser opens it.
async fn open_live_view(app: &Router, key: &str) -> axum::response::Response {
    let uri = format!("/admin/locks/events?key={}", encode(key));
    app.clone()
        .oneshot(Request::get(uri).body(Body::empty()).unwrap())
        .await
        .unwrap()
}

/// The next Server-Sent Event, skipping keep-alive comments.
async fn next_event(body: &mut Body) -> String {
    let mut event = String::new();
    loop {
        let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("an event within 10 s")
            .expect("the stream goes on")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            event.push_str(std::str::from_utf8(&data).unwrap());
        }
        if event.ends_with("\n\n") {
            if event.starts_with(':') {
                event.clear();
                continue;
            }
            return event;
        }
    }
}

/// Mounted at the root or under a trailing slash, the page still reaches its own routes; nested
/// as a service, it answers with and without the trailing slash.
#[tokio::test]
async fn links_work_wherever_the_page_is_mounted() {
    let client = LockClient::in_memory();
    let as_service = || {
        let admin = Router::new().nest_service("/locks", locks_page(client.clone()).router());
        Router::new().nest("/admin", admin)
    };
    for (app, path, base) in [
        (
            Router::new().nest("/admin/locks", locks_page(client.clone()).router()),
            "/admin/locks",
            "locks/",
        ),
        (
            Router::new().nest("/admin/locks/", locks_page(client.clone()).router()),
            "/admin/locks/",
            "",
        ),
        (locks_page(client.clone()).router(), "/", ""),
        (as_service(), "/admin/locks", "locks/"),
        (as_service(), "/admin/locks/", ""),
    ] {
        let page = get(&app, path).await;
        assert_eq!(page.status, StatusCode::OK, "{path}");
        assert!(
            page.body.contains(&format!(r#"data-base="{base}""#)),
            "{path}"
        );
        let script = format!("{}{base}page.js", &path[..path.rfind('/').unwrap() + 1]);
        let script = get(&app, &script).await;
        assert_eq!(script.status, StatusCode::OK, "{path}");
        assert!(script.body.contains("EventSource"));
    }
}

#[redis_lock(prefix = "borrow", key = user_id, client = locks)]
async fn borrow<E: From<LockError>>(
    State(locks): State<LockClient>,
    Path(user_id): Path<u64>,
) -> Result<String, E> {
    Ok(format!("book lent to {user_id}"))
}

/// A handler answering `LockError` as text and as JSON, under `/text/{id}` and `/json/{id}`.
fn borrowing(locks: LockClient) -> Router {
    Router::new()
        .route("/text/{user_id}", post(borrow::<LockError>))
        .route("/json/{user_id}", post(borrow::<JsonLockError>))
        .with_state(locks)
}

/// A wrong password is a mistake, not an outage: 500 without `Retry-After` (no retry helps),
/// logged once as an error rather than warned about on every request.
#[tokio::test]
async fn a_refused_password_answers_500_and_is_logged_once() {
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);
    let server = RedisServer::start();
    server.command(&["CONFIG", "SET", "requirepass", "right-pw"]);
    let url = format!("redis://:wrong-pw@127.0.0.1:{}", server.port());
    let app = borrowing(LockClient::builder(&url).build_lazy().unwrap());

    for (n, path) in ["/text/1", "/text/2", "/json/3", "/json/4"]
        .iter()
        .enumerate()
    {
        let answer = send(&app, Request::post(*path).body(Body::empty()).unwrap()).await;
        assert_eq!(
            answer.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{path}: {}",
            answer.body
        );
        assert!(answer.headers.get(header::RETRY_AFTER).is_none(), "{path}");
        assert!(
            !answer.body.contains("wrong-pw") && !answer.body.contains("127.0.0.1"),
            "{}",
            answer.body
        );
        if path.starts_with("/json") {
            assert!(
                answer.body.starts_with(r#"{"error":"misconfigured","#),
                "{}",
                answer.body
            );
        }
        let logged: Vec<String> = log
            .text()
            .lines()
            .filter(|line| line.contains("ERROR") && line.contains("answered 500"))
            .map(str::to_owned)
            .collect();
        assert_eq!(logged.len(), 1, "after request {}: {logged:#?}", n + 1);
        assert!(logged[0].contains("authentication to"), "{}", logged[0]);
    }
    assert_eq!(log.count("WARN"), 0, "{}", log.text());
    assert_eq!(log.count("answered 500"), 4, "the repeats at debug level");
}

#[derive(Clone)]
struct Queue {
    locks: LockClient,
    /// Told when a request holds the lock.
    entered: tokio::sync::mpsc::UnboundedSender<()>,
    /// One permit lets one holder finish.
    go: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Waits up to 20 s for the lock, then holds it until the test lets it go.
#[redis_lock(prefix = "queue", key = id, client = queue.locks, ttl = 30, wait = 20)]
async fn queue_up(State(queue): State<Queue>, Path(id): Path<u64>) -> Result<String, LockError> {
    let _ = queue.entered.send(());
    queue.go.acquire().await.unwrap().forget();
    Ok(format!("done {id}"))
}

/// Fails fast when the lock is busy.
#[redis_lock(prefix = "queue", key = id, client = queue.locks, ttl = 30)]
async fn peek(State(queue): State<Queue>, Path(id): Path<u64>) -> Result<String, LockError> {
    Ok(format!("peeked {id}"))
}

/// Regression: a 409 said `Retry-After: 3`, the lease, for work that takes 0.5 s. The hint is
/// `Busy`'s `retry_after`, the engine's estimate: once waiters of the key have been served, how
/// fast they were served (rounded up to whole seconds, at least 1), not the lease; before, with
/// nothing observed, the holder's remaining lease.
#[tokio::test]
async fn a_409_retry_after_follows_how_fast_the_lock_changes_hands() {
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.unwrap();
    let (entered, mut holding) = tokio::sync::mpsc::unbounded_channel();
    let queue = Queue {
        locks: locks.clone(),
        entered,
        go: std::sync::Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let app = Router::new()
        .route("/queue/{id}", post(queue_up))
        .route("/peek/{id}", post(peek))
        .with_state(queue.clone());
    let call = |path: &'static str| {
        app.clone()
            .oneshot(Request::post(path).body(Body::empty()).unwrap())
    };
    let callers: Vec<_> = (0..5).map(|_| tokio::spawn(call("/queue/1"))).collect();
    holding.recv().await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while locks.inspect("queue:1").await.unwrap().unwrap().waiters() < 4 {
        assert!(
            std::time::Instant::now() < deadline,
            "4 waiters not counted within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let retry_after = |response: axum::response::Response| {
        assert_eq!(response.status(), StatusCode::CONFLICT);
        response.headers()[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .to_owned()
    };
    // Nobody served yet: the holder's lease (30 s) is all there is to go by.
    assert_eq!(retry_after(call("/peek/1").await.unwrap()), "30");

    // Three waiters served one after another, each as soon as the one before let go; one still
    // waits, so what was observed stays (Redis forgets it a second after the last waiter).
    for _ in 0..3 {
        queue.go.add_permits(1);
        holding.recv().await.unwrap();
    }
    assert_eq!(
        retry_after(call("/peek/1").await.unwrap()),
        "1",
        "how fast the last holders were served, not the 30 s lease"
    );

    queue.go.add_permits(2);
    for caller in callers {
        assert_eq!(caller.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

/// The application name a client takes by default: this test binary's name.
fn app_name() -> String {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.file_stem()
        .and_then(|stem| stem.to_str())
        .expect("a file name")
        .to_owned()
}
