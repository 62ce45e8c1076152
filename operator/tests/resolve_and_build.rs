//! Resolution, the pod builder and status, without a cluster.

use crds::{AgentSession, AgentSessionSpec, McpServer, SessionPhase};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::jiff::Timestamp;
use kube::core::ObjectMeta;
use operator::names::{Names, Scheme, object_name};
use operator::resolution::{Listings, resolve};
use operator::session::pod::{build_pod, spec_hash};
use operator::session::status::build_status;
use serde_json::json;
use toolset::McpTool;

mod common;
use common::cfg;

fn session(spec: serde_json::Value) -> AgentSession {
    let spec: AgentSessionSpec = serde_json::from_value(spec).expect("spec");
    let mut s = AgentSession::new("demo", spec);
    s.metadata = ObjectMeta {
        name: Some("demo".into()),
        namespace: Some("team-a".into()),
        uid: Some("1f0c2f59-0000-4000-8000-000000000001".into()),
        generation: Some(3),
        ..ObjectMeta::default()
    };
    s
}

fn example() -> AgentSession {
    session(json!({
        "image": "localhost/agentplane/sandbox-base:dev",
        "workdir": "/workspace",
        "tools": [{"type": "agent_toolset_20260401",
                   "configs": [{"name": "write", "permission_policy": {"type": "always_ask"}}]}],
        "lifetime": {"activeDeadlineSeconds": 3600, "idleTimeoutSeconds": 600}
    }))
}

#[test]
fn resolution_of_the_example() {
    let s = example();
    let res = resolve(
        &s.spec,
        &operator::validation::entries(&s.spec),
        &Listings::new(),
    );
    assert!(res.runner.is_some());
    let names: Vec<_> = res.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["bash", "read", "write", "edit", "glob", "grep"]);
    assert_eq!(res.policies["write"], "always_ask");
    assert_eq!(res.policies["bash"], "always_allow");
    assert_eq!(
        res.toolsets[0]["default_config"],
        json!({"enabled": true, "permission_policy": {"type": "always_allow"}})
    );
    assert_eq!(res.conditions.len(), 1);
    assert_eq!(res.conditions[0].type_, "ToolsetValid");
    assert!(res.conditions[0].status);
}

#[test]
fn an_invalid_toolset_resolves_to_no_runner_and_says_why() {
    let s = session(
        json!({"image": "x", "tools": [{"type": "agent_toolset_20260401", "configs": [{"name": "bash", "permission_polciy": {}}]}]}),
    );
    let res = resolve(
        &s.spec,
        &operator::validation::entries(&s.spec),
        &Listings::new(),
    );
    assert!(res.runner.is_none());
    assert!(res.tools.is_empty());
    let c = &res.conditions[0];
    assert_eq!(
        (c.type_, c.status, c.reason.as_str()),
        ("ToolsetValid", false, "InvalidToolset")
    );
    assert!(
        c.message
            .starts_with("spec.tools[0].configs[0].permission_polciy: unknown key"),
        "{}",
        c.message
    );
    // The echo is still written, so a human sees what is stored.
    assert_eq!(res.toolsets.len(), 1);
    let st = build_status(
        &res,
        None,
        "demo-sandbox",
        None,
        Some(3),
        Timestamp::UNIX_EPOCH,
    );
    assert_eq!(st.phase, Some(SessionPhase::Invalid));
    assert!(st.pod_name.is_none() && st.endpoint.is_none());
}

#[test]
fn mcp_tools_resolve_from_the_listing_and_unknown_configs_are_noted() {
    let mut s = session(json!({"image": "x", "tools": [
        {"type": "agent_toolset_20260401", "default_config": {"enabled": false}},
        {"type": "mcp_toolset", "mcp_server_name": "docs",
         "configs": [{"name": "search", "permission_policy": {"type": "always_allow"}}, {"name": "serch"}]}
    ]}));
    s.spec.mcp_servers = vec![McpServer {
        kind: "url".into(),
        name: "docs".into(),
        url: "https://docs/mcp".into(),
    }];
    let tool = |n: &str| McpTool {
        name: n.into(),
        description: format!("{n}!"),
        input_schema: json!({"type": "object"}),
    };
    let listings: Listings = [("docs".to_owned(), Ok(vec![tool("search"), tool("delete")]))].into();
    let res = resolve(&s.spec, &operator::validation::entries(&s.spec), &listings);
    let got: Vec<_> = res
        .tools
        .iter()
        .map(|t| (t.name.as_str(), t.policy.as_deref(), t.source.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            ("mcp__docs__search", Some("always_allow"), "mcp:docs"),
            ("mcp__docs__delete", Some("always_ask"), "mcp:docs"),
        ]
    );
    let mcp = res
        .conditions
        .iter()
        .find(|c| c.type_ == "McpResolved")
        .expect("condition");
    assert!(mcp.status);
    assert_eq!(mcp.reason, "UnknownConfigNames");
    assert!(mcp.message.contains("\"serch\""));
    assert!(res.warnings.iter().any(|w| w.contains("\"serch\"")));

    let down: Listings = [(
        "docs".to_owned(),
        Err("https://docs/mcp: cannot connect".to_owned()),
    )]
    .into();
    let res = resolve(&s.spec, &operator::validation::entries(&s.spec), &down);
    assert!(
        res.runner.is_some(),
        "an unreachable server does not stop the sandbox"
    );
    assert!(res.retry_mcp);
    let mcp = res
        .conditions
        .iter()
        .find(|c| c.type_ == "McpResolved")
        .expect("condition");
    assert_eq!(
        (mcp.status, mcp.reason.as_str()),
        (false, "ServerUnavailable")
    );
    assert!(mcp.message.contains("cannot connect"));
}

#[test]
fn the_pod_is_hardened_for_pod_security_restricted() {
    let pod = build_pod(&example(), &cfg());
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.enable_service_links, Some(false));
    assert_eq!(spec.active_deadline_seconds, Some(3600));
    let psc = spec
        .security_context
        .as_ref()
        .expect("pod security context");
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(
        psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
        Some("RuntimeDefault")
    );
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let sc = c
            .security_context
            .as_ref()
            .expect("container security context");
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(
            sc.capabilities.as_ref().and_then(|c| c.drop.clone()),
            Some(vec!["ALL".to_owned()])
        );
        assert_eq!(sc.run_as_non_root, Some(true));
        assert!(sc.privileged.is_none());
        assert!(c.ports.is_none(), "no port is exposed to the network");
    }
    for v in spec.volumes.iter().flatten() {
        assert!(v.host_path.is_none(), "{}", v.name);
    }
}

#[test]
fn the_runner_runs_inside_the_sessions_image() {
    let pod = build_pod(&example(), &cfg());
    let spec = pod.spec.as_ref().expect("spec");
    let install = &spec.init_containers.as_ref().expect("init")[0];
    assert_eq!(
        install.image.as_deref(),
        Some("localhost/agentplane/runner:dev")
    );
    let sandbox = &spec.containers[0];
    assert_eq!(
        sandbox.image.as_deref(),
        Some("localhost/agentplane/sandbox-base:dev")
    );
    assert_eq!(
        sandbox.command.as_ref().expect("command")[0],
        "/opt/agentplane/bin/agent-sidecar"
    );
    let args = sandbox.args.as_ref().expect("args").join(" ");
    assert!(args.contains("--socket /run/agent/runner.sock"), "{args}");
    assert!(args.contains("--listen 127.0.0.1:7070"), "{args}");
    assert!(args.contains("--idle-timeout-seconds 600"), "{args}");
    assert_eq!(pod.metadata.name.as_deref(), Some("demo-sandbox"));
    let owner = &pod.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("AgentSession", Some(true))
    );
}

#[test]
fn pod_snapshot() {
    insta::assert_json_snapshot!("sandbox_pod", build_pod(&example(), &cfg()));
}

#[test]
fn the_spec_hash_follows_the_session() {
    let a = build_pod(&example(), &cfg());
    let mut changed = example();
    changed.spec.image = "other".into();
    let b = build_pod(&changed, &cfg());
    let hash = |p: &Pod| spec_hash(p.spec.as_ref().expect("spec"));
    assert_ne!(hash(&a), hash(&b));
    assert_eq!(
        hash(&a),
        hash(&build_pod(&example(), &cfg())),
        "deterministic"
    );
}

#[test]
fn long_names_stay_within_limits_and_apart() {
    let a = "a".repeat(200);
    let b = format!("{}b", "a".repeat(199));
    let pod_name = |s: &str| Names::with(s, Scheme::Current).pod;
    let (na, nb) = (pod_name(&a), pod_name(&b));
    assert!(na.len() <= 63 && nb.len() <= 63);
    assert_ne!(na, nb);
    assert!(na.ends_with("-sandbox"));
    assert_eq!(object_name("short", "toolset"), "short-toolset");
    let long_a = format!("{}a", "s".repeat(60));
    let long_b = format!("{}b", "s".repeat(60));
    let (a, b) = (
        object_name(&long_a, "workspace"),
        object_name(&long_b, "workspace"),
    );
    assert_ne!(a, b, "names that differ only past the cut differ");
    assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
}

#[test]
fn status_follows_the_pod() {
    let s = example();
    let res = resolve(
        &s.spec,
        &operator::validation::entries(&s.spec),
        &Listings::new(),
    );
    let now = Timestamp::UNIX_EPOCH;
    let st = build_status(&res, None, "demo-sandbox", None, Some(3), now);
    assert_eq!(st.phase, Some(SessionPhase::Pending));
    assert_eq!(st.tool_count, Some(6));
    assert_eq!(st.observed_generation, Some(3));

    let mut pod = build_pod(&s, &cfg());
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    let ready = build_status(
        &res,
        Some(&pod),
        "demo-sandbox",
        Some(&st),
        Some(3),
        Timestamp::from_second(100).expect("t"),
    );
    assert_eq!(ready.phase, Some(SessionPhase::Ready));
    let cond = |st: &crds::AgentSessionStatus, t: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == t)
            .cloned()
            .expect("condition")
    };
    assert_eq!(cond(&ready, "Ready").status, "True");
    assert_eq!(ready.pod_name.as_deref(), Some("demo-sandbox"));
    assert_eq!(ready.endpoint.as_ref().map(|e| e.port), Some(7070));
    // ToolsetValid did not change, so its transition time is kept.
    assert_eq!(
        cond(&ready, "ToolsetValid").last_transition_time,
        cond(&st, "ToolsetValid").last_transition_time
    );
    assert_ne!(
        cond(&ready, "Ready").last_transition_time,
        cond(&st, "Ready").last_transition_time
    );
}

#[test]
fn an_mcp_server_listing_too_many_tools_does_not_stop_the_sandbox() {
    let mut s = session(json!({"image": "x", "tools": [
        {"type": "agent_toolset_20260401"},
        {"type": "mcp_toolset", "mcp_server_name": "big"}
    ]}));
    s.spec.mcp_servers = vec![McpServer {
        kind: "url".into(),
        name: "big".into(),
        url: "https://big/mcp".into(),
    }];
    let many: Vec<McpTool> = (0..129)
        .map(|i| McpTool {
            name: format!("t{i}"),
            description: String::new(),
            input_schema: json!({"type": "object"}),
        })
        .collect();
    let listings: Listings = [("big".to_owned(), Ok(many))].into();
    let res = resolve(&s.spec, &operator::validation::entries(&s.spec), &listings);
    assert!(res.runner.is_some(), "the sandbox keeps running");
    assert_eq!(
        res.tools.len(),
        6,
        "the built-in tools stay; the MCP ones are withheld"
    );
    assert!(res.policies.keys().all(|k| !k.starts_with("mcp__")));
    let cond = |t: &str| res.conditions.iter().find(|c| c.type_ == t).cloned();
    assert!(cond("ToolsetValid").is_some_and(|c| c.status));
    let mcp = cond("McpResolved").expect("McpResolved");
    assert!(!mcp.status && mcp.reason == "TooManyTools", "{mcp:?}");
    assert!(mcp.message.contains("135 tools"), "{}", mcp.message);
    assert!(res.retry_mcp);
}
