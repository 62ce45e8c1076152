//! The webhook's TLS: the serving certificate, read from files (a mounted
//! Secret) and read again whenever their bytes change, so a rotated
//! certificate takes effect without a restart (the kubelet updates a mounted
//! Secret in place); and the HTTPS server that presents it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

use crate::error::{Error, Result};

/// Where the serving certificate lives.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The current certificate, swapped in place when the files change.
#[derive(Debug)]
pub struct ReloadingCert {
    files: TlsFiles,
    current: RwLock<(Vec<u8>, Arc<CertifiedKey>)>,
}

impl ReloadingCert {
    /// Loads the files once; fails when they are missing or unusable.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>> {
        let (bytes, key) = read_pair(&files)?;
        Ok(Arc::new(Self {
            files,
            current: RwLock::new((bytes, key)),
        }))
    }

    /// Reads the files again and swaps the certificate if they changed.
    /// Returns whether it swapped. A broken new pair keeps the old one.
    pub fn reload(&self) -> Result<bool> {
        let (bytes, key) = read_pair(&self.files)?;
        let mut cur = self
            .current
            .write()
            .map_err(|_| Error::Tls("certificate lock poisoned".into()))?;
        if cur.0 == bytes {
            return Ok(false);
        }
        *cur = (bytes, key);
        Ok(true)
    }

    /// The DER of the leaf certificate being served now.
    pub fn leaf_der(&self) -> Option<Vec<u8>> {
        let cur = self.current.read().ok()?;
        cur.1.cert.first().map(|c| c.as_ref().to_vec())
    }

    /// Polls the files every `every` until the process ends.
    pub fn watch(self: &Arc<Self>, every: Duration) {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                match me.reload() {
                    Ok(true) => {
                        tracing::info!(cert = %me.files.cert.display(), "webhook certificate reloaded")
                    }
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "webhook certificate not reloaded; keeping the current one")
                    }
                }
            }
        });
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| Arc::clone(&c.1))
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })
}

fn read_pair(files: &TlsFiles) -> Result<(Vec<u8>, Arc<CertifiedKey>)> {
    let cert_pem = read(&files.cert)?;
    let key_pem = read(&files.key)?;
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Tls(format!("{}: {e}", files.cert.display())))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!(
            "{}: no certificate in the file",
            files.cert.display()
        )));
    }
    let key: PrivateKeyDer<'static> = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|e| Error::Tls(format!("{}: {e}", files.key.display())))?
        .ok_or_else(|| {
            Error::Tls(format!(
                "{}: no private key in the file",
                files.key.display()
            ))
        })?;
    let signing = rustls::crypto::ring::default_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| Error::Tls(format!("{}: {e}", files.key.display())))?;
    let mut bytes = cert_pem;
    bytes.extend_from_slice(&key_pem);
    Ok((bytes, Arc::new(CertifiedKey::new(certs, signing))))
}

/// Serves `app` over TLS (HTTP/2 or HTTP/1.1) on `addr` until `shutdown`
/// resolves, with the certificate [`ReloadingCert`] holds at each handshake.
pub async fn serve(
    addr: SocketAddr,
    app: Router,
    cert: Arc<ReloadingCert>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = crate::listen::bind(addr).await?;
    tracing::info!(%addr, "admission webhook listening");
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors or memory: retrying at once would
                    // spin on the same error.
                    tracing::warn!(error = %e, "accept failed; pausing before the next");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::warn!(%peer, limit = MAX_CONNECTIONS, "too many webhook connections; closing the new one");
            continue;
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(acceptor, tcp, peer, service).await;
        });
    }
}

/// Most connections served at once; the API server keeps a few open.
pub const MAX_CONNECTIONS: usize = 256;
/// The longest a TLS handshake or a request's headers may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest one connection is kept, idle or not (the API server
/// reconnects), so an idle or trickling client cannot hold a slot forever.
const CONNECTION_LIFETIME: Duration = Duration::from_secs(300);
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

async fn serve_connection<S>(acceptor: TlsAcceptor, tcp: TcpStream, peer: SocketAddr, service: S)
where
    S: hyper::service::Service<
            hyper::Request<hyper::body::Incoming>,
            Response = axum::response::Response,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            tracing::debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HANDSHAKE_TIMEOUT);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(Some(Duration::from_secs(30)))
        .keep_alive_timeout(HANDSHAKE_TIMEOUT);
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    // At its lifetime a connection is asked to close after the request in
    // flight (an admission call cut mid-way would refuse a user's write),
    // and dropped if it does not within the handshake timeout.
    let ended = tokio::select! {
        r = conn.as_mut() => Some(r),
        () = tokio::time::sleep(CONNECTION_LIFETIME) => {
            conn.as_mut().graceful_shutdown();
            tokio::time::timeout(HANDSHAKE_TIMEOUT, conn).await.ok()
        }
    };
    match ended {
        Some(Err(e)) => {
            tracing::debug!(%peer, error = %e, "webhook connection ended with an error");
        }
        Some(Ok(())) => {}
        None => tracing::debug!(%peer, "webhook connection dropped after its lifetime"),
    }
}
