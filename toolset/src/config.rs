//! The `default_config` / `configs[]` nest that both toolset kinds share, read
//! from raw JSON, and the one resolution rule they share: enable and policy
//! resolve independently, a per-tool config overrides `default_config`, and
//! `default_config` overrides the kind's defaults.

use std::collections::HashMap;

use serde_json::value::RawValue;

use crate::error::ToolsetError;
use crate::path;
use crate::policy::{PermissionPolicy, PolicyRef};
use crate::raw::{self, Members};

/// Keys a `default_config` may carry.
pub(crate) const DEFAULT_CONFIG_KEYS: &[&str] = &["enabled", "permission_policy"];
/// Keys a `configs[]` entry may carry.
pub(crate) const CONFIG_KEYS: &[&str] = &["name", "enabled", "permission_policy"];

/// How strictly the nest is read; the kinds and the call sites differ.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    /// Refuse keys the schema does not define.
    pub(crate) strict_keys: bool,
    /// Refuse a second `configs[]` entry for a name; otherwise the first wins.
    pub(crate) refuse_duplicate_names: bool,
    /// Evaluate every policy present, not only those of live tools.
    pub(crate) eager_policies: bool,
}

/// One level of configuration: what it says about enable and policy.
#[derive(Debug, Clone, Default)]
pub(crate) struct Config {
    pub(crate) enabled: Option<bool>,
    pub(crate) policy: Option<PolicyRef>,
}

/// One `configs[]` entry.
#[derive(Debug, Clone)]
pub(crate) struct NamedConfig {
    pub(crate) name: String,
    pub(crate) path: String,
    pub(crate) config: Config,
}

/// A toolset entry's configuration, shape-checked.
#[derive(Debug, Clone, Default)]
pub(crate) struct ToolsetConfig {
    pub(crate) default: Config,
    pub(crate) configs: Vec<NamedConfig>,
    /// Each config's index in `configs` by name, so that finding a tool's
    /// config (once per tool, and once per config to refuse repeats) stays
    /// linear in the entry's size rather than quadratic.
    by_name: HashMap<String, usize>,
}

impl ToolsetConfig {
    /// Reads `default_config` and `configs` from an entry's members.
    /// `check_name` judges each `configs[].name` (the agent kind checks it
    /// against its tools; an MCP server's names are unknowable here).
    pub(crate) fn read(
        entry: &Members<'_>,
        how: Reading,
        check_name: impl Fn(&str, &str) -> Result<(), ToolsetError>,
    ) -> Result<Self, ToolsetError> {
        let default = match entry.get("default_config") {
            None => Config::default(),
            Some(v) => read_config(v, "default_config", DEFAULT_CONFIG_KEYS, how)?.1,
        };
        let mut configs: Vec<NamedConfig> = Vec::new();
        let mut by_name: HashMap<String, usize> = HashMap::new();
        if let Some(v) = entry.get("configs") {
            for (i, item) in raw::array(v, "configs")?.into_iter().enumerate() {
                let at = path::index("configs", i);
                let (members, config) = read_config(item, &at, CONFIG_KEYS, how)?;
                let name_path = path::key(&at, "name");
                let name = match members.get("name") {
                    Some(n) => raw::string(n, &name_path)?,
                    None => return Err(ToolsetError::Missing { path: name_path }),
                };
                if name.is_empty() {
                    return Err(ToolsetError::Empty { path: name_path });
                }
                check_name(&name, &name_path)?;
                if let Some(&first) = by_name.get(&name) {
                    if how.refuse_duplicate_names {
                        return Err(ToolsetError::DuplicateTool {
                            path: name_path,
                            name,
                            first: path::key(&configs[first].path, "name"),
                        });
                    }
                    continue;
                }
                by_name.insert(name.clone(), configs.len());
                configs.push(NamedConfig {
                    name,
                    path: at,
                    config,
                });
            }
        }
        Ok(Self {
            default,
            configs,
            by_name,
        })
    }

    /// The per-tool entry for `name`, if any.
    pub(crate) fn config_for(&self, name: &str) -> Option<&NamedConfig> {
        self.by_name.get(name).map(|&i| &self.configs[i])
    }

    /// Resolves one tool: `None` when disabled, its policy when enabled. A
    /// policy that cannot be evaluated is an error here, because this tool is
    /// live and defaulting the policy would run it unconfirmed.
    pub(crate) fn resolve(
        &self,
        name: &str,
        kind_default: PermissionPolicy,
    ) -> Result<Option<PermissionPolicy>, ToolsetError> {
        let own = self.config_for(name).map(|c| &c.config);
        let enabled = own
            .and_then(|c| c.enabled)
            .or(self.default.enabled)
            .unwrap_or(true);
        if !enabled {
            return Ok(None);
        }
        match own
            .and_then(|c| c.policy.as_ref())
            .or(self.default.policy.as_ref())
        {
            Some(p) => p.evaluate().map(Some),
            None => Ok(Some(kind_default)),
        }
    }
}

fn read_config<'a>(
    v: &'a RawValue,
    at: &str,
    keys: &[&str],
    how: Reading,
) -> Result<(Members<'a>, Config), ToolsetError> {
    let members = raw::object(v, at)?;
    if how.strict_keys {
        members.only(at, keys)?;
    }
    let enabled = members
        .get("enabled")
        .map(|e| raw::boolean(e, &path::key(at, "enabled")))
        .transpose()?;
    let policy = members
        .get("permission_policy")
        .map(|p| PolicyRef::read(p, &path::key(at, "permission_policy"), how.strict_keys))
        .transpose()?;
    if let Some(p) = policy.as_ref().filter(|_| how.eager_policies) {
        p.evaluate()?;
    }
    Ok((members, Config { enabled, policy }))
}
