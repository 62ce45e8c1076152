//! Materialisation: a toolset entry rendered for the response shape, where
//! `default_config`, `configs` and every `enabled` / `permission_policy` in
//! them carry a concrete value.
//!
//! It fills in what was omitted and validates nothing. A supplied value is
//! echoed as stored, malformed or not (the boundary validators refuse bad
//! input; a read of an old row must not fail because of what a write once
//! let through). Only `default_config` and resolvable `configs[]` entries are
//! rebuilt, from the fields the schema defines, so an unknown key nested in
//! them is dropped: the echo then shows the policy the tool really resolves
//! to. Anything else passes through byte for byte.

use std::borrow::Cow;

use serde_json::value::RawValue;

use crate::agent::AGENT_TOOLSET_TYPE;
use crate::definitions::is_agent_tool;
use crate::mcp::MCP_TOOLSET_TYPE;
use crate::policy::PermissionPolicy;
use crate::raw::{self, Members};
use crate::{DEFAULT_AGENT_TOOLSET_POLICY, DEFAULT_MCP_TOOLSET_POLICY};

#[derive(Debug, Clone, Copy)]
enum ToolsetKind {
    Agent,
    Mcp,
}

impl ToolsetKind {
    fn of(members: &Members<'_>) -> Option<Self> {
        // The last `type` wins, as it would for any JSON decoder.
        let t = members.0.iter().rev().find(|(k, _)| k == "type")?.1;
        match raw::string_lenient(t)?.as_str() {
            AGENT_TOOLSET_TYPE => Some(Self::Agent),
            MCP_TOOLSET_TYPE => Some(Self::Mcp),
            _ => None,
        }
    }

    fn default_policy(self) -> PermissionPolicy {
        match self {
            Self::Agent => DEFAULT_AGENT_TOOLSET_POLICY,
            Self::Mcp => DEFAULT_MCP_TOOLSET_POLICY,
        }
    }

    /// Whether a `configs[]` entry names something that resolves to a tool.
    /// An MCP server's names are unknowable at render, so any name counts.
    fn resolves(self, name: &str) -> bool {
        match self {
            Self::Agent => is_agent_tool(name),
            Self::Mcp => !name.is_empty(),
        }
    }
}

/// What `default_config` contributes to a `configs[]` entry that omits a
/// field: the stored raw value, or the kind's constant.
struct Defaults {
    enabled: String,
    policy: String,
}

/// Resolves one `tools[]` entry for the response shape. Entries of any other
/// type, and anything that is not a JSON object, come back byte for byte.
pub fn materialize(raw_entry: &[u8]) -> Cow<'_, [u8]> {
    match render(raw_entry) {
        Some(out) => Cow::Owned(out.into_bytes()),
        None => Cow::Borrowed(raw_entry),
    }
}

/// [`materialize`] over a whole `tools[]` list, as a copy: the caller's bytes
/// (what the store holds and what updates merge) stay as the client sent
/// them. An absent list stays absent, so the caller keeps deciding how that
/// renders.
pub fn materialize_tools<T: AsRef<[u8]>>(tools: Option<&[T]>) -> Option<Vec<Vec<u8>>> {
    tools.map(|list| {
        list.iter()
            .map(|t| materialize(t.as_ref()).into_owned())
            .collect()
    })
}

fn render(raw_entry: &[u8]) -> Option<String> {
    let root = raw::parse(raw_entry).ok()?;
    let members = raw::object_lenient(root)?;
    let kind = ToolsetKind::of(&members)?;

    let last = |key: &str| members.0.iter().rposition(|(k, _)| k == key);
    let default_at = last("default_config");
    let configs_at = last("configs");
    let stored_default = default_at.map(|i| members.0[i].1);
    let default_members = stored_default.and_then(raw::object_lenient);

    let field = |key: &str| -> Option<String> {
        default_members
            .as_ref()?
            .0
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.get().to_owned())
    };
    let defaults = Defaults {
        enabled: field("enabled").unwrap_or_else(|| "true".to_owned()),
        policy: field("permission_policy").unwrap_or_else(|| policy_json(kind.default_policy())),
    };

    let mut out = String::with_capacity(raw_entry.len() + 128);
    out.push('{');
    let mut first = true;
    let mut emit = |out: &mut String, key: &str, value: &str| {
        if !first {
            out.push(',');
        }
        first = false;
        out.push_str(&quote(key));
        out.push(':');
        out.push_str(value);
    };
    for (i, (k, v)) in members.0.iter().enumerate() {
        match k.as_str() {
            "default_config" if Some(i) != default_at => {}
            "configs" if Some(i) != configs_at => {}
            "default_config" => {
                let value = match default_members {
                    Some(_) => object(&[
                        ("enabled", &defaults.enabled),
                        ("permission_policy", &defaults.policy),
                    ]),
                    None => v.get().to_owned(),
                };
                emit(&mut out, k, &value);
            }
            "configs" => emit(&mut out, k, &render_configs(v, kind, &defaults)),
            _ => emit(&mut out, k, v.get()),
        }
    }
    if configs_at.is_none() {
        emit(&mut out, "configs", "[]");
    }
    if default_at.is_none() {
        emit(
            &mut out,
            "default_config",
            &object(&[
                ("enabled", &defaults.enabled),
                ("permission_policy", &defaults.policy),
            ]),
        );
    }
    out.push('}');
    Some(out)
}

/// `configs` echoes the entries the client supplied, each resolved, rather
/// than one entry per tool: an MCP server's names cannot be listed at render,
/// and one rule for both kinds beats two that diverge.
fn render_configs(v: &RawValue, kind: ToolsetKind, defaults: &Defaults) -> String {
    let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(v.get()) else {
        return v.get().to_owned();
    };
    let rendered: Vec<String> = items
        .into_iter()
        .map(|item| {
            let Some(m) = raw::object_lenient(item) else {
                return item.get().to_owned();
            };
            let get = |key: &str| m.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v);
            let name = get("name");
            let resolves = name
                .and_then(raw::string_lenient)
                .is_some_and(|n| kind.resolves(&n));
            match (resolves, name) {
                (true, Some(name)) => object(&[
                    ("name", name.get()),
                    (
                        "enabled",
                        get("enabled").map_or(defaults.enabled.as_str(), RawValue::get),
                    ),
                    (
                        "permission_policy",
                        get("permission_policy").map_or(defaults.policy.as_str(), RawValue::get),
                    ),
                ]),
                // Resolves to no tool: not rebuilt, so it keeps every key.
                _ => item.get().to_owned(),
            }
        })
        .collect();
    format!("[{}]", rendered.join(","))
}

fn policy_json(p: PermissionPolicy) -> String {
    format!("{{\"type\":\"{}\"}}", p.as_str())
}

fn object(fields: &[(&str, &str)]) -> String {
    let body: Vec<String> = fields
        .iter()
        .map(|(k, v)| format!("{}:{v}", quote(k)))
        .collect();
    format!("{{{}}}", body.join(","))
}

fn quote(key: &str) -> String {
    serde_json::to_string(key).unwrap_or_else(|_| format!("\"{key}\""))
}
