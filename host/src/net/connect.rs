//! Opening the connection of a checked request: to the address the host checked, never
//! to a name resolved again.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use capstan_caps::{NetTarget, Scheme, TargetHost};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::{self, pki_types::ServerName};

/// A connection, plain or TLS.
pub(super) trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

/// The addresses `target`'s host stands for: itself if it is one, else what the system
/// resolver answers (within `timeout`).
pub(super) async fn resolve(
    target: &NetTarget,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, String> {
    match &target.host {
        TargetHost::Ip(ip) => Ok(vec![SocketAddr::new(*ip, target.port)]),
        TargetHost::Name(name) => {
            let lookup = tokio::net::lookup_host((name.as_str(), target.port));
            match tokio::time::timeout(timeout, lookup).await {
                Err(_) => Err(format!("resolving {name} took longer than {timeout:?}")),
                Ok(Err(err)) => Err(format!("cannot resolve {name}: {err}")),
                Ok(Ok(addrs)) => Ok(addrs.collect()),
            }
        }
    }
}

/// Connects to `addr` and, for https, runs TLS for `target`'s host.
pub(super) async fn connect(
    target: &NetTarget,
    addr: SocketAddr,
) -> Result<Box<dyn Stream>, String> {
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|err| format!("cannot connect to {addr}: {err}"))?;
    // Requests are small and latency matters more than packet count.
    let _ = tcp.set_nodelay(true);
    if target.scheme == Scheme::Http {
        return Ok(Box::new(tcp));
    }
    let name = match &target.host {
        TargetHost::Name(name) => ServerName::try_from(name.clone())
            .map_err(|err| format!("`{name}` cannot be used for TLS: {err}"))?,
        TargetHost::Ip(ip) => ServerName::IpAddress((*ip).into()),
    };
    let tls = tls_connector()
        .connect(name, tcp)
        .await
        .map_err(|err| format!("TLS with {} failed: {err}", target.host))?;
    Ok(Box::new(tls))
}

/// One TLS client configuration for every request: the webpki roots, ring's provider.
pub(super) fn tls_connector() -> TlsConnector {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    let config = CONFIG.get_or_init(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("ring supports the default TLS versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Arc::new(config)
    });
    TlsConnector::from(config.clone())
}
