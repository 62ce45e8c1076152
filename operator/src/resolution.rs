//! What a session resolves to: the materialised toolsets, the tools the
//! model is handed with their policies, the runner's toolset, and the
//! conditions that explain it. Pure: MCP listings come in as data.

use std::collections::BTreeMap;

use crds::{AgentSessionSpec, ToolStatus};
use toolset::{McpTool, ResolvedToolset};

use crate::validation::{self, CUSTOM_TYPE, EntryKind, valid_tool_name};

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

/// The model-facing name of MCP tool `tool` on `server`.
pub fn mcp_tool_name(server: &str, tool: &str) -> String {
    format!("mcp__{server}__{tool}")
}

/// The MCP servers whose listing the resolution needs.
pub fn servers_to_list(spec: &AgentSessionSpec) -> Vec<(String, String)> {
    spec.mcp_servers
        .iter()
        .filter(|s| {
            spec.tools.iter().any(|t| {
                t.get("type").and_then(|v| v.as_str()) == Some(toolset::MCP_TOOLSET_TYPE)
                    && t.get("mcp_server_name").and_then(|v| v.as_str()) == Some(s.name.as_str())
            })
        })
        .map(|s| (s.name.clone(), s.url.clone()))
        .collect()
}

/// Resolves a spec against the listings of its MCP servers.
pub fn resolve(spec: &AgentSessionSpec, listings: &Listings) -> Resolution {
    let entries: Vec<Vec<u8>> = spec
        .tools
        .iter()
        .map(|v| serde_json::to_vec(v).unwrap_or_default())
        .collect();
    let toolsets = toolset::materialize_tools(Some(&entries))
        .unwrap_or_default()
        .into_iter()
        .zip(&spec.tools)
        .map(|(bytes, original)| {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| original.clone())
        })
        .collect();

    let mut out = Resolution {
        toolsets,
        tools: Vec::new(),
        policies: BTreeMap::new(),
        runner: None,
        conditions: Vec::new(),
        warnings: Vec::new(),
        retry_mcp: false,
    };

    let findings = validation::check_spec(spec);
    out.warnings.extend(findings.warnings.iter().cloned());
    if !findings.is_valid() {
        out.conditions.push(CondSpec {
            type_: "ToolsetValid",
            status: false,
            reason: "InvalidToolset".into(),
            message: findings.denial(),
        });
        return out;
    }

    let runner = match ResolvedToolset::from_entries(&entries) {
        Ok(r) => r,
        Err(e) => {
            out.conditions.push(CondSpec {
                type_: "ToolsetValid",
                status: false,
                reason: "InvalidToolset".into(),
                message: format!("spec.{e}"),
            });
            return out;
        }
    };
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

    let mut mcp_problems: Vec<String> = Vec::new();
    let mut unknown_notes: Vec<String> = Vec::new();
    let mut any_mcp = false;
    for (i, (raw, value)) in entries.iter().zip(&spec.tools).enumerate() {
        match validation::classify(raw) {
            Ok(EntryKind::Custom { name: Some(name) }) => out.tools.push(ToolStatus {
                name,
                source: CUSTOM_TYPE.into(),
                policy: None,
                description: value
                    .get("description")
                    .and_then(|d| d.as_str())
                    .unwrap_or_default()
                    .to_owned(),
                input_schema: value.get("input_schema").cloned().unwrap_or_default(),
            }),
            Ok(EntryKind::Mcp {
                server: Some(server),
            }) => {
                any_mcp = true;
                match listings.get(&server) {
                    None => mcp_problems.push(format!("{server}: not listed yet")),
                    Some(Err(why)) => mcp_problems.push(format!("{server}: {why}")),
                    Some(Ok(reported)) => match toolset::resolve_mcp(raw, reported) {
                        Err(e) => mcp_problems.push(format!(
                            "{server}: {}",
                            e.with_prefix(&format!("spec.tools[{i}]"))
                        )),
                        Ok(res) => {
                            for name in &res.unknown_configs {
                                unknown_notes.push(format!(
                                    "spec.tools[{i}].configs names {name:?}, which server {server:?} does not report"
                                ));
                            }
                            for t in res.tools {
                                let name = mcp_tool_name(&server, &t.tool.name);
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
                    },
                }
            }
            _ => {}
        }
    }

    if out.tools.len() > validation::MAX_TOOLS {
        out.conditions.push(CondSpec {
            type_: "ToolsetValid",
            status: false,
            reason: "TooManyTools".into(),
            message: format!(
                "{} tools resolved (MCP servers included); at most {} are allowed",
                out.tools.len(),
                validation::MAX_TOOLS
            ),
        });
        out.tools.clear();
        out.policies.clear();
        return out;
    }

    out.conditions.push(CondSpec {
        type_: "ToolsetValid",
        status: true,
        reason: "Resolved".into(),
        message: format!("{} tools enabled", out.tools.len()),
    });
    if any_mcp {
        let (status, reason, message) = if !mcp_problems.is_empty() {
            out.retry_mcp = true;
            let mut all = mcp_problems;
            all.extend(unknown_notes.iter().cloned());
            (false, "ServerUnavailable", all.join("; "))
        } else if !unknown_notes.is_empty() {
            (true, "UnknownConfigNames", unknown_notes.join("; "))
        } else {
            (
                true,
                "Resolved",
                "every MCP server listed its tools".to_owned(),
            )
        };
        out.warnings.extend(unknown_notes);
        out.conditions.push(CondSpec {
            type_: "McpResolved",
            status,
            reason: reason.into(),
            message,
        });
    }
    out.tools.shrink_to_fit();
    out.runner = Some(runner);
    out
}
