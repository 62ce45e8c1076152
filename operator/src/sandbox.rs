//! What the platform decides about every sandbox, from the operator's
//! command line (the chart's values): the runner image, the defaults a
//! session that sets none gets, and what sandboxes may reach. Every wing
//! reads these; none changes them.

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::cidr::Cidr;

/// What sandboxes may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Whether the operator manages a NetworkPolicy per session at all
    /// (off only for clusters that enforce egress some other way).
    pub enabled: bool,
    /// CIDRs sandboxes may reach, besides cluster DNS.
    pub allowed: Vec<Cidr>,
    /// The cluster's pod and service ranges, excepted like link-local.
    pub cluster: Vec<Cidr>,
    /// The gateway's pods, the only ingress a sandbox admits (its runner's
    /// mutual-TLS port); none when no gateway is installed.
    pub gateway: Option<GatewaySource>,
    /// The operator's own pods, admitted beside the gateway to the
    /// runner's mutual-TLS port (it takes checkpoints there).
    pub operator: Option<GatewaySource>,
}

/// Where the gateway runs: its namespace and its pods' labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySource {
    pub namespace: String,
    pub pod_labels: std::collections::BTreeMap<String, String>,
}

/// What the operator's deployment decides about every sandbox pod.
#[derive(Debug, Clone)]
pub struct PodConfig {
    /// Image holding the static runner at [`runner_api::IMAGE_BIN`].
    pub runner_image: String,
    /// Pull policy for both images (IfNotPresent unless told otherwise).
    pub image_pull_policy: String,
    /// The sandbox container's resources when the session sets none, so
    /// that no sandbox runs unbounded on the node.
    pub default_resources: Option<ResourceRequirements>,
    /// The emptyDir workspace's size limit when the session sets none.
    pub default_workspace_limit: Option<Quantity>,
    /// What sandboxes may reach over the network.
    pub egress: EgressPolicy,
    /// Mount the sandbox's root filesystem read-only (the workspace, `/tmp`
    /// and the runner's own directories stay writable volumes).
    pub read_only_root: bool,
    /// The sandbox's disk bounds besides the workspace.
    pub disk: DiskBounds,
    /// Run sandboxes in a user namespace (`hostUsers: false`) where the
    /// node's runtime supports it; `None` leaves the field unset.
    pub host_users: Option<bool>,
    /// What the runner itself watches in its sandbox.
    pub watch: RunnerWatch,
    /// Serve the gateway: the runner listens on the pod network with mutual
    /// TLS, from the namespace's runner certificate Secret.
    pub gateway: bool,
}

/// The bounds the runner enforces inside its sandbox (see the runner's
/// `watch` module): it ends every process and restarts clean at the
/// process limit, or after the kernel killed a process for memory, and
/// says why in the termination log the operator reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunnerWatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_processes: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub end_on_oom: bool,
}

impl RunnerWatch {
    /// Whether the runner watches anything.
    pub fn any(&self) -> bool {
        self.max_processes.is_some() || self.end_on_oom
    }
}

/// What a sandbox may write besides its workspace. Every emptyDir is
/// sized and the container's ephemeral storage is limited to the sum of
/// what its volumes and writable layer may hold, so the kubelet evicts a
/// sandbox that writes past them instead of letting it fill the node's
/// disk. All unset (an operator started without the flags, or a pod built
/// before they existed) leaves those bounds off.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DiskBounds {
    /// Size limit of the `/tmp` emptyDir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tmp: Option<Quantity>,
    /// Size limit of the runner's own emptyDir (socket, bash state, spill
    /// files of outputs over the model's budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runner: Option<Quantity>,
    /// What the container's writable layer (and its logs) may hold: what
    /// the image's own directories take when the agent installs packages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<Quantity>,
    /// The container's ephemeral-storage request (what the scheduler
    /// reserves on the node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<Quantity>,
}

impl DiskBounds {
    /// Whether any disk bound is set.
    pub fn any(&self) -> bool {
        self.tmp.is_some()
            || self.runner.is_some()
            || self.layer.is_some()
            || self.request.is_some()
    }
}
