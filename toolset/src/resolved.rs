//! The session's resolved built-in toolset: what the operator writes into
//! status and hands to the runner, so that both enforce the same answer.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::agent;
use crate::definitions::{BUILTIN_TOOLS, ToolDefinition, definition};
use crate::entry::{Entries, Entry};
use crate::error::ToolsetError;
use crate::policy::PermissionPolicy;
use crate::{DEFAULT_AGENT_TOOLSET_POLICY, raw};

/// The enabled sandbox tools of a session and their policies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedToolset {
    /// Definitions of the enabled tools, in wire order.
    pub tools: Vec<ToolDefinition>,
    /// Policy of each enabled tool; a tool absent here is disabled.
    pub policies: BTreeMap<String, PermissionPolicy>,
}

impl ResolvedToolset {
    /// Every sandbox tool enabled under the agent toolset's default policy:
    /// what an `agent_toolset_20260401` entry with no configuration resolves
    /// to, and what a runner started without a toolset file serves.
    pub fn default_enabled() -> Self {
        Self {
            tools: BUILTIN_TOOLS.iter().filter_map(|n| definition(n)).collect(),
            policies: BUILTIN_TOOLS
                .iter()
                .map(|n| ((*n).to_owned(), DEFAULT_AGENT_TOOLSET_POLICY))
                .collect(),
        }
    }

    /// Resolves a session's `tools[]` (raw JSON bytes of each entry). Only
    /// the `agent_toolset_20260401` entry enables sandbox tools; with none,
    /// none are enabled. Errors name the entry's index (`tools[2].configs[0]...`).
    pub fn from_entries<T: AsRef<[u8]>>(entries: &[T]) -> Result<Self, ToolsetError> {
        let parsed = Entries::parse(entries.iter().map(|e| e.as_ref().to_vec()));
        Self::from_agent_entry(parsed.agent("tools")?, "tools")
    }

    /// Resolves the session's one agent toolset entry (see
    /// [`Entries::agent`]); errors are rooted at the entry's path under `base`.
    pub fn from_agent_entry(entry: Option<&Entry>, base: &str) -> Result<Self, ToolsetError> {
        let Some(entry) = entry else {
            return Ok(Self {
                tools: Vec::new(),
                policies: BTreeMap::new(),
            });
        };
        let prefix = entry.path(base);
        Ok(Self {
            tools: agent::tools(&entry.raw).map_err(|e| e.with_prefix(&prefix))?,
            policies: agent::policies(&entry.raw).map_err(|e| e.with_prefix(&prefix))?,
        })
    }

    /// The policy of `tool`, or `None` when the session does not enable it.
    pub fn policy(&self, tool: &str) -> Option<PermissionPolicy> {
        self.policies.get(tool).copied()
    }
}

/// The `type` of one `tools[]` entry, if it is an object with a string type.
pub fn entry_type(raw_entry: &[u8]) -> Option<String> {
    let root = raw::parse(raw_entry).ok()?;
    let members = raw::object_lenient(root)?;
    let t = members.0.iter().rev().find(|(k, _)| k == "type")?.1;
    raw::string_lenient(t)
}
