//! `toolset::validate` (Go `Validate`) on arbitrary bytes as one
//! `agent_toolset_20260401` entry.
//!
//! Invariants: no panic; the verdict is deterministic; every rejection names
//! a JSON path that leads (in the entry) to what is wrong and starts its
//! message; an accepted entry also resolves (`tools`, `policies`), and its
//! materialised echo is accepted and resolves to the same policies.
#![no_main]

use agentplane_fuzz::check_toolset_rejection;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let verdict = toolset::validate(data);
    assert_eq!(
        verdict,
        toolset::validate(data),
        "validate is not deterministic"
    );
    match verdict {
        Err(e) => check_toolset_rejection(data, &e),
        Ok(()) => {
            let policies = toolset::policies(data).expect("validated entry resolves its policies");
            let tools = toolset::tools(data).expect("validated entry resolves its tools");
            assert_eq!(policies.len(), tools.len());
            let echo = toolset::materialize(data);
            toolset::validate(&echo).expect("the echo of a valid entry is valid");
            assert_eq!(
                toolset::policies(&echo).expect("echo resolves"),
                policies,
                "the echo resolves to other policies"
            );
        }
    }
});
