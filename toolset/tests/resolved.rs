//! `ResolvedToolset`: what the runner and the status are given.

use serde_json::json;
use toolset::{BUILTIN_TOOLS, PermissionPolicy, ResolvedToolset, entry_type};

fn entries(v: serde_json::Value) -> Vec<Vec<u8>> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|e| serde_json::to_vec(e).expect("serialises"))
        .collect()
}

#[test]
fn default_enabled_is_what_a_bare_entry_resolves_to() {
    let bare = entries(json!([{"type": "agent_toolset_20260401"}]));
    assert_eq!(
        ResolvedToolset::from_entries(&bare).expect("ok"),
        ResolvedToolset::default_enabled()
    );
    let d = ResolvedToolset::default_enabled();
    assert_eq!(
        d.tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
        BUILTIN_TOOLS
    );
    assert_eq!(d.policy("bash"), Some(PermissionPolicy::AlwaysAllow));
    assert_eq!(d.policy("web_fetch"), None);
}

#[test]
fn only_the_agent_toolset_entry_enables_sandbox_tools() {
    let list = entries(json!([
        {"type": "custom", "name": "lookup", "input_schema": {"type": "object"}},
        {"type": "mcp_toolset", "mcp_server_name": "docs"},
        {"type": "agent_toolset_20260401", "default_config": {"enabled": false},
         "configs": [{"name": "read", "enabled": true, "permission_policy": {"type": "always_ask"}}]}
    ]));
    let r = ResolvedToolset::from_entries(&list).expect("ok");
    assert_eq!(r.tools.len(), 1);
    assert_eq!(r.policy("read"), Some(PermissionPolicy::AlwaysAsk));
    assert_eq!(r.policy("bash"), None);
    let none = ResolvedToolset::from_entries(&entries(json!([{"type": "custom", "name": "x"}])))
        .expect("ok");
    assert!(none.tools.is_empty() && none.policies.is_empty());
}

#[test]
fn errors_name_the_entry_index() {
    let list = entries(json!([
        {"type": "custom", "name": "x"},
        {"type": "agent_toolset_20260401", "configs": [{"name": "bash", "permission_policy": {"type": "?"}}]}
    ]));
    let err = ResolvedToolset::from_entries(&list).expect_err("refused");
    assert_eq!(
        err.path(),
        Some("tools[1].configs[0].permission_policy.type")
    );
    let two =
        entries(json!([{"type": "agent_toolset_20260401"}, {"type": "agent_toolset_20260401"}]));
    let err = ResolvedToolset::from_entries(&two).expect_err("refused");
    assert_eq!(
        err.to_string(),
        "tools[1]: a second agent_toolset_20260401 entry (the first is at tools[0]); a session holds at most one"
    );
}

#[test]
fn round_trips_through_json_as_the_runner_reads_it() {
    let r = ResolvedToolset::default_enabled();
    let text = serde_json::to_string(&r).expect("serialises");
    assert!(text.contains(r#""bash":"always_allow""#));
    assert_eq!(
        serde_json::from_str::<ResolvedToolset>(&text).expect("parses"),
        r
    );
}

#[test]
fn entry_type_reads_only_a_string_type() {
    assert_eq!(
        entry_type(br#"{"type":"mcp_toolset"}"#).as_deref(),
        Some("mcp_toolset")
    );
    assert_eq!(entry_type(br#"{"type":1}"#), None);
    assert_eq!(entry_type(b"[]"), None);
    assert_eq!(entry_type(b"nope"), None);
}
