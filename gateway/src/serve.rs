//! One port for every front: gRPC, HTTP/JSON and MCP share a listener
//! (HTTP/2 and HTTP/1.1, told apart by ALPN or the connection preface),
//! over TLS when a certificate is given. Each connection is bounded: its
//! TLS handshake and its request headers must arrive within a time, its
//! headers within a size, its HTTP/2 streams within a count, and the
//! connections within a total.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};

/// Bounds on every connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub handshake: Duration,
    pub max_streams_per_connection: u32,
    pub max_header_bytes: usize,
}

impl Default for ConnLimits {
    fn default() -> Self {
        Self {
            max_connections: 4096,
            handshake: Duration::from_secs(10),
            max_streams_per_connection: 256,
            max_header_bytes: 64 * 1024,
        }
    }
}

/// The server TLS configuration from PEM files (ALPN h2 and http/1.1).
pub fn tls_config(cert_pem: &[u8], key_pem: &[u8]) -> Result<Arc<rustls::ServerConfig>> {
    let certs: Vec<_> = rustls_pemfile::certs(&mut &*cert_pem)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Tls(format!("the certificate: {e}")))?;
    let key = rustls_pemfile::private_key(&mut &*key_pem)
        .map_err(|e| Error::Tls(format!("the key: {e}")))?
        .ok_or_else(|| Error::Tls("no private key in the key file".into()))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::Tls(e.to_string()))?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| Error::Tls(format!("the certificate and key: {e}")))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves `app` on `addr` until `stop` resolves.
pub async fn serve(
    addr: SocketAddr,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ConnLimits,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind {
            addr: addr.to_string(),
            source,
        })?;
    tracing::info!(%addr, tls = tls.is_some(), "gateway serving");
    serve_on(listener, app, tls, limits, stop).await
}

/// Serves `app` on a bound listener (tests bind port 0).
pub async fn serve_on(
    listener: TcpListener,
    app: Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ConnLimits,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    let acceptor = tls.map(TlsAcceptor::from);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.handshake)
        .max_buf_size(limits.max_header_bytes.max(8192));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_streams_per_connection)
        .max_header_list_size(u32::try_from(limits.max_header_bytes).unwrap_or(u32::MAX))
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(Duration::from_secs(20));
    let builder = Arc::new(builder);
    tokio::pin!(stop);
    loop {
        let permit = tokio::select! {
            () = &mut stop => return Ok(()),
            p = Arc::clone(&slots).acquire_owned() => p.map_err(|_| Error::Internal("connection slots closed".into()))?,
        };
        let (tcp, peer) = tokio::select! {
            () = &mut stop => return Ok(()),
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::debug!(error = %e, "accept");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        let app = app.clone();
        let builder = Arc::clone(&builder);
        let handshake = limits.handshake;
        tokio::spawn(async move {
            let _permit = permit;
            let svc = TowerToHyperService::new(app);
            let res = match acceptor {
                Some(acceptor) => {
                    let tls = match tokio::time::timeout(handshake, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(tls), svc)
                        .await
                }
                None => {
                    builder
                        .serve_connection_with_upgrades(TokioIo::new(tcp), svc)
                        .await
                }
            };
            if let Err(e) = res {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
}
