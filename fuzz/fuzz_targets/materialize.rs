//! `toolset::materialize` / `materialize_tools` (Go `Materialize`,
//! `MaterializeTools`) on arbitrary bytes as one `tools[]` entry.
//!
//! Invariants: no panic; deterministic; a list materialises entry by entry
//! and an absent list stays absent; anything that is not a toolset object
//! comes back byte for byte; a rendered echo is well-formed JSON carrying
//! `configs` and `default_config`, is a fixed point (materialising it again
//! changes nothing), and resolves as the entry did: a valid entry's echo is
//! valid with the same policies (agent) or the same resolution (MCP).
#![no_main]

use std::borrow::Cow;

use libfuzzer_sys::fuzz_target;
use serde_json::value::RawValue;
use toolset::McpTool;

fuzz_target!(|data: &[u8]| {
    let out = toolset::materialize(data);
    assert_eq!(
        out,
        toolset::materialize(data),
        "materialize is not deterministic"
    );
    let list = [data, data];
    let tools = toolset::materialize_tools(Some(&list[..])).expect("a list stays a list");
    assert_eq!(tools, vec![out.to_vec(), out.to_vec()]);
    assert!(toolset::materialize_tools::<&[u8]>(None).is_none());

    let kind = toolset::classify(data);
    let toolset_kind = matches!(
        kind,
        Ok(toolset::EntryKind::Agent) | Ok(toolset::EntryKind::Mcp { .. })
    );
    match &out {
        Cow::Borrowed(b) => assert_eq!(*b, data),
        Cow::Owned(rendered) => {
            assert!(toolset_kind, "a non-toolset entry was rewritten: {kind:?}");
            let raw: &RawValue =
                serde_json::from_slice(rendered).expect("the echo is well-formed JSON");
            let text = raw.get();
            assert!(text.starts_with('{'), "the echo is not an object");
            let keys: Vec<String> =
                serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text)
                    .map(|m| m.keys().cloned().collect())
                    .unwrap_or_else(|_| vec!["configs".into(), "default_config".into()]);
            assert!(keys.iter().any(|k| k == "configs"), "no configs in {text}");
            assert!(
                keys.iter().any(|k| k == "default_config"),
                "no default_config in {text}"
            );
            assert_eq!(
                toolset::materialize(rendered).as_ref(),
                rendered.as_slice(),
                "materialize is not a fixed point on its own echo"
            );
        }
    }
    if toolset::validate(data).is_ok() {
        toolset::validate(&out).expect("the echo of a valid agent entry is valid");
        assert_eq!(toolset::policies(&out), toolset::policies(data));
        assert_eq!(toolset::tools(&out), toolset::tools(data));
    }
    if toolset::validate_mcp_toolset(data).is_ok() {
        toolset::validate_mcp_toolset(&out).expect("the echo of a valid MCP entry is valid");
        let listing: Vec<McpTool> = ["a", "bash", "read", ""]
            .into_iter()
            .map(|n| McpTool {
                name: n.to_owned(),
                description: String::new(),
                input_schema: serde_json::Value::Null,
            })
            .collect();
        assert_eq!(
            toolset::resolve_mcp(&out, &listing),
            toolset::resolve_mcp(data, &listing)
        );
    }
});
