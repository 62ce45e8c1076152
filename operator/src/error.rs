//! The operator's one error type. Messages say what failed and what to
//! check, because they end up in logs and conditions that a platform
//! engineer reads.

/// What can go wrong in the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),

    #[error("cannot load kubeconfig or in-cluster config: {0}")]
    KubeConfig(String),

    #[error("MCP server {server} ({url}): {message}")]
    Mcp {
        server: String,
        url: String,
        message: String,
    },

    #[error("TLS: {0}")]
    Tls(String),

    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: not a valid manifest: {message}")]
    Manifest { path: String, message: String },

    #[error("cannot serve on {addr}: {source}")]
    Bind {
        addr: String,
        #[source]
        source: std::io::Error,
    },

    #[error("telemetry setup failed: {0}")]
    Telemetry(String),

    #[error("a leader lease call did not answer within {0:?}")]
    LeaseTimeout(std::time::Duration),

    #[error("leader election timing: {0}")]
    LeaseTiming(String),

    #[error("lost the leader lease {0}; exiting so that another replica takes over")]
    LostLease(String),

    #[error("the AgentSession has no {0}")]
    MissingField(&'static str),

    #[error("checkpoint: {0}")]
    Checkpoint(String),
}

/// Shorthand for operator results.
pub type Result<T, E = Error> = std::result::Result<T, E>;
