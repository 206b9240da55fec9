//! TLS for tests: a throwaway CA and server certificate made with the system's `openssl`, and a
//! `redis-server` with a TLS port signed by it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::RedisServer;

/// A throwaway CA and a server certificate it signed, made with the system's `openssl`.
pub struct TlsCertificates {
    dir: PathBuf,
}

impl TlsCertificates {
    /// A CA, and a certificate for `subject_alt_names` (e.g. `DNS:localhost,IP:127.0.0.1`).
    pub fn make(subject_alt_names: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "lockmacro-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
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

    /// The path of one of its files: `ca.crt`, `server.crt`, `server.key`.
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_str().unwrap().to_owned()
    }

    /// The CA's certificate (PEM), for `tls_root_certificate`.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.crt")).unwrap()
    }
}

impl Drop for TlsCertificates {
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
/// a test reads what the client left in Redis through it too). Clients need no certificate.
pub fn tls_server(certificates: &TlsCertificates) -> (RedisServer, u16) {
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
