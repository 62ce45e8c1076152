//! `mcp_toolset`: the shape check at the API boundary, and resolution against
//! the tool list one MCP server reported.

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::expect_type;
use crate::config::{Reading, ToolsetConfig};
use crate::error::ToolsetError;
use crate::policy::PermissionPolicy;
use crate::{DEFAULT_MCP_TOOLSET_POLICY, raw};

/// The entry type this module handles.
pub const MCP_TOOLSET_TYPE: &str = "mcp_toolset";

/// Keys an `mcp_toolset` entry may carry: the agent kind's plus the server
/// it draws from.
const ENTRY_KEYS: &[&str] = &["type", "mcp_server_name", "default_config", "configs"];

/// One tool as an MCP server reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpTool {
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    #[serde(default)]
    pub input_schema: Value,
}

/// One enabled MCP tool: what the server reported plus the policy the entry
/// resolves for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpResolved {
    #[serde(flatten)]
    pub tool: McpTool,
    pub policy: PermissionPolicy,
}

/// The resolution of one `mcp_toolset` entry against a server's listing.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct McpResolution {
    /// Enabled tools, in the order the server listed them.
    pub tools: Vec<McpResolved>,
    /// `configs[].name`s that named no reported tool, in `configs` order.
    /// A warning for a human, not an error: the server's list is dynamic.
    pub unknown_configs: Vec<String>,
}

/// The server an `mcp_toolset` entry draws from, or the error naming why it
/// cannot be read.
pub fn mcp_server_name(raw_entry: &[u8]) -> Result<String, ToolsetError> {
    let root = raw::parse(raw_entry)?;
    let members = raw::object(root, "")?;
    expect_type(&members, MCP_TOOLSET_TYPE)?;
    let v = members
        .get("mcp_server_name")
        .ok_or_else(|| ToolsetError::Missing {
            path: "mcp_server_name".into(),
        })?;
    let name = raw::string(v, "mcp_server_name")?;
    if name.is_empty() {
        return Err(ToolsetError::Empty {
            path: "mcp_server_name".into(),
        });
    }
    Ok(name)
}

/// Checks an `mcp_toolset` entry's shape: unknown keys anywhere in the
/// `default_config` / `configs` / `permission_policy` nest, and policy types
/// this platform cannot evaluate, are refused. It is eager about policies
/// where [`crate::validate`] is lazy: an MCP entry has no enumerable tool
/// list, so "is this tool live" cannot be decided here, and an unevaluable
/// policy is a defect wherever it sits. No tool name is checked against a
/// known set: the server reports its own.
pub fn validate_mcp_toolset(raw_entry: &[u8]) -> Result<(), ToolsetError> {
    mcp_server_name(raw_entry)?;
    let root = raw::parse(raw_entry)?;
    let members = raw::object(root, "")?;
    members.only("", ENTRY_KEYS)?;
    let how = Reading {
        strict_keys: true,
        refuse_duplicate_names: true,
        eager_policies: true,
    };
    ToolsetConfig::read(&members, how, |_, _| Ok(())).map(drop)
}

/// Applies an `mcp_toolset` entry's `default_config` and `configs[]` onto the
/// tools one server reported.
///
/// Unknown keys are not refused here (that is [`validate_mcp_toolset`]'s job
/// at the boundary, and a row stored before it existed must still resolve).
/// A policy that cannot be evaluated is refused when a live tool carries it,
/// because defaulting it would run an unconfirmed tool. A reported tool with
/// no name, or a name repeated after its first listing, is dropped: neither
/// can be offered to a model (two definitions under one name is a request the
/// model endpoint refuses).
pub fn resolve_mcp(raw_entry: &[u8], reported: &[McpTool]) -> Result<McpResolution, ToolsetError> {
    let root = raw::parse(raw_entry)?;
    let members = raw::object(root, "")?;
    expect_type(&members, MCP_TOOLSET_TYPE)?;
    let how = Reading {
        strict_keys: false,
        refuse_duplicate_names: false,
        eager_policies: false,
    };
    let cfg = ToolsetConfig::read(&members, how, |_, _| Ok(()))?;
    let mut out = McpResolution::default();
    let mut seen: HashSet<&str> = HashSet::new();
    for tool in reported {
        if tool.name.is_empty() || !seen.insert(tool.name.as_str()) {
            continue;
        }
        if let Some(policy) = cfg.resolve(&tool.name, DEFAULT_MCP_TOOLSET_POLICY)? {
            out.tools.push(McpResolved {
                tool: tool.clone(),
                policy,
            });
        }
    }
    out.unknown_configs = cfg
        .configs
        .iter()
        .filter(|c| !seen.contains(&c.name.as_str()))
        .map(|c| c.name.clone())
        .collect();
    Ok(out)
}
