//! `rediss://` with certificate verification, against a server with a TLS port.
//!
//! (The Redis 8 build that `scripts/test-redis8.sh` uses has no TLS; these run on Redis 7.)

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{assert_clean, lock_round_trip, opts};
use lockmacro_runtime::{LockClient, LockError};
use testkit::RedisServer;

/// A throwaway CA and a server certificate it signed, made with the system's `openssl`.
struct Certificates {
    dir: PathBuf,
}

impl Certificates {
    /// A CA, and a certificate for `subject_alt_names` (e.g. `DNS:localhost,IP:127.0.0.1`).
    fn make(subject_alt_names: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "lockmacro-tls-{}-{}",
            std::process::id(),
            common::monotonic_ns()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let extensions = dir.join("server.ext");
        std::fs::write(
            &extensions,
            format!(
                "subjectAltName={subject_alt_names}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n"
            ),
        )
        .unwrap();
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &dir,
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout",
                    "ca.key",
                    "-out",
                    "ca.crt",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=lockmacro test CA",
                    "-addext",
                    "basicConstraints=critical,CA:TRUE",
                    "-addext",
                    "keyUsage=critical,keyCertSign,cRLSign",
                ],
            ]
            .concat(),
        );
        openssl(
            &dir,
            &[
                &["req"][..],
                &ec,
                &[
                    "-keyout",
                    "server.key",
                    "-out",
                    "server.csr",
                    "-subj",
                    "/CN=lockmacro test server",
                ],
            ]
            .concat(),
        );
        openssl(
            &dir,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                extensions.to_str().unwrap(),
            ],
        );
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }

    fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.crt")).unwrap()
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A server with a TLS port next to its plain one (the kit waits for `PING` on the plain port;
/// the test reads what the client left in Redis through it too). Clients need no certificate.
fn tls_server(certificates: &Certificates) -> (RedisServer, u16) {
    let tls_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &certificates.path("server.crt"),
        "--tls-key-file",
        &certificates.path("server.key"),
        "--tls-ca-cert-file",
        &certificates.path("ca.crt"),
        "--tls-auth-clients",
        "no",
    ]);
    (server, tls_port)
}

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
