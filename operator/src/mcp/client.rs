//! Listing an MCP server's tools over Streamable HTTP: `initialize`, the
//! `initialized` notification, then `tools/list` page by page.
//!
//! Written against the protocol rather than a full SDK because the operator
//! needs one read-only question answered; every response may come back as
//! plain JSON or as a server-sent-event stream, and both are handled.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use toolset::McpTool;

use crate::error::{Error, Result};
use crate::mcp::destinations::{Destinations, GuardedResolver};

/// The protocol revision this client speaks.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// Most pages one listing follows, so a server that keeps handing out
/// cursors cannot hold a reconcile forever.
const MAX_PAGES: usize = 50;
/// Largest answer read from a server: a listing of 128 tools with rich
/// schemas fits many times over, and a hostile server cannot grow the
/// operator (whose memory limit is shared by every session) past it.
pub const MAX_BODY_BYTES: usize = 4 << 20;
/// The longest a TCP connect may take, whatever the request timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A Streamable HTTP client for one server.
#[derive(Debug, Clone)]
pub struct McpClient {
    http: reqwest::Client,
    server: String,
    url: String,
}

impl McpClient {
    /// A client for `server` at `url`, each request bounded by `timeout`,
    /// connecting only to addresses `destinations` permits.
    pub fn new(
        server: &str,
        url: &str,
        timeout: Duration,
        destinations: &Arc<Destinations>,
    ) -> Result<Self> {
        let fail = |message: String| Error::Mcp {
            server: server.to_owned(),
            url: url.to_owned(),
            message,
        };
        // A literal address never goes through the resolver: check it here.
        let parsed = reqwest::Url::parse(url).map_err(|e| fail(format!("not a URL: {e}")))?;
        let literal = parsed
            .host_str()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
            .and_then(|h| h.parse::<IpAddr>().ok());
        if let Some(ip) = literal
            && !destinations.permits(ip)
        {
            return Err(fail(format!("refused: {}", Destinations::refusal(ip))));
        }
        // Redirects are not followed: a 307/308 would replay the POST to a
        // destination the session's author chose after admission, from the
        // operator's network position.
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(CONNECT_TIMEOUT.min(timeout))
            .redirect(reqwest::redirect::Policy::none())
            .dns_resolver(Arc::new(GuardedResolver {
                destinations: Arc::clone(destinations),
            }))
            .build()
            .map_err(|e| Error::Mcp {
                server: server.to_owned(),
                url: url.to_owned(),
                message: format!("cannot build an HTTP client: {e}"),
            })?;
        Ok(Self {
            http,
            server: server.to_owned(),
            url: url.to_owned(),
        })
    }

    fn fail(&self, message: impl Into<String>) -> Error {
        Error::Mcp {
            server: self.server.clone(),
            url: self.url.clone(),
            message: message.into(),
        }
    }

    /// Every tool the server lists.
    pub async fn list_tools(&self) -> Result<Vec<McpTool>> {
        let init = json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {
                "protocolVersion": PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "agentplane-operator", "version": env!("CARGO_PKG_VERSION")}
            }
        });
        let (result, session) = self.send(&init, None, None).await?;
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .unwrap_or(PROTOCOL_VERSION)
            .to_owned();
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        self.notify(&note, session.as_deref(), &version).await?;

        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for page in 0..MAX_PAGES {
            let mut params = json!({});
            if let Some(c) = &cursor {
                params["cursor"] = json!(c);
            }
            let req =
                json!({"jsonrpc": "2.0", "id": 2 + page, "method": "tools/list", "params": params});
            let (result, _) = self.send(&req, session.as_deref(), Some(&version)).await?;
            let listed = result
                .get("tools")
                .and_then(Value::as_array)
                .ok_or_else(|| self.fail("tools/list result has no tools array"))?;
            for t in listed {
                tools.push(McpTool {
                    name: t
                        .get("name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    description: t
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    input_schema: t
                        .get("inputSchema")
                        .cloned()
                        .unwrap_or_else(|| json!({"type": "object"})),
                });
            }
            cursor = result
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if cursor.is_none() {
                if let Some(id) = &session {
                    // Best effort: end the session so the server can free it.
                    let _ = self
                        .http
                        .delete(&self.url)
                        .header("Mcp-Session-Id", id)
                        .send()
                        .await;
                }
                return Ok(tools);
            }
        }
        Err(self.fail(format!("tools/list still paging after {MAX_PAGES} pages")))
    }

    async fn notify(&self, body: &Value, session: Option<&str>, version: &str) -> Result<()> {
        let resp = self
            .post(body, session, Some(version))
            .send()
            .await
            .map_err(|e| self.fail(describe(&e)))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(self.fail(format!(
                "initialized notification answered HTTP {}",
                resp.status()
            )))
        }
    }

    fn post(
        &self,
        body: &Value,
        session: Option<&str>,
        version: Option<&str>,
    ) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(&self.url)
            .header("Content-Type", "application/json")
            .header("Accept", "application/json, text/event-stream")
            .body(body.to_string());
        if let Some(id) = session {
            req = req.header("Mcp-Session-Id", id);
        }
        if let Some(v) = version {
            req = req.header("MCP-Protocol-Version", v);
        }
        req
    }

    async fn send(
        &self,
        body: &Value,
        session: Option<&str>,
        version: Option<&str>,
    ) -> Result<(Value, Option<String>)> {
        let method = body
            .get("method")
            .and_then(Value::as_str)
            .unwrap_or("request");
        let resp = self
            .post(body, session, version)
            .send()
            .await
            .map_err(|e| self.fail(describe(&e)))?;
        let status = resp.status();
        let session_id = resp
            .headers()
            .get("Mcp-Session-Id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .or_else(|| session.map(str::to_owned));
        let sse = resp
            .headers()
            .get("Content-Type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        if !status.is_success() {
            // The body is the server's, not ours to copy into a status that
            // the session's author reads; it goes to the operator's log.
            let head = read_capped(resp, 512).await.unwrap_or_default();
            tracing::debug!(server = %self.server, %status, body = %String::from_utf8_lossy(&head), "MCP server refused");
            let hint = if status.is_redirection() {
                " (redirects are not followed)"
            } else {
                ""
            };
            return Err(self.fail(format!("{method} answered HTTP {status}{hint}")));
        }
        let answer = read_capped(resp, MAX_BODY_BYTES)
            .await
            .map_err(|e| self.fail(e))?;
        let text = String::from_utf8_lossy(&answer);
        let id = body.get("id").cloned().unwrap_or(Value::Null);
        let message = if sse {
            find_sse_response(&text, &id)
        } else {
            serde_json::from_str(&text).ok()
        }
        .ok_or_else(|| self.fail(format!("{method}: no JSON-RPC response in the answer")))?;
        if let Some(err) = message.get("error") {
            return Err(self.fail(format!("{method} failed: {err}")));
        }
        let result = message
            .get("result")
            .cloned()
            .ok_or_else(|| self.fail(format!("{method}: response has no result")))?;
        Ok((result, session_id))
    }
}

/// The JSON-RPC response with `id` among a server-sent-event stream's
/// `data:` lines (requests and notifications the server interleaves are
/// skipped).
pub fn find_sse_response(stream: &str, id: &Value) -> Option<Value> {
    let mut data = String::new();
    let mut found = None;
    let mut flush = |data: &mut String| {
        if !data.is_empty() {
            if let Ok(v) = serde_json::from_str::<Value>(data)
                && v.get("id") == Some(id)
                && (v.get("result").is_some() || v.get("error").is_some())
            {
                found = Some(v);
            }
            data.clear();
        }
    };
    for line in stream.lines() {
        if let Some(rest) = line.strip_prefix("data:") {
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
        } else if line.is_empty() {
            flush(&mut data);
        }
    }
    flush(&mut data);
    found
}

/// The body, up to `limit` bytes; an error when it is longer (or the read
/// fails), so that nothing past the limit is ever buffered.
async fn read_capped(
    mut resp: reqwest::Response,
    limit: usize,
) -> std::result::Result<Vec<u8>, String> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| describe(&e))? {
        if out.len() + chunk.len() > limit {
            return Err(format!("answer larger than {limit} bytes; not read"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A short, fixed description of a transport failure for status: whether
/// it timed out, could not connect, or was refused by the destination
/// guard. The detail (addresses, OS errors) goes to the operator's log only,
/// so status is not a port-scanning oracle.
fn describe(e: &reqwest::Error) -> String {
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(e);
    while let Some(s) = source {
        let text = s.to_string();
        if text.contains("is not a public address") {
            return format!("refused: {text}");
        }
        source = s.source();
    }
    tracing::debug!(error = ?e, "MCP request failed");
    if e.is_timeout() {
        "timed out".to_owned()
    } else if e.is_connect() {
        "cannot connect".to_owned()
    } else {
        "the request failed".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_matching_response_in_an_event_stream() {
        let stream = "event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\"}\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"tools\":[]}}\n\n";
        let v = find_sse_response(stream, &json!(3)).expect("found");
        assert_eq!(v["result"]["tools"], json!([]));
        assert!(find_sse_response(stream, &json!(4)).is_none());
        // No trailing blank line: the last event still counts.
        let v = find_sse_response("data: {\"id\":1,\"result\":{}}", &json!(1));
        assert!(v.is_some());
    }
}
