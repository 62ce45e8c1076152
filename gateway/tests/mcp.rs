//! The MCP front end to end but for the cluster: the router that `cli::app`
//! serves, over a fake Kubernetes API server (TokenReview,
//! SubjectAccessReview, and a list of one session whose sandbox has no
//! pod). What needs a runner (a call that runs) is the e2e test's
//! (`tests/e2e/mcp/mcp_gateway_client.py`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Json, RawQuery};
use axum::http::{Method, Request, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use gateway::approval::Approvals;
use gateway::auth::Auth;
use gateway::directory::Directory;
use gateway::gate::Gate;
use gateway::limits::Limits;
use gateway::runners::Runners;
use serde_json::{Value, json};
use tower::ServiceExt;

const GOOD: &str = "Bearer good-token";
const DENIED: &str = "Bearer denied-token";
const PATH: &str = "/mcp/v1/namespaces/t/sessions/s1";

fn tool(name: &str, policy: &str) -> Value {
    json!({
        "name": name,
        "source": "agent_toolset_20260401",
        "policy": policy,
        "description": format!("The {name} tool."),
        "inputSchema": {"type": "object", "properties": {"x": {"type": "string"}}},
    })
}

/// A list, or for a watch a body that never ends.
fn list_or_watch(query: Option<String>, list: Value) -> Response {
    if query.is_some_and(|q| q.contains("watch=true")) {
        let forever = futures::stream::pending::<Result<Bytes, Infallible>>();
        return (
            [(header::CONTENT_TYPE, "application/json")],
            Body::from_stream(forever),
        )
            .into_response();
    }
    Json(list).into_response()
}

async fn fake_api() -> SocketAddr {
    let sessions = json!({
        "apiVersion": "agentplane.dev/v1alpha1",
        "kind": "AgentSessionList",
        "metadata": {"resourceVersion": "1"},
        "items": [{
            "apiVersion": "agentplane.dev/v1alpha1",
            "kind": "AgentSession",
            "metadata": {"name": "s1", "namespace": "t", "uid": "u1", "resourceVersion": "1"},
            "spec": {"image": "busybox"},
            "status": {
                "tools": [
                    tool("bash", "always_ask"),
                    tool("read", "always_allow"),
                    tool("write", "always_allow"),
                    tool("edit", "always_allow"),
                    tool("glob", "always_allow"),
                    tool("grep", "always_allow"),
                ],
            },
        }],
    });
    let pods = json!({
        "apiVersion": "v1",
        "kind": "PodList",
        "metadata": {"resourceVersion": "1"},
        "items": [],
    });
    let app = axum::Router::new()
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(|Json(mut review): Json<Value>| async move {
                let user = match review["spec"]["token"].as_str() {
                    Some("good-token") => Some("alice"),
                    Some("denied-token") => Some("system:serviceaccount:t:nobody"),
                    _ => None,
                };
                review["status"] = match user {
                    Some(u) => json!({"authenticated": true, "user": {"username": u, "uid": u, "groups": ["system:authenticated"]}}),
                    None => json!({"authenticated": false}),
                };
                Json(review)
            }),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(|Json(mut review): Json<Value>| async move {
                let allowed = review["spec"]["user"] == "alice";
                review["status"] = json!({"allowed": allowed});
                Json(review)
            }),
        )
        .route(
            "/apis/agentplane.dev/v1alpha1/agentsessions",
            get(move |RawQuery(q): RawQuery| {
                let sessions = sessions.clone();
                async move { list_or_watch(q, sessions) }
            }),
        )
        .route(
            "/api/v1/pods",
            get(move |RawQuery(q): RawQuery| {
                let pods = pods.clone();
                async move { list_or_watch(q, pods) }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn app() -> (axum::Router, Arc<Gate>) {
    let api = fake_api().await;
    let config = kube::Config::new(format!("http://{api}").parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let (directory, watches) = Directory::start(client.clone());
    tokio::spawn(watches);
    tokio::time::timeout(Duration::from_secs(20), directory.ready())
        .await
        .expect("the caches fill from the fake API server");
    let gate = Arc::new(Gate {
        auth: Auth::new(client, Vec::new(), 100),
        directory,
        runners: Runners::new(b"", b"", b"", 4),
        approvals: Approvals::new(b"a test key"),
        limits: Limits::new(4, 16, 16),
    });
    (gateway::mcp::router(Arc::clone(&gate)), gate)
}

struct Answer {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Value,
    text: String,
}

async fn send(
    app: &axum::Router,
    method: Method,
    path: &str,
    auth: Option<&str>,
    body: Body,
) -> Answer {
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        // The gateway is reached by Service names and pod IPs alike.
        .header(header::HOST, "10.96.12.34:8443")
        .header(header::ACCEPT, "application/json, text/event-stream")
        .header(header::CONTENT_TYPE, "application/json")
        .header("mcp-protocol-version", "2025-06-18");
    if let Some(a) = auth {
        req = req.header(header::AUTHORIZATION, a);
    }
    let res = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = axum::body::to_bytes(res.into_body(), 1 << 20)
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer {
        status,
        headers,
        body,
        text,
    }
}

async fn rpc(app: &axum::Router, auth: Option<&str>, method: &str, params: Value) -> Answer {
    let msg = json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params});
    send(app, Method::POST, PATH, auth, Body::from(msg.to_string())).await
}

fn initialize() -> Value {
    json!({
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "test", "version": "0"},
    })
}

#[tokio::test]
async fn initialize_names_the_gateway_and_keeps_no_session() {
    let (app, _) = app().await;
    let a = rpc(&app, Some(GOOD), "initialize", initialize()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    assert!(
        a.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    assert!(!a.headers.contains_key("mcp-session-id"), "stateless");
    let r = &a.body["result"];
    assert_eq!(r["serverInfo"]["name"], "agentplane-gateway");
    assert_eq!(r["protocolVersion"], "2025-06-18");
    assert!(r["capabilities"]["tools"].is_object(), "{r}");

    let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let a = send(
        &app,
        Method::POST,
        PATH,
        Some(GOOD),
        Body::from(note.to_string()),
    )
    .await;
    assert_eq!(a.status, StatusCode::ACCEPTED, "{}", a.text);

    let a = rpc(&app, Some(GOOD), "ping", json!({})).await;
    assert_eq!(a.body["result"], json!({}), "{}", a.text);
}

#[tokio::test]
async fn no_or_a_refused_token_is_401() {
    let (app, _) = app().await;
    for auth in [
        None,
        Some("Bearer nobody-knows-me"),
        Some("Basic Zm9vOmJhcg=="),
    ] {
        let a = rpc(&app, auth, "initialize", initialize()).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{auth:?}: {}", a.text);
        assert_eq!(a.headers[header::WWW_AUTHENTICATE], "Bearer");
        assert_eq!(a.body["error"]["code"], "unauthenticated", "{}", a.text);
        let a = rpc(&app, auth, "tools/list", json!({})).await;
        assert_eq!(a.status, StatusCode::UNAUTHORIZED, "{auth:?}: {}", a.text);
    }
}

#[tokio::test]
async fn tools_carry_their_schema_and_policy() {
    let (app, _) = app().await;
    let a = rpc(&app, Some(GOOD), "tools/list", json!({})).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    let tools = a.body["result"]["tools"].as_array().expect("tools").clone();
    let names: Vec<_> = tools.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["bash", "read", "write", "edit", "glob", "grep"]);
    for t in &tools {
        assert_eq!(t["inputSchema"]["type"], "object", "{t}");
        let policy = &t["_meta"]["agentplane.dev/permission_policy"];
        let asks = t["name"] == "bash";
        assert_eq!(
            policy,
            if asks { "always_ask" } else { "always_allow" },
            "{t}"
        );
        let desc = t["description"].as_str().unwrap();
        assert_eq!(desc.ends_with("(needs approval)"), asks, "{t}");
    }
}

#[tokio::test]
async fn calls_map_to_results_and_errors() {
    let (app, gate) = app().await;

    // always_ask without an approval: a result the model reads.
    let a = rpc(
        &app,
        Some(GOOD),
        "tools/call",
        json!({"name": "bash", "arguments": {"x": "ls"}}),
    )
    .await;
    let r = &a.body["result"];
    assert_eq!(r["isError"], true, "{}", a.text);
    assert!(
        r["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("approval"),
        "{r}"
    );
    assert_eq!(r["_meta"]["agentplane.dev/reason"], "approval_required");

    // A forged approval is invalid params.
    let a = rpc(
        &app,
        Some(GOOD),
        "tools/call",
        json!({"name": "bash", "arguments": {"x": "ls"}, "_meta": {"agentplane.dev/approval": "v1.1.AAAA"}}),
    )
    .await;
    assert_eq!(a.body["error"]["code"], -32602, "{}", a.text);
    assert!(
        a.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("approval"),
        "{}",
        a.text
    );

    // A real approval (in _meta, with the call id it names) gets past the
    // policy: the call then finds no sandbox running.
    let input = json!({"x": "ls"});
    let (token, _) = gate
        .approve(
            Some(GOOD),
            &gateway::address::SessionAddr::new("t", "s1").unwrap(),
            "bash",
            &input,
            Some("call-1"),
        )
        .await
        .unwrap();
    let a = rpc(
        &app,
        Some(GOOD),
        "tools/call",
        json!({"name": "bash", "arguments": input, "_meta": {"agentplane.dev/approval": token, "agentplane.dev/call_id": "call-1"}}),
    )
    .await;
    assert_eq!(a.body["error"]["code"], -32050, "{}", a.text);
    assert!(
        a.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no running sandbox"),
        "{}",
        a.text
    );
    assert_eq!(a.body["error"]["data"]["reason"], "unavailable");

    // always_allow, no arguments: straight to the (absent) runner.
    let a = rpc(&app, Some(GOOD), "tools/call", json!({"name": "read"})).await;
    assert_eq!(a.body["error"]["code"], -32050, "{}", a.text);

    // Input that is not an object is refused before the gateway sees it.
    let a = rpc(
        &app,
        Some(GOOD),
        "tools/call",
        json!({"name": "read", "arguments": "x"}),
    )
    .await;
    assert!(a.body["error"].is_object(), "{}", a.text);
}

#[tokio::test]
async fn a_caller_without_the_permission_learns_which_it_lacks() {
    let (app, _) = app().await;
    let a = rpc(&app, Some(DENIED), "initialize", initialize()).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.text);
    for (method, params) in [
        ("tools/list", json!({})),
        (
            "tools/call",
            json!({"name": "read", "arguments": {"file_path": "/etc/hostname"}}),
        ),
    ] {
        let a = rpc(&app, Some(DENIED), method, params).await;
        let e = &a.body["error"];
        assert_eq!(e["code"], -32013, "{}", a.text);
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .contains("agentsessions/call"),
            "{e}"
        );
        assert_eq!(e["data"]["reason"], "forbidden");
    }
}

#[tokio::test]
async fn unknown_sessions_and_bad_names() {
    let (app, _) = app().await;
    let msg = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    let a = send(
        &app,
        Method::POST,
        "/mcp/v1/namespaces/t/sessions/nope",
        Some(GOOD),
        Body::from(msg.to_string()),
    )
    .await;
    assert_eq!(a.body["error"]["code"], -32014, "{}", a.text);

    let a = send(
        &app,
        Method::POST,
        "/mcp/v1/namespaces/Team/sessions/s1",
        Some(GOOD),
        Body::from(msg.to_string()),
    )
    .await;
    assert_eq!(a.status, StatusCode::BAD_REQUEST, "{}", a.text);
    assert_eq!(a.body["error"]["code"], "invalid");
}

#[tokio::test]
async fn no_streams_no_sessions_and_a_bounded_body() {
    let (app, _) = app().await;
    for method in [Method::GET, Method::DELETE] {
        let a = send(&app, method.clone(), PATH, Some(GOOD), Body::empty()).await;
        assert_eq!(
            a.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method}: {}",
            a.text
        );
    }
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"write","arguments":{{"content":"{}"}}}}}}"#,
        "a".repeat(gateway::http::MAX_BODY_BYTES)
    );
    let a = send(&app, Method::POST, PATH, Some(GOOD), Body::from(big)).await;
    assert_eq!(a.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", a.text);
}
