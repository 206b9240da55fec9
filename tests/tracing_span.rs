//! A locked call runs inside a DEBUG `lock` span carrying its key, from its acquire to its
//! release, so with DEBUG on the library's events and the user's own log lines inside say which
//! lock they are about, and the events name the holder by the token hint `inspect` and the CLI
//! show; at the default INFO the span stays out.

mod common;

use std::time::Duration;

use common::{Log, fast_client, opts};
use lockmacro_runtime::{LockContext, LockError, LockOptions, redis_lock};
use testkit::RedisServer;
use tokio::sync::oneshot;

#[tokio::test(flavor = "current_thread")]
async fn a_log_line_inside_locked_work_carries_the_key_at_debug() {
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);

    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    locks
        .run_locked("invoices:42", opts(1000), async {
            tracing::info!("sending the invoice");
        })
        .await
        .unwrap();
    tracing::info!("after the lock");

    let output = log.text();
    let inside = output
        .lines()
        .find(|line| line.contains("sending the invoice"))
        .expect("the line inside was logged");
    assert!(inside.contains("lock{key=invoices:42}"), "{inside}");
    let after = output
        .lines()
        .find(|line| line.contains("after the lock"))
        .expect("the line after was logged");
    assert!(!after.contains("invoices:42"), "{after}");
}

/// The span is DEBUG, as tower-http's request spans: at INFO, a log line inside locked work is
/// the user's alone.
#[tokio::test(flavor = "current_thread")]
async fn at_info_the_lock_span_stays_out_of_the_log() {
    let (log, _guard) = Log::capture(tracing::Level::INFO);

    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    locks
        .run_locked("invoices:43", opts(1000), async {
            tracing::info!("sending the invoice");
        })
        .await
        .unwrap();

    let output = log.text();
    let inside = output
        .lines()
        .find(|line| line.contains("sending the invoice"))
        .expect("the line inside was logged");
    assert!(!inside.contains("lock{"), "{inside}");
}

/// The first 4 characters of a token: what `inspect` and the CLI show of a holder.
fn hint(token: &str) -> &str {
    &token[..4]
}

/// The line of `output` that holds `needle`.
fn line_with<'a>(output: &'a str, needle: &str) -> &'a str {
    output
        .lines()
        .find(|line| line.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{output}"))
}

/// The span wraps the whole call: the acquire's event, the work's lines and the release's event
/// are all inside `lock{key=…}`, and the library's events carry the holder's token hint.
#[tokio::test(flavor = "current_thread")]
async fn the_lock_span_wraps_acquire_work_and_release_and_events_name_the_holder() {
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);

    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let token = locks
        .run_locked("invoices:44", opts(1000), async {
            tracing::info!("sending the invoice");
            LockContext::current().unwrap().token().to_owned()
        })
        .await
        .unwrap();

    let output = log.text();
    let expected = format!("token_hint={}", hint(&token));
    for event in ["lock acquired", "sending the invoice", "lock released"] {
        let line = line_with(&output, event);
        assert!(line.contains("lock{key=invoices:44}"), "{event}: {line}");
    }
    for event in ["lock acquired", "lock released"] {
        let line = line_with(&output, event);
        assert!(line.contains(&expected), "{event}: {line}");
    }
}

#[redis_lock(prefix = "invoices", key = id, ttl = 1, client = locks)]
async fn send_invoice(locks: &lockmacro_runtime::LockClient, id: u32) -> Result<String, LockError> {
    tracing::info!("sending the invoice");
    Ok(LockContext::current().unwrap().token().to_owned())
}

/// The same through the attribute.
#[tokio::test(flavor = "current_thread")]
async fn the_attributes_span_wraps_acquire_work_and_release() {
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);

    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    let token = send_invoice(&locks, 45).await.unwrap();

    let output = log.text();
    for event in ["lock acquired", "sending the invoice", "lock released"] {
        let line = line_with(&output, event);
        assert!(line.contains("lock{key=invoices:45}"), "{event}: {line}");
    }
    let released = line_with(&output, "lock released");
    assert!(
        released.contains(&format!("token_hint={}", hint(&token))),
        "{released}"
    );
}

/// A waiter whose lock is held by another client says it waits for the release (or for the
/// lock to be handed to it), never that a release of its own client will hand it over; its
/// events name it by its token hint.
#[tokio::test(flavor = "current_thread")]
async fn a_waiter_of_another_client_says_what_it_waits_for() {
    let (log, _guard) = Log::capture(tracing::Level::DEBUG);

    let server = RedisServer::start();
    let (holder, other) = (fast_client(&server).await, fast_client(&server).await);
    let held = holder.acquire("invoices:46", opts(5_000)).await.unwrap();
    let (token_tx, token_rx) = oneshot::channel();
    let waiter = tokio::spawn(async move {
        let options = LockOptions::new()
            .ttl(Duration::from_secs(5))
            .wait(Duration::from_secs(10));
        other
            .run_locked("invoices:46", options, async move {
                let token = LockContext::current().unwrap().token().to_owned();
                token_tx.send(token).unwrap();
            })
            .await
    });
    log.seen("parked until the lock is released or handed to this caller")
        .await;
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap();
    let token = token_rx.await.unwrap();

    let output = log.text();
    let parked = line_with(&output, "parked until the lock is released");
    assert!(parked.contains("lock{key=invoices:46}"), "{parked}");
    assert!(parked.contains("token_hint="), "{parked}");
    assert!(
        !output.contains("release by this client") && !output.contains("release of this client"),
        "a waiter of another client promised a hand-over by its own client:\n{output}"
    );
    let acquired = output
        .lines()
        .rfind(|line| line.contains("lock acquired"))
        .expect("the waiter's acquire logged");
    assert!(
        acquired.contains(&format!("token_hint={}", hint(&token))),
        "{acquired}"
    );
}
