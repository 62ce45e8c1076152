//! The HTTP/JSON front, for curl and any language: the routes under
//! `/v1/namespaces/{ns}/sessions/{name}/`, server-sent events for streams.
//! Errors are `{"error": {"code", "message"}}` with the status of
//! [`Error::http_status`].

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use futures::StreamExt;
use serde::Deserialize;

use crate::address::SessionAddr;
use crate::error::Error;
use crate::gate::{Call, Event, Events, Gate};

/// The largest request body: a `write` of a large file fits, a flood does not.
pub const MAX_BODY_BYTES: usize = 16 << 20;

/// The routes.
pub fn router(gate: Arc<Gate>) -> Router {
    Router::new()
        .route("/v1/namespaces/{ns}/sessions/{name}/tools", get(tools))
        .route("/v1/namespaces/{ns}/sessions/{name}/calls", post(call))
        .route(
            "/v1/namespaces/{ns}/sessions/{name}/calls/{id}/events",
            get(attach),
        )
        .route(
            "/v1/namespaces/{ns}/sessions/{name}/calls/{id}",
            delete(cancel),
        )
        .route(
            "/v1/namespaces/{ns}/sessions/{name}/approvals",
            post(approve),
        )
        .route("/healthz", get(|| async { "ok" }))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(gate)
}

#[derive(Debug)]
struct Failure(Error);

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure(e)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status =
            StatusCode::from_u16(self.0.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.0.body())).into_response()
    }
}

fn auth(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

fn addr(ns: &str, name: &str) -> Result<SessionAddr, Failure> {
    Ok(SessionAddr::new(ns, name)?)
}

async fn tools(
    State(gate): State<Arc<Gate>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    let addr = addr(&ns, &name)?;
    let tools = gate.tools(auth(&headers), &addr).await?;
    Ok(Json(serde_json::json!({ "tools": tools })).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBody {
    name: String,
    #[serde(default = "empty_object")]
    input: serde_json::Value,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    approval: Option<String>,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

/// The body as JSON, or an error naming where it is wrong.
fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, Failure> {
    serde_json::from_slice(body).map_err(|e| {
        Failure(Error::Invalid(format!(
            "the request body is not what this route takes: {e}"
        )))
    })
}

fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("text/event-stream"))
}

async fn call(
    State(gate): State<Arc<Gate>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, Failure> {
    let addr = addr(&ns, &name)?;
    // Who calls is settled before the body is read as anything.
    let b: CallBody = parse(&body)?;
    let call = Call {
        id: b.id,
        tool: b.name,
        input: b.input,
        approval: b.approval,
    };
    if wants_events(&headers) {
        let events = gate.stream(auth(&headers), &addr, call).await?;
        return Ok(sse(events));
    }
    let out = gate.call(auth(&headers), &addr, call).await?;
    Ok(Json(out).into_response())
}

#[derive(Debug, Deserialize)]
struct Offsets {
    #[serde(default)]
    stdout_offset: u64,
    #[serde(default)]
    stderr_offset: u64,
}

async fn attach(
    State(gate): State<Arc<Gate>>,
    Path((ns, name, id)): Path<(String, String, String)>,
    Query(o): Query<Offsets>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    let addr = addr(&ns, &name)?;
    let events = gate
        .attach(auth(&headers), &addr, &id, o.stdout_offset, o.stderr_offset)
        .await?;
    Ok(sse(events))
}

async fn cancel(
    State(gate): State<Arc<Gate>>,
    Path((ns, name, id)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    let addr = addr(&ns, &name)?;
    let was = gate.cancel(auth(&headers), &addr, &id).await?;
    Ok(Json(serde_json::json!({ "was_running": was })).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    name: String,
    #[serde(default = "empty_object")]
    input: serde_json::Value,
    #[serde(default)]
    id: Option<String>,
}

async fn approve(
    State(gate): State<Arc<Gate>>,
    Path((ns, name)): Path<(String, String)>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, Failure> {
    let addr = addr(&ns, &name)?;
    let b: ApproveBody = parse(&body)?;
    let (token, expires) = gate
        .approve(auth(&headers), &addr, &b.name, &b.input, b.id.as_deref())
        .await?;
    Ok(Json(serde_json::json!({
        "approval": token,
        "expires_at": rfc3339(expires),
    }))
    .into_response())
}

/// Unix seconds as RFC 3339 in UTC.
pub fn rfc3339(unix: i64) -> String {
    let days = unix.div_euclid(86_400);
    let secs = unix.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A stream as server-sent events: `stdout`/`stderr` chunks (base64 data,
/// byte offsets), then one `result` or one `error`.
fn sse(events: Events) -> Response {
    let stream = events.map(|e| {
        let ev = match e {
            Ok(Event::Stdout { offset, data }) => SseEvent::default().event("stdout").data(
                serde_json::json!({"offset": offset, "data": STANDARD.encode(data)}).to_string(),
            ),
            Ok(Event::Stderr { offset, data }) => SseEvent::default().event("stderr").data(
                serde_json::json!({"offset": offset, "data": STANDARD.encode(data)}).to_string(),
            ),
            Ok(Event::Result(o)) => SseEvent::default()
                .event("result")
                .data(serde_json::to_string(&o).unwrap_or_default()),
            Err(e) => SseEvent::default()
                .event("error")
                .data(serde_json::json!({"code": e.code(), "message": e.to_string()}).to_string()),
        };
        Ok::<_, Infallible>(ev)
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_rfc3339() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_428_800), "2026-12-05T00:00:00Z");
        assert_eq!(rfc3339(951_782_400 + 3_661), "2000-02-29T01:01:01Z");
    }

    #[test]
    fn a_body_that_is_not_a_call_names_what_is_wrong() {
        let e = parse::<CallBody>(br#"{"name": 5}"#).expect_err("refused");
        assert!(e.0.to_string().contains("invalid type"), "{}", e.0);
        let e = parse::<CallBody>(br#"{"name": "bash", "confirmed": true}"#)
            .expect_err("unknown field refused");
        assert!(e.0.to_string().contains("confirmed"), "{}", e.0);
    }
}
