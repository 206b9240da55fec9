//! rustls needs one crypto provider for the process. It picks one by itself only when exactly one
//! is compiled in, and an application that also depends on rustls with its default features
//! brings a second (aws-lc-rs beside our ring): then the first TLS connection would panic. So a
//! client with TLS URLs makes sure a process default exists: the application's when it installed
//! one, else ours.

/// Whether `url` asks for TLS.
pub(crate) fn wants_tls(url: &str) -> bool {
    let scheme = url.split("://").next().unwrap_or_default();
    scheme.starts_with("rediss") || scheme.starts_with("valkeys")
}

/// Installs ring as the process's rustls provider unless one is installed already.
#[cfg(feature = "tls")]
pub(crate) fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Fails only if another thread installed one meanwhile; theirs then stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(not(feature = "tls"))]
pub(crate) fn ensure_crypto_provider() {}
