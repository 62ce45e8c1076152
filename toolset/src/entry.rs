//! A session's `tools[]`, classified once.
//!
//! The webhook's check, the status resolution and the runner's toolset all
//! need to know which entry is which and where the one agent toolset is.
//! Working that out separately in each place let the answers drift (a
//! classifier that decoded through `serde_json::Value` next to one that
//! walked the raw bytes), so it happens here, once per entry, and every
//! consumer reads the same [`Entries`].

use crate::agent::AGENT_TOOLSET_TYPE;
use crate::error::ToolsetError;
use crate::mcp::MCP_TOOLSET_TYPE;
use crate::{path, raw};

/// The entry type of a tool the client executes itself (model-facing only:
/// it enables nothing in the sandbox).
pub const CUSTOM_TYPE: &str = "custom";

/// What one `tools[]` entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    /// `agent_toolset_20260401`: the sandbox's built-in tools.
    Agent,
    /// `mcp_toolset`, with its server's name when it gives a non-empty string.
    Mcp { server: Option<String> },
    /// `custom`, with its tool's name when it gives a string.
    Custom { name: Option<String> },
}

/// One `tools[]` entry: where it sits, its bytes as stored, and its kind (or
/// why it has none, as a message relative to the entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub index: usize,
    pub raw: Vec<u8>,
    pub kind: Result<EntryKind, String>,
}

impl Entry {
    /// Classifies the entry at `index`.
    pub fn new(index: usize, raw: Vec<u8>) -> Self {
        let kind = classify(&raw);
        Self { index, raw, kind }
    }

    /// The entry's path under `base` (e.g. `spec.tools[3]`).
    pub fn path(&self, base: &str) -> String {
        path::index(base, self.index)
    }

    /// The MCP server an `mcp_toolset` entry names.
    pub fn mcp_server(&self) -> Option<&str> {
        match &self.kind {
            Ok(EntryKind::Mcp { server }) => server.as_deref(),
            _ => None,
        }
    }
}

/// Every entry of one `tools[]`, in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entries(pub Vec<Entry>);

impl Entries {
    /// Classifies each entry's raw JSON once.
    pub fn parse<T: Into<Vec<u8>>>(raw: impl IntoIterator<Item = T>) -> Self {
        Self(
            raw.into_iter()
                .enumerate()
                .map(|(i, bytes)| Entry::new(i, bytes.into()))
                .collect(),
        )
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Entry> {
        self.0.iter()
    }

    /// The raw bytes of every entry, in order.
    pub fn raw(&self) -> Vec<&[u8]> {
        self.0.iter().map(|e| e.raw.as_slice()).collect()
    }

    /// The session's one agent toolset entry, if any. A session holds at most
    /// one: two would leave "which policy governs bash" to entry order. The
    /// error names the second entry under `base` and the first.
    pub fn agent(&self, base: &str) -> Result<Option<&Entry>, ToolsetError> {
        let mut agents = self
            .0
            .iter()
            .filter(|e| e.kind.as_ref() == Ok(&EntryKind::Agent));
        let first = agents.next();
        match (first, agents.next()) {
            (Some(first), Some(second)) => Err(ToolsetError::DuplicateToolset {
                path: second.path(base),
                kind: AGENT_TOOLSET_TYPE,
                first: first.path(base),
            }),
            (first, None) => Ok(first),
            (None, Some(_)) => Ok(None),
        }
    }
}

/// Names the kind of an entry, or says why it has none. The last `type`
/// wins, as it would for any JSON decoder; a repeated key is refused later
/// by the entry's own validation, with its path.
pub fn classify(raw_entry: &[u8]) -> Result<EntryKind, String> {
    let root = raw::parse(raw_entry).map_err(|e| e.to_string())?;
    let Some(members) = raw::object_lenient(root) else {
        return Err("expected an object".into());
    };
    let last = |key: &str| members.0.iter().rev().find(|(k, _)| k == key).map(|m| m.1);
    let Some(t) = last("type") else {
        return Err(format!(
            "type: required but missing; one of {AGENT_TOOLSET_TYPE}, {MCP_TOOLSET_TYPE}, {CUSTOM_TYPE}"
        ));
    };
    let string_of = |key: &str| last(key).and_then(raw::string_lenient);
    match raw::string_lenient(t).as_deref() {
        Some(AGENT_TOOLSET_TYPE) => Ok(EntryKind::Agent),
        Some(MCP_TOOLSET_TYPE) => Ok(EntryKind::Mcp {
            server: string_of("mcp_server_name").filter(|s| !s.is_empty()),
        }),
        Some(CUSTOM_TYPE) => Ok(EntryKind::Custom {
            name: string_of("name"),
        }),
        Some(other) => Err(format!(
            "type: unknown tool type {other:?}; one of {AGENT_TOOLSET_TYPE}, {MCP_TOOLSET_TYPE}, {CUSTOM_TYPE}"
        )),
        None => Err("type: expected a string".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(raw: &[&str]) -> Vec<Result<EntryKind, String>> {
        Entries::parse(raw.iter().map(|s| s.as_bytes().to_vec()))
            .iter()
            .map(|e| e.kind.clone())
            .collect()
    }

    #[test]
    fn each_kind_and_each_reason_for_none() {
        let got = kinds(&[
            r#"{"type":"agent_toolset_20260401"}"#,
            r#"{"type":"mcp_toolset","mcp_server_name":"gh"}"#,
            r#"{"type":"mcp_toolset","mcp_server_name":""}"#,
            r#"{"type":"custom","name":"lookup"}"#,
            r#"{"type":"custom","name":7}"#,
            r#"[]"#,
            r#"{}"#,
            r#"{"type":"web"}"#,
            r#"{"type":null}"#,
        ]);
        assert_eq!(got[0], Ok(EntryKind::Agent));
        assert_eq!(
            got[1],
            Ok(EntryKind::Mcp {
                server: Some("gh".into())
            })
        );
        assert_eq!(got[2], Ok(EntryKind::Mcp { server: None }));
        assert_eq!(
            got[3],
            Ok(EntryKind::Custom {
                name: Some("lookup".into())
            })
        );
        assert_eq!(got[4], Ok(EntryKind::Custom { name: None }));
        assert_eq!(got[5], Err("expected an object".into()));
        assert!(
            got[6]
                .as_ref()
                .unwrap_err()
                .starts_with("type: required but missing")
        );
        assert!(
            got[7]
                .as_ref()
                .unwrap_err()
                .starts_with("type: unknown tool type \"web\"")
        );
        assert_eq!(got[8], Err("type: expected a string".into()));
    }

    #[test]
    fn the_last_type_wins_as_for_a_decoder() {
        let got = kinds(&[r#"{"type":"custom","type":"agent_toolset_20260401"}"#]);
        assert_eq!(got[0], Ok(EntryKind::Agent));
    }

    #[test]
    fn one_agent_toolset_and_the_second_is_named() {
        let agent = r#"{"type":"agent_toolset_20260401"}"#;
        let custom = r#"{"type":"custom","name":"x"}"#;
        let one = Entries::parse([custom, agent].map(|s| s.as_bytes().to_vec()));
        assert_eq!(one.agent("tools").unwrap().map(|e| e.index), Some(1));
        let none = Entries::parse([custom].map(|s| s.as_bytes().to_vec()));
        assert_eq!(none.agent("tools").unwrap(), None);
        let two = Entries::parse([agent, custom, agent].map(|s| s.as_bytes().to_vec()));
        let err = two.agent("spec.tools").unwrap_err().to_string();
        assert!(
            err.contains("spec.tools[2]") && err.contains("spec.tools[0]"),
            "{err}"
        );
    }
}
