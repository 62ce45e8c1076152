//! The agent toolset's rules, without I/O: which tools a `tools[]` entry
//! enables and under which permission policy, the checks that refuse a
//! malformed entry at the API boundary, the materialised echo written into a
//! session's status, and the caps every tool result goes through.
//!
//! Every input is the raw JSON of one entry, walked without a typed decode:
//! an explicit `null` is told from an absent key, a repeated key is noticed,
//! and every error names the JSON path of what was wrong, because these
//! errors are the text of an admission denial.
//!
//! The behaviour is the seed document's (the Go package `toolset` of the
//! platform this re-creates); deliberate differences are listed in
//! `docs/DIVERGENCES.md`.

#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

mod agent;
mod config;
mod definitions;
mod duration;
mod entry;
mod error;
mod materialize;
mod mcp;
mod output;
mod path;
mod policy;
mod raw;
mod resolved;
mod stall;

use std::time::Duration;

pub use agent::{AGENT_TOOLSET_TYPE, enabled_web_tools, policies, tools, validate};
pub use definitions::{
    BUILTIN_TOOLS, GLOB_RESULT_LIMIT, MAX_FILE_BYTES, MAX_READ_BYTES, ToolDefinition, WEB_TOOLS,
    definition, is_web_tool,
};
pub use duration::format_duration;
pub use entry::{CUSTOM_TYPE, Entries, Entry, EntryKind, classify};
pub use error::ToolsetError;
pub use materialize::{materialize, materialize_tools};
pub use mcp::{
    MCP_TOOLSET_TYPE, McpResolution, McpResolved, McpTool, mcp_server_name, resolve_mcp,
    validate_mcp_toolset,
};
pub use output::{
    cap_output, cap_output_with_notice, sanitize_text, spill_file_name, spill_notice,
    truncate_runes,
};
pub use policy::PermissionPolicy;
pub use resolved::{ResolvedToolset, entry_type};
pub use stall::{check_stall_default, parse_stall_timeout, stall_floor};

/// Internals the fuzz targets (`fuzz/`) drive directly. Not part of the API:
/// nothing outside the fuzz crate calls these, and they may change freely.
#[doc(hidden)]
pub mod fuzzing {
    use std::time::Duration;

    /// The Go-duration parser behind [`crate::parse_stall_timeout`], as
    /// `(negative, magnitude)`.
    pub fn parse_duration(text: &str) -> Option<(bool, Duration)> {
        crate::duration::parse(text).map(|d| (d.negative, d.magnitude))
    }
}

/// The policy an `agent_toolset_20260401` entry resolves to when it sets
/// none. Documented by the wire ("the agent toolset defaults to
/// `always_allow`"), and a constant rather than a value frozen into stored
/// rows, so that flipping it changes every session on its next render.
pub const DEFAULT_AGENT_TOOLSET_POLICY: PermissionPolicy = PermissionPolicy::AlwaysAllow;

/// The policy an `mcp_toolset` entry resolves to when it sets none: asking,
/// so that a tool newly appearing on someone else's server cannot run
/// without approval.
pub const DEFAULT_MCP_TOOLSET_POLICY: PermissionPolicy = PermissionPolicy::AlwaysAsk;

/// What one tool call may return to the model: the model's context budget,
/// and the size of a result that is kept forever. Larger outputs are cut and
/// spilled to a file in the sandbox.
pub const MAX_OUTPUT_BYTES: usize = 100 << 10;

/// Bound on a tool call the model did not time itself.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2 * 60);

/// Bound on a call the model did time: a model-chosen timeout is a lease the
/// executor must keep alive, so it cannot be unbounded.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The stall budget a binary uses when its operator sets none: three full
/// steps, so a slow image pull behind a slow mount behind a full-length
/// `bash` still clears it while a wedge costs half an hour rather than the
/// process's life. Derived, so it follows [`MAX_TIMEOUT`] wherever it goes.
pub const DEFAULT_STALL_BUDGET: Duration = Duration::from_secs(3 * MAX_TIMEOUT.as_secs());

/// The metric every tool call records. Deliberately not one of OTel's
/// `gen_ai.*` metrics: those describe a client's call to a GenAI provider and
/// require `gen_ai.provider.name`, which running bash in a container has
/// not. The attributes reuse the semantic-convention keys that do apply
/// ([`ATTR_TOOL_NAME`], [`ATTR_ERROR_TYPE`]).
pub const METRIC_TOOL_DURATION: &str = "tool.execution.duration";

/// The tool the model named, on [`METRIC_TOOL_DURATION`].
pub const ATTR_TOOL_NAME: &str = "gen_ai.tool.name";

/// The standard failure dimension, on [`METRIC_TOOL_DURATION`].
pub const ATTR_ERROR_TYPE: &str = "error.type";
