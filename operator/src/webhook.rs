//! The admission webhook's HTTP surface: one route that answers an
//! AdmissionReview with [`admission::review`]'s decision. TLS is
//! [`crate::tls`]'s, the health endpoints [`crate::health`]'s.

use std::sync::LazyLock;

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;

use crate::admission;

/// Built on first use, which is after telemetry is installed (the server
/// starts after it), and then shared by every request.
static DECISIONS: LazyLock<Counter<u64>> = LazyLock::new(|| {
    opentelemetry::global::meter("agentplane-operator")
        .u64_counter("agentplane.webhook.decisions")
        .with_description("Admission decisions on AgentSessions")
        .build()
});

async fn validate(body: Bytes) -> Response {
    let decisions = &*DECISIONS;
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
