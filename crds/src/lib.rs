//! The `AgentSession` custom resource.
//!
//! A session is one agent's sandbox: the image its tools run in, where they
//! start, and the agent's `tools[]` exactly as the Managed Agents API takes
//! them. `spec.tools` is kept as the client wrote it (unknown fields
//! preserved) so that a misspelt key reaches the admission webhook and is
//! refused by name, instead of being pruned silently by the API server.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    EnvVar, PersistentVolumeClaimSpec, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

pub mod checkpoint;
pub mod conditions;
pub mod environment;
pub mod pool;
pub use checkpoint::{
    AgentCheckpoint, AgentCheckpointSpec, AgentCheckpointStatus, CheckpointMethod, CheckpointPhase,
    CheckpointSource,
};
pub use environment::{
    AgentEnvironment, AgentEnvironmentSpec, AgentEnvironmentStatus, EnvironmentSandbox,
    KeySecretRef, MemorySync,
};
pub use pool::{AgentWarmPool, AgentWarmPoolSpec, AgentWarmPoolStatus, WarmPoolTemplate};

/// The API group this project owns.
pub const GROUP: &str = "agentplane.dev";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";
/// The annotation that asks an idle-suspended session to wake: an RFC 3339
/// time later than its suspension. `kubectl agent` sets it for a session
/// with `lifetime.wakeOnCall`; the operator watches for it.
pub const WAKE_ANNOTATION: &str = "agentplane.dev/wake";

/// An agent session: a hardened sandbox pod whose built-in runner executes
/// the agent's tools (bash, read, write, edit, glob, grep) inside the
/// session's image.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "agentplane.dev",
    version = "v1alpha1",
    kind = "AgentSession",
    plural = "agentsessions",
    singular = "agentsession",
    shortname = "ags",
    category = "agentplane",
    namespaced,
    status = "AgentSessionStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Suspended","type":"boolean","jsonPath":".spec.suspended"}"#,
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".status.podName"}"#,
    printcolumn = r#"{"name":"Tools","type":"integer","jsonPath":".status.toolCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AgentSessionSpec {
    /// Container image the sandbox runs. It must provide /bin/bash (GNU grep
    /// and coreutils are expected by the grep and glob tools); the runner
    /// binary is injected into it, so the image needs nothing else.
    #[x_kube(validation = Rule::new("self != ''").message("image must not be empty"))]
    pub image: String,

    /// Absolute directory where the tools start and relative paths resolve.
    /// It is backed by the session's workspace volume. Default /workspace.
    #[serde(default = "default_workdir")]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("workdir must be an absolute path"))]
    pub workdir: String,

    /// The agent's tools[], exactly as the Managed Agents API takes them:
    /// one `agent_toolset_20260401` entry (the six sandbox tools), any
    /// number of `mcp_toolset` entries, and custom tools. Stored as written;
    /// the admission webhook validates it and names the JSON path of any
    /// error, and status shows the resolved result.
    #[serde(default)]
    #[schemars(schema_with = "tool_entries")]
    pub tools: Vec<serde_json::Value>,

    /// MCP servers the mcp_toolset entries draw from, by name. At most 20,
    /// names unique; every server must be referenced by an mcp_toolset entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 20))]
    #[x_kube(validation = Rule::new("self.all(s, self.exists_one(t, t.name == s.name))").message("mcpServers names must be unique"))]
    pub mcp_servers: Vec<McpServer>,

    /// Compute resources of the sandbox container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Environment of the sandbox container (and so of every bash call).
    /// At most 128 variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub env: Vec<EnvVar>,

    /// RuntimeClass for stronger isolation (e.g. gVisor or Kata), passed
    /// through to the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,

    /// Node selector of the sandbox pod (at most 16 terms).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub node_selector: BTreeMap<String, String>,

    /// Tolerations of the sandbox pod (at most 16).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tolerations: Vec<Toleration>,

    /// Storage behind the workdir: an emptyDir by default (gone with the
    /// pod), or a PersistentVolumeClaim the operator creates and owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceStorage>,

    /// How long the session may live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lifetime: Option<Lifetime>,

    /// Suspend the session: its pod is removed and its workspace claim, its
    /// toolset and bash's state (cwd, exported variables, functions, kept on
    /// the workspace) stay; `false` brings a pod back where it left off.
    /// Needs a `workspace.volumeClaimTemplate` (an emptyDir would be lost).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspended: Option<bool>,

    /// An AgentWarmPool in the session's namespace to take a running
    /// sandbox from instead of starting one. The session's toolset, its
    /// plain environment values and its name are bound to the claimed pod
    /// late; everything else the pod fixes (image, workdir, resources,
    /// scheduling, workspace, lifetime flags of the runner) must match the
    /// pool's template. When it does not, or the pool has no ready pod, the
    /// session starts cold and its `WarmPool` condition says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub warm_pool: Option<String>,

    /// Start from a copy of another session's workspace and bash state (a
    /// fork) rather than an empty workdir: from an AgentCheckpoint already
    /// taken, or from a session by name, which the operator checkpoints
    /// first. Either way the session stays Pending until the checkpoint is
    /// Ready, and its runner imports it once, before serving. Immutable, so
    /// a fork's starting point cannot move under it; a fork never takes a
    /// warm pod (that pod's runner started without the checkpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == oldSelf").message("from is immutable"))]
    pub from: Option<SessionFrom>,
}

/// Where a forked session starts from: a checkpoint or a session, exactly
/// one of the two.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.checkpoint) != has(self.session)").message("from names a checkpoint or a session to fork, exactly one of the two"))]
pub struct SessionFrom {
    /// An AgentCheckpoint in the session's namespace: for many forks of one
    /// moment, or a moment kept after its session is gone. The fork does
    /// not own it; deleting it does not stop a fork that already started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub checkpoint: Option<String>,
    /// An AgentSession in the session's namespace, to fork it as it is now
    /// in one step: the operator takes an AgentCheckpoint of it, named
    /// after the fork (`<fork>-from`, shortened with a digest when long)
    /// and owned by the fork, so deleting the fork deletes that copy too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub session: Option<String>,
}

pub(crate) fn default_workdir() -> String {
    "/workspace".to_owned()
}

/// An MCP server reachable over Streamable HTTP.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct McpServer {
    /// Transport kind; only "url" (Streamable HTTP) is supported.
    #[serde(rename = "type")]
    #[x_kube(validation = Rule::new("self == 'url'").message("only type url is supported"))]
    pub kind: String,
    /// Name that mcp_toolset entries refer to in mcp_server_name.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self != ''").message("name must not be empty"))]
    pub name: String,
    /// The server's endpoint, http:// or https://.
    #[schemars(length(max = 2048))]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("url must start with http:// or https://"))]
    pub url: String,
}

/// Storage behind the workdir. Set at most one of the two.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.emptyDir) && has(self.volumeClaimTemplate))").message("set emptyDir or volumeClaimTemplate, not both"))]
pub struct WorkspaceStorage {
    /// An emptyDir workspace (the default), optionally size-limited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDirWorkspace>,
    /// A PersistentVolumeClaim created for the session and deleted with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_claim_template: Option<VolumeClaimTemplate>,
}

/// An emptyDir workspace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct EmptyDirWorkspace {
    /// Upper bound of the workspace's size (e.g. 1Gi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_limit: Option<Quantity>,
}

/// The claim created for a persistent workspace.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct VolumeClaimTemplate {
    /// The claim's spec (storageClassName, accessModes, resources).
    pub spec: PersistentVolumeClaimSpec,
}

/// Lifetime bounds of a session.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Lifetime {
    /// Seconds the sandbox pod may run in all (the pod's
    /// activeDeadlineSeconds); the session then ends as Expired.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0").message("activeDeadlineSeconds must be positive"))]
    pub active_deadline_seconds: Option<i64>,
    /// Seconds without a tool call after which the runner exits and the
    /// session ends as Idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0").message("idleTimeoutSeconds must be positive"))]
    pub idle_timeout_seconds: Option<i64>,
    /// Seconds without a tool call after which the session is suspended
    /// (pod removed, workspace and bash state kept) rather than ended.
    /// `kubectl agent` wakes it (see `wakeOnCall`). Needs a
    /// `workspace.volumeClaimTemplate`; not with `idleTimeoutSeconds`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0").message("idleSuspendSeconds must be positive"))]
    pub idle_suspend_seconds: Option<i64>,
    /// Let `kubectl agent` wake a suspended session to serve a call (it
    /// sets the `agentplane.dev/wake` annotation and waits for the pod).
    /// Without it a call on a suspended session fails and says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_on_call: Option<bool>,
    /// Seconds the session may exist, counted from its creation and across
    /// suspensions; then it ends: phase Finished, pod removed, workspace
    /// kept or deleted per `workspaceOnFinish`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self > 0").message("maxLifetimeSeconds must be positive"))]
    pub max_lifetime_seconds: Option<i64>,
    /// What becomes of a persistent workspace when the session finishes:
    /// `Keep` (the default; it goes with the session object) or `Delete`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 'Keep' || self == 'Delete'").message("workspaceOnFinish is Keep or Delete"))]
    pub workspace_on_finish: Option<String>,
}

/// Where a session stands.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionPhase {
    /// Accepted; the pod is being created or scheduled.
    Pending,
    /// The runner answers: tools can be called.
    Ready,
    /// The toolset cannot be resolved; no pod runs. See the ToolsetValid condition.
    Invalid,
    /// The pod failed or the session's lifetime ended.
    Failed,
    /// The pod ended normally (deadline or idle timeout).
    Succeeded,
    /// No pod runs by request or after idling; the workspace is kept.
    Suspended,
    /// The session's lifetime (`maxLifetimeSeconds`) is over.
    Finished,
}

/// How to reach the runner.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct RunnerEndpoint {
    /// Unix socket inside the sandbox container.
    pub socket: String,
    /// Loopback TCP port inside the pod, for `kubectl port-forward`.
    pub port: u16,
}

/// One tool the model is handed.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ToolStatus {
    /// The name the model calls it by.
    pub name: String,
    /// Where it comes from: "agent_toolset_20260401", "mcp:<server>" or "custom".
    pub source: String,
    /// The resolved permission policy: always_allow or always_ask.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Description shown to the model.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// JSON schema of the tool's input.
    #[schemars(schema_with = "preserved_object")]
    pub input_schema: serde_json::Value,
}

/// What the operator observed and resolved.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AgentSessionStatus {
    /// Summary of where the session stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<SessionPhase>,
    /// Ready, ToolsetValid, McpResolved, PodScheduled-style detail.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The sandbox pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_name: Option<String>,
    /// How to reach the runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<RunnerEndpoint>,
    /// Every tools[] entry, materialised: toolset entries carry concrete
    /// configs and default_config; other entries as written.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "preserved_objects")]
    pub toolsets: Vec<serde_json::Value>,
    /// The definitions of every enabled tool, as the model is handed them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolStatus>,
    /// Number of enabled tools (printed by kubectl get).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_count: Option<i64>,
    /// Tool name -> permission policy, for every enabled tool.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub policies: BTreeMap<String, String>,
    /// How the session's object names were made: absent for the current
    /// scheme, `digest32` for a session whose objects an earlier release
    /// named (they keep those names, so its workspace is not left behind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_names: Option<String>,
    /// For a fork whose workspace claim was made from a VolumeSnapshot of
    /// its source's (a checkpoint taken that way). Kept once set, so the
    /// fork's pod keeps its shape after the checkpoint is gone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_snapshot: Option<FromSnapshot>,
}

/// What a fork of a VolumeSnapshot checkpoint was made from.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct FromSnapshot {
    /// The VolumeSnapshot its workspace claim was made from.
    pub volume_snapshot: String,
    /// The Secret with bash's state its runner imported.
    pub state_secret: String,
}

/// A list whose items keep every field the client wrote.
/// `spec.tools`: entries kept as written (the webhook validates them), at
/// most 256 so that the API server bounds the list before any validation
/// runs (one agent toolset, 20 MCP toolsets and 128 tools fit many times).
fn tool_entries(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 256,
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

fn preserved_objects(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
    })
}

/// An object that keeps every field.
fn preserved_object(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
}

/// The AgentSession CRD as YAML, as `crdgen` writes it and the chart
/// ships it.
pub fn crd_yaml() -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(&AgentSession::crd())?;
    Ok(format!(
        "# Generated by `cargo run -p crds --bin crdgen`; do not edit.\n{body}"
    ))
}

/// The AgentWarmPool CRD as YAML (`crdgen agentwarmpools`).
pub fn pool_crd_yaml() -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(&AgentWarmPool::crd())?;
    Ok(format!(
        "# Generated by `cargo run -p crds --bin crdgen -- agentwarmpools`; do not edit.\n{body}"
    ))
}

/// The AgentEnvironment CRD as YAML (`crdgen agentenvironments`).
pub fn environment_crd_yaml() -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(&AgentEnvironment::crd())?;
    Ok(format!(
        "# Generated by `cargo run -p crds --bin crdgen -- agentenvironments`; do not edit.\n{body}"
    ))
}

/// The AgentCheckpoint CRD as YAML (`crdgen agentcheckpoints`).
pub fn checkpoint_crd_yaml() -> Result<String, serde_yaml::Error> {
    let body = serde_yaml::to_string(&AgentCheckpoint::crd())?;
    Ok(format!(
        "# Generated by `cargo run -p crds --bin crdgen -- agentcheckpoints`; do not edit.\n{body}"
    ))
}

/// The file names of the CRDs under `charts/agentplane/crds/`.
pub const CRD_FILES: [&str; 4] = [
    "agentsessions.agentplane.dev.yaml",
    "agentwarmpools.agentplane.dev.yaml",
    "agentenvironments.agentplane.dev.yaml",
    "agentcheckpoints.agentplane.dev.yaml",
];
