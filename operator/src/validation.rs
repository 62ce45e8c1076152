//! The rules a session's spec must pass, as one pure function shared by the
//! admission webhook, the controller (which never trusts that the webhook
//! ran) and `agent-operator check`.
//!
//! Per-entry rules are the toolset crate's; this module adds what only the
//! whole list can answer: one agent toolset, at most 128 tools, at most 20
//! MCP servers with unique names, every server used and every toolset's
//! server declared.

use std::collections::{HashMap, HashSet};
use std::fmt;

use crds::AgentSessionSpec;
pub use toolset::{CUSTOM_TYPE, EntryKind, classify};
use toolset::{Entries, Entry, ToolsetError};

/// Most tools one session may hand the model.
pub const MAX_TOOLS: usize = 128;
/// Most MCP servers one session may declare.
pub const MAX_MCP_SERVERS: usize = 20;
/// Where a session's `tools[]` sits, for paths in findings.
pub const TOOLS_PATH: &str = "spec.tools";

/// One thing wrong with a spec, at a JSON path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub path: String,
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

impl From<ToolsetError> for Finding {
    fn from(e: ToolsetError) -> Self {
        let path = e.path().unwrap_or_default().to_owned();
        let text = e.to_string();
        // The toolset error prints "path: message"; keep only the message.
        let message = text
            .strip_prefix(&format!("{path}: "))
            .map_or_else(|| text.clone(), str::to_owned);
        Self { path, message }
    }
}

/// What a spec's check found: errors deny, warnings are shown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Findings {
    pub errors: Vec<Finding>,
    pub warnings: Vec<String>,
}

impl Findings {
    /// Whether the spec may be stored.
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }

    /// All errors in one message, the form an admission denial carries.
    pub fn denial(&self) -> String {
        let lines: Vec<String> = self.errors.iter().map(ToString::to_string).collect();
        lines.join("; ")
    }
}

/// Decodes a spec, naming the path of the first thing that does not fit it
/// (`spec.mcpServers[0].url`; `spec` itself for a missing field or a spec
/// that is not an object, the message then naming the field).
pub fn decode_spec(value: serde_json::Value) -> Result<AgentSessionSpec, Finding> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = match e.path().to_string().as_str() {
            "." => "spec".to_owned(),
            p => format!("spec.{p}"),
        };
        Finding {
            path,
            message: e.into_inner().to_string(),
        }
    })
}

/// The parsed `tools[]` of a spec: each entry serialised and classified
/// once, for the check and the resolution alike.
pub fn entries(spec: &AgentSessionSpec) -> Entries {
    Entries::parse(
        spec.tools
            .iter()
            .map(|v| serde_json::to_vec(v).unwrap_or_default()),
    )
}

/// Checks a spec. Entry-level errors name `spec.tools[i]...`.
pub fn check_spec(spec: &AgentSessionSpec) -> Findings {
    check(spec, &entries(spec))
}

/// Tool names enabled so far, for the count and the uniqueness rules.
#[derive(Default)]
struct Names {
    count: usize,
    taken: HashSet<String>,
}

/// Checks a spec whose `tools[]` is already parsed.
pub fn check(spec: &AgentSessionSpec, entries: &Entries) -> Findings {
    let mut out = Findings::default();
    let mut names = Names::default();
    let mut used_servers: Vec<(usize, String)> = Vec::new();
    let mut server_entry: HashMap<String, usize> = HashMap::new();
    let agent = match entries.agent(TOOLS_PATH) {
        Ok(a) => a.map(|e| e.index),
        Err(e) => {
            out.errors.push(e.into());
            entries
                .iter()
                .find(|e| e.kind == Ok(EntryKind::Agent))
                .map(|e| e.index)
        }
    };
    for entry in entries.iter() {
        let at = entry.path(TOOLS_PATH);
        match &entry.kind {
            Err(message) => out.errors.push(Finding {
                path: at,
                message: message.clone(),
            }),
            // A second agent entry is the one-toolset rule's finding above.
            Ok(EntryKind::Agent) if Some(entry.index) != agent => {}
            Ok(EntryKind::Agent) => check_agent(entry, &at, &mut names, &mut out),
            Ok(EntryKind::Mcp { server }) => {
                let used = (&mut used_servers, &mut server_entry);
                check_mcp(entry, server.as_deref(), &at, used, &mut out);
            }
            Ok(EntryKind::Custom { name }) => {
                check_custom_entry(entry, name.as_deref(), &at, &mut names, &mut out);
            }
        }
    }
    if names.count > MAX_TOOLS {
        out.errors.push(Finding {
            path: TOOLS_PATH.into(),
            message: format!(
                "{} tools enabled; at most {MAX_TOOLS} are allowed",
                names.count
            ),
        });
    }
    check_servers(spec, &used_servers, &mut out);
    check_lifecycle(spec, &mut out);
    check_warm_pool(spec, &mut out);
    check_from(spec, &mut out);
    out
}

/// Whether `name` can name an object: a DNS subdomain.
fn is_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// `spec.from` names one AgentCheckpoint or one AgentSession of the
/// session's namespace; a fork that also names a warm pool is told now
/// that it always starts cold.
fn check_from(spec: &AgentSessionSpec, out: &mut Findings) {
    let Some(from) = &spec.from else {
        return;
    };
    let named = [
        ("spec.from.checkpoint", from.checkpoint.as_deref()),
        ("spec.from.session", from.session.as_deref()),
    ];
    if named.iter().filter(|(_, name)| name.is_some()).count() != 1 {
        out.errors.push(Finding {
            path: "spec.from".into(),
            message: "name a checkpoint or a session to fork, exactly one of the two".into(),
        });
    }
    for (path, name) in named {
        if let Some(name) = name.filter(|n| !is_object_name(n)) {
            out.errors.push(Finding {
                path: path.into(),
                message: format!(
                    "{:?} is not an object name (lowercase letters, digits, '-' and '.', at most 253)",
                    toolset::truncate_runes(name, 64)
                ),
            });
        }
    }
    if spec.warm_pool.is_some() {
        out.warnings.push(
            "spec.warmPool: a fork (spec.from) always starts cold (a warm pod cannot import its checkpoint)".into(),
        );
    }
}

/// Suspension removes the pod: only a claim keeps the workspace (and the
/// bash state kept on it) across it. An idle session is either suspended or
/// ended, not both.
fn check_lifecycle(spec: &AgentSessionSpec, out: &mut Findings) {
    let claim = spec
        .workspace
        .as_ref()
        .is_some_and(|w| w.volume_claim_template.is_some());
    let lifetime = spec.lifetime.as_ref();
    let needs_claim = |path: &str| {
        Finding {
        path: path.into(),
        message: "suspending removes the pod, and an emptyDir workspace with it; set spec.workspace.volumeClaimTemplate".into(),
    }
    };
    if spec.suspended == Some(true) && !claim {
        out.errors.push(needs_claim("spec.suspended"));
    }
    if let Some(l) = lifetime {
        if l.idle_suspend_seconds.is_some() && !claim {
            out.errors
                .push(needs_claim("spec.lifetime.idleSuspendSeconds"));
        }
        if l.idle_suspend_seconds.is_some() && l.idle_timeout_seconds.is_some() {
            out.errors.push(Finding {
                path: "spec.lifetime.idleSuspendSeconds".into(),
                message: "set idleSuspendSeconds (suspend when idle) or idleTimeoutSeconds (end when idle), not both".into(),
            });
        }
    }
}

/// `spec.warmPool` names an object: a DNS subdomain. A session that asks
/// for what no warm pod can be (a persistent workspace, a suspension) is
/// told now that it will always start cold, rather than after each claim.
fn check_warm_pool(spec: &AgentSessionSpec, out: &mut Findings) {
    let Some(pool) = spec.warm_pool.as_deref() else {
        return;
    };
    if !is_object_name(pool) {
        out.errors.push(Finding {
            path: "spec.warmPool".into(),
            message: format!(
                "{:?} is not an object name (lowercase letters, digits, '-' and '.', at most 253)",
                toolset::truncate_runes(pool, 64)
            ),
        });
        return;
    }
    let claim = spec
        .workspace
        .as_ref()
        .is_some_and(|w| w.volume_claim_template.is_some());
    if claim {
        out.warnings.push(
            "spec.warmPool: a session with a persistent workspace always starts cold (its claim cannot be made ahead of it)".into(),
        );
    }
}

fn check_agent(entry: &Entry, at: &str, names: &mut Names, out: &mut Findings) {
    if let Err(e) = toolset::validate(&entry.raw) {
        out.errors.push(e.with_prefix(at).into());
        return;
    }
    let tools = toolset::tools(&entry.raw).unwrap_or_default();
    names.count += tools.len();
    names.taken.extend(tools.into_iter().map(|t| t.name));
    for web in toolset::enabled_web_tools(&entry.raw).unwrap_or_default() {
        out.warnings.push(format!(
            "{at}: {web} is enabled but this platform has no web driver; the model will not be offered it"
        ));
    }
}

fn check_mcp(
    entry: &Entry,
    server: Option<&str>,
    at: &str,
    (used, first_entry): (&mut Vec<(usize, String)>, &mut HashMap<String, usize>),
    out: &mut Findings,
) {
    if let Err(e) = toolset::validate_mcp_toolset(&entry.raw) {
        out.errors.push(e.with_prefix(at).into());
    }
    let Some(server) = server else { return };
    if let Some(first) = first_entry.get(server) {
        out.errors.push(Finding {
            path: format!("{at}.mcp_server_name"),
            message: format!(
                "server {server:?} already has an mcp_toolset entry at spec.tools[{first}]"
            ),
        });
    } else {
        first_entry.insert(server.to_owned(), entry.index);
        used.push((entry.index, server.to_owned()));
    }
}

fn check_custom_entry(
    entry: &Entry,
    name: Option<&str>,
    at: &str,
    names: &mut Names,
    out: &mut Findings,
) {
    if let Err(f) = check_custom(&entry.raw, at) {
        out.errors.push(f);
        return;
    }
    let Some(name) = name else { return };
    names.count += 1;
    if !names.taken.insert(name.to_owned()) {
        out.errors.push(Finding {
            path: format!("{at}.name"),
            message: format!("tool name {name:?} is already taken by another tool"),
        });
    }
}

fn check_servers(spec: &AgentSessionSpec, used: &[(usize, String)], out: &mut Findings) {
    if spec.mcp_servers.len() > MAX_MCP_SERVERS {
        out.errors.push(Finding {
            path: "spec.mcpServers".into(),
            message: format!(
                "{} servers declared; at most {MAX_MCP_SERVERS} are allowed",
                spec.mcp_servers.len()
            ),
        });
    }
    // Names to first index and the names referenced: lookups by hash, so a
    // spec of many servers and entries is checked in linear time.
    let mut declared: HashMap<&str, usize> = HashMap::new();
    let referenced: HashSet<&str> = used.iter().map(|(_, s)| s.as_str()).collect();
    for (i, server) in spec.mcp_servers.iter().enumerate() {
        let at = format!("spec.mcpServers[{i}]");
        if let Some(&first) = declared.get(server.name.as_str()) {
            out.errors.push(Finding {
                path: format!("{at}.name"),
                message: format!(
                    "server name {:?} is already declared at spec.mcpServers[{first}]",
                    server.name
                ),
            });
        }
        if server.kind != "url" {
            out.errors.push(Finding {
                path: format!("{at}.type"),
                message: format!("unsupported server type {:?}; only \"url\" is", server.kind),
            });
        }
        if !(server.url.starts_with("http://") || server.url.starts_with("https://")) {
            out.errors.push(Finding {
                path: format!("{at}.url"),
                message: format!("{:?} is not an http:// or https:// URL", server.url),
            });
        } else if server.url.starts_with("http://") {
            out.warnings.push(format!(
                "{at}.url: {} is plain HTTP; tool listings and calls travel unencrypted",
                server.url
            ));
        }
        declared.entry(server.name.as_str()).or_insert(i);
        if !referenced.contains(server.name.as_str()) {
            out.errors.push(Finding {
                path: format!("{at}.name"),
                message: format!(
                    "server {:?} is declared but no mcp_toolset entry references it",
                    server.name
                ),
            });
        }
    }
    for (i, name) in used {
        if !declared.contains_key(name.as_str()) {
            out.errors.push(Finding {
                path: format!("spec.tools[{i}].mcp_server_name"),
                message: format!("server {name:?} is not declared in spec.mcpServers"),
            });
        }
    }
}

/// A custom tool: `{type, name, description?, input_schema}`, the name as
/// the model endpoint accepts tool names.
fn check_custom(raw: &[u8], at: &str) -> Result<(), Finding> {
    let fail = |path: String, message: String| Err(Finding { path, message });
    let value: serde_json::Value = serde_json::from_slice(raw).unwrap_or_default();
    let obj = value.as_object().cloned().unwrap_or_default();
    for key in obj.keys() {
        if !["type", "name", "description", "input_schema"].contains(&key.as_str()) {
            return fail(
                format!("{at}.{key}"),
                "unknown key; allowed here: type, name, description, input_schema".into(),
            );
        }
    }
    match obj.get("name").and_then(|n| n.as_str()) {
        None => return fail(format!("{at}.name"), "required string is missing".into()),
        Some(n) if !valid_tool_name(n) => {
            return fail(
                format!("{at}.name"),
                format!("{n:?} is not a tool name (1-64 of A-Z a-z 0-9 _ -)"),
            );
        }
        Some(n) if toolset::BUILTIN_TOOLS.contains(&n) || toolset::is_web_tool(n) => {
            return fail(
                format!("{at}.name"),
                format!("{n:?} is a built-in tool's name; pick another"),
            );
        }
        Some(_) => {}
    }
    if let Some(d) = obj.get("description")
        && !d.is_string()
    {
        return fail(format!("{at}.description"), "expected a string".into());
    }
    match obj.get("input_schema") {
        Some(s) if s.is_object() => Ok(()),
        Some(_) => fail(
            format!("{at}.input_schema"),
            "expected an object (a JSON schema)".into(),
        ),
        None => fail(
            format!("{at}.input_schema"),
            "required object is missing".into(),
        ),
    }
}

/// Tool names as the model endpoint accepts them.
pub fn valid_tool_name(n: &str) -> bool {
    (1..=64).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}
