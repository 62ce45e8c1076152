//! The spec rules the webhook, the controller and `check` share.

use crds::{AgentSessionSpec, McpServer};
use operator::validation::{MAX_MCP_SERVERS, MAX_TOOLS, check_spec};
use serde_json::{Value, json};

fn spec(tools: Value) -> AgentSessionSpec {
    serde_json::from_value(json!({"image": "busybox", "tools": tools})).expect("spec")
}

fn server(name: &str) -> McpServer {
    McpServer {
        kind: "url".into(),
        name: name.into(),
        url: format!("https://{name}.example/mcp"),
    }
}

fn errors(s: &AgentSessionSpec) -> Vec<String> {
    check_spec(s)
        .errors
        .iter()
        .map(ToString::to_string)
        .collect()
}

#[test]
fn a_plain_agent_toolset_is_valid() {
    let s = spec(json!([{"type": "agent_toolset_20260401"}]));
    let f = check_spec(&s);
    assert!(f.is_valid(), "{:?}", f.errors);
    assert!(f.warnings.is_empty());
}

/// Each class of invalid toolset is refused, and the message names the path.
#[test]
fn every_class_of_invalid_entry_names_its_path() {
    let cases: Vec<(Value, &str)> = vec![
        (
            json!([{"type": "agent_toolset_20260401", "configs": [{"name": "bash", "permission_polciy": {"type": "always_ask"}}]}]),
            "spec.tools[0].configs[0].permission_polciy: unknown key",
        ),
        (
            json!([{"type": "agent_toolset_20260401", "default_config": {"permission_policy": {"type": "always_deny"}}}]),
            "spec.tools[0].default_config.permission_policy.type: permission policy type \"always_deny\" cannot be evaluated",
        ),
        (
            json!([{"type": "agent_toolset_20260401", "configs": [{"name": "bsh"}]}]),
            "spec.tools[0].configs[0].name: \"bsh\" is not a tool",
        ),
        (
            json!([{"type": "agent_toolset_20260401", "default_config": {"enabled": "yes"}}]),
            "spec.tools[0].default_config.enabled: expected a boolean, found a string",
        ),
        (
            json!([{"type": "custom", "name": "x", "input_schema": {}}, {"type": "agent_toolset_20260401"}, {"type": "agent_toolset_20260401"}]),
            "spec.tools[2]: a second agent_toolset_20260401 entry (the first is at spec.tools[1])",
        ),
        (
            json!([{"type": "agent_toolset_2026041"}]),
            "spec.tools[0]: type: unknown tool type \"agent_toolset_2026041\"",
        ),
        (
            json!([{"name": "x"}]),
            "spec.tools[0]: type: required but missing",
        ),
        (json!(["bash"]), "spec.tools[0]: expected an object"),
        (
            json!([{"type": "custom", "name": "bad name", "input_schema": {}}]),
            "spec.tools[0].name: \"bad name\" is not a tool name",
        ),
        (
            json!([{"type": "custom", "name": "bash", "input_schema": {}}]),
            "spec.tools[0].name: \"bash\" is a built-in tool's name",
        ),
        (
            json!([{"type": "custom", "name": "x"}]),
            "spec.tools[0].input_schema: required object is missing",
        ),
        (
            json!([{"type": "custom", "name": "x", "input_schema": {}, "inputSchema": {}}]),
            "spec.tools[0].inputSchema: unknown key",
        ),
        (
            json!([{"type": "custom", "name": "x", "input_schema": {}}, {"type": "custom", "name": "x", "input_schema": {}}]),
            "spec.tools[1].name: tool name \"x\" is already taken",
        ),
        (
            json!([{"type": "mcp_toolset", "mcp_server_name": "docs", "configs": [{"name": "a", "permission_policy": {"type": "maybe"}}]}]),
            "spec.tools[0].configs[0].permission_policy.type: permission policy type \"maybe\" cannot be evaluated",
        ),
        (
            json!([{"type": "mcp_toolset", "mcp_server_name": "docs"}]),
            "spec.tools[0].mcp_server_name: server \"docs\" is not declared in spec.mcpServers",
        ),
    ];
    for (tools, want) in cases {
        let got = errors(&spec(tools.clone()));
        assert!(
            got.iter().any(|e| e.starts_with(want)),
            "{tools}\n got: {got:?}\nwant prefix: {want}"
        );
    }
}

#[test]
fn mcp_servers_must_be_declared_used_unique_and_few() {
    let mut s = spec(json!([{"type": "mcp_toolset", "mcp_server_name": "docs"}]));
    s.mcp_servers = vec![server("docs"), server("unused")];
    assert_eq!(
        errors(&s),
        [
            "spec.mcpServers[1].name: server \"unused\" is declared but no mcp_toolset entry references it"
        ]
    );

    s.mcp_servers = vec![server("docs"), server("docs")];
    assert!(errors(&s).iter().any(|e| {
        e.starts_with("spec.mcpServers[1].name: server name \"docs\" is already declared")
    }));

    let mut tools = Vec::new();
    let mut servers = Vec::new();
    for i in 0..=MAX_MCP_SERVERS {
        tools.push(json!({"type": "mcp_toolset", "mcp_server_name": format!("s{i}")}));
        servers.push(server(&format!("s{i}")));
    }
    let mut s = spec(Value::Array(tools));
    s.mcp_servers = servers;
    assert!(
        errors(&s)
            .iter()
            .any(|e| e.starts_with("spec.mcpServers: 21 servers declared; at most 20"))
    );

    let mut s = spec(
        json!([{"type": "mcp_toolset", "mcp_server_name": "docs"}, {"type": "mcp_toolset", "mcp_server_name": "docs"}]),
    );
    s.mcp_servers = vec![server("docs")];
    assert!(errors(&s).iter().any(|e| e.starts_with("spec.tools[1].mcp_server_name: server \"docs\" already has an mcp_toolset entry at spec.tools[0]")));
}

#[test]
fn at_most_128_tools() {
    let mut tools: Vec<Value> = (0..MAX_TOOLS - 6)
        .map(|i| json!({"type": "custom", "name": format!("t{i}"), "input_schema": {"type": "object"}}))
        .collect();
    tools.push(json!({"type": "agent_toolset_20260401"}));
    assert!(
        check_spec(&spec(Value::Array(tools.clone()))).is_valid(),
        "exactly 128"
    );
    tools.push(json!({"type": "custom", "name": "one_more", "input_schema": {}}));
    assert_eq!(
        errors(&spec(Value::Array(tools))),
        ["spec.tools: 129 tools enabled; at most 128 are allowed"]
    );
}

#[test]
fn soft_findings_are_warnings() {
    let s = spec(
        json!([{"type": "agent_toolset_20260401", "configs": [{"name": "web_search", "enabled": true}]}]),
    );
    let f = check_spec(&s);
    assert!(f.is_valid());
    assert_eq!(f.warnings.len(), 1);
    assert!(f.warnings[0].contains("web_search"));

    let mut s = spec(json!([{"type": "mcp_toolset", "mcp_server_name": "docs"}]));
    s.mcp_servers = vec![McpServer {
        kind: "url".into(),
        name: "docs".into(),
        url: "http://docs.local/mcp".into(),
    }];
    let f = check_spec(&s);
    assert!(f.is_valid(), "{:?}", f.errors);
    assert!(f.warnings.iter().any(|w| w.contains("plain HTTP")));
}

#[test]
fn the_denial_carries_every_error() {
    let s = spec(
        json!([{"type": "agent_toolset_20260401", "configs": [{"name": "bsh"}]}, {"type": "nope"}]),
    );
    let f = check_spec(&s);
    let denial = f.denial();
    assert!(
        denial.contains("spec.tools[0].configs[0].name") && denial.contains("spec.tools[1]"),
        "{denial}"
    );
}

/// Suspension needs a persistent workspace, and idle sessions are either
/// suspended or ended, each named by its path.
#[test]
fn suspension_rules_name_their_fields() {
    let with = |extra: Value| -> AgentSessionSpec {
        let mut v = json!({"image": "busybox", "tools": [{"type": "agent_toolset_20260401"}]});
        if let (Some(o), Some(e)) = (v.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        serde_json::from_value(v).expect("spec")
    };
    let errs = errors(&with(json!({
        "suspended": true,
        "lifetime": {"idleSuspendSeconds": 60, "idleTimeoutSeconds": 60}
    })));
    assert!(
        errs.iter()
            .any(|e| e.starts_with("spec.suspended: suspending removes the pod")),
        "{errs:?}"
    );
    assert!(
        errs.iter()
            .any(|e| e.starts_with("spec.lifetime.idleSuspendSeconds: suspending")),
        "{errs:?}"
    );
    assert!(errs.iter().any(|e| e.contains("not both")), "{errs:?}");
    let claim = json!({"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}});
    let ok = with(
        json!({"suspended": true, "workspace": claim, "lifetime": {"idleSuspendSeconds": 60}}),
    );
    assert!(errors(&ok).is_empty(), "{:?}", errors(&ok));
}

/// A spec of many MCP servers and entries is checked in one pass: every
/// duplicate is still named (linear-time checks, not fewer checks).
#[test]
fn many_servers_and_entries_are_all_checked() {
    let mut tools = vec![json!({"type": "agent_toolset_20260401"})];
    let mut s = spec(json!([]));
    for i in 0..20 {
        tools.push(json!({"type": "mcp_toolset", "mcp_server_name": format!("s{i}")}));
        s.mcp_servers.push(server(&format!("s{i}")));
    }
    tools.push(json!({"type": "mcp_toolset", "mcp_server_name": "s3"}));
    s.mcp_servers.push(server("s7"));
    s.tools = tools;
    let errs = errors(&s);
    assert!(errs.iter().any(|e| e.starts_with("spec.tools[21].mcp_server_name: server \"s3\" already has an mcp_toolset entry at spec.tools[4]")), "{errs:?}");
    assert!(
        errs.iter().any(|e| e.starts_with(
            "spec.mcpServers[20].name: server name \"s7\" is already declared at spec.mcpServers[7]"
        )),
        "{errs:?}"
    );
}
