//! The `AgentCheckpoint` custom resource (issue 25, docs/checkpoints.md):
//! the operator's checkpoint wing takes it onto a volume of its own, and a
//! session with `spec.from` (naming the checkpoint, or a session the
//! operator checkpoints for it) starts from it.
//!
//! A checkpoint is a named, immutable copy of one session's workspace and
//! bash state (working directory, exported variables, functions), taken
//! while the session runs. Immutable: the spec cannot change after
//! creation (a CEL rule, `self == oldSelf`, refuses it at the API
//! server), so a fork started from it always starts from the same state.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A copy of a session's workspace and shell state.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "agentplane.dev",
    version = "v1alpha1",
    kind = "AgentCheckpoint",
    plural = "agentcheckpoints",
    singular = "agentcheckpoint",
    shortname = "ackpt",
    category = "agentplane",
    namespaced,
    status = "AgentCheckpointStatus",
    printcolumn = r#"{"name":"Session","type":"string","jsonPath":".spec.source.session"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Size","type":"integer","jsonPath":".status.sizeBytes"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self == oldSelf").message("an AgentCheckpoint's spec is immutable; make a new checkpoint"))]
pub struct AgentCheckpointSpec {
    /// What is copied.
    pub source: CheckpointSource,
    /// Whether bash's state travels with the files (default true).
    #[serde(default = "yes")]
    pub shell_state: bool,
    /// Most bytes of file content; the checkpoint fails past it. Absent,
    /// what the platform's default checkpoint volume holds; more than its
    /// largest volume (operator `--checkpoint-max-size`) fails.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_bytes: Option<u64>,
    /// How the files are copied. Absent: a VolumeSnapshot where the
    /// session's workspace allows one (a claim whose StorageClass's driver
    /// has a VolumeSnapshotClass, all of the workdir, no env from Secrets),
    /// an archive otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<CheckpointMethod>,
}

/// How a checkpoint's files are copied.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CheckpointMethod {
    /// The runner archives the workdir onto a volume of the checkpoint's
    /// own; forks import it. Works on any storage.
    Archive,
    /// A VolumeSnapshot of the session's workspace claim, cut while the
    /// runner holds the workspace still; forks' claims are made from it.
    VolumeSnapshot,
}

fn yes() -> bool {
    true
}

/// The session a checkpoint copies: in the checkpoint's namespace, so a
/// tenant can copy (and later fork) only within it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointSource {
    /// The AgentSession's name.
    #[schemars(length(min = 1, max = 253))]
    pub session: String,
    /// Below the session's workdir; empty (the default) is all of it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 4096))]
    pub path: String,
}

/// Where a checkpoint is.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum CheckpointPhase {
    /// Accepted, not started (the session is not Ready yet).
    Pending,
    /// The runner is archiving (calls that change the workspace wait).
    Taking,
    /// Stored; forks may start from it.
    Ready,
    /// Could not be taken; the Ready condition says why.
    Failed,
}

/// What the operator reports about a checkpoint.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentCheckpointStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<CheckpointPhase>,
    /// Bytes of file content copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Files, directories and links copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// What the runner left out (its own files, FIFOs, sockets), counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<u64>,
    /// When the archive was complete (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_at: Option<String>,
    /// Failed attempts so far (at most 5, then Failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// How the files were copied (chosen once, when the take starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<CheckpointMethod>,
    /// The VolumeSnapshot, for that method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot: Option<String>,
    /// The StorageClass a fork's workspace claim is made in, for that
    /// method (the source claim's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// The Secret with bash's state, for that method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn the_sketch_renders_and_defaults_to_carrying_shell_state() {
        let crd = AgentCheckpoint::crd();
        assert_eq!(crd.spec.names.kind, "AgentCheckpoint");
        assert_eq!(crd.spec.names.short_names, Some(vec!["ackpt".to_owned()]));
        let spec: AgentCheckpointSpec =
            serde_json::from_value(serde_json::json!({"source": {"session": "demo"}}))
                .expect("spec");
        assert!(spec.shell_state);
        assert_eq!(spec.source.path, "");
        assert_eq!(spec.max_bytes, None);
    }
}
