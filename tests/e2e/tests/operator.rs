//! The operator and its webhook against the real API server, driven with
//! kubectl as a user drives them. One test, scenarios in order, because
//! they share one operator process and one webhook registration, and some
//! (a session stored before the webhook existed, an operator killed midway)
//! are about the order of events.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use e2e::{
    Certs, Kubectl, Namespace, Operator, condition, fail_with_log, free_port, install_crd,
    register_webhook, root, runner_image, sandbox_image, unregister_webhook, wait_for,
};
use serde_json::Value;

const WEBHOOK: &str = "agentplane-e2e";
const T: Duration = Duration::from_secs(90);

fn session(name: &str, tools: &str) -> String {
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {image}\n  tools:\n{tools}",
        image = sandbox_image()
    )
}

const AGENT: &str = "    - type: agent_toolset_20260401\n      configs:\n        - name: write\n          permission_policy: {type: always_ask}\n";

fn apply_in(k: &Kubectl, ns: &str, yaml: &str) -> e2e::Run {
    k.run(&["apply", "-n", ns, "-f", "-"], Some(yaml))
}

fn pods_of(k: &Kubectl, ns: &str, session: &str) -> Vec<Value> {
    e2e::session_objects(k, "pods", ns, session)
}

struct McpServer(Child);

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_mcp(port: u16) -> McpServer {
    let python = std::env::var("AGENTPLANE_PYTHON").unwrap_or_else(|_| {
        format!(
            "{}/.cache/agentplane/venv/bin/python",
            std::env::var("HOME").unwrap_or_else(|_| "/root".into())
        )
    });
    let child = Command::new(&python)
        .arg(root().join("tests/e2e/mcp_server.py"))
        .arg(port.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start the MCP server with {python}: {e}"));
    wait_for("the MCP server to listen", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(drop)
    });
    McpServer(child)
}

#[test]
fn operator_and_webhook_on_a_real_api_server() {
    let k = Kubectl::from_env();
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("operator.log");
    let result = std::panic::catch_unwind(|| scenarios(&k, &log));
    unregister_webhook(&k, WEBHOOK);
    if let Err(e) = result {
        fail_with_log(log.as_path(), e);
    }
}

fn scenarios(k: &Kubectl, log: &std::path::Path) {
    // The CRD, as the chart ships it.
    install_crd(k);
    unregister_webhook(k, WEBHOOK);

    // A session stored before the webhook existed.
    let legacy = Namespace::create(k, "e2e-legacy", &[]);
    let bad = session(
        "stored-early",
        "    - type: agent_toolset_20260401\n      configs:\n        - name: bash\n          permission_polciy: {type: always_ask}\n",
    );
    let r = apply_in(k, &legacy.name, &bad);
    assert!(
        r.ok,
        "without the webhook the API server stores it: {}",
        r.stderr
    );

    // The operator, and the webhook registered with a CA made for this run.
    let certs = Certs::generate();
    let port = free_port();
    let runner = runner_image();
    let op = Operator::start(
        &k.kubeconfig,
        &certs,
        port,
        log,
        &["--runner-image", &runner],
    );
    let r = register_webhook(k, WEBHOOK, &certs.ca_pem, port);
    assert!(r.ok, "register webhook: {}", r.stderr);

    // The stored bad session reconciles to ToolsetValid=False and no pod.
    let obj = wait_for("status on the early session", T, || {
        let o = k.get(&["agentsession", "stored-early", "-n", &legacy.name])?;
        condition(&o, "ToolsetValid").map(|_| o)
    });
    let (status, reason, message) = condition(&obj, "ToolsetValid").expect("condition");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "InvalidToolset")
    );
    assert!(
        message.contains("spec.tools[0].configs[0].permission_polciy: unknown key"),
        "{message}"
    );
    assert_eq!(obj["status"]["phase"], "Invalid");
    assert!(
        pods_of(k, &legacy.name, "stored-early").is_empty(),
        "no pod for an invalid toolset"
    );
    assert!(
        obj["status"]["toolsets"][0]["configs"].is_array(),
        "the echo is written anyway"
    );
    stale_status_is_refused(k, &legacy.name);

    // Every class of invalid toolset is now denied at apply, naming its path.
    let ns = Namespace::create(
        k,
        "e2e-restricted",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    );
    wait_for("the webhook to take effect", T, || {
        let r = apply_in(k, &ns.name, &bad);
        (!r.ok && r.stderr.contains("permission_polciy")).then_some(())
    });
    let denials = [
        (
            "    - type: agent_toolset_20260401\n      configs:\n        - name: bash\n          permission_polciy: {type: always_ask}\n",
            "spec.tools[0].configs[0].permission_polciy: unknown key",
        ),
        (
            "    - type: agent_toolset_20260401\n      default_config:\n        permission_policy: {type: always_deny}\n",
            "spec.tools[0].default_config.permission_policy.type: permission policy type \"always_deny\" cannot be evaluated",
        ),
        (
            "    - type: agent_toolset_20260401\n      configs:\n        - name: bsh\n",
            "spec.tools[0].configs[0].name: \"bsh\" is not a tool",
        ),
        (
            "    - type: agent_toolset_20260401\n      default_config: {enabled: \"yes\"}\n",
            "spec.tools[0].default_config.enabled: expected a boolean",
        ),
        (
            "    - type: agent_toolset_20260401\n    - type: agent_toolset_20260401\n",
            "spec.tools[1]: a second agent_toolset_20260401 entry",
        ),
        (
            "    - type: mcp_toolset\n      mcp_server_name: nowhere\n",
            "spec.tools[0].mcp_server_name: server \"nowhere\" is not declared",
        ),
        (
            "    - type: agent_toolset_2026\n",
            "spec.tools[0]: type: unknown tool type",
        ),
    ];
    for (tools, want) in denials {
        let r = apply_in(k, &ns.name, &session("denied", tools));
        assert!(!r.ok, "applied but should be denied: {tools}");
        assert!(
            r.stderr.contains("admission webhook") && r.stderr.contains(want),
            "want {want:?} in: {}",
            r.stderr
        );
    }

    // The held-out rule: a session author gets no Secret through the spec
    // unless the platform listed it (the operator runs with the default,
    // empty session policy here).
    let steals = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: steals\nspec:\n  image: {image}\n  env:\n    - name: X\n      valueFrom: {{secretKeyRef: {{name: db, key: pw}}}}\n  tools:\n{AGENT}",
        image = sandbox_image()
    );
    let r = apply_in(k, &ns.name, &steals);
    assert!(!r.ok, "a secretKeyRef was admitted");
    assert!(
        r.stderr
            .contains("spec.env[0].valueFrom.secretKeyRef.name: Secret \"db\""),
        "{}",
        r.stderr
    );

    // Soft findings come back as warnings and the apply succeeds.
    let r = apply_in(
        k,
        &ns.name,
        &session(
            "warned",
            "    - type: agent_toolset_20260401\n      configs:\n        - name: web_search\n          enabled: true\n",
        ),
    );
    assert!(r.ok, "{}", r.stderr);
    assert!(
        r.stderr.contains("Warning:") && r.stderr.contains("web_search"),
        "{}",
        r.stderr
    );
    k.must(&["delete", "agentsession", "warned", "-n", &ns.name]);

    // A valid session in a Pod Security "restricted" namespace gets its pod
    // and full status.
    let r = apply_in(k, &ns.name, &session("demo", AGENT));
    assert!(r.ok, "{}", r.stderr);
    let obj = wait_for("the demo session's status", T, || {
        let o = k.get(&["agentsession", "demo", "-n", &ns.name])?;
        o["status"]["podName"].as_str().map(|_| o.clone())
    });
    assert_eq!(obj["status"]["podName"], "demo-sandbox");
    assert_eq!(obj["status"]["policies"]["write"], "always_ask");
    assert_eq!(obj["status"]["policies"]["bash"], "always_allow");
    assert_eq!(obj["status"]["toolCount"], 6);
    assert_eq!(obj["status"]["tools"][0]["name"], "bash");
    assert_eq!(
        obj["status"]["toolsets"][0]["default_config"]["permission_policy"]["type"],
        "always_allow"
    );
    assert_eq!(obj["status"]["endpoint"]["port"], 7070);
    assert_eq!(
        condition(&obj, "ToolsetValid").map(|c| c.0),
        Some("True".to_owned())
    );
    let pod = k
        .get(&["pod", "demo-sandbox", "-n", &ns.name])
        .expect("the pod exists: PSS restricted admitted it");
    assert_eq!(
        pod["metadata"]["ownerReferences"][0]["kind"],
        "AgentSession"
    );
    let printed = k.must(&["get", "agentsessions", "-n", &ns.name]);
    assert!(
        printed.contains("PHASE") && printed.contains("TOOLS") && printed.contains("demo-sandbox"),
        "{printed}"
    );
    let cm = k
        .get(&["configmap", "demo-toolset", "-n", &ns.name])
        .expect("toolset configmap");
    let resolved: Value =
        serde_json::from_str(cm["data"]["toolset.json"].as_str().expect("data")).expect("json");
    assert_eq!(resolved["policies"]["write"], "always_ask");
    // Its NetworkPolicy, owned by the session, admits no ingress and only
    // cluster DNS out (no --egress-allow-cidr given). The object is what is
    // checked here; tests/egress.rs checks that the cluster enforces it.
    let np = k
        .get(&["networkpolicy", "demo-egress", "-n", &ns.name])
        .expect("the session's NetworkPolicy");
    assert_eq!(np["metadata"]["ownerReferences"][0]["kind"], "AgentSession");
    assert_eq!(
        np["spec"]["policyTypes"],
        serde_json::json!(["Ingress", "Egress"])
    );
    assert_eq!(
        np["spec"]["egress"].as_array().map(Vec::len),
        Some(1),
        "{np}"
    );
    assert_eq!(
        np["spec"]["podSelector"]["matchLabels"]["agentplane.dev/session"],
        "demo"
    );

    // The pod runs the runner in the session's image and becomes Ready.
    let obj = wait_for(
        "the demo session to be Ready",
        Duration::from_secs(180),
        || {
            let o = k.get(&["agentsession", "demo", "-n", &ns.name])?;
            (o["status"]["phase"] == "Ready").then_some(o)
        },
    );
    assert_eq!(
        condition(&obj, "Ready").map(|c| c.0),
        Some("True".to_owned())
    );

    // Deleting the pod recreates it.
    let uid = pod["metadata"]["uid"].as_str().expect("uid").to_owned();
    k.must(&[
        "delete",
        "pod",
        "demo-sandbox",
        "-n",
        &ns.name,
        "--wait=true",
    ]);
    wait_for("a new demo pod", T, || {
        let p = k.get(&["pod", "demo-sandbox", "-n", &ns.name])?;
        (p["metadata"]["uid"].as_str() != Some(uid.as_str())).then_some(())
    });

    // An operator killed midway converges on restart with no duplicate pod.
    op.kill();
    // With the webhook down, failurePolicy Fail refuses writes: closed, not open.
    let r = apply_in(k, &ns.name, &session("midway", AGENT));
    assert!(
        !r.ok && r.stderr.contains("agentsessions.agentplane.dev"),
        "must fail closed: {}",
        r.stderr
    );
    let op = Operator::start(
        &k.kubeconfig,
        &certs,
        port,
        log,
        &["--runner-image", &runner],
    );
    let r = apply_in(k, &ns.name, &session("midway", AGENT));
    assert!(r.ok, "{}", r.stderr);
    // Kill it again right after it starts working, then bring it back.
    std::thread::sleep(Duration::from_millis(300));
    op.kill();
    let op = Operator::start(
        &k.kubeconfig,
        &certs,
        port,
        log,
        &["--runner-image", &runner],
    );
    wait_for("the midway session's pod", T, || {
        let pods = pods_of(k, &ns.name, "midway");
        (!pods.is_empty()).then_some(())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        pods_of(k, &ns.name, "midway").len(),
        1,
        "exactly one pod after restarts"
    );

    // Deleting the session removes its pod (owner reference, garbage collector).
    k.must(&["delete", "agentsession", "midway", "-n", &ns.name]);
    wait_for("the midway pod to go", Duration::from_secs(120), || {
        pods_of(k, &ns.name, "midway").is_empty().then_some(())
    });

    // MCP: a real server's tools land in status; unknown config names become
    // a Warning event and a condition message; an unreachable server is a
    // condition with its reason.
    let mcp_port = free_port();
    let _mcp = start_mcp(mcp_port);
    let mcp_session = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: mcp\nspec:\n  image: {}\n  mcpServers:\n    - {{type: url, name: docs, url: \"http://127.0.0.1:{mcp_port}/mcp\"}}\n    - {{type: url, name: gone, url: \"http://127.0.0.1:{}/mcp\"}}\n    - {{type: url, name: meta, url: \"http://169.254.169.254/mcp\"}}\n  tools:\n    - type: agent_toolset_20260401\n      default_config: {{enabled: false}}\n    - type: mcp_toolset\n      mcp_server_name: docs\n      configs:\n        - {{name: search, permission_policy: {{type: always_allow}}}}\n        - {{name: serch}}\n    - type: mcp_toolset\n      mcp_server_name: gone\n    - type: mcp_toolset\n      mcp_server_name: meta\n",
        sandbox_image(),
        free_port()
    );
    let r = apply_in(k, &ns.name, &mcp_session);
    assert!(r.ok, "{}", r.stderr);
    let obj = wait_for("MCP tools in status", T, || {
        let o = k.get(&["agentsession", "mcp", "-n", &ns.name])?;
        o["status"]["policies"]
            .get("mcp__docs__search")
            .map(|_| o.clone())
    });
    assert_eq!(
        obj["status"]["policies"]["mcp__docs__search"],
        "always_allow"
    );
    assert_eq!(
        obj["status"]["policies"]["mcp__docs__delete_page"],
        "always_ask"
    );
    let (status, reason, message) = condition(&obj, "McpResolved").expect("McpResolved");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "ServerUnavailable"),
        "{message}"
    );
    assert!(
        message.contains("gone:") && message.contains("cannot connect"),
        "{message}"
    );
    // The cloud metadata address is refused before any connection: the
    // operator reaches non-public addresses only when the platform allows.
    assert!(
        message.contains(
            "meta: http://169.254.169.254/mcp: refused: 169.254.169.254 is not a public address"
        ),
        "{message}"
    );
    assert!(
        message.contains("\"serch\""),
        "unknown config names are in the message: {message}"
    );
    let events = wait_for("a Warning event", T, || {
        let ev = k.must(&[
            "get",
            "events",
            "-n",
            &ns.name,
            "--field-selector",
            "involvedObject.name=mcp",
            "-o",
            "json",
        ]);
        (ev.contains("ServerUnavailable") && ev.contains("serch")).then_some(ev)
    });
    assert!(events.contains("\"Warning\""), "{events}");
    drop(op);
}

/// The operator's status apply carries the resourceVersion its plan was
/// made from, so a reconcile working from a lagging watch cache cannot
/// overwrite a newer status. That rests on the API server refusing a
/// forced server-side apply whose resourceVersion is stale: shown here, as
/// the operator's field manager, with the status left as it was.
fn stale_status_is_refused(k: &Kubectl, ns: &str) {
    let before = k
        .get(&["agentsession", "stored-early", "-n", ns])
        .expect("the session");
    let stale = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: stored-early\n  namespace: {ns}\n  resourceVersion: \"1\"\nstatus:\n  phase: Running\n"
    );
    let r = k.run(
        &[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=agentplane-operator",
            "--subresource=status",
            "-f",
            "-",
        ],
        Some(&stale),
    );
    assert!(
        !r.ok && r.stderr.contains("has been modified"),
        "a stale status apply must be refused: ok={} {}",
        r.ok,
        r.stderr
    );
    let after = k
        .get(&["agentsession", "stored-early", "-n", ns])
        .expect("the session");
    assert_eq!(after["status"]["phase"], before["status"]["phase"]);
}
