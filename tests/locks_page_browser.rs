//! The live locks page in a real browser: headless Chromium, driven through chromedriver
//! (WebDriver), against an app serving the page over a real redis-server. Locks are taken and
//! released by clients of their own; the test checks what the browser shows: rows that appear
//! and go without a reload, a waiter counted and named, the live view's events, a forced
//! release asked for and confirmed, and, on a read-only page mounted as a service and opened
//! with a trailing slash, no release button, counts of every lock held while only some are
//! listed, and tables that arrive gzipped. It keeps a screenshot at `target/locks-page.png`.
//!
//! Needs `chromium` and `chromedriver` (Debian's `chromium` and `chromium-driver`;
//! `scripts/test.sh` installs them), or their paths in `CHROMIUM` and `CHROMEDRIVER`.
//! Run it alone with `scripts/test.sh -E 'binary(locks_page_browser)'`.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use fantoccini::error::CmdError;
use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use lockmacro_runtime::axum::locks_page;
use lockmacro_runtime::{Lease, LockClient, LockOptions};
use serde_json::json;
use testkit::{Deployment, SingleRedis};

/// chromedriver on a free loopback port, stopped on drop.
struct ChromeDriver {
    child: Child,
    url: String,
}

impl ChromeDriver {
    fn start() -> Self {
        let binary = std::env::var("CHROMEDRIVER").unwrap_or_else(|_| "chromedriver".into());
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(&binary)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|error| {
                panic!(
                    "cannot start `{binary}` ({error}): install Debian's chromium and \
                     chromium-driver (scripts/test.sh does), or set CHROMEDRIVER"
                )
            });
        let driver = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(address).is_err() {
            assert!(
                Instant::now() < deadline,
                "chromedriver did not listen within 30 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        driver
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Headless Chromium as root on a machine without network: no sandbox, no GPU, nothing that
/// calls home, a profile of its own.
async fn browser(driver: &ChromeDriver, profile: &std::path::Path) -> Client {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let capabilities = json!({
        "browserName": "chrome",
        // The test reads and answers the confirmation itself.
        "unhandledPromptBehavior": "ignore",
        "goog:chromeOptions": {
            "binary": chromium,
            "args": [
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--window-size=1280,900",
                format!("--user-data-dir={}", profile.display()),
            ],
        },
    });
    let serde_json::Value::Object(capabilities) = capabilities else {
        unreachable!("an object")
    };
    ClientBuilder::new(HttpConnector::new())
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a Chromium session through chromedriver")
}

/// Serves `app` on a free loopback port; returns its address.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// Polls the browser until `check` gives `Some`: the page changes on its own schedule (its
/// refresh, the live view), which the test can only observe.
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, CmdError>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match check().await {
            Ok(Some(found)) => return found,
            Ok(None) => {}
            // The table is replaced at each refresh: an element found a moment ago may be gone.
            Err(error) if error.is_stale_element_reference() => {}
            Err(error) => panic!("{what}: {error}"),
        }
        assert!(Instant::now() < deadline, "not within 20 s: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the first element matching `css` shows a text `wanted` accepts; returns it.
async fn until_text(browser: &Client, css: &str, wanted: impl Fn(&str) -> bool) -> String {
    until(css, || async {
        Ok(text_of(browser, css).await?.filter(|text| wanted(text)))
    })
    .await
}

/// Waits until nothing matches `css`.
async fn until_gone(browser: &Client, css: &str) {
    until(&format!("{css} gone"), || async {
        Ok(text_of(browser, css).await?.is_none().then_some(()))
    })
    .await
}

/// The text of the first element matching `css`, if there is one.
async fn text_of(browser: &Client, css: &str) -> Result<Option<String>, CmdError> {
    match browser.find(Locator::Css(css)).await {
        Ok(element) => element.text().await.map(Some),
        Err(error) if error.is_no_such_element() => Ok(None),
        Err(error) => Err(error),
    }
}

/// Whether `expression` is true in the page.
async fn script_is_true(browser: &Client, expression: &str) -> bool {
    let value = browser
        .execute(&format!("return {expression}"), vec![])
        .await
        .unwrap();
    value == json!(true)
}

fn row(key: &str) -> String {
    format!(r#"tr[data-key="{key}"]"#)
}

fn held() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(60))
}

fn hint(lease: &Lease) -> &str {
    &lease.token()[..4]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locks_page_in_chromium() {
    let redis = SingleRedis::start();
    let client: LockClient = redis.client().await;
    let app = Router::new()
        .nest(
            "/admin/locks",
            locks_page(client.clone())
                .force_release(true)
                .refresh_every(Duration::from_millis(500))
                .router(),
        )
        .nest_service(
            "/readonly/locks",
            locks_page(client.clone())
                .limit(2)
                .refresh_every(Duration::from_millis(500))
                .router(),
        );
    let address = serve(app).await;
    let driver = ChromeDriver::start();
    let profile = std::env::temp_dir().join(format!("lockmacro-chromium-{}", std::process::id()));
    let browser = browser(&driver, &profile).await;

    // Locks of every kind, a key holding markup, and a waiter in another client.
    let order = client
        .acquire("orders:1", held().fencing(true))
        .await
        .unwrap();
    let readers = [
        client.acquire("reports:q3", held().read()).await.unwrap(),
        client.acquire("reports:q3", held().read()).await.unwrap(),
    ];
    let markup = r#"users:<img src=x onerror="window.pwned=1">"#;
    let marked = client.acquire(markup, held()).await.unwrap();
    let nightly = client.acquire("jobs:nightly", held()).await.unwrap();
    let other = redis.another_client().await;
    let waiter = tokio::spawn(async move {
        other
            .acquire("jobs:nightly", held().wait(Duration::from_secs(60)))
            .await
    });
    redis.waiter_subscribed("jobs:nightly").await;

    browser
        .goto(&format!("http://{address}/admin/locks?watch=orders:2"))
        .await
        .unwrap();
    let orders_1 = row("orders:1");
    let kind = until_text(&browser, &format!("{orders_1} td:nth-child(2)"), |_| true).await;
    assert_eq!(kind, "exclusive");
    let holders = until_text(&browser, &format!("{orders_1} .holders"), |_| true).await;
    assert!(holders.contains(&format!("{}…", hint(&order))), "{holders}");
    let fencing = until_text(&browser, &format!("{orders_1} td:nth-child(5)"), |_| true).await;
    assert_eq!(fencing, order.fencing_token().unwrap().to_string());
    let readers_shown = browser
        .find_all(Locator::Css(&format!("{} .holders li", row("reports:q3"))))
        .await
        .unwrap();
    assert_eq!(readers_shown.len(), 2);

    // The key with markup is text on the page, and nothing of it ran.
    let shown = until_text(&browser, "tr td.key a[href*='users']", |_| true).await;
    assert_eq!(shown, markup);
    assert!(
        script_is_true(&browser, "window.pwned === undefined").await,
        "the key's markup ran"
    );

    // The waiter in the other client is counted, and named once the lock is reserved for it (it
    // reserves it 20 ms into its wait).
    let waiters = format!("{} td.waiters", row("jobs:nightly"));
    until_text(&browser, &format!("{waiters} .count"), |count| count == "1").await;
    let next = until_text(&browser, &format!("{waiters} .next"), |_| true).await;
    assert!(
        next.starts_with("next: ") && next.contains(&format!("(pid {}) on ", std::process::id())),
        "{next}"
    );

    // Rows and counts change without a reload: a mark set in the page survives them.
    browser
        .execute("window.notReloaded = true", vec![])
        .await
        .unwrap();
    let before: usize = until_text(&browser, "#count-locks", |_| true)
        .await
        .parse()
        .unwrap();
    let extra = client.acquire("orders:3", held()).await.unwrap();
    until_text(&browser, &row("orders:3"), |_| true).await;
    let after = (before + 1).to_string();
    until_text(&browser, "#count-locks", |count| count == after).await;
    extra.release().await.unwrap();
    until_gone(&browser, &row("orders:3")).await;
    assert!(
        script_is_true(&browser, "window.notReloaded === true").await,
        "the page reloaded"
    );

    // The live view of orders:2 shows it acquired, then released.
    until_text(&browser, "#live-state", |state| state == "live").await;
    let followed = client.acquire("orders:2", held()).await.unwrap();
    let acquired = format!("acquired by {}…", hint(&followed));
    until_text(&browser, "#events li.acquired", |line| {
        line.contains(&acquired) && line.contains(&format!("(pid {})", std::process::id()))
    })
    .await;
    followed.release().await.unwrap();
    until_text(&browser, "#events li.released", |_| true).await;
    // Held again for the picture: the live view shows a whole hold and a new one.
    let followed = client.acquire("orders:2", held()).await.unwrap();
    let acquired = format!("acquired by {}…", hint(&followed));
    until_text(&browser, "#events li:first-child", |line| {
        line.contains(&acquired)
    })
    .await;
    until_text(&browser, &row("orders:2"), |_| true).await;
    let screenshot = browser.screenshot().await.unwrap();
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"));
    std::fs::create_dir_all(&target).unwrap();
    let picture = target.join("locks-page.png");
    std::fs::write(&picture, screenshot).unwrap();
    eprintln!("screenshot: {}", picture.display());

    // A forced release asks first, naming the holder; declined, nothing happens.
    let release_button = format!("{orders_1} button.release");
    let question = click_and_read_the_question(&browser, &release_button).await;
    assert!(
        question.contains("orders:1") && question.contains(&format!("token {}…", hint(&order))),
        "{question}"
    );
    browser.dismiss_alert().await.unwrap();
    assert!(client.inspect("orders:1").await.unwrap().is_some());
    // Accepted, it releases, and the row goes.
    click_and_read_the_question(&browser, &release_button).await;
    browser.accept_alert().await.unwrap();
    let said = until_text(&browser, "#status", |status| !status.is_empty()).await;
    assert!(said.starts_with("released `orders:1`"), "{said}");
    assert!(client.inspect("orders:1").await.unwrap().is_none());
    until_gone(&browser, &orders_1).await;

    // Read-only, with a trailing slash, limited to 2 rows: the same locks with nothing to
    // release, counted all (reports:q3, the markup key, jobs:nightly, orders:2), 2 listed.
    browser
        .goto(&format!("http://{address}/readonly/locks/"))
        .await
        .unwrap();
    until_text(&browser, "#count-locks", |count| count == "4").await;
    until_text(&browser, "#truncated", |note| {
        note.starts_with("Showing the first 2 of 4 locks found")
    })
    .await;
    let rows = browser
        .find_all(Locator::Css("tr[data-key]"))
        .await
        .unwrap();
    assert_eq!(rows.len(), 2);
    let buttons = browser
        .find_all(Locator::Css("button.release"))
        .await
        .unwrap();
    assert!(buttons.is_empty(), "a read-only page offers a release");
    // Its refreshes (under the trailing slash) count a lock taken since, and come gzipped.
    let extra = client.acquire("orders:4", held()).await.unwrap();
    until_text(&browser, "#count-locks", |count| count == "5").await;
    extra.release().await.unwrap();
    assert!(
        script_is_true(
            &browser,
            r#"performance.getEntriesByType("resource").some((entry) =>
                entry.name.includes("/readonly/locks/table")
                && entry.encodedBodySize > 0
                && entry.encodedBodySize * 2 < entry.decodedBodySize)"#
        )
        .await,
        "the table's refreshes were not compressed"
    );

    browser.close().await.unwrap();
    drop(driver);
    let _ = std::fs::remove_dir_all(&profile);
    drop(order);
    for lease in readers.into_iter().chain([marked, followed, nightly]) {
        lease.release().await.unwrap();
    }
    let waited = waiter.await.unwrap().unwrap();
    assert!(
        next.starts_with(&format!("next: {}…", hint(&waited))),
        "the waiter named is the one that got the lock: {next}"
    );
    waited.release().await.unwrap();
}

/// Clicks `button` (found again if a refresh replaced it) and returns the confirmation's text.
async fn click_and_read_the_question(browser: &Client, button: &str) -> String {
    until("the release button", || async {
        match browser.find(Locator::Css(button)).await {
            Ok(element) => element.click().await.map(Some),
            Err(error) if error.is_no_such_element() => Ok(None),
            Err(error) => Err(error),
        }
    })
    .await;
    browser.get_alert_text().await.expect("a confirmation")
}
