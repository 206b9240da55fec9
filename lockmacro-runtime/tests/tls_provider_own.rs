//! `rediss://` in a process where rustls has two crypto providers compiled in (this test crate
//! enables rustls's default aws-lc-rs beside the library's ring) and none installed: rustls
//! cannot choose one by itself, and used to panic on the first connection.

use lockmacro_runtime::{LockClient, LockError};

#[tokio::test]
async fn rediss_works_beside_another_rustls_provider() {
    assert!(rustls::crypto::CryptoProvider::get_default().is_none());
    // Nothing listens on port 1: the TLS configuration is built before the connection is refused.
    let outcome = LockClient::builder("rediss://127.0.0.1:1").build().await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
    assert!(
        rustls::crypto::CryptoProvider::get_default().is_some(),
        "the library installed its own provider as the process default"
    );
}
