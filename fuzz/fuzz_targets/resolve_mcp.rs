//! `toolset::resolve_mcp` (Go `ResolveMCP`). Input: an `mcp_toolset` entry,
//! then the names of the tools a server reported, each after a NUL byte
//! (`<entry>\0<name>\0<name>...`; NUL cannot occur in JSON text).
//!
//! Invariants: no panic; deterministic; every rejection names a JSON path
//! that leads to what is wrong; an entry `validate_mcp_toolset` accepts
//! always resolves; the enabled tools are the reported ones, in listing
//! order, without an empty or repeated name, each with the policy an
//! independent reading of the entry gives (first `configs[]` entry of the
//! name, then `default_config`, then on and `always_ask`); the unknown
//! configs are exactly the configured names nobody reported.
#![no_main]

use agentplane_fuzz::{check_toolset_rejection, expected_policy};
use libfuzzer_sys::fuzz_target;
use toolset::McpTool;

fuzz_target!(|data: &[u8]| {
    let mut parts = data.split(|b| *b == 0);
    let entry = parts.next().unwrap_or_default();
    let listing: Vec<McpTool> = parts
        .map(|n| McpTool {
            name: String::from_utf8_lossy(n).into_owned(),
            description: String::new(),
            input_schema: serde_json::Value::Null,
        })
        .collect();
    let res = toolset::resolve_mcp(entry, &listing);
    assert_eq!(
        res,
        toolset::resolve_mcp(entry, &listing),
        "not deterministic"
    );
    let res = match res {
        Err(e) => {
            check_toolset_rejection(entry, &e);
            assert!(
                toolset::validate_mcp_toolset(entry).is_err(),
                "a validated entry failed to resolve: {e}"
            );
            return;
        }
        Ok(r) => r,
    };
    // Enabled tools: a subsequence of the de-duplicated listing.
    let mut seen: Vec<&str> = Vec::new();
    for t in &listing {
        if !t.name.is_empty() && !seen.contains(&t.name.as_str()) {
            seen.push(&t.name);
        }
    }
    let mut at = 0;
    for r in &res.tools {
        let pos = seen[at..]
            .iter()
            .position(|n| *n == r.tool.name)
            .unwrap_or_else(|| {
                panic!(
                    "{:?} is not in listing order or was not reported",
                    r.tool.name
                )
            });
        at += pos + 1;
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(entry) else {
        return;
    };
    for name in &seen {
        let want = expected_policy(&v, name, "always_ask");
        let got = res
            .tools
            .iter()
            .find(|r| r.tool.name == *name)
            .map(|r| r.policy.as_str().to_owned());
        assert_eq!(got, want, "tool {name:?} resolved unlike the entry says");
    }
    let configured: Vec<&str> = v
        .get("configs")
        .and_then(|c| c.as_array())
        .into_iter()
        .flatten()
        .filter_map(|c| c.get("name").and_then(|n| n.as_str()))
        .collect();
    let mut unknown: Vec<&str> = Vec::new();
    for n in configured {
        if !seen.contains(&n) && !unknown.contains(&n) {
            unknown.push(n);
        }
    }
    assert_eq!(res.unknown_configs, unknown, "unknown configs");
});
