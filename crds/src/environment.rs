//! The `AgentEnvironment` custom resource: a Claude Managed Agents
//! `self_hosted` environment whose sessions run on this cluster.
//!
//! The hosted side runs the agent loop and queues one work item per session
//! that needs tools; the plane's dispatcher polls that queue with the
//! environment key, gives each item a sandbox (an `AgentSession` owned by
//! this object, so the webhook and the materialised status apply as for any
//! other session), runs the session's tool calls in it through the gateway
//! and posts the results back. The key lives in a Secret that only the
//! dispatcher reads: the sandbox holds no Anthropic credential.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::WarmPoolTemplate;

/// The most sessions one environment may run at once. Each is a sandbox
/// pod; more than this from one queue is a fleet, sized by several
/// environments or a larger cap raised deliberately.
pub const MAX_CONCURRENT_SESSIONS: i32 = 256;

/// A Claude Managed Agents self-hosted environment served by the plane.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "agentplane.dev",
    version = "v1alpha1",
    kind = "AgentEnvironment",
    plural = "agentenvironments",
    singular = "agentenvironment",
    shortname = "agenv",
    category = "agentplane",
    namespaced,
    status = "AgentEnvironmentStatus",
    printcolumn = r#"{"name":"Environment","type":"string","jsonPath":".spec.environmentId"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Running","type":"integer","jsonPath":".status.sessionsRunning"}"#,
    printcolumn = r#"{"name":"Queued","type":"integer","jsonPath":".status.queueDepth"}"#,
    printcolumn = r#"{"name":"Oldest","type":"integer","description":"age in seconds of the oldest queued item","jsonPath":".status.oldestQueuedSeconds"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AgentEnvironmentSpec {
    /// The self-hosted environment's id, as the Claude console or API
    /// shows it (`env_...`).
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9_-]+$"))]
    pub environment_id: String,

    /// The Secret in this namespace that holds the environment key. It is
    /// read again before every poll, so a key rotated in the Secret is used
    /// on the next poll without a restart.
    pub key_secret_ref: KeySecretRef,

    /// The sandbox every session of this environment runs in.
    pub sandbox: EnvironmentSandbox,

    /// How many sessions may run at once (1 to 256, default 8). Items
    /// beyond it stay queued on the hosted side, where `status.queueDepth`
    /// shows them.
    #[serde(default = "default_max_concurrent")]
    #[schemars(range(min = 1, max = 256))]
    pub max_concurrent_sessions: i32,

    /// Seconds a session may stay idle (its agent waiting on a person)
    /// before its run here ends and its sandbox is released (default 60).
    /// A later message queues the session again.
    #[serde(default = "default_idle_seconds")]
    #[schemars(range(min = 1, max = 86400))]
    pub idle_seconds: i64,

    /// Memory stores: where in the sandbox they are put, and whether
    /// changes are synced back when a run ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemorySync>,

    /// Stop taking new work (running sessions finish).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
}

/// Where the environment key is.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KeySecretRef {
    /// The Secret's name (same namespace as the environment).
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The data key holding the environment key (default `key`).
    #[serde(default = "default_secret_key")]
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// The sandbox a work item's session gets.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentSandbox {
    /// An AgentWarmPool in this namespace to claim from, so that a session
    /// starts in a running pod. The template must then equal the pool's
    /// (the session's WarmPool condition says when it does not, and the
    /// session starts cold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub warm_pool: Option<String>,
    /// Image, workdir, resources, environment and scheduling of the
    /// sandbox, as for a warm pool's pods. The tools come from the hosted
    /// session's agent.
    pub template: WarmPoolTemplate,
}

/// Memory stores in the sandbox.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemorySync {
    /// Put the session's memory stores into the sandbox and sync changes
    /// back at the end (default true).
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Directory under the workdir that holds them (default `memory`, as
    /// the official worker's `{workdir}/memory/<name>`), for stores whose
    /// `mount_path` the sandbox cannot hold.
    #[serde(default = "default_memory_dir")]
    #[x_kube(validation = Rule::new("!self.startsWith('/') && !self.contains('..')").message("memory.directory is relative to the workdir and stays inside it"))]
    #[schemars(length(min = 1, max = 255))]
    pub directory: String,
}

/// What the dispatcher observed of the environment and its queue.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct AgentEnvironmentStatus {
    /// Items queued on the hosted side (from the queue's stats).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<i64>,
    /// Items polled but not yet acknowledged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_pending: Option<i64>,
    /// Age in seconds of the oldest queued item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_queued_seconds: Option<i64>,
    /// Sessions whose tools run here now.
    #[serde(default)]
    pub sessions_running: i32,
    /// When the queue was last polled (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_poll_time: Option<String>,
    /// The last poll's error, if it failed (never a credential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_poll_error: Option<String>,
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ready: the queue answers polls with this key.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

fn default_max_concurrent() -> i32 {
    8
}

fn default_idle_seconds() -> i64 {
    60
}

fn default_secret_key() -> String {
    "key".to_owned()
}

fn default_true() -> bool {
    true
}

fn default_memory_dir() -> String {
    "memory".to_owned()
}

impl Default for MemorySync {
    fn default() -> Self {
        Self {
            enabled: true,
            directory: default_memory_dir(),
        }
    }
}
