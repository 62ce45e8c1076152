//! The Claude Managed Agents API as a self-hosted environment's worker
//! uses it: the work queue (poll, ack, heartbeat, stop, stats) and the
//! session endpoints (retrieve, events list, stream and send). Every
//! response body is read under a cap and every call under a timeout; no
//! credential reaches an error or a log line.

use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::sse::{SseEvent, SseParser};

/// The beta every call of this protocol carries.
pub const BETA: &str = "managed-agents-2026-04-01";
/// The API version header the SDKs send.
pub const API_VERSION: &str = "2023-06-01";
/// `expected_last_heartbeat` on a lease's first beat.
pub const NO_HEARTBEAT: &str = "NO_HEARTBEAT";
/// The longest a poll waits server-side (the API caps it at 999 ms).
pub const POLL_BLOCK_MS: u32 = 999;
/// The largest JSON response read.
pub const MAX_BODY: usize = 16 << 20;
/// The largest single event read from a stream.
pub const MAX_EVENT: usize = 32 << 20;
/// A page of session events (the official worker reads 1000 at a time).
pub const PAGE_LIMIT: u32 = 1000;
/// Timeout of one ordinary call.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A work item as polled.
#[derive(Clone)]
pub struct WorkItem {
    /// `work_...`.
    pub id: String,
    /// `session` for a session's work; other kinds (`healthcheck`) are
    /// stopped without running anything.
    pub kind: String,
    /// The session it is for.
    pub session_id: Option<String>,
    /// The item's own bearer for its heartbeat, stop and session calls,
    /// from the poll's `secret`; only the poll response carries it.
    pub sessions_token: Option<String>,
}

impl std::fmt::Debug for WorkItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkItem")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("session_id", &self.session_id)
            .field(
                "sessions_token",
                &self.sessions_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

/// A heartbeat's answer.
#[derive(Debug, Clone, Deserialize)]
pub struct Heartbeat {
    /// Echoed back on the next beat.
    pub last_heartbeat: String,
    /// False when the server would not extend the lease (a stop was asked).
    #[serde(default)]
    pub lease_extended: bool,
    /// The item's state.
    #[serde(default)]
    pub state: String,
    /// The lease's time to live.
    #[serde(default)]
    pub ttl_seconds: Option<f64>,
}

/// The queue's figures.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct QueueStats {
    /// Items queued.
    #[serde(default)]
    pub depth: Option<i64>,
    /// Items polled, not acknowledged.
    #[serde(default)]
    pub pending: Option<i64>,
    /// When the oldest queued item was queued (RFC 3339).
    #[serde(default)]
    pub oldest_queued_at: Option<String>,
    /// Workers that polled lately.
    #[serde(default)]
    pub workers_polling: Option<i64>,
}

/// What the dispatcher needs of a session.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    /// `idle`, `running`, `rescheduling`, `terminated`.
    pub status: String,
    /// The session agent's `tools[]`, as the API holds them.
    pub tools: Vec<Value>,
    /// The session agent's skills.
    pub skills: Vec<Value>,
    /// The session's resources (memory stores among them).
    pub resources: Vec<Value>,
}

/// The beta the memory-store endpoints take (the SDK sends it alone there).
pub const MEMORY_BETA: &str = "agent-memory-2026-07-22";
/// A page of memories with their content (the API's maximum for `full`).
pub const MEMORY_PAGE_LIMIT: u32 = 20;
/// Timeout of a skill archive's download.
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// A skill version, as retrieved.
#[derive(Debug, Clone, Deserialize)]
pub struct SkillVersion {
    /// The concrete version id (`latest` resolves to it).
    pub id: String,
    /// The skill's name (its directory in the sandbox).
    #[serde(default)]
    pub name: String,
}

/// A memory of a memory store.
#[derive(Clone, Deserialize)]
pub struct Memory {
    /// `mem_...`.
    pub id: String,
    /// `memory` (listings may also carry other kinds, which are skipped).
    #[serde(default, rename = "type")]
    pub kind: String,
    /// `/a/b.md`.
    #[serde(default)]
    pub path: String,
    /// Lowercase hex SHA-256 of the content.
    #[serde(default)]
    pub content_sha256: String,
    /// The content (`view=full` only).
    #[serde(default)]
    pub content: Option<String>,
}

impl std::fmt::Debug for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Memory")
            .field("id", &self.id)
            .field("path", &self.path)
            .field("content_sha256", &self.content_sha256)
            .finish_non_exhaustive()
    }
}

/// A client of one API base URL.
#[derive(Debug, Clone)]
pub struct ManagedApi {
    http: reqwest::Client,
    base: String,
}

impl ManagedApi {
    /// A client of `base` (e.g. `https://api.anthropic.com`).
    pub fn new(base: &str) -> Result<Self> {
        let base = base.trim_end_matches('/').to_owned();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(Error::Config(format!(
                "the API URL {base:?} must start with https:// (or http:// for a local stand-in)"
            )));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("agentplane-dispatcher/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self { http, base })
    }

    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: &str,
    ) -> reqwest::RequestBuilder {
        self.request_beta(method, path, bearer, Some(BETA))
    }

    fn request_beta(
        &self,
        method: reqwest::Method,
        path: &str,
        bearer: &str,
        beta: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .header("anthropic-version", API_VERSION)
            .bearer_auth(bearer);
        if let Some(b) = beta {
            r = r.header("anthropic-beta", b);
        }
        r
    }

    /// A skill's version (`latest` or a version id), resolved. Sent with no
    /// `anthropic-beta`, as the SDK sends it.
    pub async fn skill_version(
        &self,
        bearer: &str,
        skill: &str,
        version: &str,
    ) -> Result<SkillVersion> {
        let path = format!("/v1/skills/{}/versions/{}", seg(skill)?, seg(version)?);
        let body = send(
            self.request_beta(reqwest::Method::GET, &path, bearer, None)
                .timeout(CALL_TIMEOUT),
            "skill version retrieve",
        )
        .await?;
        serde_json::from_slice(&body).map_err(|e| protocol("skill version retrieve", e))
    }

    /// A skill version's files: an archive (zip or tar) of at most `cap`
    /// bytes; a larger one is refused while it is read.
    pub async fn skill_content(
        &self,
        bearer: &str,
        skill: &str,
        version_id: &str,
        cap: usize,
    ) -> Result<Vec<u8>> {
        let path = format!(
            "/v1/skills/{}/versions/{}/content",
            seg(skill)?,
            seg(version_id)?
        );
        let req = self
            .request_beta(reqwest::Method::GET, &path, bearer, None)
            .header("accept", "application/binary")
            .timeout(DOWNLOAD_TIMEOUT);
        send_capped(req, "skill download", cap).await
    }

    /// One page of a memory store's memories with their content, and the
    /// cursor of the next page. Takes the item's sessions token.
    pub async fn memories_page(
        &self,
        sessions_token: &str,
        store: &str,
        page: Option<&str>,
    ) -> Result<(Vec<Memory>, Option<String>)> {
        let path = format!("/v1/memory_stores/{}/memories", seg(store)?);
        let mut req = self
            .request_beta(
                reqwest::Method::GET,
                &path,
                sessions_token,
                Some(MEMORY_BETA),
            )
            .query(&[
                ("view", "full".to_owned()),
                ("limit", MEMORY_PAGE_LIMIT.to_string()),
            ])
            .timeout(CALL_TIMEOUT);
        if let Some(p) = page {
            req = req.query(&[("page", p)]);
        }
        let body = send(req, "memory list").await?;
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            data: Vec<Memory>,
            #[serde(default)]
            next_page: Option<String>,
        }
        let p: Page = serde_json::from_slice(&body).map_err(|e| protocol("memory list", e))?;
        Ok((p.data, p.next_page.filter(|s| !s.is_empty())))
    }

    /// Creates a memory at `path` (`/a/b.md`).
    pub async fn memory_create(
        &self,
        sessions_token: &str,
        store: &str,
        path: &str,
        content: &str,
    ) -> Result<Memory> {
        let p = format!("/v1/memory_stores/{}/memories", seg(store)?);
        let req = self
            .request_beta(reqwest::Method::POST, &p, sessions_token, Some(MEMORY_BETA))
            .json(&serde_json::json!({ "path": path, "content": content }))
            .timeout(CALL_TIMEOUT);
        let body = send(req, "memory create").await?;
        serde_json::from_slice(&body).map_err(|e| protocol("memory create", e))
    }

    /// Replaces a memory's content if it still has `expected_sha256`
    /// (409 otherwise: changed elsewhere meanwhile).
    pub async fn memory_update(
        &self,
        sessions_token: &str,
        store: &str,
        id: &str,
        content: &str,
        expected_sha256: &str,
    ) -> Result<Memory> {
        let p = format!("/v1/memory_stores/{}/memories/{}", seg(store)?, seg(id)?);
        let req = self
            .request_beta(reqwest::Method::POST, &p, sessions_token, Some(MEMORY_BETA))
            .json(&serde_json::json!({
                "content": content,
                "precondition": {"type": "content_sha256", "content_sha256": expected_sha256},
            }))
            .timeout(CALL_TIMEOUT);
        let body = send(req, "memory update").await?;
        serde_json::from_slice(&body).map_err(|e| protocol("memory update", e))
    }

    /// Waits up to a second for a work item; `None` when there is none.
    pub async fn poll(&self, env: &str, key: &str, worker_id: &str) -> Result<Option<WorkItem>> {
        let path = format!("/v1/environments/{}/work/poll", seg(env)?);
        let req = self
            .request(reqwest::Method::GET, &path, key)
            .header("Anthropic-Worker-ID", worker_id)
            .query(&[("block_ms", POLL_BLOCK_MS)])
            .timeout(CALL_TIMEOUT);
        let body = send(req, "poll").await?;
        parse_poll(&body)
    }

    /// Takes the item off the queue.
    pub async fn ack(&self, env: &str, key: &str, work: &str) -> Result<()> {
        let path = format!("/v1/environments/{}/work/{}/ack", seg(env)?, seg(work)?);
        send(
            self.request(reqwest::Method::POST, &path, key)
                .timeout(CALL_TIMEOUT),
            "ack",
        )
        .await?;
        Ok(())
    }

    /// Extends the item's lease. `expected` is `NO_HEARTBEAT` on the first
    /// beat, then the previous answer's `last_heartbeat`.
    pub async fn heartbeat(
        &self,
        env: &str,
        bearer: &str,
        work: &str,
        expected: &str,
        desired_ttl: u64,
        timeout: Duration,
    ) -> Result<Heartbeat> {
        let path = format!(
            "/v1/environments/{}/work/{}/heartbeat",
            seg(env)?,
            seg(work)?
        );
        let req = self
            .request(reqwest::Method::POST, &path, bearer)
            .query(&[
                ("desired_ttl_seconds", desired_ttl.to_string()),
                ("expected_last_heartbeat", expected.to_owned()),
            ])
            .timeout(timeout);
        let body = send(req, "heartbeat").await?;
        serde_json::from_slice(&body).map_err(|e| protocol("heartbeat", e))
    }

    /// Ends the item (`force` skips the hosted side's graceful shutdown).
    /// An item already stopped (409) counts as stopped.
    pub async fn stop(&self, env: &str, bearer: &str, work: &str, force: bool) -> Result<()> {
        let path = format!("/v1/environments/{}/work/{}/stop", seg(env)?, seg(work)?);
        let req = self
            .request(reqwest::Method::POST, &path, bearer)
            .json(&serde_json::json!({ "force": force }))
            .timeout(CALL_TIMEOUT);
        match send(req, "stop").await {
            Ok(_) => Ok(()),
            Err(e) if e.status() == Some(409) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The queue's figures.
    pub async fn stats(&self, env: &str, key: &str) -> Result<QueueStats> {
        let path = format!("/v1/environments/{}/work/stats", seg(env)?);
        let body = send(
            self.request(reqwest::Method::GET, &path, key)
                .timeout(CALL_TIMEOUT),
            "stats",
        )
        .await?;
        serde_json::from_slice(&body).map_err(|e| protocol("stats", e))
    }

    /// The session, with its agent's tools and skills.
    pub async fn session(&self, bearer: &str, id: &str) -> Result<SessionInfo> {
        let path = format!("/v1/sessions/{}", seg(id)?);
        let body = send(
            self.request(reqwest::Method::GET, &path, bearer)
                .timeout(CALL_TIMEOUT),
            "session retrieve",
        )
        .await?;
        let v: Value =
            serde_json::from_slice(&body).map_err(|e| protocol("session retrieve", e))?;
        Ok(session_info(&v))
    }

    /// One page of the session's events, oldest first, and the cursor of
    /// the next page.
    pub async fn events_page(
        &self,
        bearer: &str,
        id: &str,
        page: Option<&str>,
    ) -> Result<(Vec<Value>, Option<String>)> {
        let path = format!("/v1/sessions/{}/events", seg(id)?);
        let mut req = self
            .request(reqwest::Method::GET, &path, bearer)
            .query(&[
                ("limit", PAGE_LIMIT.to_string()),
                ("order", "asc".to_owned()),
            ])
            .timeout(CALL_TIMEOUT);
        if let Some(p) = page {
            req = req.query(&[("page", p)]);
        }
        let body = send(req, "events list").await?;
        #[derive(Deserialize)]
        struct Page {
            #[serde(default)]
            data: Vec<Value>,
            #[serde(default)]
            next_page: Option<String>,
        }
        let p: Page = serde_json::from_slice(&body).map_err(|e| protocol("events list", e))?;
        Ok((p.data, p.next_page.filter(|s| !s.is_empty())))
    }

    /// Posts events (tool results) to the session.
    pub async fn send_events(&self, bearer: &str, id: &str, events: &[Value]) -> Result<()> {
        let path = format!("/v1/sessions/{}/events", seg(id)?);
        let req = self
            .request(reqwest::Method::POST, &path, bearer)
            .json(&serde_json::json!({ "events": events }))
            .timeout(CALL_TIMEOUT);
        send(req, "events send").await?;
        Ok(())
    }

    /// Opens the session's live event stream.
    pub async fn stream(&self, bearer: &str, id: &str) -> Result<EventStream> {
        let path = format!("/v1/sessions/{}/events/stream", seg(id)?);
        let resp = self
            .request(reqwest::Method::GET, &path, bearer)
            .header("accept", "text/event-stream")
            .send()
            .await
            .map_err(|e| transport("events stream", &e))?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            let body = read_capped(resp, MAX_BODY).await.unwrap_or_default();
            return Err(api_error("events stream", status, &body));
        }
        Ok(EventStream {
            body: Box::pin(resp.bytes_stream()),
            parser: SseParser::new(MAX_EVENT),
            ready: std::collections::VecDeque::new(),
        })
    }
}

/// A session's live events, parsed.
pub struct EventStream {
    body: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    parser: SseParser,
    ready: std::collections::VecDeque<SseEvent>,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventStream").finish_non_exhaustive()
    }
}

impl EventStream {
    /// The next event as JSON; `Ok(None)` when the stream ended.
    pub async fn next(&mut self) -> Result<Option<Value>> {
        loop {
            if let Some(ev) = self.ready.pop_front() {
                if ev.event == "error" {
                    return Err(Error::Protocol {
                        what: "events stream",
                        message: format!("the stream sent an error: {}", short(&ev.data)),
                    });
                }
                match serde_json::from_str::<Value>(&ev.data) {
                    Ok(v) if v.is_object() => return Ok(Some(v)),
                    // Keep-alives and pings carry no session event.
                    _ => continue,
                }
            }
            match self.body.next().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(transport("events stream", &e)),
                Some(Ok(chunk)) => {
                    let evs = self.parser.feed(&chunk).map_err(|t| Error::Protocol {
                        what: "events stream",
                        message: format!("an event is larger than {} bytes", t.0),
                    })?;
                    self.ready.extend(evs);
                }
            }
        }
    }
}

/// An id put into a path: ids of this API are letters, digits, `_` and
/// `-`; anything else (a `/`, a `..`) is refused rather than escaped, since
/// nothing the API or a spec hands us is trusted.
fn seg(s: &str) -> Result<&str> {
    let ok = !s.is_empty()
        && s.len() <= 128
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(s)
    } else {
        Err(Error::Protocol {
            what: "an id",
            message: format!(
                "{:?} is not an id (1-128 letters, digits, '_' or '-')",
                short(s)
            ),
        })
    }
}

async fn send(req: reqwest::RequestBuilder, what: &'static str) -> Result<Vec<u8>> {
    send_capped(req, what, MAX_BODY).await
}

async fn send_capped(
    req: reqwest::RequestBuilder,
    what: &'static str,
    cap: usize,
) -> Result<Vec<u8>> {
    let resp = req.send().await.map_err(|e| transport(what, &e))?;
    let status = resp.status().as_u16();
    let body = read_capped(resp, cap)
        .await
        .map_err(|m| Error::Transport { what, message: m })?;
    if (200..300).contains(&status) {
        Ok(body)
    } else {
        Err(api_error(what, status, &body))
    }
}

/// Reads a body, refusing one over `cap` bytes instead of holding it.
async fn read_capped(resp: reqwest::Response, cap: usize) -> Result<Vec<u8>, String> {
    if resp.content_length().is_some_and(|n| n > cap as u64) {
        return Err(format!("the response is larger than {cap} bytes"));
    }
    let mut out = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| without_url(&e))?;
        if out.len() + chunk.len() > cap {
            return Err(format!("the response is larger than {cap} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn without_url(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    if let Some(u) = e.url() {
        s = s.replace(u.as_str(), u.path());
    }
    s
}

fn transport(what: &'static str, e: &reqwest::Error) -> Error {
    Error::Transport {
        what,
        message: without_url(e),
    }
}

fn protocol(what: &'static str, e: impl std::fmt::Display) -> Error {
    Error::Protocol {
        what,
        message: e.to_string(),
    }
}

fn short(s: &str) -> String {
    let mut t: String = s.chars().take(300).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t
}

/// The API's error, from its `{"type":"error","error":{type,message}}` body.
pub fn api_error(what: &'static str, status: u16, body: &[u8]) -> Error {
    let json: Option<Value> = serde_json::from_slice(body).ok();
    let message = json
        .as_ref()
        .and_then(|v| v.get("error"))
        .map(|e| {
            let t = e.get("type").and_then(Value::as_str).unwrap_or("error");
            let m = e.get("message").and_then(Value::as_str).unwrap_or("");
            short(&format!("{t}: {m}"))
        })
        .unwrap_or_else(|| short(&String::from_utf8_lossy(body)));
    Error::Api {
        what,
        status,
        message,
        body: json,
    }
}

/// A poll's answer: an item, or nothing (an empty body, `null`, or 204).
pub fn parse_poll(body: &[u8]) -> Result<Option<WorkItem>> {
    let text = String::from_utf8_lossy(body);
    let t = text.trim();
    if t.is_empty() || t == "null" {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(t).map_err(|e| protocol("poll", e))?;
    if v.is_null() {
        return Ok(None);
    }
    let id = v
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| protocol("poll", "the work item has no id"))?
        .to_owned();
    let data = v.get("data").cloned().unwrap_or(Value::Null);
    let kind = data
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let session_id = data.get("id").and_then(Value::as_str).map(str::to_owned);
    let sessions_token = v
        .get("secret")
        .and_then(Value::as_str)
        .and_then(sessions_token_from_secret);
    Ok(Some(WorkItem {
        id,
        kind,
        session_id,
        sessions_token,
    }))
}

/// The `sessions_token` inside an item's secret: URL-safe base64 (padded
/// or not) of a JSON object. Anything else yields none, and the
/// environment key is used instead.
pub fn sessions_token_from_secret(secret: &str) -> Option<String> {
    let s = secret.trim().trim_end_matches('=');
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    v.get("sessions_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
}

/// The parts of a retrieved session the dispatcher uses.
pub fn session_info(v: &Value) -> SessionInfo {
    let agent = v.get("agent").cloned().unwrap_or(Value::Null);
    let list = |k: &str| {
        agent
            .get(k)
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    SessionInfo {
        status: v
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned(),
        tools: list("tools"),
        skills: list("skills"),
        resources: v
            .get("resources")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_poll_is_no_work() {
        assert!(parse_poll(b"").unwrap().is_none());
        assert!(parse_poll(b"null").unwrap().is_none());
        assert!(parse_poll(b" null\n").unwrap().is_none());
    }

    #[test]
    fn a_polled_item_yields_its_session_and_token() {
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"sessions_token":"sst_1","ingress_token":"x"}"#);
        let body = serde_json::json!({
            "id": "work_1", "type": "work", "environment_id": "env_1", "state": "queued",
            "data": {"type": "session", "id": "sesn_1"}, "secret": secret
        });
        let item = parse_poll(body.to_string().as_bytes()).unwrap().unwrap();
        assert_eq!(item.id, "work_1");
        assert_eq!(item.kind, "session");
        assert_eq!(item.session_id.as_deref(), Some("sesn_1"));
        assert_eq!(item.sessions_token.as_deref(), Some("sst_1"));
        assert!(
            !format!("{item:?}").contains("sst_1"),
            "the token is never printed"
        );
    }

    #[test]
    fn a_malformed_secret_or_item_is_named() {
        assert_eq!(sessions_token_from_secret("%%%"), None);
        assert_eq!(sessions_token_from_secret("e30"), None); // {}
        let e = parse_poll(br#"{"data":{}}"#).unwrap_err().to_string();
        assert!(e.contains("poll") && e.contains("no id"), "{e}");
    }

    #[test]
    fn api_errors_carry_type_and_message() {
        let e = api_error(
            "ack",
            401,
            br#"{"type":"error","error":{"type":"authentication_error","message":"bad key"}}"#,
        );
        assert_eq!(
            e.to_string(),
            "the Managed Agents API answered 401 to ack: authentication_error: bad key"
        );
        assert!(!e.is_transient());
        assert!(api_error("poll", 503, b"upstream").is_transient());
        assert!(api_error("poll", 429, b"").is_transient());
    }

    #[test]
    fn ids_that_could_leave_their_path_are_refused() {
        assert_eq!(seg("env_1").unwrap(), "env_1");
        for bad in ["..", "../x", "a/b", "a?b", "", "a b"] {
            assert!(seg(bad).is_err(), "{bad:?}");
        }
    }
}
