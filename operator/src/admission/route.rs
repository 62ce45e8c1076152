//! The admission webhook's HTTP surface: one route that answers an
//! AdmissionReview with [`admission::review`]'s decision. TLS is
//! [`crate::admission::tls`]'s, the health endpoints [`crate::health`]'s.

use std::sync::{Arc, LazyLock};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};

use crate::admission::review as admission;
use crate::policy::SessionPolicy;

/// Built on first use, which is after telemetry is installed (the server
/// starts after it), and then shared by every request.
static DECISIONS: LazyLock<Counter<u64>> = LazyLock::new(|| {
    opentelemetry::global::meter("agentplane-operator")
        .u64_counter("agentplane.webhook.decisions")
        .with_description("Admission decisions on AgentSessions")
        .build()
});

/// How long each decision took, from the request's body to the answer:
/// the webhook's own share of an admission's latency (the API server's
/// `apiserver_admission_webhook_admission_duration_seconds` adds the
/// network and its own queueing).
static DURATION: LazyLock<Histogram<f64>> = LazyLock::new(|| {
    opentelemetry::global::meter("agentplane-operator")
        .f64_histogram("agentplane.webhook.duration")
        .with_unit("s")
        .with_description("Time to decide one AgentSession admission review")
        .build()
});

/// Largest AdmissionReview accepted. An UPDATE carries the object and the
/// old object, each up to the API server's ~3 MiB request limit, plus the
/// review's own fields; axum's 2 MB default refused the UPDATE of a session
/// over about 1 MB.
pub const MAX_REVIEW_BYTES: usize = 8 << 20;
/// The longest one decision may take. The API server waits at most the
/// webhook's timeoutSeconds (10 s in the chart) and then applies the
/// failure policy; answering earlier with a denial names the cause.
pub const DECISION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);

async fn validate(State(session_policy): State<Arc<SessionPolicy>>, body: Bytes) -> Response {
    let decisions = &*DECISIONS;
    let started = std::time::Instant::now();
    let response = decide(session_policy, body, decisions).await;
    DURATION.record(started.elapsed().as_secs_f64(), &[]);
    response
}

async fn decide(
    session_policy: Arc<SessionPolicy>,
    body: Bytes,
    decisions: &Counter<u64>,
) -> Response {
    // Decoding and validating are CPU work: off the async workers, which
    // also renew the leader lease and serve the health endpoints.
    let work = tokio::task::spawn_blocking(move || admission::review(&body, &session_policy));
    let outcome = match tokio::time::timeout(DECISION_DEADLINE, work).await {
        Ok(Ok(outcome)) => outcome,
        Ok(Err(e)) => Err(format!("validation failed: {e}")),
        Err(_) => {
            decisions.add(1, &[KeyValue::new("allowed", "timeout")]);
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("validation took longer than {DECISION_DEADLINE:?}"),
            )
                .into_response();
        }
    };
    match outcome {
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

/// The webhook's routes, deciding under `session_policy`.
pub fn router(session_policy: Arc<SessionPolicy>) -> Router {
    Router::new()
        .route("/validate", post(validate))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(session_policy)
}
