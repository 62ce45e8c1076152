//! The dispatcher's one error type. Messages say what failed and what to
//! do; none carries a credential (the environment key, an item's secret and
//! its sessions token are never formatted into an error or a log line).

use thiserror::Error;

/// Everything that can go wrong serving an environment.
#[derive(Debug, Error)]
pub enum Error {
    /// The Managed Agents API answered with an error status.
    #[error("the Managed Agents API answered {status} to {what}: {message}")]
    Api {
        /// What was asked ("poll", "heartbeat", ...).
        what: &'static str,
        /// The HTTP status.
        status: u16,
        /// The API's error type and message, or the start of the body.
        message: String,
        /// The body as JSON, when it was JSON (the 412 of a heartbeat
        /// carries the lease's current state in it).
        body: Option<serde_json::Value>,
    },
    /// The API could not be reached or the connection broke.
    #[error("cannot reach the Managed Agents API for {what}: {message}")]
    Transport {
        /// What was asked.
        what: &'static str,
        /// The cause, without the URL's query.
        message: String,
    },
    /// A response was not what the protocol says.
    #[error("the Managed Agents API's answer to {what} is not understood: {message}")]
    Protocol {
        /// What was asked.
        what: &'static str,
        /// What was wrong with it.
        message: String,
    },
    /// The environment key's Secret is missing or unusable.
    #[error("the environment key: {0}")]
    Key(String),
    /// A Kubernetes call failed.
    #[error("Kubernetes: {0}")]
    Kube(#[from] kube::Error),
    /// The gateway refused or failed a tool call before it ran.
    #[error("the gateway: {0}")]
    Gateway(String),
    /// The session's sandbox did not become ready.
    #[error("the sandbox: {0}")]
    Sandbox(String),
    /// A configuration problem at start.
    #[error("configuration: {0}")]
    Config(String),
}

impl Error {
    /// Whether retrying may help: connection failures, 408, 409 (except
    /// where a caller treats it as done), 429 and 5xx. Any other 4xx is
    /// fatal, as the official worker judges it.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Transport { .. } => true,
            Error::Api { status, .. } => transient_status(*status),
            _ => false,
        }
    }

    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            Error::Api { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// 408, 409, 429 and every 5xx may succeed when tried again.
pub fn transient_status(status: u16) -> bool {
    matches!(status, 408 | 409 | 429) || status >= 500
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
