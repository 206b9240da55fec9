//! Locked work runs inside a `lock` span carrying its key, so the user's own log lines inside
//! say which lock they ran under.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use common::{fast_client, opts};
use testkit::RedisServer;
use tracing_subscriber::fmt::MakeWriter;

/// Log output kept in memory.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Captured {
    type Writer = Self;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_log_line_inside_locked_work_carries_the_key() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(captured.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let server = RedisServer::start();
    let locks = fast_client(&server).await;
    locks
        .run_locked("invoices:42", opts(1000), async {
            tracing::info!("sending the invoice");
        })
        .await
        .unwrap();
    tracing::info!("after the lock");

    let output = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
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
