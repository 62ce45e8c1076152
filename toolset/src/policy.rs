//! Permission policies: the closed set this platform can evaluate, and the
//! reading of a `permission_policy` object.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::error::ToolsetError;
use crate::{path, raw};

/// Whether a tool call runs at once or waits for a human.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionPolicy {
    /// The call runs without asking.
    AlwaysAllow,
    /// The call runs only after a human confirmed it.
    AlwaysAsk,
}

impl PermissionPolicy {
    /// The wire name (`always_allow`, `always_ask`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AlwaysAllow => "always_allow",
            Self::AlwaysAsk => "always_ask",
        }
    }

    /// The policy a wire name denotes, if this platform can evaluate it.
    pub fn from_wire(s: &str) -> Option<Self> {
        match s {
            "always_allow" => Some(Self::AlwaysAllow),
            "always_ask" => Some(Self::AlwaysAsk),
            _ => None,
        }
    }
}

impl fmt::Display for PermissionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `permission_policy` object whose shape has been checked but whose type
/// has not been evaluated yet: the agent toolset evaluates it only where a
/// live tool carries it.
#[derive(Debug, Clone)]
pub(crate) struct PolicyRef {
    /// Path of the `type` key, where an unevaluable value is reported.
    type_path: String,
    type_value: String,
}

impl PolicyRef {
    /// Reads the policy object at `at`. With `strict`, keys other than `type`
    /// are refused; without, they are ignored (a row stored before
    /// validation existed must still resolve).
    pub(crate) fn read(v: &RawValue, at: &str, strict: bool) -> Result<Self, ToolsetError> {
        let members = raw::object(v, at)?;
        if strict {
            members.only(at, &["type"])?;
        }
        let type_path = path::key(at, "type");
        let t = members.get("type").ok_or_else(|| ToolsetError::Missing {
            path: type_path.clone(),
        })?;
        let type_value = raw::string(t, &type_path)?;
        Ok(Self {
            type_path,
            type_value,
        })
    }

    /// The policy, or the refusal naming where the unevaluable type sits.
    pub(crate) fn evaluate(&self) -> Result<PermissionPolicy, ToolsetError> {
        PermissionPolicy::from_wire(&self.type_value).ok_or_else(|| {
            ToolsetError::UnevaluablePolicy {
                path: self.type_path.clone(),
                value: self.type_value.clone(),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_names_round_trip() {
        for p in [PermissionPolicy::AlwaysAllow, PermissionPolicy::AlwaysAsk] {
            assert_eq!(PermissionPolicy::from_wire(p.as_str()), Some(p));
            assert_eq!(
                serde_json::to_string(&p).expect("serialises"),
                format!("\"{p}\"")
            );
        }
        assert_eq!(PermissionPolicy::from_wire("always_deny"), None);
        assert_eq!(PermissionPolicy::from_wire("Always_Allow"), None);
    }
}
