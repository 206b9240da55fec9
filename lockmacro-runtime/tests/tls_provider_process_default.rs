//! `rediss://` in a process that installed its own rustls crypto provider (aws-lc-rs here): the
//! library uses it and leaves it in place.

use std::sync::Arc;

use lockmacro_runtime::{LockClient, LockError};

#[tokio::test]
async fn rediss_uses_the_process_default_provider() {
    rustls::crypto::aws_lc_rs::default_provider()
        .install_default()
        .expect("no provider installed yet");
    let installed = rustls::crypto::CryptoProvider::get_default()
        .unwrap()
        .clone();
    let outcome = LockClient::builder("rediss://127.0.0.1:1").build().await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    let after = rustls::crypto::CryptoProvider::get_default().unwrap();
    assert!(
        Arc::ptr_eq(&installed, after),
        "the process default was kept"
    );
}
