//! The plain-HTTP health endpoints every replica serves, leader or not.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::error::{Error, Result};

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

/// The health routes: `/healthz` answers while the process lives,
/// `/readyz` once it can do its work.
pub fn router(ready: Arc<Readiness>) -> Router {
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

/// Serves plain HTTP `app` on `addr` until `shutdown` resolves.
pub async fn serve_plain(
    addr: SocketAddr,
    app: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let listener = crate::listen::bind(addr).await?;
    tracing::info!(%addr, "health endpoints listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| Error::Bind {
            addr: addr.to_string(),
            source,
        })
}
