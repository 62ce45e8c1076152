//! The `AgentWarmPool` custom resource: sandbox pods started ahead of the
//! sessions that will use them.
//!
//! A cold session waits for its pod to be scheduled, its images unpacked,
//! the runner installed and started -- seconds. A pool keeps `replicas`
//! such pods running from a template, each serving nothing (its runner
//! refuses every call) until a session that names the pool claims it; the
//! session's toolset, environment values and name are then bound late
//! through the pod's toolset ConfigMap, and the pool starts a replacement.
//! The scale subresource lets an HPA or KEDA drive `replicas`.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::EmptyDirWorkspace;

/// The most pods one pool keeps. A pool is a standing cost on the nodes;
/// more than this is a fleet, not a pool.
pub const MAX_POOL_REPLICAS: i32 = 256;

/// A pool of warm sandbox pods that sessions naming it claim instead of
/// starting their own.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "agentplane.dev",
    version = "v1alpha1",
    kind = "AgentWarmPool",
    plural = "agentwarmpools",
    singular = "agentwarmpool",
    shortname = "awp",
    category = "agentplane",
    namespaced,
    status = "AgentWarmPoolStatus",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn = r#"{"name":"Desired","type":"integer","jsonPath":".spec.replicas"}"#,
    printcolumn = r#"{"name":"Warm","type":"integer","jsonPath":".status.replicas"}"#,
    printcolumn = r#"{"name":"Ready","type":"integer","jsonPath":".status.readyReplicas"}"#,
    printcolumn = r#"{"name":"Image","type":"string","jsonPath":".spec.template.image"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AgentWarmPoolSpec {
    /// How many unclaimed pods the pool keeps (0 to 256).
    #[schemars(range(min = 0, max = 256))]
    pub replicas: i32,
    /// What every pod of the pool runs. A session is served from the pool
    /// only when its own spec asks for exactly this (see `spec.warmPool` of
    /// AgentSession); otherwise it starts cold and says why.
    pub template: WarmPoolTemplate,
}

/// The parts of a session's spec a warm pod is built from: everything the
/// pod itself fixes (its image, mounts, resources, scheduling). A pod
/// cannot change these once it runs, so a session must match them.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WarmPoolTemplate {
    /// Container image of the sandbox (as `spec.image` of a session).
    #[x_kube(validation = Rule::new("self != ''").message("image must not be empty"))]
    pub image: String,
    /// The workdir, where the workspace volume is mounted. Default /workspace.
    #[serde(default = "crate::default_workdir")]
    #[x_kube(validation = Rule::new("self.startsWith('/')").message("workdir must be an absolute path"))]
    pub workdir: String,
    /// Compute resources of the sandbox container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Environment baked into every pod of the pool (a claiming session's
    /// own plain values are bound late, over these). At most 128.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub env: Vec<EnvVar>,
    /// RuntimeClass of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_class_name: Option<String>,
    /// Node selector of the pods (at most 16 terms).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub node_selector: BTreeMap<String, String>,
    /// Tolerations of the pods (at most 16).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tolerations: Vec<Toleration>,
    /// The pods' emptyDir workspace (a persistent claim cannot be made
    /// ahead of the session that owns it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_dir: Option<EmptyDirWorkspace>,
}

impl WarmPoolTemplate {
    /// The session spec a pod of this template serves, less what is bound
    /// late (tools, the pool's name): what a cold session asking for
    /// exactly this pod would say.
    pub fn session_spec(&self) -> crate::AgentSessionSpec {
        crate::AgentSessionSpec {
            image: self.image.clone(),
            workdir: self.workdir.clone(),
            tools: Vec::new(),
            mcp_servers: Vec::new(),
            resources: self.resources.clone(),
            env: self.env.clone(),
            runtime_class_name: self.runtime_class_name.clone(),
            node_selector: self.node_selector.clone(),
            tolerations: self.tolerations.clone(),
            workspace: self.empty_dir.clone().map(|e| crate::WorkspaceStorage {
                empty_dir: Some(e),
                volume_claim_template: None,
            }),
            lifetime: None,
            suspended: None,
            warm_pool: None,
            from: None,
        }
    }
}

/// What the operator observed of a pool.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AgentWarmPoolStatus {
    /// Unclaimed pods of the pool (ready or starting).
    #[serde(default)]
    pub replicas: i32,
    /// Unclaimed pods whose runner answers: what a session can claim now.
    #[serde(default)]
    pub ready_replicas: i32,
    /// The label selector of the pool's unclaimed pods (for the scale
    /// subresource).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub selector: String,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready (every desired pod is warm) and PolicyAllowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
