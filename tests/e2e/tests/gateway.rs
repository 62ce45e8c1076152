//! The gateway on the real node, installed by the chart: service accounts
//! with and without the permissions call every tool over HTTP and gRPC,
//! an always_ask call runs only once a principal allowed to approve has
//! approved it, a pod in the tenant's namespace cannot reach the runner,
//! a session deleted mid-stream ends the stream with a clear error, and
//! the Python client's live tests pass against it.

use std::process::Command;
use std::time::Duration;

use e2e::front::{Front, api_server, token, with_token};
use e2e::release::Release;
use e2e::{Kubectl, Namespace, agent, root, sandbox_image, wait_for};
use gateway::proto::gateway_client::GatewayClient;
use gateway::proto::{CallRequest, ListToolsRequest, Session, call_event};
use serde_json::{Value, json};

const RELEASE: &str = "agentplane";
const RELEASE_NS: &str = "agentplane-gw";
const GATEWAY: &str = "agentplane-gateway";

#[test]
fn the_gateway_authorises_by_kubernetes_over_grpc_and_http() {
    let k = Kubectl::from_env();
    let release = Release::install(&k, RELEASE, RELEASE_NS, &[]);
    let result = std::panic::catch_unwind(|| walk(&k));
    if result.is_err() {
        release.print_logs("agentplane-gateway", 60);
        release.print_logs("agentplane-operator", 60);
    }
    drop(release);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn tenant(k: &Kubectl, ns: &str) {
    let yaml = format!(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {{name: caller, namespace: {ns}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: approver, namespace: {ns}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: nobody, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: caller, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: agentplane-session-caller}}
subjects: [{{kind: ServiceAccount, name: caller, namespace: {ns}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: approver, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: agentplane-session-approver}}
subjects: [{{kind: ServiceAccount, name: approver, namespace: {ns}}}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: human, namespace: {ns}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: human-caller, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: agentplane-session-caller}}
subjects: [{{kind: ServiceAccount, name: human, namespace: {ns}}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: human-approver, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: agentplane-session-approver}}
subjects: [{{kind: ServiceAccount, name: human, namespace: {ns}}}]
---
# The Python client's tests make and delete a session of their own.
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: session-author, namespace: {ns}}}
rules: [{{apiGroups: [agentplane.dev], resources: [agentsessions], verbs: [create, get, list, watch, delete]}}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: session-author, namespace: {ns}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: session-author}}
subjects: [{{kind: ServiceAccount, name: caller, namespace: {ns}}}]
---
apiVersion: agentplane.dev/v1alpha1
kind: AgentSession
metadata: {{name: s1, namespace: {ns}}}
spec:
  image: {image}
  workdir: /workspace
  tools:
    - type: agent_toolset_20260401
      default_config: {{permission_policy: {{type: always_allow}}}}
      configs:
        - {{name: bash, permission_policy: {{type: always_ask}}}}
"#,
        image = sandbox_image()
    );
    let r = k.apply(&yaml);
    assert!(r.ok, "tenant objects: {}", r.stderr);
}

fn ready(k: &Kubectl, ns: &str, name: &str) {
    wait_for(
        &format!("session {ns}/{name} to be Ready"),
        Duration::from_secs(180),
        || {
            let s = k.get(&["agentsession", name, "-n", ns])?;
            (e2e::condition(&s, "Ready").map(|c| c.0) == Some("True".to_owned())).then_some(())
        },
    );
}

async fn post(c: &reqwest::Client, url: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let mut req = c.post(url).json(body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("the gateway answers");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn walk(k: &Kubectl) {
    let ns = Namespace::create(k, "gw-tenant", &[]);
    tenant(k, &ns.name);
    ready(k, &ns.name, "s1");
    let caller = token(k, &ns.name, "caller");
    let approver = token(k, &ns.name, "approver");
    let nobody = token(k, &ns.name, "nobody");
    let front = Front::of(k, RELEASE_NS, GATEWAY);
    plugin_flags(k, &ns.name);
    plugin_through_gateway(k, &ns.name, &caller, &token(k, &ns.name, "human"));
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(http_checks(&front, &ns.name, &caller, &approver, &nobody));
    rt.block_on(grpc_checks(&front, &ns.name, &caller, &approver, &nobody));
    isolation(k, &ns.name, &front);
    python_client(k, &ns.name, &front, &caller, &approver, &nobody);
    mcp_client(&ns.name, &front, &caller, &nobody);
    rt.block_on(deleted_mid_stream(k, &front, &ns.name, &caller, &approver));
}

async fn http_checks(f: &Front, ns: &str, caller: &str, approver: &str, nobody: &str) {
    let c = f.http();
    let base = f.url(&format!("/v1/namespaces/{ns}/sessions/s1"));

    // Unauthenticated: 401, and nothing about the session.
    let resp = c.get(format!("{base}/tools")).send().await.expect("answer");
    assert_eq!(resp.status().as_u16(), 401);
    let body = resp.text().await.expect("body");
    assert!(!body.contains("s1") && !body.contains(ns), "{body}");
    let resp = c
        .get(format!("{base}/tools"))
        .bearer_auth("not-a-token")
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status().as_u16(), 401);

    // The tools, from the session's status, with their policies.
    let resp = c
        .get(format!("{base}/tools"))
        .bearer_auth(caller)
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status().as_u16(), 200);
    let tools: Value = resp.json().await.expect("json");
    let mut names: Vec<(String, String)> = tools["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or_default().to_owned(),
                t["permission_policy"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            ("bash", "always_ask"),
            ("edit", "always_allow"),
            ("glob", "always_allow"),
            ("grep", "always_allow"),
            ("read", "always_allow"),
            ("write", "always_allow"),
        ]
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
    );

    // Every tool through HTTP.
    let calls = format!("{base}/calls");
    let (s, r) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "write", "input": {"file_path": "/workspace/g.txt", "content": "alpha\nbeta\n"}}),
    )
    .await;
    assert_eq!((s, r["is_error"].as_bool()), (200, Some(false)), "{r}");
    let (s, r) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "edit", "input": {"file_path": "/workspace/g.txt", "old_string": "beta", "new_string": "gamma"}}),
    )
    .await;
    assert_eq!((s, r["is_error"].as_bool()), (200, Some(false)), "{r}");
    let (s, r) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "read", "input": {"file_path": "/workspace/g.txt"}, "id": "read-1"}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["id"], "read-1");
    assert!(
        r["content"].as_str().unwrap_or_default().contains("gamma"),
        "{r}"
    );
    let (s, r) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "glob", "input": {"pattern": "*.txt", "path": "/workspace"}}),
    )
    .await;
    assert!(
        s == 200 && r["content"].as_str().unwrap_or_default().contains("g.txt"),
        "{r}"
    );
    let (s, r) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "grep", "input": {"pattern": "gam+a", "path": "/workspace"}}),
    )
    .await;
    assert!(
        s == 200 && r["content"].as_str().unwrap_or_default().contains("g.txt"),
        "{r}"
    );

    // Without the call permission: 403 naming it.
    let (s, r) = post(
        &c,
        &calls,
        Some(nobody),
        &json!({"name": "read", "input": {"file_path": "/workspace/g.txt"}}),
    )
    .await;
    assert_eq!(s, 403, "{r}");
    assert_eq!(r["error"]["code"], "forbidden");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("agentsessions/call"),
        "{r}"
    );

    // always_ask: refused without an approval, whatever the client says.
    let bash = json!({"command": "echo approved-$((6*7))"});
    let (s, r) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "bash", "input": bash}),
    )
    .await;
    assert_eq!(
        (s, r["error"]["code"].as_str()),
        (403, Some("approval_required")),
        "{r}"
    );
    let (s, r) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "bash", "input": bash, "confirmed": true}),
    )
    .await;
    assert_eq!(s, 400, "a client cannot confirm for itself: {r}");
    // The caller cannot approve; the approver can.
    let approvals = format!("{base}/approvals");
    let (s, r) = post(
        &c,
        &approvals,
        Some(caller),
        &json!({"name": "bash", "input": bash}),
    )
    .await;
    assert_eq!(s, 403, "{r}");
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("agentsessions/approve"),
        "{r}"
    );
    let (s, r) = post(
        &c,
        &approvals,
        Some(approver),
        &json!({"name": "bash", "input": bash}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let approval = r["approval"].as_str().expect("token").to_owned();
    // The approver cannot call (approving is not calling).
    let (s, _) = post(
        &c,
        &calls,
        Some(approver),
        &json!({"name": "bash", "input": bash, "approval": approval}),
    )
    .await;
    assert_eq!(s, 403);
    // An approval is for its input only.
    let (s, r) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "bash", "input": {"command": "id"}, "approval": approval}),
    )
    .await;
    assert_eq!(s, 400, "{r}");
    let (s, r) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "bash", "input": bash, "approval": approval}),
    )
    .await;
    assert_eq!(s, 200, "{r}");
    assert!(
        r["content"]
            .as_str()
            .unwrap_or_default()
            .contains("approved-42"),
        "{r}"
    );

    // Streaming as server-sent events.
    let looped = json!({"command": "for i in 1 2 3; do echo line$i; sleep 0.2; done"});
    let (_, r) = post(
        &c,
        &approvals,
        Some(approver),
        &json!({"name": "bash", "input": looped}),
    )
    .await;
    let approval = r["approval"].as_str().expect("token").to_owned();
    let resp = c
        .post(&calls)
        .bearer_auth(caller)
        .header("accept", "text/event-stream")
        .json(&json!({"name": "bash", "input": looped, "approval": approval, "id": "sse-1"}))
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status().as_u16(), 200);
    let text = resp.text().await.expect("events");
    let stdout_events = text.matches("event: stdout").count();
    assert!(stdout_events >= 1, "{text}");
    assert!(text.contains("event: result"), "{text}");
    let result_line = text
        .lines()
        .skip_while(|l| *l != "event: result")
        .nth(1)
        .expect("the result's data");
    let result: Value =
        serde_json::from_str(result_line.trim_start_matches("data: ")).expect("json");
    assert!(
        result["content"]
            .as_str()
            .unwrap_or_default()
            .contains("line3"),
        "{result}"
    );

    // Addresses that could reach elsewhere are refused as such.
    let resp = c
        .get(f.url("/v1/namespaces/..%2Fkube-system/sessions/s1/tools"))
        .bearer_auth(caller)
        .send()
        .await
        .expect("answer");
    assert!(
        matches!(resp.status().as_u16(), 400 | 404),
        "{}",
        resp.status()
    );
    // A body past the bound is refused, not read.
    let big = "x".repeat(gateway::http::MAX_BODY_BYTES + 1);
    let (s, _) = post(
        &c,
        &calls,
        Some(caller),
        &json!({"name": "write", "input": {"file_path": "/workspace/big", "content": big}}),
    )
    .await;
    assert_eq!(s, 413);
}

async fn grpc_checks(f: &Front, ns: &str, caller: &str, approver: &str, nobody: &str) {
    let mut g = GatewayClient::new(f.channel().await);
    let session = Some(Session {
        namespace: ns.to_owned(),
        name: "s1".to_owned(),
    });
    let tools = g
        .list_tools(with_token(
            ListToolsRequest {
                session: session.clone(),
            },
            caller,
        ))
        .await
        .expect("list tools")
        .into_inner();
    assert_eq!(tools.tools.len(), 6);
    let r = g
        .run(with_token(
            CallRequest {
                session: session.clone(),
                name: "read".into(),
                input_json: json!({"file_path": "/workspace/g.txt"}).to_string(),
                ..CallRequest::default()
            },
            caller,
        ))
        .await
        .expect("read")
        .into_inner();
    assert!(r.content.contains("gamma") && !r.is_error, "{r:?}");
    let denied = g
        .run(with_token(
            CallRequest {
                session: session.clone(),
                name: "read".into(),
                input_json: "{}".into(),
                ..CallRequest::default()
            },
            nobody,
        ))
        .await
        .expect_err("denied");
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    let unauth = g
        .run(tonic::Request::new(CallRequest {
            session: session.clone(),
            name: "read".into(),
            ..CallRequest::default()
        }))
        .await
        .expect_err("no token");
    assert_eq!(unauth.code(), tonic::Code::Unauthenticated);
    let ask = g
        .run(with_token(
            CallRequest {
                session: session.clone(),
                name: "bash".into(),
                input_json: json!({"command": "echo grpc"}).to_string(),
                ..CallRequest::default()
            },
            caller,
        ))
        .await
        .expect_err("needs an approval");
    assert_eq!(
        ask.metadata()
            .get("agentplane-reason")
            .and_then(|v| v.to_str().ok()),
        Some("approval_required")
    );
    let approval = g
        .approve(with_token(
            gateway::proto::ApproveRequest {
                session: session.clone(),
                name: "bash".into(),
                input_json: json!({"command": "echo grpc; sleep 0.3; echo err >&2; sleep 0.3"})
                    .to_string(),
                id: String::new(),
            },
            approver,
        ))
        .await
        .expect("approve")
        .into_inner();
    let mut events = g
        .run_stream(with_token(
            CallRequest {
                session: session.clone(),
                name: "bash".into(),
                input_json: json!({"command": "echo grpc; sleep 0.3; echo err >&2; sleep 0.3"})
                    .to_string(),
                approval: approval.token,
                ..CallRequest::default()
            },
            caller,
        ))
        .await
        .expect("stream")
        .into_inner();
    let (mut out, mut err, mut result) = (Vec::new(), Vec::new(), None);
    while let Some(e) = events.message().await.expect("event") {
        match e.event {
            Some(call_event::Event::Stdout(c)) => out.extend(c.data),
            Some(call_event::Event::Stderr(c)) => err.extend(c.data),
            Some(call_event::Event::Result(r)) => result = Some(r),
            None => {}
        }
    }
    assert_eq!(String::from_utf8_lossy(&out).trim(), "grpc");
    assert_eq!(String::from_utf8_lossy(&err).trim(), "err");
    assert!(result.expect("a result").content.contains("grpc"));
}

/// `kubectl agent` takes kubectl's identity flags itself (kubectl refuses
/// `kubectl --as=x agent`): as the caller it reads the session's tools, as
/// nobody it is refused by the API server.
fn plugin_flags(k: &Kubectl, ns: &str) {
    let caller = format!("system:serviceaccount:{ns}:caller");
    let (code, out, err) = agent(k, ns, &["--as", &caller, "tools", "s1"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("bash") && out.contains("always_ask"), "{out}");
    let nobody = format!("system:serviceaccount:{ns}:nobody");
    let (code, _, err) = agent(k, ns, &["--as", &nobody, "tools", "s1"]);
    assert_ne!(code, 0);
    assert!(
        err.contains("forbidden") || err.contains("Forbidden"),
        "{err}"
    );
    let (code, _, err) = agent(k, ns, &["--context", "no-such-context", "tools", "s1"]);
    assert_ne!(code, 0);
    assert!(err.contains("no-such-context"), "{err}");
}

/// `kubectl agent` with a kubeconfig whose user has a bearer token goes
/// through the gateway: the caller's service account has no
/// pods/portforward, so a result proves the route. `--confirm` on an
/// always_ask tool is an approval asked as the user: refused for the
/// caller, granted for a human with both roles.
fn plugin_through_gateway(k: &Kubectl, ns: &str, caller: &str, human: &str) {
    write_g_txt(k, ns);
    let dir = tempfile::tempdir().expect("dir");
    let (server, ca) = api_server(k, dir.path());
    let kubeconfig = |who: &str, token: &str| {
        let path = dir.path().join(format!("{who}.kubeconfig"));
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: \"{server}\", certificate-authority: \"{}\"}}}}]\nusers: [{{name: u, user: {{token: \"{token}\"}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u, namespace: {ns}}}}}]\ncurrent-context: x\n",
                ca.display()
            ),
        )
        .expect("kubeconfig");
        path.to_string_lossy().into_owned()
    };
    let as_caller = kubeconfig("caller", caller);
    let (code, out, err) = agent(
        k,
        ns,
        &[
            "--kubeconfig",
            &as_caller,
            "call",
            "s1",
            "read",
            r#"{"file_path": "/workspace/g.txt"}"#,
        ],
    );
    assert_eq!(code, 0, "read through the gateway: {err}");
    assert!(out.contains("gamma"), "{out}");
    let (code, _, err) = agent(
        k,
        ns,
        &[
            "--kubeconfig",
            &as_caller,
            "bash",
            "s1",
            "--confirm",
            "--",
            "echo no",
        ],
    );
    assert_eq!(code, 2, "the caller may not approve: {err}");
    assert!(err.contains("agentsessions/approve"), "{err}");
    let as_human = kubeconfig("human", human);
    let (code, out, err) = agent(
        k,
        ns,
        &[
            "--kubeconfig",
            &as_human,
            "bash",
            "s1",
            "--confirm",
            "--",
            "echo via-$((40+2))",
        ],
    );
    assert_eq!(code, 0, "approved and run through the gateway: {err}");
    assert_eq!(out.trim(), "via-42");
}

/// Makes sure /workspace/g.txt holds "gamma" (the HTTP checks wrote it).
fn write_g_txt(k: &Kubectl, ns: &str) {
    let (code, _, err) = agent(
        k,
        ns,
        &[
            "call",
            "s1",
            "write",
            r#"{"file_path": "/workspace/g.txt", "content": "alpha\ngamma\n"}"#,
        ],
    );
    assert_eq!(code, 0, "{err}");
}

/// The Python client's live tests, against this gateway and session.
fn python_client(k: &Kubectl, ns: &str, f: &Front, caller: &str, approver: &str, nobody: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let ca = dir.path().join("gateway-ca.crt");
    std::fs::write(&ca, &f.ca).expect("ca");
    let (server, api_ca) = api_server(k, dir.path());
    let python = std::env::var("AGENTPLANE_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root().join("clients/python/tests/live"))
        .current_dir(root())
        .env("AGENTPLANE_GATEWAY_URL", f.url(""))
        .env("AGENTPLANE_GATEWAY_ADDR", f.addr.to_string())
        .env("AGENTPLANE_GATEWAY_CA", &ca)
        .env("AGENTPLANE_CALLER_TOKEN", caller)
        .env("AGENTPLANE_APPROVER_TOKEN", approver)
        .env("AGENTPLANE_DENIED_TOKEN", nobody)
        .env("AGENTPLANE_NAMESPACE", ns)
        .env("AGENTPLANE_SESSION", "s1")
        .env("AGENTPLANE_API_SERVER", server)
        .env("AGENTPLANE_API_CA", api_ca)
        .output()
        .expect("pytest");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(
        out.status.success(),
        "the Python client's live tests failed:\n{text}"
    );
}

/// The session as an MCP server, driven by the official Python MCP SDK.
fn mcp_client(ns: &str, f: &Front, caller: &str, nobody: &str) {
    let dir = tempfile::tempdir().expect("dir");
    let ca = dir.path().join("gateway-ca.crt");
    std::fs::write(&ca, &f.ca).expect("ca");
    let python = std::env::var("AGENTPLANE_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = Command::new(python)
        .arg(root().join("tests/e2e/mcp/mcp_gateway_client.py"))
        .env("AGENTPLANE_GATEWAY_HOST", &f.host)
        .env("AGENTPLANE_GATEWAY_ADDR", f.addr.to_string())
        .env("AGENTPLANE_GATEWAY_CA", &ca)
        .env("AGENTPLANE_CALLER_TOKEN", caller)
        .env("AGENTPLANE_DENIED_TOKEN", nobody)
        .env("AGENTPLANE_NAMESPACE", ns)
        .env("AGENTPLANE_SESSION", "s1")
        .output()
        .expect("python");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{text}");
    assert!(out.status.success(), "the MCP client failed:\n{text}");
}

/// Only the gateway reaches a runner: another pod in the tenant's
/// namespace cannot open its port, though it reaches the gateway.
fn isolation(k: &Kubectl, ns: &str, f: &Front) {
    let pod_ip = wait_for("the sandbox's IP", Duration::from_secs(30), || {
        let s = k.get(&["agentsession", "s1", "-n", ns])?;
        let pod = s["status"]["podName"].as_str()?.to_owned();
        let p = k.get(&["pod", &pod, "-n", ns])?;
        p["status"]["podIP"].as_str().map(str::to_owned)
    });
    let r = k.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: prober, namespace: {ns}}}
spec:
  containers:
    - name: p
      image: {image}
      command: ["/bin/bash", "-c", "sleep 3600"]
      securityContext: {{runAsUser: 65532, runAsNonRoot: true}}
"#,
        image = sandbox_image()
    ));
    assert!(r.ok, "{}", r.stderr);
    k.must(&[
        "wait",
        "--for=condition=Ready",
        "pod/prober",
        "-n",
        ns,
        "--timeout=120s",
    ]);
    let probe = |ip: &str, port: u16| {
        let script = format!(
            "timeout 5 bash -c 'exec 3<>/dev/tcp/{ip}/{port}' 2>/dev/null && echo open || echo closed"
        );
        k.run(
            &["exec", "-n", ns, "prober", "--", "bash", "-c", &script],
            None,
        )
        .stdout
        .trim()
        .to_owned()
    };
    // Open to the gateway (the probe works), closed to the runner.
    wait_for(
        "the prober to reach the gateway",
        Duration::from_secs(60),
        || (probe(&f.addr.ip().to_string(), f.addr.port()) == "open").then_some(()),
    );
    assert_eq!(probe(&pod_ip, runner_api::RUNNER_TLS_PORT), "closed");
    assert_eq!(probe(&pod_ip, runner_api::RUNNER_PORT), "closed");
}

/// A session deleted while a call streams ends the stream with an error
/// event that says so.
async fn deleted_mid_stream(k: &Kubectl, f: &Front, ns: &str, caller: &str, approver: &str) {
    let c = f.http();
    let base = f.url(&format!("/v1/namespaces/{ns}/sessions/s1"));
    let long = json!({"command": "echo started; sleep 120"});
    let (_, r) = post(
        &c,
        &format!("{base}/approvals"),
        Some(approver),
        &json!({"name": "bash", "input": long}),
    )
    .await;
    let approval = r["approval"].as_str().expect("token").to_owned();
    let resp = c
        .post(format!("{base}/calls"))
        .bearer_auth(caller)
        .header("accept", "text/event-stream")
        .json(&json!({"name": "bash", "input": long, "approval": approval}))
        .send()
        .await
        .expect("answer");
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.bytes_stream();
    use futures::StreamExt;
    let mut seen = String::new();
    // The first output event (its data is base64) says the call runs.
    while !seen.contains("event: stdout") {
        let chunk = body.next().await.expect("an event").expect("bytes");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    k.must(&["delete", "agentsession", "s1", "-n", ns, "--wait=false"]);
    let rest = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(chunk) = body.next().await {
            match chunk {
                Ok(b) => seen.push_str(&String::from_utf8_lossy(&b)),
                Err(_) => break,
            }
        }
    })
    .await;
    assert!(
        rest.is_ok(),
        "the stream ends after the session is deleted: {seen}"
    );
    assert!(seen.contains("event: error"), "{seen}");
    assert!(
        seen.contains("deleted") || seen.contains("went away"),
        "the error says what happened: {seen}"
    );
}
