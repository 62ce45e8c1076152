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
}
