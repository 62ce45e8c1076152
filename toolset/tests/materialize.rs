//! `materialize` and `materialize_tools`: what the status echoes.

use serde_json::{Value, json};
use toolset::{materialize, materialize_tools};

fn render(entry: &str) -> Value {
    let out = materialize(entry.as_bytes());
    serde_json::from_slice(&out).expect("materialised output is JSON")
}

#[test]
fn a_bare_agent_entry_gains_configs_and_a_concrete_default_config() {
    assert_eq!(
        render(r#"{"type":"agent_toolset_20260401"}"#),
        json!({"type": "agent_toolset_20260401", "configs": [],
               "default_config": {"enabled": true, "permission_policy": {"type": "always_allow"}}})
    );
}

#[test]
fn a_bare_mcp_entry_defaults_to_asking() {
    assert_eq!(
        render(r#"{"type":"mcp_toolset","mcp_server_name":"docs"}"#),
        json!({"type": "mcp_toolset", "mcp_server_name": "docs", "configs": [],
               "default_config": {"enabled": true, "permission_policy": {"type": "always_ask"}}})
    );
}

#[test]
fn configs_echo_the_supplied_entries_each_resolved_against_default_config() {
    let got = render(
        r#"{"type":"agent_toolset_20260401",
            "default_config":{"enabled":false,"permission_policy":{"type":"always_ask"}},
            "configs":[{"name":"bash","enabled":true},{"permission_policy":{"type":"always_allow"},"name":"read"}]}"#,
    );
    assert_eq!(
        got,
        json!({"type": "agent_toolset_20260401",
        "default_config": {"enabled": false, "permission_policy": {"type": "always_ask"}},
        "configs": [
            {"name": "bash", "enabled": true, "permission_policy": {"type": "always_ask"}},
            {"name": "read", "enabled": false, "permission_policy": {"type": "always_allow"}}
        ]})
    );
}

#[test]
fn rebuilt_objects_carry_the_fields_in_schema_order() {
    let out = materialize(
        br#"{"type":"agent_toolset_20260401","configs":[{"enabled":false,"name":"bash"}]}"#,
    );
    let text = String::from_utf8(out.into_owned()).expect("utf-8");
    assert!(
        text.contains(
            r#"{"name":"bash","enabled":false,"permission_policy":{"type":"always_allow"}}"#
        ),
        "{text}"
    );
}

#[test]
fn supplied_values_are_echoed_as_stored_even_when_malformed() {
    let got = render(
        r#"{"type":"agent_toolset_20260401",
            "default_config":{"enabled":"yes","permission_policy":{"type":"always_deny"}},
            "configs":[{"name":"bash","enabled":null}]}"#,
    );
    assert_eq!(got["default_config"]["enabled"], json!("yes"));
    assert_eq!(
        got["default_config"]["permission_policy"],
        json!({"type": "always_deny"})
    );
    assert_eq!(got["configs"][0]["enabled"], Value::Null);
    assert_eq!(
        got["configs"][0]["permission_policy"],
        json!({"type": "always_deny"})
    );
}

#[test]
fn stored_value_bytes_survive_exactly() {
    // Number spelling and string escapes of supplied values are not normalised.
    let out = materialize(
        br#"{"type":"agent_toolset_20260401","x_rev":1.50,"configs":[{"name":"b\u0061sh","enabled":true}]}"#,
    );
    let text = String::from_utf8(out.into_owned()).expect("utf-8");
    assert!(text.contains(r#""x_rev":1.50"#), "{text}");
    assert!(text.contains(r#""name":"b\u0061sh""#), "{text}");
}

#[test]
fn unknown_keys_nested_in_rebuilt_objects_are_dropped_but_top_level_ones_kept() {
    let got = render(
        r#"{"type":"agent_toolset_20260401","note":"keep me",
            "default_config":{"permission_polciy":{"type":"always_ask"}},
            "configs":[{"name":"bash","extra":1}]}"#,
    );
    assert_eq!(got["note"], json!("keep me"));
    // The misspelt policy vanishes and the echo shows what really applies.
    assert_eq!(
        got["default_config"],
        json!({"enabled": true, "permission_policy": {"type": "always_allow"}})
    );
    assert_eq!(
        got["configs"][0],
        json!({"name": "bash", "enabled": true, "permission_policy": {"type": "always_allow"}})
    );
}

#[test]
fn a_config_that_resolves_to_no_tool_keeps_every_key() {
    let got = render(
        r#"{"type":"agent_toolset_20260401","configs":[{"name":"bsh","extra":1},{"enabled":true},"bash",{"name":7}]}"#,
    );
    assert_eq!(
        got["configs"],
        json!([{"name": "bsh", "extra": 1}, {"enabled": true}, "bash", {"name": 7}])
    );
    // For MCP any non-empty name resolves (the server's list is unknowable).
    let got = render(
        r#"{"type":"mcp_toolset","mcp_server_name":"s","configs":[{"name":"whatever","x":1},{"name":""}]}"#,
    );
    assert_eq!(
        got["configs"],
        json!([{"name": "whatever", "enabled": true, "permission_policy": {"type": "always_ask"}}, {"name": ""}])
    );
}

#[test]
fn non_object_default_config_and_configs_are_echoed() {
    let got = render(r#"{"type":"agent_toolset_20260401","default_config":null,"configs":"all"}"#);
    assert_eq!(got["default_config"], Value::Null);
    assert_eq!(got["configs"], json!("all"));
}

#[test]
fn other_entries_pass_through_byte_for_byte() {
    let cases: [&[u8]; 8] = [
        br#"{"type": "custom", "name": "lookup",  "input_schema": {"type":"object"}}"#,
        br#"{"type":"agent_toolset_20250101"}"#,
        br#"{"name":"no type"}"#,
        br#"{"type":7}"#,
        b"[1, 2]",
        b"  \"text\" ",
        b"{not json",
        b"\xff\xfe",
    ];
    for raw in cases {
        let out = materialize(raw);
        assert_eq!(&*out, raw, "{}", String::from_utf8_lossy(raw));
    }
}

#[test]
fn materialize_tools_copies_and_keeps_none_as_none() {
    let list: Vec<Vec<u8>> = vec![
        br#"{"type":"agent_toolset_20260401"}"#.to_vec(),
        br#"{"type":"custom","name":"x"}"#.to_vec(),
    ];
    let before = list.clone();
    let out = materialize_tools(Some(&list)).expect("some");
    assert_eq!(list, before, "the argument is never written through");
    assert_eq!(out.len(), 2);
    assert_eq!(out[1], list[1]);
    let first: Value = serde_json::from_slice(&out[0]).expect("json");
    assert_eq!(first["configs"], json!([]));
    assert_eq!(materialize_tools::<Vec<u8>>(None), None);
    assert_eq!(materialize_tools::<Vec<u8>>(Some(&[])), Some(vec![]));
}

#[test]
fn materialising_twice_changes_nothing_more() {
    for entry in [
        r#"{"type":"agent_toolset_20260401","configs":[{"name":"bash","enabled":false}]}"#,
        r#"{"type":"mcp_toolset","mcp_server_name":"s","default_config":{"enabled":false}}"#,
    ] {
        let once = materialize(entry.as_bytes()).into_owned();
        let twice = materialize(&once).into_owned();
        assert_eq!(once, twice);
    }
}

#[test]
fn the_echo_resolves_to_what_tools_resolves() {
    // An entry and its echo enable the same tools under the same policies.
    let entry = br#"{"type":"agent_toolset_20260401","default_config":{"enabled":false},"configs":[{"name":"grep","enabled":true,"permission_policy":{"type":"always_ask"}},{"name":"read","enabled":true}]}"#;
    let echo = materialize(entry);
    assert_eq!(
        toolset::policies(entry).expect("ok"),
        toolset::policies(&echo).expect("ok")
    );
    toolset::validate(&echo).expect("the echo of a valid entry is valid");
}
