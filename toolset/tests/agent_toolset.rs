//! `tools`, `policies` and `validate` for `agent_toolset_20260401`: the enable
//! and policy resolution, and every way an entry can be refused.

use serde_json::json;
use toolset::{
    BUILTIN_TOOLS, DEFAULT_AGENT_TOOLSET_POLICY, PermissionPolicy, ToolsetError, enabled_web_tools,
    policies, tools, validate,
};

use PermissionPolicy::{AlwaysAllow as Allow, AlwaysAsk as Ask};

fn bytes(v: serde_json::Value) -> Vec<u8> {
    serde_json::to_vec(&v).expect("serialises")
}

fn names(raw: &[u8]) -> Vec<String> {
    tools(raw)
        .expect("resolves")
        .into_iter()
        .map(|t| t.name)
        .collect()
}

fn pol(raw: &[u8]) -> Vec<(String, PermissionPolicy)> {
    policies(raw).expect("resolves").into_iter().collect()
}

#[test]
fn a_bare_entry_enables_all_six_in_wire_order_under_the_default_policy() {
    let raw = bytes(json!({"type": "agent_toolset_20260401"}));
    assert_eq!(names(&raw), BUILTIN_TOOLS);
    assert_eq!(DEFAULT_AGENT_TOOLSET_POLICY, Allow);
    for (name, p) in pol(&raw) {
        assert_eq!(p, Allow, "{name}");
    }
    assert_eq!(pol(&raw).len(), 6);
    validate(&raw).expect("valid");
}

#[test]
fn wire_order_holds_whatever_order_configs_come_in() {
    let raw = bytes(json!({
        "type": "agent_toolset_20260401",
        "default_config": {"enabled": false},
        "configs": [
            {"name": "grep", "enabled": true},
            {"name": "bash", "enabled": true},
            {"name": "edit", "enabled": true},
        ]
    }));
    assert_eq!(names(&raw), ["bash", "edit", "grep"]);
}

/// Enable and policy resolve independently; a per-tool config overrides
/// `default_config`, which overrides the toolset default.
#[test]
fn resolution_table() {
    struct Case {
        what: &'static str,
        entry: serde_json::Value,
        want: &'static [(&'static str, PermissionPolicy)],
    }
    let all_allow: &[(&str, PermissionPolicy)] = &[
        ("bash", Allow),
        ("edit", Allow),
        ("glob", Allow),
        ("grep", Allow),
        ("read", Allow),
        ("write", Allow),
    ];
    let cases = [
        Case {
            what: "empty nest",
            entry: json!({"type": "agent_toolset_20260401", "default_config": {}, "configs": []}),
            want: all_allow,
        },
        Case {
            what: "default policy ask",
            entry: json!({"type": "agent_toolset_20260401", "default_config": {"permission_policy": {"type": "always_ask"}}}),
            want: &[
                ("bash", Ask),
                ("edit", Ask),
                ("glob", Ask),
                ("grep", Ask),
                ("read", Ask),
                ("write", Ask),
            ],
        },
        Case {
            what: "per-tool policy overrides default policy",
            entry: json!({"type": "agent_toolset_20260401",
                "default_config": {"permission_policy": {"type": "always_ask"}},
                "configs": [{"name": "read", "permission_policy": {"type": "always_allow"}}]}),
            want: &[
                ("bash", Ask),
                ("edit", Ask),
                ("glob", Ask),
                ("grep", Ask),
                ("read", Allow),
                ("write", Ask),
            ],
        },
        Case {
            what: "per-tool enable overrides default disable, policy still from default",
            entry: json!({"type": "agent_toolset_20260401",
                "default_config": {"enabled": false, "permission_policy": {"type": "always_ask"}},
                "configs": [{"name": "bash", "enabled": true}]}),
            want: &[("bash", Ask)],
        },
        Case {
            what: "per-tool disable",
            entry: json!({"type": "agent_toolset_20260401",
                "configs": [{"name": "bash", "enabled": false}, {"name": "write", "enabled": false}]}),
            want: &[
                ("edit", Allow),
                ("glob", Allow),
                ("grep", Allow),
                ("read", Allow),
            ],
        },
        Case {
            what: "a policy on a config without enabled keeps the default enable",
            entry: json!({"type": "agent_toolset_20260401",
                "configs": [{"name": "bash", "permission_policy": {"type": "always_ask"}}]}),
            want: &[
                ("bash", Ask),
                ("edit", Allow),
                ("glob", Allow),
                ("grep", Allow),
                ("read", Allow),
                ("write", Allow),
            ],
        },
        Case {
            what: "everything disabled",
            entry: json!({"type": "agent_toolset_20260401", "default_config": {"enabled": false}}),
            want: &[],
        },
        Case {
            what: "unknown top-level key of a stored row still renders",
            entry: json!({"type": "agent_toolset_20260401", "x_note": 1}),
            want: all_allow,
        },
    ];
    for c in cases {
        let raw = bytes(c.entry);
        let got = pol(&raw);
        let want: Vec<(String, PermissionPolicy)> =
            c.want.iter().map(|(n, p)| ((*n).to_owned(), *p)).collect();
        assert_eq!(got, want, "{}", c.what);
        // tools mirrors policies' enable resolution exactly.
        let mut tool_names = names(&raw);
        tool_names.sort();
        let policy_names: Vec<String> = got.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(tool_names, policy_names, "{}", c.what);
    }
}

/// Every refusal, with the path it names.
#[test]
fn refusal_table() {
    let cases: Vec<(&str, &[u8], &str)> = vec![
        ("not JSON", b"{", "entry: not valid JSON"),
        ("not an object", b"[]", "entry: expected an object, found an array"),
        ("null entry", b"null", "entry: expected an object, found null"),
        ("no type", br#"{"configs":[]}"#, "type: required but missing"),
        ("type not a string", br#"{"type":7}"#, "type: expected a string, found a number"),
        ("other type", br#"{"type":"mcp_toolset"}"#, "type: expected \"agent_toolset_20260401\", found \"mcp_toolset\""),
        ("duplicate top-level key", br#"{"type":"agent_toolset_20260401","configs":[],"configs":[]}"#, "configs: duplicate key"),
        ("default_config null", br#"{"type":"agent_toolset_20260401","default_config":null}"#, "default_config: expected an object, found null"),
        ("default_config array", br#"{"type":"agent_toolset_20260401","default_config":[]}"#, "default_config: expected an object, found an array"),
        ("enabled string", br#"{"type":"agent_toolset_20260401","default_config":{"enabled":"yes"}}"#, "default_config.enabled: expected a boolean, found a string"),
        ("enabled null", br#"{"type":"agent_toolset_20260401","default_config":{"enabled":null}}"#, "default_config.enabled: expected a boolean, found null"),
        ("misspelt key in default_config", br#"{"type":"agent_toolset_20260401","default_config":{"permission_polciy":{"type":"always_ask"}}}"#, "default_config.permission_polciy: unknown key; allowed here: enabled, permission_policy"),
        ("misspelt key in a config", br#"{"type":"agent_toolset_20260401","configs":[{"name":"bash"},{"name":"read","permission_polciy":{"type":"always_ask"}}]}"#, "configs[1].permission_polciy: unknown key; allowed here: name, enabled, permission_policy"),
        ("unknown key in a policy", br#"{"type":"agent_toolset_20260401","configs":[{"name":"bash","permission_policy":{"type":"always_ask","why":"x"}}]}"#, "configs[0].permission_policy.why: unknown key; allowed here: type"),
        ("policy not an object", br#"{"type":"agent_toolset_20260401","default_config":{"permission_policy":"always_ask"}}"#, "default_config.permission_policy: expected an object, found a string"),
        ("policy without type", br#"{"type":"agent_toolset_20260401","default_config":{"permission_policy":{}}}"#, "default_config.permission_policy.type: required but missing"),
        ("policy type null", br#"{"type":"agent_toolset_20260401","default_config":{"permission_policy":{"type":null}}}"#, "default_config.permission_policy.type: expected a string, found null"),
        ("unevaluable default policy", br#"{"type":"agent_toolset_20260401","default_config":{"permission_policy":{"type":"always_deny"}}}"#, "default_config.permission_policy.type: permission policy type \"always_deny\" cannot be evaluated"),
        ("unevaluable tool policy", br#"{"type":"agent_toolset_20260401","configs":[{"name":"glob"},{"name":"grep","permission_policy":{"type":"ask_once"}}]}"#, "configs[1].permission_policy.type: permission policy type \"ask_once\" cannot be evaluated"),
        ("configs not an array", br#"{"type":"agent_toolset_20260401","configs":{"name":"bash"}}"#, "configs: expected an array, found an object"),
        ("config not an object", br#"{"type":"agent_toolset_20260401","configs":["bash"]}"#, "configs[0]: expected an object, found a string"),
        ("config without name", br#"{"type":"agent_toolset_20260401","configs":[{"enabled":true}]}"#, "configs[0].name: required but missing"),
        ("config name empty", br#"{"type":"agent_toolset_20260401","configs":[{"name":""}]}"#, "configs[0].name: must not be empty"),
        ("unknown tool", br#"{"type":"agent_toolset_20260401","configs":[{"name":"bsh"}]}"#, "configs[0].name: \"bsh\" is not a tool of agent_toolset_20260401; known tools: bash, read, write, edit, glob, grep, web_fetch, web_search"),
        ("duplicate tool", br#"{"type":"agent_toolset_20260401","configs":[{"name":"bash"},{"name":"read"},{"name":"bash","enabled":false}]}"#, "configs[2].name: tool \"bash\" is configured twice (first at configs[0].name)"),
        ("duplicate key in a config", br#"{"type":"agent_toolset_20260401","configs":[{"name":"bash","enabled":true,"enabled":false}]}"#, "configs[0].enabled: duplicate key"),
        ("unevaluable web tool policy", br#"{"type":"agent_toolset_20260401","configs":[{"name":"web_fetch","permission_policy":{"type":"nope"}}]}"#, "configs[0].permission_policy.type: permission policy type \"nope\" cannot be evaluated"),
    ];
    for (what, raw, want) in cases {
        for (f, got) in [
            ("validate", validate(raw).err()),
            ("tools", tools(raw).err()),
            ("policies", policies(raw).err()),
        ] {
            let got = got
                .unwrap_or_else(|| panic!("{what}: {f} accepted {}", String::from_utf8_lossy(raw)));
            assert!(
                got.to_string().starts_with(want),
                "{what}: {f}\n got: {got}\nwant: {want}"
            );
        }
    }
}

#[test]
fn validate_refuses_unknown_top_level_keys_that_render_tolerates() {
    let raw = br#"{"type":"agent_toolset_20260401","mcp_server_name":"x"}"#;
    let err = validate(raw).expect_err("refused");
    assert_eq!(
        err.to_string(),
        "mcp_server_name: unknown key; allowed here: type, default_config, configs"
    );
    assert_eq!(err.path(), Some("mcp_server_name"));
    assert_eq!(names(raw), BUILTIN_TOOLS);
}

/// A policy that cannot be evaluated is an error only where a live tool
/// carries it: the agent toolset is lazy about policies.
#[test]
fn unevaluable_policies_on_disabled_tools_are_not_errors() {
    let every_tool_asks: Vec<_> = [
        "bash",
        "read",
        "write",
        "edit",
        "glob",
        "grep",
        "web_fetch",
        "web_search",
    ]
    .iter()
    .map(|n| json!({"name": n, "permission_policy": {"type": "always_ask"}}))
    .collect();
    let cases = [
        json!({"type": "agent_toolset_20260401",
            "configs": [{"name": "bash", "enabled": false, "permission_policy": {"type": "bogus"}}]}),
        json!({"type": "agent_toolset_20260401",
            "default_config": {"enabled": false, "permission_policy": {"type": "bogus"}}}),
        // Every tool overrides the bogus default, so no live tool carries it.
        json!({"type": "agent_toolset_20260401",
            "default_config": {"permission_policy": {"type": "bogus"}},
            "configs": every_tool_asks}),
    ];
    for entry in cases {
        let raw = bytes(entry);
        validate(&raw).expect("lazy about dead policies");
        tools(&raw).expect("resolves");
    }
    // ...but the same default is an error once one tool inherits it.
    let raw = bytes(json!({"type": "agent_toolset_20260401",
        "default_config": {"permission_policy": {"type": "bogus"}},
        "configs": [{"name": "bash", "permission_policy": {"type": "always_ask"}}]}));
    let err = validate(&raw).expect_err("live tool inherits it");
    assert_eq!(err.path(), Some("default_config.permission_policy.type"));
}

#[test]
fn web_tools_validate_but_are_not_handed_to_the_model() {
    let raw = bytes(json!({"type": "agent_toolset_20260401",
        "configs": [{"name": "web_search", "enabled": true}, {"name": "web_fetch", "enabled": false}]}));
    validate(&raw).expect("valid on the wire");
    assert_eq!(names(&raw), BUILTIN_TOOLS);
    assert!(!policies(&raw).expect("resolves").contains_key("web_search"));
    assert_eq!(enabled_web_tools(&raw).expect("resolves"), ["web_search"]);
    let none = bytes(json!({"type": "agent_toolset_20260401"}));
    assert!(enabled_web_tools(&none).expect("resolves").is_empty());
}

#[test]
fn errors_reroot_under_the_entry_path() {
    let raw = br#"{"type":"agent_toolset_20260401","configs":[{"name":"bash","permission_policy":{"type":"x"}}]}"#;
    let err = validate(raw)
        .expect_err("refused")
        .with_prefix("spec.tools[3]");
    assert_eq!(
        err.path(),
        Some("spec.tools[3].configs[0].permission_policy.type")
    );
    assert!(
        err.to_string()
            .starts_with("spec.tools[3].configs[0].permission_policy.type: ")
    );
    let dup = br#"{"type":"agent_toolset_20260401","configs":[{"name":"bash"},{"name":"bash"}]}"#;
    let err = validate(dup)
        .expect_err("refused")
        .with_prefix("spec.tools[0]");
    assert_eq!(
        err.to_string(),
        "spec.tools[0].configs[1].name: tool \"bash\" is configured twice (first at spec.tools[0].configs[0].name)"
    );
    let root = validate(b"[]")
        .expect_err("refused")
        .with_prefix("spec.tools[1]");
    assert_eq!(
        root.to_string(),
        "spec.tools[1]: expected an object, found an array"
    );
    assert!(matches!(root, ToolsetError::WrongType { .. }));
}

#[test]
fn whitespace_and_key_order_do_not_matter() {
    let a = b" { \"configs\" : [ { \"enabled\" : false , \"name\" : \"bash\" } ] ,\n \"type\" : \"agent_toolset_20260401\" } ";
    assert_eq!(names(a), ["read", "write", "edit", "glob", "grep"]);
}
