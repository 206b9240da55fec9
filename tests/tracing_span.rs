//! Locked work runs inside a DEBUG `lock` span carrying its key, so with DEBUG on the user's own
//! log lines inside say which lock they ran under; at the default INFO the span stays out.

mod common;

use common::{Log, fast_client, opts};
use testkit::RedisServer;

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
