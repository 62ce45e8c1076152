//! What can go wrong between a user and a tool call, worded for that user.

/// The plugin's one error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot load kubeconfig: {0}")]
    Config(String),
    #[error("AgentSession {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
    #[error("AgentSession {session} is not ready (phase {phase}): {detail}")]
    NotReady {
        session: String,
        phase: String,
        detail: String,
    },
    #[error("tool {tool:?} is not enabled in AgentSession {session}; enabled: {enabled}")]
    Disabled {
        session: String,
        tool: String,
        enabled: String,
    },
    #[error(
        "tool {tool:?} requires confirmation (policy always_ask): rerun with --confirm once a human approved this call"
    )]
    ConfirmationRequired { tool: String },
    #[error(
        "{tool:?} is not a sandbox tool: it runs in the agent's executor, not the session's runner"
    )]
    NotSandboxTool { tool: String },
    #[error("the input is not a JSON object: {0}")]
    Input(String),
    #[error("port-forward to pod {pod}: {message}")]
    PortForward { pod: String, message: String },
    #[error("the runner refused the call ({code}): {message}")]
    Refused { code: String, message: String },
    #[error("cannot write the output: {0}")]
    Output(String),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
}

impl Error {
    /// The exit code: 2 for a refusal or a usage problem, 3 for anything
    /// that kept the call from being made.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Disabled { .. }
            | Self::ConfirmationRequired { .. }
            | Self::NotSandboxTool { .. }
            | Self::Input(_)
            | Self::Refused { .. } => 2,
            _ => 3,
        }
    }
}
