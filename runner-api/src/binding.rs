//! What a warm pool's sandbox learns when a session claims it.
//!
//! A warm pod starts before any session exists, so the session's own parts
//! -- its toolset, the values of its environment, its name -- reach the
//! runner late, through files the operator writes into the pod's toolset
//! ConfigMap after adopting the pod. The toolset travels in its usual file;
//! the rest travels here. The operator writes this type and the runner
//! reads it, so the two cannot disagree on a field name.

use serde::{Deserialize, Serialize};

/// The binding file's name inside the toolset directory.
pub const BINDING_FILE: &str = "binding.json";
/// The largest binding file the runner reads (a ConfigMap holds 1 MiB).
pub const MAX_BINDING_BYTES: u64 = 1 << 20;
/// The most environment variables a binding may carry (a session's spec
/// allows 128).
pub const MAX_BINDING_ENV: usize = 128;

/// The session a warm sandbox now serves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Binding {
    /// The session's name, for the runner's logs.
    pub session: String,
    /// The session's environment (plain values only: a reference to a
    /// Secret or ConfigMap is resolved by the kubelet, so a session with one
    /// is never served warm). Every bash call sees these, over the pool
    /// template's own values of the same names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<BoundEnv>,
}

/// One environment variable of a binding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundEnv {
    pub name: String,
    pub value: String,
}
