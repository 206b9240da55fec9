//! `rediss://` with certificate verification, against a server with a TLS port.
//!
//! (The Redis 8 build that `scripts/test-redis8.sh` uses has no TLS; these run on Redis 7.)

mod common;

use std::time::Duration;

use common::{assert_clean, lock_round_trip, opts};
use lockmacro_runtime::{LockClient, LockError};
use testkit::{RedisServer, TlsCertificates as Certificates, tls_server};

/// Certificate verification is on by default: a self-signed CA the client was not told about
/// is refused (as a `Redis` error, in bounded time); trusting it with `tls_root_certificate`
/// works end to end; `#insecure` is the explicit opt-out and works too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_certificates_unless_told_otherwise() {
    let certificates = Certificates::make("DNS:localhost,IP:127.0.0.1");
    let (server, tls_port) = tls_server(&certificates);
    let tls_url = format!("rediss://127.0.0.1:{tls_port}");

    let untrusted = LockClient::builder(&tls_url)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .await;
    match untrusted {
        Err(LockError::Redis { .. }) => {}
        other => panic!("an unknown CA must be refused: {other:?}"),
    }
    let lazy = LockClient::builder(&tls_url).build_lazy().unwrap();
    let outcome = lazy.run_locked("tls:refused", opts(1_000), async {}).await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );

    let trusted = LockClient::builder(&tls_url)
        .scan_interval(Duration::from_millis(50))
        .tls_root_certificate(certificates.ca_pem())
        .build()
        .await
        .expect("trusting the test CA");
    lock_round_trip(&trusted, &server, "lockmacro", "tls:trusted").await;
    let by_name = LockClient::builder(&format!("rediss://localhost:{tls_port}"))
        .tls_root_certificate(certificates.ca_pem())
        .build()
        .await
        .expect("the certificate names localhost too");
    by_name
        .run_locked("tls:by-name", opts(1_000), async {})
        .await
        .unwrap();

    let insecure = LockClient::builder(&format!("{tls_url}/#insecure"))
        .scan_interval(Duration::from_millis(50))
        .build()
        .await
        .expect("#insecure opts out of verification");
    lock_round_trip(&insecure, &server, "lockmacro", "tls:insecure").await;

    assert_clean(&server, &trusted, "tls:*").await;
    assert_eq!(insecure.held_leases(), 0);
}

/// Trusting the right CA is not enough: the certificate must name the host connected to.
#[tokio::test]
async fn tls_refuses_a_certificate_for_another_host() {
    let certificates = Certificates::make("DNS:redis.example.invalid");
    let (_server, tls_port) = tls_server(&certificates);
    let outcome = LockClient::builder(&format!("rediss://127.0.0.1:{tls_port}"))
        .connect_timeout(Duration::from_secs(2))
        .tls_root_certificate(certificates.ca_pem())
        .build()
        .await;
    assert!(
        matches!(outcome, Err(LockError::Redis { .. })),
        "{outcome:?}"
    );
}

/// `rediss://` pointed at a plaintext port hears no TLS handshake: the error says so instead of
/// a bare timeout.
#[tokio::test]
async fn rediss_to_a_plaintext_port_says_it_heard_no_tls() {
    let server = RedisServer::start();
    let url = format!("rediss://127.0.0.1:{}", server.port());
    let outcome = LockClient::builder(&url)
        .connect_timeout(Duration::from_millis(500))
        .build()
        .await;
    let shown = outcome.unwrap_err().to_string();
    assert!(
        shown.contains(&format!("127.0.0.1:{}", server.port())),
        "{shown}"
    );
    assert!(shown.contains("TLS"), "{shown}");
}
