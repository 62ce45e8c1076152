//! `toolset::validate_mcp_toolset` (Go `ValidateMCPToolset`) and
//! `mcp_server_name` on arbitrary bytes as one `mcp_toolset` entry.
//!
//! Invariants: no panic; deterministic; every rejection names a JSON path
//! that leads to what is wrong and starts its message; an accepted entry
//! names a non-empty server, resolves against any listing (it is eager about
//! policies, so nothing a live tool carries can fail), and its materialised
//! echo is accepted and resolves the same.
#![no_main]

use agentplane_fuzz::check_toolset_rejection;
use libfuzzer_sys::fuzz_target;
use toolset::McpTool;

fuzz_target!(|data: &[u8]| {
    let verdict = toolset::validate_mcp_toolset(data);
    assert_eq!(verdict, toolset::validate_mcp_toolset(data));
    if let Err(e) = toolset::mcp_server_name(data) {
        check_toolset_rejection(data, &e);
    }
    match verdict {
        Err(e) => check_toolset_rejection(data, &e),
        Ok(()) => {
            let server = toolset::mcp_server_name(data).expect("valid entry names its server");
            assert!(!server.is_empty());
            // A listing with every configured name, a stranger, and a repeat.
            let v: serde_json::Value = serde_json::from_slice(data).unwrap_or_default();
            let mut listing: Vec<McpTool> = v
                .get("configs")
                .and_then(|c| c.as_array())
                .into_iter()
                .flatten()
                .filter_map(|c| c.get("name").and_then(|n| n.as_str()))
                .map(tool)
                .collect();
            listing.push(tool("a-tool-nobody-configured"));
            listing.push(tool("a-tool-nobody-configured"));
            let res = toolset::resolve_mcp(data, &listing).expect("valid entry resolves");
            let echo = toolset::materialize(data);
            toolset::validate_mcp_toolset(&echo).expect("the echo of a valid entry is valid");
            assert_eq!(
                toolset::resolve_mcp(&echo, &listing).expect("echo resolves"),
                res,
                "the echo resolves differently"
            );
        }
    }
});

fn tool(name: &str) -> McpTool {
    McpTool {
        name: name.to_owned(),
        description: String::new(),
        input_schema: serde_json::Value::Null,
    }
}
