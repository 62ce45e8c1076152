//! The admission webhook's HTTPS server and the plain health endpoints.
//!
//! The serving certificate comes from files (a mounted Secret) and is read
//! again whenever their bytes change, so a rotated certificate takes effect
//! without a restart: the kubelet updates a mounted Secret in place.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use opentelemetry::KeyValue;
use rustls::ServerConfig;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::admission;
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

/// Whether the process is ready to serve (set once the certificate is
/// loaded and the API server answered).
#[derive(Debug, Default)]
pub struct Readiness(AtomicBool);

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

async fn validate(body: Bytes) -> Response {
    let meter = opentelemetry::global::meter("agentplane-operator");
    let decisions = meter
        .u64_counter("agentplane.webhook.decisions")
        .with_description("Admission decisions on AgentSessions")
        .build();
    match admission::review(&body) {
        Ok((decision, review)) => {
            decisions.add(1, &[KeyValue::new("allowed", decision.allowed)]);
            if !decision.allowed {
                tracing::info!(message = ?decision.message, "admission denied");
            }
            axum::Json(review).into_response()
        }
        Err(e) => {
            decisions.add(1, &[KeyValue::new("allowed", "malformed")]);
            (StatusCode::BAD_REQUEST, e).into_response()
        }
    }
}

/// The webhook's routes.
pub fn router() -> Router {
    Router::new().route("/validate", post(validate))
}

/// The health routes: `/healthz` answers while the process lives,
/// `/readyz` once it can do its work.
pub fn health_router(ready: Arc<Readiness>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(r): State<Arc<Readiness>>| async move {
                if r.get() {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(ready)
}

/// Serves the webhook over TLS on `addr` until `shutdown` resolves.
pub async fn serve_tls(
    addr: SocketAddr,
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
    let listener = bind(addr).await?;
    tracing::info!(%addr, "admission webhook listening");
    let app = router();
    tokio::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            () = &mut shutdown => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => { tracing::warn!(error = %e, "accept failed"); continue; }
            },
        };
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let tls =
                match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(tcp)).await {
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
            if let Err(e) = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(tls), service)
                .await
            {
                tracing::debug!(%peer, error = %e, "webhook connection ended with an error");
            }
        });
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|source| Error::Bind {
        addr: addr.to_string(),
        source,
    })
}

/// Serves plain HTTP `app` on `addr` until `shutdown` resolves.
pub async fn serve_plain(
    addr: SocketAddr,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let listener = bind(addr).await?;
    tracing::info!(%addr, "health endpoints listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| Error::Bind {
            addr: addr.to_string(),
            source,
        })
}
