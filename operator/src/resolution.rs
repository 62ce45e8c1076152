//! What a session resolves to: the materialised toolsets, the tools the
//! model is handed with their policies, the runner's toolset, and the
//! conditions that explain it. Pure: MCP listings come in as data.

use std::collections::BTreeMap;

use crds::{AgentSessionSpec, ToolStatus};
use toolset::{Entries, Entry, McpTool, ResolvedToolset};

use crate::validation::{self, CUSTOM_TYPE, EntryKind, TOOLS_PATH, valid_tool_name};

/// What listing one MCP server gave: its tools, or why there are none.
pub type Listings = BTreeMap<String, Result<Vec<McpTool>, String>>;

/// A condition to write, before timestamps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CondSpec {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The resolved view of one session.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolution {
    /// Every `tools[]` entry, materialised.
    pub toolsets: Vec<serde_json::Value>,
    /// Every enabled tool as the model is handed it.
    pub tools: Vec<ToolStatus>,
    /// Tool name -> policy, for every enabled tool.
    pub policies: BTreeMap<String, String>,
    /// What the runner enforces; `None` when the toolset is invalid and no
    /// pod may run.
    pub runner: Option<ResolvedToolset>,
    /// `ToolsetValid`, and `McpResolved` when any server is declared.
    pub conditions: Vec<CondSpec>,
    /// Things a human should hear about (Warning events).
    pub warnings: Vec<String>,
    /// Whether an MCP server must be listed again soon.
    pub retry_mcp: bool,
}

/// Applies the platform's verdict: a spec the session policy denies runs
/// no pod, and a `PolicyAllowed=False` condition names every denied field.
pub fn apply_policy(res: &mut Resolution, denied: &[validation::Finding]) {
    if denied.is_empty() {
        return;
    }
    let message: Vec<String> = denied.iter().map(ToString::to_string).collect();
    res.runner = None;
    res.conditions.push(CondSpec {
        type_: "PolicyAllowed",
        status: false,
        reason: "PolicyDenied".into(),
        message: message.join("; "),
    });
}

/// The model-facing name of MCP tool `tool` on `server`.
pub fn mcp_tool_name(server: &str, tool: &str) -> String {
    format!("mcp__{server}__{tool}")
}

/// The MCP servers whose listing the resolution needs.
pub fn servers_to_list(spec: &AgentSessionSpec, entries: &Entries) -> Vec<(String, String)> {
    spec.mcp_servers
        .iter()
        .filter(|s| {
            entries
                .iter()
                .any(|e| e.mcp_server() == Some(s.name.as_str()))
        })
        .map(|s| (s.name.clone(), s.url.clone()))
        .collect()
}

fn invalid(reason: &str, message: String) -> CondSpec {
    CondSpec {
        type_: "ToolsetValid",
        status: false,
        reason: reason.into(),
        message,
    }
}

/// Resolves a spec against the listings of its MCP servers; `entries` is
/// the spec's `tools[]` as [`validation::entries`] parsed it.
pub fn resolve(spec: &AgentSessionSpec, entries: &Entries, listings: &Listings) -> Resolution {
    resolve_checked(spec, entries, validation::check(spec, entries), listings)
}

/// [`resolve`] for a caller that already ran [`validation::check`] on the
/// same spec (the controller does, to decide whether to list servers).
pub fn resolve_checked(
    spec: &AgentSessionSpec,
    entries: &Entries,
    findings: validation::Findings,
    listings: &Listings,
) -> Resolution {
    let mut out = Resolution {
        toolsets: materialized(spec, entries),
        tools: Vec::new(),
        policies: BTreeMap::new(),
        runner: None,
        conditions: Vec::new(),
        warnings: Vec::new(),
        retry_mcp: false,
    };
    out.warnings.extend(findings.warnings.iter().cloned());
    if !findings.is_valid() {
        out.conditions
            .push(invalid("InvalidToolset", findings.denial()));
        return out;
    }
    let agent = entries.agent(TOOLS_PATH).ok().flatten();
    let runner = match ResolvedToolset::from_agent_entry(agent, TOOLS_PATH) {
        Ok(r) => r,
        Err(e) => {
            out.conditions
                .push(invalid("InvalidToolset", e.to_string()));
            return out;
        }
    };
    add_builtin(&runner, &mut out);
    let mut mcp = McpOutcome::default();
    for entry in entries.iter() {
        match &entry.kind {
            Ok(EntryKind::Custom { name: Some(name) }) => {
                out.tools
                    .push(custom_status(name, &spec.tools[entry.index]));
            }
            Ok(EntryKind::Mcp {
                server: Some(server),
            }) => resolve_mcp_entry(entry, server, listings, &mut out, &mut mcp),
            _ => {}
        }
    }
    if out.tools.len() > validation::MAX_TOOLS {
        // The spec itself passed the count (the webhook checks built-in and
        // custom tools), so the overflow is the MCP servers': their tools
        // are withheld and the sandbox keeps running with the rest, rather
        // than a server growing its list deleting the pod and its workspace.
        let listed = out.tools.len();
        let mcp_names: Vec<String> = out
            .tools
            .iter()
            .filter(|t| t.source.starts_with("mcp:"))
            .map(|t| t.name.clone())
            .collect();
        out.tools.retain(|t| !t.source.starts_with("mcp:"));
        for name in &mcp_names {
            out.policies.remove(name);
        }
        mcp.problems.push(format!(
            "{listed} tools resolved with the MCP servers' ({} of them), over the limit of {}; the MCP tools are withheld until a server lists fewer",
            mcp_names.len(),
            validation::MAX_TOOLS
        ));
        mcp.too_many = true;
    }
    out.conditions.push(CondSpec {
        type_: "ToolsetValid",
        status: true,
        reason: "Resolved".into(),
        message: format!("{} tools enabled", out.tools.len()),
    });
    mcp.conclude(&mut out);
    out.tools.shrink_to_fit();
    out.runner = Some(runner);
    out
}

/// Every entry materialised (defaults written out); an entry that cannot
/// be is echoed as stored.
fn materialized(spec: &AgentSessionSpec, entries: &Entries) -> Vec<serde_json::Value> {
    toolset::materialize_tools(Some(&entries.raw()))
        .unwrap_or_default()
        .into_iter()
        .zip(&spec.tools)
        .map(|(bytes, original)| {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| original.clone())
        })
        .collect()
}

/// The built-in tools the agent toolset enables, with their policies.
fn add_builtin(runner: &ResolvedToolset, out: &mut Resolution) {
    for def in &runner.tools {
        let policy = runner.policy(&def.name).map(|p| p.as_str().to_owned());
        if let Some(p) = &policy {
            out.policies.insert(def.name.clone(), p.clone());
        }
        out.tools.push(ToolStatus {
            name: def.name.clone(),
            source: toolset::AGENT_TOOLSET_TYPE.into(),
            policy,
            description: def.description.clone(),
            input_schema: def.input_schema.clone(),
        });
    }
}

/// A custom tool as the model is handed it (the client runs it; no policy).
fn custom_status(name: &str, value: &serde_json::Value) -> ToolStatus {
    ToolStatus {
        name: name.to_owned(),
        source: CUSTOM_TYPE.into(),
        policy: None,
        description: value
            .get("description")
            .and_then(|d| d.as_str())
            .unwrap_or_default()
            .to_owned(),
        input_schema: value.get("input_schema").cloned().unwrap_or_default(),
    }
}

/// What the MCP entries came to, for the McpResolved condition.
#[derive(Default)]
struct McpOutcome {
    any: bool,
    /// The servers listed more tools than a session may have.
    too_many: bool,
    problems: Vec<String>,
    unknown_configs: Vec<String>,
}

impl McpOutcome {
    fn conclude(self, out: &mut Resolution) {
        if !self.any {
            return;
        }
        let (status, reason, message) = if !self.problems.is_empty() {
            out.retry_mcp = true;
            let reason = if self.too_many {
                "TooManyTools"
            } else {
                "ServerUnavailable"
            };
            let mut all = self.problems;
            all.extend(self.unknown_configs.iter().cloned());
            (false, reason, all.join("; "))
        } else if !self.unknown_configs.is_empty() {
            (true, "UnknownConfigNames", self.unknown_configs.join("; "))
        } else {
            (
                true,
                "Resolved",
                "every MCP server listed its tools".to_owned(),
            )
        };
        out.warnings.extend(self.unknown_configs);
        out.conditions.push(CondSpec {
            type_: "McpResolved",
            status,
            reason: reason.into(),
            message,
        });
    }
}

/// One `mcp_toolset` entry against its server's listing.
fn resolve_mcp_entry(
    entry: &Entry,
    server: &str,
    listings: &Listings,
    out: &mut Resolution,
    mcp: &mut McpOutcome,
) {
    mcp.any = true;
    let i = entry.index;
    let reported = match listings.get(server) {
        None => return mcp.problems.push(format!("{server}: not listed yet")),
        Some(Err(why)) => return mcp.problems.push(format!("{server}: {why}")),
        Some(Ok(reported)) => reported,
    };
    let res = match toolset::resolve_mcp(&entry.raw, reported) {
        Ok(res) => res,
        Err(e) => {
            return mcp.problems.push(format!(
                "{server}: {}",
                e.with_prefix(&entry.path(TOOLS_PATH))
            ));
        }
    };
    for name in &res.unknown_configs {
        mcp.unknown_configs.push(format!(
            "spec.tools[{i}].configs names {name:?}, which server {server:?} does not report"
        ));
    }
    for t in res.tools {
        let name = mcp_tool_name(server, &t.tool.name);
        if !valid_tool_name(&name) {
            out.warnings.push(format!(
                "MCP tool {:?} of server {server:?} cannot be offered: {name:?} is not a valid tool name",
                t.tool.name
            ));
            continue;
        }
        out.policies
            .insert(name.clone(), t.policy.as_str().to_owned());
        out.tools.push(ToolStatus {
            name,
            source: format!("mcp:{server}"),
            policy: Some(t.policy.as_str().to_owned()),
            description: t.tool.description,
            input_schema: t.tool.input_schema,
        });
    }
}
