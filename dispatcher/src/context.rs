//! What every environment's loop and every run share.

use crate::api::ManagedApi;
use crate::metrics::Metrics;
use crate::tools::Gateway;

/// Shared by all environments of one dispatcher.
pub struct Context {
    /// The Kubernetes client (the dispatcher's ServiceAccount).
    pub kube: kube::Client,
    /// The Managed Agents API.
    pub api: ManagedApi,
    /// The gateway, for tool calls.
    pub gateway: std::sync::Arc<Gateway>,
    /// Named on every poll (`Anthropic-Worker-ID`).
    pub worker_id: String,
    /// Instruments.
    pub metrics: Metrics,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("api", &self.api)
            .field("worker_id", &self.worker_id)
            .finish_non_exhaustive()
    }
}
