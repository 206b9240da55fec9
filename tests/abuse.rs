//! Bad input and secrets: odd and hostile keys, malformed URLs, passwords that must never leak,
//! tokens that must never repeat.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{Log, assert_clean, fast_client, opts};
use lockmacro_runtime::{LockClient, LockContext, LockError, LockOptions, MAX_KEY_LEN, protocol};
use redis::AsyncCommands;
use testkit::{FaultProxy, RedisServer};

/// The value under `key` (exact bytes) on a raw connection.
async fn raw_get(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> Option<String> {
    conn.get(key.as_bytes()).await.expect("GET")
}

/// Keys that are legal but odd: whitespace, control characters, NUL, RESP and glob syntax,
/// bidi overrides, zero-width and combining characters, replacement characters (what invalid
/// UTF-8 becomes once it is a `String`), and names from the library's own namespaces.
fn odd_keys() -> Vec<String> {
    [
        "odd:with space",
        "odd: ",
        "odd:new\nline",
        "odd:crlf\r\n*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$1\r\ny\r\n",
        "odd:nul\u{0}byte",
        "odd:\u{0}",
        "odd:tab\tand\u{7}bell\u{1b}[31m",
        "odd:emoji 🔒🦀",
        "odd:rtl \u{202E}gnp.exe",
        "odd:zero\u{200B}width",
        "odd:combining e\u{301}",
        "odd:\u{FFFD}\u{FFFD} from invalid utf-8",
        "odd:\u{FFFF}\u{10FFFF}",
        "odd:glob * ? [a-z] \\",
        "odd:{hash-tag}",
        "odd:quote \" ' `",
        "odd:lockmacro:released:odd:x",
    ]
    .iter()
    .map(|key| key.to_string())
    .chain([String::from_utf8_lossy(&[b'o', b'd', b'd', b':', 0xff, 0xfe, 0xc3]).into_owned()])
    .collect()
}

/// Odd keys lock exactly the bytes given: the stored key is byte-for-byte the same, the lease is
/// renewed and released on it, every path (plain `SET`, the scripts with fencing and waiting)
/// takes it, and keys that differ only after a NUL or in invisible characters are distinct locks.
#[tokio::test]
async fn odd_keys_lock_exactly_their_bytes() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let mut conn = server.connection().await;
    for key in odd_keys() {
        for options in [
            opts(300).unlimited_renewals(),
            opts(300).unlimited_renewals().fencing(true),
            opts(300).wait(Duration::from_millis(100)),
        ] {
            let lease = locks
                .acquire(key.clone(), options)
                .await
                .unwrap_or_else(|err| panic!("{key:?} with {options:?}: {err:?}"));
            assert_eq!(
                raw_get(&mut conn, &key)
                    .await
                    .as_deref()
                    .map(lockmacro_runtime::protocol::holder_token),
                Some(lease.token()),
                "{key:?}"
            );
            lease.release().await.unwrap();
            assert_eq!(raw_get(&mut conn, &key).await, None, "{key:?}");
        }
        // Renewed on its exact name.
        let renewals = locks
            // A lease long enough that a loaded machine's scheduling cannot lapse it.
            .run_locked(key.clone(), opts(600).unlimited_renewals(), async {
                tokio::time::sleep(Duration::from_millis(500)).await;
                LockContext::current().unwrap().renewals()
            })
            .await
            .unwrap_or_else(|err| panic!("{key:?}: {err:?}"));
        assert!(renewals >= 1, "{key:?}: {renewals} renewals");
    }

    // No truncation at NUL, no normalisation of invisible or combining characters.
    for (held, other) in [
        ("odd:nul\u{0}byte", "odd:nul"),
        ("odd:zero\u{200B}width", "odd:zerowidth"),
        ("odd:combining e\u{301}", "odd:combining \u{e9}"),
        ("odd:with space", "odd:with"),
    ] {
        let first = locks.acquire(held, opts(5_000)).await.unwrap();
        let second = locks
            .acquire(other, opts(5_000))
            .await
            .unwrap_or_else(|err| panic!("{other:?} collided with {held:?}: {err:?}"));
        second.release().await.unwrap();
        first.release().await.unwrap();
    }
    assert_clean(&server, &locks, "odd:*").await;
    let _ = server.command(&["FLUSHALL"]);
}

/// A key crafted to break out of a Lua string or a command line is only data: the scripts get
/// keys as `KEYS[]`, never as source text, so nothing else in Redis is touched.
#[tokio::test]
async fn keys_that_look_like_lua_or_commands_are_inert() {
    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let mut conn = server.connection().await;
    for n in 0..5 {
        let _: () = conn.set(format!("canary:{n}"), n).await.unwrap();
    }
    let hostile = [
        r#"x"]) redis.call('FLUSHALL') --"#,
        r#"x') redis.call('FLUSHALL') --"#,
        "x]] redis.call('FLUSHALL') --[[",
        "x\" .. redis.call('FLUSHALL') .. \"",
        "x\r\nFLUSHALL\r\n",
        "*1\r\n$8\r\nFLUSHALL\r\n",
        "'; DEL canary:0; --",
    ];
    for key in hostile {
        // The plain path, then the scripts: acquire (fencing), extend, release, and the
        // release announcement built in Lua from the key.
        // A lease long enough that a loaded machine's scheduling cannot lapse it (a 150 ms
        // one, renewed at 50 ms, lapsed at one stall of 100 ms), renewed about 3 times.
        locks
            .run_locked(key, opts(600).unlimited_renewals().fencing(true), async {
                tokio::time::sleep(Duration::from_millis(700)).await;
                assert!(LockContext::current().unwrap().renewals() >= 1);
            })
            .await
            .unwrap_or_else(|err| panic!("{key:?}: {err:?}"));
        locks.run_locked(key, opts(1_000), async {}).await.unwrap();
        let held = locks.acquire(key, opts(5_000)).await.unwrap();
        let waiter = locks
            .run_locked(key, opts(1_000).wait(Duration::from_millis(200)), async {})
            .await;
        assert!(matches!(waiter, Err(LockError::Busy { .. })), "{waiter:?}");
        held.release().await.unwrap();
    }
    for n in 0..5 {
        let value: Option<i64> = conn.get(format!("canary:{n}")).await.unwrap();
        assert_eq!(value, Some(n), "canary:{n} must survive hostile keys");
    }
    // The waiter that gave up leaves in the background: a key the release handed to its
    // reservation meanwhile is given back once its leave lands.
    common::eventually(Duration::from_secs(3), "no lock left", || async {
        let left = common::scan_keys(&server, "*").await;
        left.iter()
            .all(|key| key.starts_with("canary:") || protocol::Names::default().is_internal(key))
    })
    .await;
    assert_eq!(locks.held_leases(), 0);
}

/// A 1 MiB key (and anything over the documented limit) is refused as `InvalidKey` before any
/// I/O: the client, pointed at a proxy, never opens a connection. The limit itself works against
/// a real server, renewals included.
#[tokio::test]
async fn oversized_keys_are_refused_before_any_io_and_the_limit_itself_works() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let locks = LockClient::builder(&proxy.url())
        .scan_interval(Duration::from_millis(50))
        .build_lazy()
        .unwrap();
    let ran = std::sync::atomic::AtomicBool::new(false);
    for len in [MAX_KEY_LEN + 1, 1 << 20, 16 << 20] {
        let key = "k".repeat(len);
        let started = Instant::now();
        let outcome = locks
            .run_locked(key.clone(), LockOptions::new(), async {
                ran.store(true, std::sync::atomic::Ordering::SeqCst)
            })
            .await;
        assert!(
            matches!(outcome, Err(LockError::InvalidKey { .. })),
            "{len} bytes: {outcome:?}"
        );
        let message = outcome.unwrap_err().to_string();
        assert!(
            message.len() < 400,
            "{len} bytes: message of {} bytes",
            message.len()
        );
        let acquired = locks.acquire(key, LockOptions::new()).await;
        assert!(
            matches!(acquired, Err(LockError::InvalidKey { .. })),
            "{len} bytes: {acquired:?}"
        );
        // Refused without sending or scanning the key (no I/O is checked below): at once, but a
        // loaded machine's debug build took over 200 ms now and then for the largest.
        let refused = started.elapsed();
        eprintln!("{len} bytes: refused twice in {refused:?}");
        assert!(refused < Duration::from_secs(2), "{len} bytes: {refused:?}");
    }
    assert!(!ran.load(std::sync::atomic::Ordering::SeqCst));
    assert_eq!(proxy.connections(), 0, "no I/O for an invalid key");

    let longest = "k".repeat(MAX_KEY_LEN);
    let renewals = locks
        // Long enough not to lapse on a loaded machine; renewed about 4 times.
        .run_locked(longest.clone(), opts(600).unlimited_renewals(), async {
            tokio::time::sleep(Duration::from_millis(1_000)).await;
            LockContext::current().unwrap().renewals()
        })
        .await
        .expect("a key of exactly MAX_KEY_LEN bytes is a valid lock");
    assert!(renewals >= 2, "{renewals}");
    let mut conn = server.connection().await;
    let exists: bool = conn.exists(&longest).await.unwrap();
    assert!(!exists, "released");
    assert_eq!(locks.held_leases(), 0);
}

/// Malformed URLs are `Config` errors at build time, with no connection attempt, and never
/// panic; a database index the server refuses is a `Redis` error carrying the server's answer.
#[tokio::test]
async fn malformed_urls_are_config_errors_without_io() {
    let server = RedisServer::start();
    let mut wrong = Vec::new();
    for url in [
        "",
        " ",
        "http://127.0.0.1:1",
        "https://127.0.0.1:1",
        "ftp://127.0.0.1",
        "127.0.0.1:1",
        "redis//127.0.0.1:1",
        "redis://127.0.0.1:notaport",
        "redis://127.0.0.1:65536",
        "redis://127.0.0.1:-1",
        "redis://[::1",
        "redis://127.0.0.1:1/notadb",
        "redis://127.0.0.1:1/99999999999999999999999",
        "redis://127.0.0.1:1/0/extra",
    ] {
        let started = Instant::now();
        let lazy = LockClient::builder(url).build_lazy();
        if !matches!(lazy, Err(LockError::Config { .. })) {
            wrong.push(format!("build_lazy({url:?}): {lazy:?}"));
        }
        let built = LockClient::builder(url).build().await;
        if !matches!(built, Err(LockError::Config { .. })) {
            wrong.push(format!("build({url:?}): {built:?}"));
        }
        let connected = LockClient::connect(url).await;
        if !matches!(connected, Err(LockError::Config { .. })) {
            wrong.push(format!("connect({url:?}): {connected:?}"));
        }
        assert!(started.elapsed() < Duration::from_secs(3), "{url:?}");
    }
    assert!(
        wrong.is_empty(),
        "not refused as Config errors:\n{}",
        wrong.join("\n")
    );

    let out_of_range = format!("redis://127.0.0.1:{}/9999", server.port());
    let outcome = LockClient::connect(&out_of_range).await;
    match outcome {
        Err(err @ LockError::Redis { .. }) => {
            assert!(err.to_string().contains("out of range"), "{err}");
        }
        other => panic!("{out_of_range}: {other:?}"),
    }
}

/// A negative database index can never be selected; like `/notadb` it is refused when the
/// client is built, not left to surface as a `Redis` error (which looks transient) on the first
/// lock call of a lazily built client.
#[tokio::test]
async fn negative_db_index_is_a_config_error() {
    let outcome = LockClient::builder("redis://127.0.0.1:1/-1").build_lazy();
    assert!(
        matches!(outcome, Err(LockError::Config { .. })),
        "{outcome:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Secrets
// ---------------------------------------------------------------------------------------------

/// `{e}`, `{e:?}` and every `source()` below it.
fn everything_shown(err: &LockError) -> String {
    let mut shown = format!("{err} | {err:?}");
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        shown.push_str(&format!(" | {cause} | {cause:?}"));
        source = cause.source();
    }
    shown
}

/// A known password never appears in the client's or builder's `Debug`, in any error's
/// `Display`/`Debug`/source chain, or in tracing output at TRACE level: while Redis works
/// (acquire, renew, busy, dropped leases), with a wrong password, with malformed URLs that
/// carry it, and while Redis is down (connect failures, background releases retrying).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn password_never_appears_in_debug_display_errors_or_tracing() {
    const SECRET: &str = "Pw-7f3a9c1e-do-not-print";
    // Percent-encoded in the URL: neither spelling may show.
    const ENCODED: &str = "Enc%40Pw-5b2d";
    const DECODED: &str = "Enc@Pw-5b2d";
    let logs = Log::everywhere();
    let mut server = RedisServer::start();
    for (user, password) in [("locker", SECRET), ("encoded", DECODED)] {
        server.command(&[
            "ACL",
            "SETUSER",
            user,
            "on",
            &format!(">{password}"),
            "~*",
            "&*",
            "+@all",
        ]);
    }
    let port = server.port();
    let url = format!("redis://locker:{SECRET}@127.0.0.1:{port}");
    let encoded_url = format!("redis://encoded:{ENCODED}@127.0.0.1:{port}");
    let mut shown = Vec::new();

    let builder = LockClient::builder(&url).scan_interval(Duration::from_millis(50));
    shown.push(format!("{builder:?}"));
    let locks = builder.build().await.unwrap();
    shown.push(format!("{locks:?}"));
    let encoded = LockClient::connect(&encoded_url).await.unwrap();
    shown.push(format!("{encoded:?}"));

    // Working: renewals, busy, a dropped lease, a waiter.
    locks
        .run_locked("secret:1", opts(600).unlimited_renewals(), async {
            tokio::time::sleep(Duration::from_millis(700)).await;
        })
        .await
        .unwrap();
    let held = locks.acquire("secret:2", opts(5_000)).await.unwrap();
    shown.push(format!("{held:?}"));
    for outcome in [
        encoded.run_locked("secret:2", opts(1_000), async {}).await,
        locks
            .run_locked(
                "secret:2",
                opts(1_000).wait(Duration::from_millis(100)),
                async {},
            )
            .await,
    ] {
        shown.push(everything_shown(&outcome.unwrap_err()));
    }
    drop(held);

    // Wrong password, and malformed URLs that carry the password.
    for bad in [
        format!("redis://locker:wrong-{SECRET}@127.0.0.1:{port}"),
        format!("redis://locker:{SECRET}@127.0.0.1:notaport"),
        format!("http://locker:{SECRET}@127.0.0.1:{port}"),
        format!("redis://locker:{SECRET}@127.0.0.1:{port}/notadb"),
        format!("redis://locker:{SECRET}@[::1"),
    ] {
        shown.push(format!("{:?}", LockClient::builder(&bad)));
        shown.push(everything_shown(
            &LockClient::connect(&bad).await.unwrap_err(),
        ));
    }

    // Redis down, with a lease held: the call fails, the drop-time release retries and gives up.
    let doomed = locks.acquire("secret:3", opts(500)).await.unwrap();
    server.kill();
    drop(doomed);
    for outcome in [
        locks.run_locked("secret:4", opts(1_000), async {}).await,
        encoded.run_locked("secret:4", opts(1_000), async {}).await,
    ] {
        shown.push(everything_shown(&outcome.unwrap_err()));
    }
    shown.push(everything_shown(
        &LockClient::connect(&url).await.unwrap_err(),
    ));
    let lazy = LockClient::builder(&url).build_lazy().unwrap();
    shown.push(format!("{lazy:?}"));
    shown.push(everything_shown(
        &lazy.acquire("secret:5", opts(1_000)).await.unwrap_err(),
    ));
    // Let the background release give up (its lease was 500 ms), so its warnings are logged.
    logs.seen_within("gave up", Duration::from_secs(3)).await;

    let logged = logs.text();
    assert!(
        logged.contains("secret:1"),
        "tracing captured the lock events"
    );
    assert!(logged.contains("renewed"), "tracing captured renewals");
    for text in shown.iter().map(String::as_str).chain([logged.as_str()]) {
        for secret in [SECRET, ENCODED, DECODED, "Pw-5b2d"] {
            assert!(!text.contains(secret), "password shown: {text}");
        }
    }
}

/// Tokens are unique across 100 000 real acquisitions (10 rounds of 10 000 concurrent locks
/// on distinct keys), each a UUID v4 in its simple form (122 random bits as 32 hex digits). A
/// million would take minutes of round trips on this machine; uniqueness is the random
/// source's (UUID v4) property, so this
/// checks the wiring, not the randomness: a shared or reused token would collide at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_acquisitions_get_unique_tokens() {
    const ROUNDS: usize = 10;
    const PER_ROUND: usize = 10_000;
    let server = RedisServer::start();
    let locks = LockClient::connect(&server.url()).await.unwrap();
    let mut tokens = HashSet::with_capacity(ROUNDS * PER_ROUND);
    let started = Instant::now();
    for round in 0..ROUNDS {
        let mut acquiring = tokio::task::JoinSet::new();
        for n in 0..PER_ROUND {
            let locks = locks.clone();
            acquiring.spawn(async move {
                locks
                    .acquire(format!("tokens:{round}:{n}"), opts(30_000))
                    .await
            });
        }
        let mut leases = Vec::with_capacity(PER_ROUND);
        while let Some(lease) = acquiring.join_next().await {
            let lease = lease.unwrap().expect("distinct keys are free");
            let token = lease.token();
            assert!(
                token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()),
                "{token}"
            );
            assert!(tokens.insert(token.to_owned()), "token {token} repeated");
            leases.push(lease);
        }
        let mut releasing = tokio::task::JoinSet::new();
        for lease in leases {
            releasing.spawn(lease.release());
        }
        while let Some(released) = releasing.join_next().await {
            released.unwrap().unwrap();
        }
    }
    eprintln!(
        "{} unique tokens from {} acquisitions in {:?}",
        tokens.len(),
        ROUNDS * PER_ROUND,
        started.elapsed()
    );
    assert_eq!(tokens.len(), ROUNDS * PER_ROUND);
    assert_clean(&server, &locks, "tokens:*").await;
}
