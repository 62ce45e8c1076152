//! The MCP front: one MCP server per session, at
//! `/mcp/v1/namespaces/{ns}/sessions/{name}` (Streamable HTTP), so any MCP
//! client lists and calls a session's tools. The protocol is `rmcp`'s; this
//! module only translates to and from [`Gate`], like the HTTP and gRPC
//! fronts.
//!
//! How it is served:
//!
//! - **Stateless.** No `Mcp-Session-Id` and nothing kept between requests
//!   (rmcp's `legacy_session_mode: false`): every POST is a whole exchange,
//!   so a hostile client cannot grow server-side state, and any replica
//!   answers any request. `GET` (no server-initiated stream) and `DELETE`
//!   (no session to end) are 405.
//! - **JSON answers.** A request is answered with one `application/json`
//!   JSON-RPC message, not an event stream.
//! - **Any `Host`.** The gateway is reached by Service DNS names and pod
//!   IPs, and it authenticates every request by its bearer token, so rmcp's
//!   DNS-rebinding guard (a loopback-only `Host` list by default) is off.
//! - **Bounded body.** 16 MiB ([`crate::http::MAX_BODY_BYTES`]), counted
//!   while the body streams in; 413 past it.
//!
//! Who calls: every request carries `Authorization: Bearer <token>`. The
//! token is checked (TokenReview, cached) before rmcp reads the body: none,
//! or one the cluster refuses, is **HTTP 401** with `WWW-Authenticate:
//! Bearer` and the gateway's JSON error body (the MCP client sees an HTTP
//! error, not a JSON-RPC one). The permission (`create` on
//! `agentsessions/call`) is checked, with the session, at `tools/list` and
//! `tools/call`, as for the other fronts; a caller without it gets the
//! JSON-RPC error below naming the permission.
//!
//! What the methods do:
//!
//! - `initialize`: server `agentplane-gateway`, the tools capability.
//! - `tools/list`: the session's tools ([`Gate::tools`]) with their
//!   `inputSchema`, and the permission policy as
//!   `_meta: {"agentplane.dev/permission_policy": "always_ask" | ...}`; an
//!   `always_ask` tool's description ends with `(needs approval)`.
//! - `tools/call` ([`Gate::call`]): `arguments` is the input (absent: `{}`);
//!   `_meta["agentplane.dev/approval"]` the approval token and
//!   `_meta["agentplane.dev/call_id"]` the call id, when given (strings). The
//!   result is one text content, `isError` the tool's, and
//!   `_meta["agentplane.dev/call_id"]` the id the call ran under.
//!
//! How the gateway's errors read ([`Error::code`] on the left):
//!
//! | error | MCP answer |
//! | --- | --- |
//! | `approval_required` | result, `isError: true`, the message as its text (plus how to pass an approval over MCP) |
//! | a runner's answer (`refused`, `invalid`, `timeout`, ... from the runner) | result, `isError: true`, the message as its text |
//! | `invalid` | JSON-RPC error -32602 (invalid params) |
//! | `unauthenticated` | JSON-RPC error -32011 (only if a token stops being accepted between the HTTP check and the call) |
//! | `forbidden` | JSON-RPC error -32013 |
//! | `not_found` | JSON-RPC error -32014 |
//! | `too_many_requests` | JSON-RPC error -32029 |
//! | `unavailable` | JSON-RPC error -32050 |
//! | anything else (`internal`) | JSON-RPC error -32603 (internal error) |
//!
//! An error's `message` is the gateway's message, its `data`
//! `{"reason": <code>}`; an `isError` result's `_meta` carries
//! `"agentplane.dev/reason": <code>`. So a model reads why a call did not
//! run, and a program tells an approval that is needed from a permission
//! that is missing without parsing text. The server error codes (-32011 to
//! -32050) are this gateway's own, chosen clear of those MCP and its SDKs
//! use (-32000, -32001, -32002, -32020 to -32022, -32042).

use std::borrow::Cow;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::{Json, Router};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorCode,
    Implementation, JsonObject, ListToolsResult, MetaObject, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;

use crate::address::SessionAddr;
use crate::error::Error;
use crate::gate::{Call, Gate, Outcome, ToolView};

/// Where each session's MCP server is.
pub const ROUTE: &str = "/mcp/v1/namespaces/{ns}/sessions/{name}";
const PREFIX: &str = "/mcp/v1/namespaces/";

/// The server's name in `initialize`.
pub const SERVER_NAME: &str = "agentplane-gateway";
/// Tool `_meta` key: the tool's permission policy.
pub const META_PERMISSION_POLICY: &str = "agentplane.dev/permission_policy";
/// `tools/call` `_meta` key: an approval token for an `always_ask` call.
pub const META_APPROVAL: &str = "agentplane.dev/approval";
/// `tools/call` `_meta` key: the call id (also on the result).
pub const META_CALL_ID: &str = "agentplane.dev/call_id";
/// Result `_meta` key on an `isError` result the gateway made: the error code.
pub const META_REASON: &str = "agentplane.dev/reason";

const NEEDS_APPROVAL: &str = "(needs approval)";

/// The MCP routes: one stateless Streamable HTTP server per session.
pub fn router(gate: Arc<Gate>) -> Router {
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .disable_allowed_hosts()
        .with_max_request_body_bytes(crate::http::MAX_BODY_BYTES);
    let handler = Server {
        gate: Arc::clone(&gate),
    };
    let mcp = StreamableHttpService::new(
        move || Ok(handler.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    Router::new()
        .route(ROUTE, any(serve))
        .with_state(Front { gate, mcp })
}

#[derive(Clone)]
struct Front {
    gate: Arc<Gate>,
    mcp: StreamableHttpService<Server, NeverSessionManager>,
}

/// Authenticates the request, then hands it to rmcp.
async fn serve(State(front): State<Front>, request: Request) -> Response {
    if let Err(e) = front.gate.auth.authenticate(auth(request.headers())).await {
        return failure(&e);
    }
    // A malformed address is refused here too, before any protocol work.
    if let Err(e) = session_of(request.uri().path()) {
        return failure(&e);
    }
    front
        .mcp
        .handle(request)
        .await
        .map(axum::body::Body::new)
        .into_response()
}

/// The gateway's HTTP error (status and JSON body); a 401 says how to
/// authenticate.
fn failure(e: &Error) -> Response {
    let status = StatusCode::from_u16(e.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Json(e.body())).into_response();
    if status == StatusCode::UNAUTHORIZED {
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    }
    response
}

fn auth(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// The session a request path names: `/mcp/v1/namespaces/{ns}/sessions/{name}`,
/// both parts valid Kubernetes names (the raw path: `%2F` is not decoded, so
/// it names nothing).
pub fn session_of(path: &str) -> Result<SessionAddr, Error> {
    let parts = path
        .strip_prefix(PREFIX)
        .and_then(|rest| rest.split_once("/sessions/"));
    let Some((ns, name)) = parts else {
        return Err(Error::Invalid(format!(
            "an MCP server is at {PREFIX}<namespace>/sessions/<name>"
        )));
    };
    SessionAddr::new(ns, name)
}

/// One session's MCP server, for one request.
#[derive(Debug, Clone)]
struct Server {
    gate: Arc<Gate>,
}

/// The session and the `Authorization` header of the HTTP request behind
/// an MCP request.
fn target(cx: &RequestContext<RoleServer>) -> Result<(SessionAddr, Option<String>), ErrorData> {
    let parts = cx
        .extensions
        .get::<axum::http::request::Parts>()
        .ok_or_else(|| {
            ErrorData::internal_error("the MCP request came without its HTTP request", None)
        })?;
    let addr = session_of(parts.uri.path()).map_err(|e| protocol_error(&e))?;
    Ok((addr, auth(&parts.headers).map(str::to_owned)))
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(SERVER_NAME, env!("CARGO_PKG_VERSION")))
            .with_instructions(format!(
                "The tools of one agentplane session (a sandbox). A tool whose description ends \
                 with {NEEDS_APPROVAL} is always_ask: a call without an approval returns an error \
                 result saying so; an approver (create on agentsessions/approve) obtains an \
                 approval for the same tool and arguments from the gateway, and the call is \
                 repeated with _meta {{\"{META_APPROVAL}\": <approval>}}."
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        cx: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let (addr, header) = target(&cx)?;
        let tools = self
            .gate
            .tools(header.as_deref(), &addr)
            .await
            .map_err(|e| protocol_error(&e))?;
        // A session has a handful of tools: one page.
        Ok(ListToolsResult::with_all_items(
            tools.iter().map(tool_of).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        cx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let (addr, header) = target(&cx)?;
        let metas = [Some(&cx.meta.0.0), request.meta.as_ref().map(|m| &m.0.0)];
        let call =
            call_of(&request.name, request.arguments, &metas).map_err(|e| protocol_error(&e))?;
        let tool = call.tool.clone();
        let out = self.gate.call(header.as_deref(), &addr, call).await;
        if let Err(e) = &out {
            tracing::debug!(session = %addr, tool, code = e.code(), "MCP call not run");
        }
        answer_of(out).map(CallToolResponse::from)
    }
}

/// A session's tool as MCP lists it.
pub fn tool_of(t: &ToolView) -> Tool {
    let mut description = t.description.trim_end().to_owned();
    if t.permission_policy == "always_ask" {
        if !description.is_empty() {
            description.push(' ');
        }
        description.push_str(NEEDS_APPROVAL);
    }
    let schema = match &t.input_schema {
        Value::Object(o) => o.clone(),
        // MCP requires an object schema; a tool without one takes an object.
        _ => {
            let mut o = JsonObject::new();
            o.insert("type".into(), Value::String("object".into()));
            o
        }
    };
    let mut meta = MetaObject::new();
    meta.insert(
        META_PERMISSION_POLICY.into(),
        Value::String(t.permission_policy.clone()),
    );
    Tool::new(t.name.clone(), description, schema).with_meta(meta)
}

/// A string `_meta` value: the first of `metas` holding `key`. Not a
/// string is invalid.
pub fn meta_str(metas: &[Option<&JsonObject>], key: &str) -> Result<Option<String>, Error> {
    let Some(v) = metas.iter().flatten().find_map(|m| m.get(key)) else {
        return Ok(None);
    };
    match v {
        Value::String(s) => Ok(Some(s.clone())),
        Value::Null => Ok(None),
        _ => Err(Error::Invalid(format!("_meta[{key:?}] must be a string"))),
    }
}

/// The gate's call for `tools/call`: `metas` are the request's `_meta`
/// maps (rmcp keeps it apart from the params; either is read).
pub fn call_of(
    name: &str,
    arguments: Option<JsonObject>,
    metas: &[Option<&JsonObject>],
) -> Result<Call, Error> {
    Ok(Call {
        id: meta_str(metas, META_CALL_ID)?,
        tool: name.to_owned(),
        input: Value::Object(arguments.unwrap_or_default()),
        approval: meta_str(metas, META_APPROVAL)?,
    })
}

/// A tool's result as MCP returns it.
pub fn result_of(o: Outcome) -> CallToolResult {
    let content = vec![ContentBlock::text(o.content)];
    let mut r = if o.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    let mut meta = MetaObject::new();
    meta.insert(META_CALL_ID.into(), Value::String(o.id));
    r.meta = Some(meta);
    r
}

/// The answer to `tools/call`: a result, an error result the model reads,
/// or a JSON-RPC error (the table in the module's documentation).
pub fn answer_of(out: Result<Outcome, Error>) -> Result<CallToolResult, ErrorData> {
    match out {
        Ok(o) => Ok(result_of(o)),
        Err(e @ (Error::ApprovalRequired { .. } | Error::Runner(_))) => {
            let mut text = e.to_string();
            if matches!(e, Error::ApprovalRequired { .. }) {
                text.push_str(&format!(
                    ". Over MCP, pass the approval as _meta[\"{META_APPROVAL}\"] of tools/call."
                ));
            }
            let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
            let mut meta = MetaObject::new();
            meta.insert(META_REASON.into(), Value::String(e.code().into()));
            r.meta = Some(meta);
            Ok(r)
        }
        Err(e) => Err(protocol_error(&e)),
    }
}

/// The JSON-RPC error code of a gateway error that is not a tool result.
pub fn error_code(e: &Error) -> ErrorCode {
    match e {
        Error::Invalid(_) => ErrorCode::INVALID_PARAMS,
        Error::Unauthenticated(_) => ErrorCode(-32011),
        Error::Forbidden { .. } => ErrorCode(-32013),
        Error::NotFound(_) => ErrorCode(-32014),
        Error::TooManyRequests(_) => ErrorCode(-32029),
        Error::Unavailable(_) => ErrorCode(-32050),
        _ => ErrorCode::INTERNAL_ERROR,
    }
}

/// A gateway error as a JSON-RPC error: its message, and its code in `data`.
pub fn protocol_error(e: &Error) -> ErrorData {
    ErrorData::new(
        error_code(e),
        Cow::Owned(e.to_string()),
        Some(serde_json::json!({ "reason": e.code() })),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> JsonObject {
        match v {
            Value::Object(o) => o,
            _ => panic!("not an object"),
        }
    }

    #[test]
    fn paths_name_sessions() {
        let a = session_of("/mcp/v1/namespaces/team-a/sessions/demo.v2").unwrap();
        assert_eq!(
            (a.namespace.as_str(), a.name.as_str()),
            ("team-a", "demo.v2")
        );
        for bad in [
            "/mcp/v1/namespaces/team-a/sessions/a%2Fb",
            "/mcp/v1/namespaces/team-a/sessions/a/b",
            "/mcp/v1/namespaces/Team/sessions/x",
            "/mcp/v1/namespaces//sessions/x",
            "/mcp/v1/namespaces/team-a/sessions/",
            "/mcp/v1/namespaces/team-a",
            "/v1/namespaces/team-a/sessions/x",
        ] {
            let e = session_of(bad).expect_err(bad);
            assert!(matches!(e, Error::Invalid(_)), "{bad}: {e}");
        }
    }

    fn view(policy: &str, schema: Value) -> ToolView {
        ToolView {
            name: "bash".into(),
            description: "Run a command.".into(),
            input_schema: schema,
            permission_policy: policy.into(),
        }
    }

    #[test]
    fn tools_carry_schema_and_policy() {
        let schema = serde_json::json!({"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]});
        let t = serde_json::to_value(tool_of(&view("always_ask", schema.clone()))).unwrap();
        assert_eq!(t["name"], "bash");
        assert_eq!(t["description"], "Run a command. (needs approval)");
        assert_eq!(t["inputSchema"], schema);
        assert_eq!(t["_meta"][META_PERMISSION_POLICY], "always_ask");

        let t = serde_json::to_value(tool_of(&view("always_allow", schema))).unwrap();
        assert_eq!(t["description"], "Run a command.");
        assert_eq!(t["_meta"][META_PERMISSION_POLICY], "always_allow");

        let t = serde_json::to_value(tool_of(&view("always_allow", Value::Null))).unwrap();
        assert_eq!(t["inputSchema"], serde_json::json!({"type": "object"}));
    }

    #[test]
    fn calls_take_arguments_and_meta() {
        let cx = obj(serde_json::json!({META_APPROVAL: "tok", "progressToken": 1}));
        let params = obj(serde_json::json!({META_CALL_ID: "toolu_1", META_APPROVAL: "other"}));
        let args = obj(serde_json::json!({"command": "ls"}));
        let c = call_of("bash", Some(args), &[Some(&cx), Some(&params)]).unwrap();
        assert_eq!(c.tool, "bash");
        assert_eq!(c.input, serde_json::json!({"command": "ls"}));
        // The context's map comes first.
        assert_eq!(c.approval.as_deref(), Some("tok"));
        assert_eq!(c.id.as_deref(), Some("toolu_1"));

        let c = call_of("read", None, &[None, None]).unwrap();
        assert_eq!(c.input, serde_json::json!({}));
        assert_eq!((c.id, c.approval), (None, None));

        let bad = obj(serde_json::json!({META_APPROVAL: 5}));
        let e = call_of("bash", None, &[Some(&bad)]).unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        assert!(e.to_string().contains(META_APPROVAL));
    }

    #[test]
    fn results_keep_the_tools_error_flag() {
        let ok = serde_json::to_value(result_of(Outcome {
            id: "c1".into(),
            content: "hello".into(),
            is_error: false,
        }))
        .unwrap();
        assert_eq!(
            ok["content"],
            serde_json::json!([{"type": "text", "text": "hello"}])
        );
        assert_eq!(ok["isError"], false);
        assert_eq!(ok["_meta"][META_CALL_ID], "c1");

        let failed = serde_json::to_value(
            answer_of(Ok(Outcome {
                id: "c2".into(),
                content: "no such file".into(),
                is_error: true,
            }))
            .unwrap(),
        )
        .unwrap();
        assert_eq!(failed["isError"], true);
        assert_eq!(failed["content"][0]["text"], "no such file");
    }

    #[test]
    fn a_model_reads_why_its_call_did_not_run() {
        let needs = Error::ApprovalRequired {
            tool: "bash".into(),
            namespace: "t".into(),
            name: "s1".into(),
        };
        let r = serde_json::to_value(answer_of(Err(needs)).unwrap()).unwrap();
        assert_eq!(r["isError"], true);
        let text = r["content"][0]["text"].as_str().unwrap();
        assert!(text.contains("needs an approval"), "{text}");
        assert!(text.contains(META_APPROVAL), "{text}");
        assert_eq!(r["_meta"][META_REASON], "approval_required");

        let refused = Error::Runner(tonic::Status::failed_precondition("bash is always_ask"));
        let r = serde_json::to_value(answer_of(Err(refused)).unwrap()).unwrap();
        assert_eq!(r["isError"], true);
        assert_eq!(r["content"][0]["text"], "runner: bash is always_ask");
        assert_eq!(r["_meta"][META_REASON], "refused");
    }

    #[test]
    fn other_errors_are_json_rpc_errors() {
        let forbidden = Error::Forbidden {
            user: "system:serviceaccount:t:nobody".into(),
            verb: "create",
            subresource: "call",
            namespace: "t".into(),
            name: "s1".into(),
        };
        let cases = [
            (Error::Invalid("input: x".into()), -32602, "invalid"),
            (
                Error::Unauthenticated("no credentials".into()),
                -32011,
                "unauthenticated",
            ),
            (forbidden, -32013, "forbidden"),
            (
                Error::NotFound("session t/s1 does not exist".into()),
                -32014,
                "not_found",
            ),
            (
                Error::TooManyRequests("slow down".into()),
                -32029,
                "too_many_requests",
            ),
            (
                Error::Unavailable("no sandbox".into()),
                -32050,
                "unavailable",
            ),
            (Error::Internal("oops".into()), -32603, "internal"),
        ];
        for (e, code, reason) in cases {
            let message = e.to_string();
            let err = answer_of(Err(e)).unwrap_err();
            assert_eq!(err.code, ErrorCode(code), "{message}");
            assert_eq!(err.message, message);
            assert_eq!(err.data, Some(serde_json::json!({"reason": reason})));
        }
        let err = protocol_error(&Error::Forbidden {
            user: "u".into(),
            verb: "create",
            subresource: "call",
            namespace: "t".into(),
            name: "s1".into(),
        });
        assert!(
            err.message.contains("agentsessions/call"),
            "{}",
            err.message
        );
    }

    #[test]
    fn unauthenticated_is_401_with_a_challenge() {
        let r = failure(&Error::Unauthenticated("no credentials".into()));
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(r.headers()[header::WWW_AUTHENTICATE], "Bearer");
        let r = failure(&Error::Invalid("bad name".into()));
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        assert!(!r.headers().contains_key(header::WWW_AUTHENTICATE));
    }
}
