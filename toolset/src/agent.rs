//! `agent_toolset_20260401`: which built-in tools an entry enables, under
//! which policy, and the create-time check that it resolves at all.

use std::collections::BTreeMap;

use crate::DEFAULT_AGENT_TOOLSET_POLICY;
use crate::config::{Reading, ToolsetConfig};
use crate::definitions::{BUILTIN_TOOLS, ToolDefinition, WEB_TOOLS, definition, is_agent_tool};
use crate::error::ToolsetError;
use crate::policy::PermissionPolicy;
use crate::raw::{self, Members};

/// The entry type this module handles.
pub const AGENT_TOOLSET_TYPE: &str = "agent_toolset_20260401";

/// Keys an `agent_toolset_20260401` entry may carry.
const ENTRY_KEYS: &[&str] = &["type", "default_config", "configs"];

/// What resolution reads: unknown keys inside the nest are refused (for this
/// kind every name is known, so a stray key can only be a mistake), duplicate
/// tool configs are refused, and policies are evaluated only where a live
/// tool carries them.
const RESOLVE: Reading = Reading {
    strict_keys: true,
    refuse_duplicate_names: true,
    eager_policies: false,
};

/// Parses an agent toolset entry down to its configuration.
fn read(raw_entry: &[u8], entry_keys_checked: bool) -> Result<ToolsetConfig, ToolsetError> {
    let root = raw::parse(raw_entry)?;
    let members = raw::object(root, "")?;
    expect_type(&members, AGENT_TOOLSET_TYPE)?;
    if entry_keys_checked {
        members.only("", ENTRY_KEYS)?;
    }
    ToolsetConfig::read(&members, RESOLVE, |name, at| {
        if is_agent_tool(name) {
            Ok(())
        } else {
            Err(ToolsetError::UnknownTool {
                path: at.to_owned(),
                name: name.to_owned(),
                known: BUILTIN_TOOLS
                    .iter()
                    .chain(WEB_TOOLS.iter())
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", "),
            })
        }
    })
}

/// Refuses an entry whose `type` is not `want`.
pub(crate) fn expect_type(members: &Members<'_>, want: &'static str) -> Result<(), ToolsetError> {
    let t = members.get("type").ok_or_else(|| ToolsetError::Missing {
        path: "type".into(),
    })?;
    let found = raw::string(t, "type")?;
    if found == want {
        Ok(())
    } else {
        Err(ToolsetError::WrongEntryType {
            path: "type".into(),
            expected: want,
            found: format!("{found:?}"),
        })
    }
}

/// The enabled sandbox tools and their policies, in wire order.
fn resolve(cfg: &ToolsetConfig) -> Result<Vec<(&'static str, PermissionPolicy)>, ToolsetError> {
    let mut out = Vec::new();
    for name in BUILTIN_TOOLS {
        if let Some(policy) = cfg.resolve(name, DEFAULT_AGENT_TOOLSET_POLICY)? {
            out.push((name, policy));
        }
    }
    // The web tools never reach the model from here (there is no web driver
    // in this platform), but a manifest that enables one with a policy no one
    // can evaluate is just as broken as for a sandbox tool.
    for name in WEB_TOOLS {
        cfg.resolve(name, DEFAULT_AGENT_TOOLSET_POLICY)?;
    }
    Ok(out)
}

/// The model-facing definitions of the sandbox tools an
/// `agent_toolset_20260401` entry enables, in the wire's order (bash, read,
/// write, edit, glob, grep).
pub fn tools(raw_entry: &[u8]) -> Result<Vec<ToolDefinition>, ToolsetError> {
    let cfg = read(raw_entry, false)?;
    Ok(resolve(&cfg)?
        .into_iter()
        .filter_map(|(name, _)| definition(name))
        .collect())
}

/// The permission policy of every sandbox tool the entry enables, keyed by
/// tool name. Mirrors [`tools`]' enable resolution, so a disabled tool is
/// absent: absence means "not callable", never "default policy".
pub fn policies(raw_entry: &[u8]) -> Result<BTreeMap<String, PermissionPolicy>, ToolsetError> {
    let cfg = read(raw_entry, false)?;
    Ok(resolve(&cfg)?
        .into_iter()
        .map(|(name, p)| (name.to_owned(), p))
        .collect())
}

/// Checks at create time that an `agent_toolset_20260401` entry resolves:
/// its enable flags and the policies of its enabled tools are well formed,
/// and no key anywhere is unknown. A failure here is a rejected apply rather
/// than a session that cannot start.
pub fn validate(raw_entry: &[u8]) -> Result<(), ToolsetError> {
    let cfg = read(raw_entry, true)?;
    resolve(&cfg).map(drop)
}

/// The unknown `configs[].name`s are refused by [`validate`]; this names the
/// configured web tools that are enabled, which this platform accepts but
/// cannot run (a warning for the webhook).
pub fn enabled_web_tools(raw_entry: &[u8]) -> Result<Vec<&'static str>, ToolsetError> {
    let cfg = read(raw_entry, false)?;
    let mut out = Vec::new();
    for name in WEB_TOOLS {
        if cfg.config_for(name).is_some()
            && cfg.resolve(name, DEFAULT_AGENT_TOOLSET_POLICY)?.is_some()
        {
            out.push(name);
        }
    }
    Ok(out)
}
