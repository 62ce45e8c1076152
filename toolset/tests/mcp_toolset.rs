//! `validate_mcp_toolset` and `resolve_mcp`.

use serde_json::json;
use toolset::{
    DEFAULT_MCP_TOOLSET_POLICY, McpTool, PermissionPolicy, mcp_server_name, resolve_mcp,
    validate_mcp_toolset,
};

use PermissionPolicy::{AlwaysAllow as Allow, AlwaysAsk as Ask};

fn bytes(v: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&v).expect("serialises")
}

fn tool(name: &str) -> McpTool {
    McpTool {
        name: name.to_owned(),
        description: format!("{name} tool"),
        input_schema: json!({"type": "object"}),
    }
}

fn resolved(raw: &[u8], reported: &[McpTool]) -> (Vec<(String, PermissionPolicy)>, Vec<String>) {
    let r = resolve_mcp(raw, reported).expect("resolves");
    (
        r.tools
            .into_iter()
            .map(|t| (t.tool.name, t.policy))
            .collect(),
        r.unknown_configs,
    )
}

fn pairs(v: &[(&str, PermissionPolicy)]) -> Vec<(String, PermissionPolicy)> {
    v.iter().map(|(n, p)| ((*n).to_owned(), *p)).collect()
}

#[test]
fn defaults_to_asking_for_every_reported_tool_in_server_order() {
    assert_eq!(DEFAULT_MCP_TOOLSET_POLICY, Ask);
    let raw = bytes(json!({"type": "mcp_toolset", "mcp_server_name": "docs"}));
    let (tools, unknown) = resolved(&raw, &[tool("search"), tool("fetch"), tool("add")]);
    assert_eq!(
        tools,
        pairs(&[("search", Ask), ("fetch", Ask), ("add", Ask)])
    );
    assert!(unknown.is_empty());
    validate_mcp_toolset(&raw).expect("valid");
    assert_eq!(mcp_server_name(&raw).expect("named"), "docs");
}

#[test]
fn configs_override_default_config_which_overrides_the_kind_default() {
    let raw = bytes(json!({"type": "mcp_toolset", "mcp_server_name": "docs",
    "default_config": {"permission_policy": {"type": "always_allow"}},
    "configs": [
        {"name": "delete", "permission_policy": {"type": "always_ask"}},
        {"name": "fetch", "enabled": false},
    ]}));
    let (tools, unknown) = resolved(&raw, &[tool("search"), tool("fetch"), tool("delete")]);
    assert_eq!(tools, pairs(&[("search", Allow), ("delete", Ask)]));
    assert!(unknown.is_empty());
}

#[test]
fn default_disable_with_an_allow_list() {
    let raw = bytes(json!({"type": "mcp_toolset", "mcp_server_name": "docs",
        "default_config": {"enabled": false},
        "configs": [{"name": "search", "enabled": true}]}));
    let (tools, _) = resolved(&raw, &[tool("search"), tool("fetch")]);
    assert_eq!(tools, pairs(&[("search", Ask)]));
}

#[test]
fn config_names_no_server_reported_are_returned_not_refused() {
    let raw = bytes(json!({"type": "mcp_toolset", "mcp_server_name": "docs",
        "configs": [{"name": "serch"}, {"name": "search"}, {"name": "gone", "enabled": false}]}));
    let (tools, unknown) = resolved(&raw, &[tool("search")]);
    assert_eq!(tools, pairs(&[("search", Ask)]));
    assert_eq!(unknown, ["serch", "gone"]);
}

#[test]
fn nameless_and_repeated_reported_tools_are_dropped() {
    let raw = bytes(json!({"type": "mcp_toolset", "mcp_server_name": "docs"}));
    let mut second = tool("a");
    second.description = "shadow".into();
    let r = resolve_mcp(&raw, &[tool(""), tool("a"), second, tool("b")]).expect("resolves");
    let names: Vec<_> = r.tools.iter().map(|t| t.tool.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        r.tools[0].tool.description, "a tool",
        "the first listing wins"
    );
}

#[test]
fn resolve_tolerates_unknown_keys_a_stored_row_may_carry() {
    let raw = bytes(
        json!({"type": "mcp_toolset", "mcp_server_name": "docs", "legacy": true,
        "default_config": {"permission_polciy": {"type": "always_allow"}},
        "configs": [{"name": "a", "note": "x", "permission_policy": {"type": "always_allow", "why": 1}}]}),
    );
    let (tools, _) = resolved(&raw, &[tool("a"), tool("b")]);
    // The misspelt default is not read: b falls to the kind default (ask).
    assert_eq!(tools, pairs(&[("a", Allow), ("b", Ask)]));
    assert!(validate_mcp_toolset(&raw).is_err());
}

#[test]
fn resolve_refuses_an_unevaluable_policy_only_on_a_live_tool() {
    let raw = bytes(json!({"type": "mcp_toolset", "mcp_server_name": "docs",
        "configs": [{"name": "a", "enabled": false, "permission_policy": {"type": "bogus"}},
                    {"name": "b", "permission_policy": {"type": "bogus"}}]}));
    resolve_mcp(&raw, &[tool("a")]).expect("a is disabled, b not reported");
    let err = resolve_mcp(&raw, &[tool("a"), tool("b")]).expect_err("b is live");
    assert_eq!(err.path(), Some("configs[1].permission_policy.type"));
    // ...while the boundary check is eager: it cannot know what is live.
    let err = validate_mcp_toolset(&raw).expect_err("eager");
    assert_eq!(err.path(), Some("configs[0].permission_policy.type"));
}

#[test]
fn resolve_refuses_shapes_it_cannot_read() {
    for (raw, path) in [
        (json!({"type": "agent_toolset_20260401"}), "type"),
        (
            json!({"type": "mcp_toolset", "default_config": {"enabled": "no"}}),
            "default_config.enabled",
        ),
        (
            json!({"type": "mcp_toolset", "configs": [{"name": 3}]}),
            "configs[0].name",
        ),
        (json!({"type": "mcp_toolset", "configs": "a"}), "configs"),
    ] {
        let err = resolve_mcp(&bytes(raw), &[tool("a")]).expect_err("refused");
        assert_eq!(err.path(), Some(path), "{err}");
    }
}

#[test]
fn resolve_lets_the_first_of_repeated_configs_win() {
    let raw = bytes(json!({"type": "mcp_toolset", "mcp_server_name": "docs",
        "configs": [{"name": "a", "permission_policy": {"type": "always_allow"}},
                    {"name": "a", "enabled": false}]}));
    let (tools, unknown) = resolved(&raw, &[tool("a")]);
    assert_eq!(tools, pairs(&[("a", Allow)]));
    assert!(unknown.is_empty());
}

#[test]
fn validate_mcp_refusal_table() {
    let cases: Vec<(serde_json::Value, &str, &str)> = vec![
        (
            json!({"type": "mcp_toolset"}),
            "mcp_server_name",
            "required but missing",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": ""}),
            "mcp_server_name",
            "must not be empty",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": null}),
            "mcp_server_name",
            "expected a string, found null",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": "s", "server": "x"}),
            "server",
            "unknown key",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": "s", "default_config": {"permission_polciy": {}}}),
            "default_config.permission_polciy",
            "unknown key",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": "s", "default_config": {"permission_policy": {"type": "sometimes"}}}),
            "default_config.permission_policy.type",
            "cannot be evaluated",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": "s", "default_config": {"enabled": false, "permission_policy": {"type": "sometimes"}}}),
            "default_config.permission_policy.type",
            "cannot be evaluated",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": "s", "configs": [{"name": "a", "permission_policy": {"type": "always_ask", "x": 1}}]}),
            "configs[0].permission_policy.x",
            "unknown key",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": "s", "configs": [{"name": "a"}, {"name": "a"}]}),
            "configs[1].name",
            "configured twice",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": "s", "configs": [{"enabled": true}]}),
            "configs[0].name",
            "required but missing",
        ),
        (
            json!({"type": "mcp_toolset", "mcp_server_name": "s", "configs": [{"name": "a", "enabled": null}]}),
            "configs[0].enabled",
            "expected a boolean, found null",
        ),
        (
            json!({"type": "agent_toolset_20260401", "mcp_server_name": "s"}),
            "type",
            "expected \"mcp_toolset\"",
        ),
    ];
    for (entry, path, text) in cases {
        let err = validate_mcp_toolset(&bytes(entry.clone())).expect_err(&entry.to_string());
        assert_eq!(err.path(), Some(path), "{entry}: {err}");
        assert!(err.to_string().contains(text), "{entry}: {err}");
    }
    // Any tool name is accepted: the server reports its own.
    validate_mcp_toolset(&bytes(json!({"type": "mcp_toolset", "mcp_server_name": "s",
        "configs": [{"name": "anything_at_all", "enabled": true, "permission_policy": {"type": "always_allow"}}]})))
        .expect("valid");
}
