//! `toolset::policies` and `toolset::tools` (Go `Policies`, `Tools`), with
//! `enabled_web_tools`, on arbitrary bytes as one `agent_toolset_20260401`
//! entry.
//!
//! Invariants: no panic; deterministic; both succeed or both fail with the
//! same error, which names a JSON path leading to what is wrong; they agree
//! on which tools are enabled, `tools` in wire order (bash, read, write,
//! edit, glob, grep) without web tools; each policy is the one an independent
//! reading of the entry gives; an entry `validate` accepts resolves.
#![no_main]

use agentplane_fuzz::{check_toolset_rejection, expected_policy};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let policies = toolset::policies(data);
    let tools = toolset::tools(data);
    assert_eq!(policies, toolset::policies(data), "not deterministic");
    match (&policies, &tools) {
        (Err(a), Err(b)) => {
            assert_eq!(a, b, "policies and tools fail differently");
            check_toolset_rejection(data, a);
            assert!(
                toolset::validate(data).is_err(),
                "a validated entry does not resolve: {a}"
            );
        }
        (Ok(p), Ok(t)) => {
            let names: Vec<&str> = t.iter().map(|d| d.name.as_str()).collect();
            let wire: Vec<&str> = toolset::BUILTIN_TOOLS
                .iter()
                .copied()
                .filter(|n| names.contains(n))
                .collect();
            assert_eq!(
                names, wire,
                "tools are not in wire order or include a stranger"
            );
            let keys: Vec<&str> = p.keys().map(String::as_str).collect();
            let mut sorted = names.clone();
            sorted.sort_unstable();
            assert_eq!(
                keys, sorted,
                "policies and tools disagree on what is enabled"
            );
            let webs = toolset::enabled_web_tools(data).expect("resolving entry lists web tools");
            assert!(webs.iter().all(|w| toolset::is_web_tool(w)));
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
                for tool in toolset::BUILTIN_TOOLS {
                    let want = expected_policy(&v, tool, "always_allow");
                    let got = p.get(tool).map(|p| p.as_str().to_owned());
                    assert_eq!(got, want, "{tool} resolved unlike the entry says");
                }
            }
        }
        _ => panic!("policies {policies:?} but tools {tools:?}"),
    }
});
