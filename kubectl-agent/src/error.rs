//! What can go wrong between a user and a tool call, worded for that user.

use runner_api::Refusal;

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
    #[error("AgentSession {session} is suspended: {detail}")]
    Suspended { session: String, detail: String },
    #[error(
        "AgentSession {session} was woken but its sandbox was not ready within {seconds}s; see kubectl describe agentsession {session}"
    )]
    WakeTimedOut { session: String, seconds: u64 },
    /// The session's warm sandbox kept refusing calls as unbound.
    #[error(
        "the session's warm sandbox was not bound within {seconds} s; the operator writes the binding when it claims the pod -- see kubectl describe agentsession {session}"
    )]
    NotBound { session: String, seconds: u64 },
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
    /// The runner declined or failed the call for a reason the plugin
    /// has no better words for (busy, a runner fault, a broken connection).
    #[error(transparent)]
    Runner(#[from] runner_api::Error),
    #[error(
        "the connection to the runner broke {times} times in a row; call {id} may still be running in the sandbox"
    )]
    Disconnected { times: u32, id: String },
    #[error("cannot write the output: {0}")]
    Output(String),
    /// A copy that cannot be made as asked (which side is the session's,
    /// a target in the way).
    #[error("cp: {0}")]
    Cp(String),
    /// A file on this side could not be read or written.
    #[error("cp: {context}: {source}")]
    Local {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// An archive that could not be packed here, or that the session sent
    /// and this side refused (the message names the entry).
    #[error("cp: {0}")]
    Archive(#[from] archive::Error),
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The gateway refused the call (a permission, an approval).
    #[error("the gateway refused the call: {0}")]
    GatewayRefused(String),
    /// The gateway took the call and could not finish it.
    #[error("the gateway could not make the call: {0}")]
    Gateway(String),
}

impl Error {
    /// The exit code, in the convention `agent-sidecar` shares
    /// ([`runner_api::exit`]): a refusal or a usage problem is
    /// [`REFUSED`](runner_api::exit::REFUSED), anything that kept the call
    /// from being made or finished is
    /// [`COULD_NOT_CALL`](runner_api::exit::COULD_NOT_CALL).
    pub fn exit_code(&self) -> u8 {
        use runner_api::exit;
        match self {
            Self::Disabled { .. }
            | Self::ConfirmationRequired { .. }
            | Self::NotSandboxTool { .. }
            | Self::GatewayRefused(_)
            | Self::Input(_)
            | Self::Cp(_) => exit::REFUSED,
            Self::Archive(archive::Error::Io { .. }) | Self::Local { .. } => exit::COULD_NOT_CALL,
            Self::Archive(_) => exit::REFUSED,
            Self::Runner(e) => e.exit_code(),
            Self::Config(_)
            | Self::NotFound { .. }
            | Self::NotReady { .. }
            | Self::Suspended { .. }
            | Self::WakeTimedOut { .. }
            | Self::NotBound { .. }
            | Self::PortForward { .. }
            | Self::Disconnected { .. }
            | Self::Output(_)
            | Self::Gateway(_)
            | Self::Kube(_) => exit::COULD_NOT_CALL,
        }
    }
}
/// The plugin's error for a call the runner did not run: the refusals a
/// user can act on get the plugin's own words (which say what to type),
/// the rest keep the runner's.
pub fn refusal(e: runner_api::Error, tool: &str, session: &str) -> Error {
    match e.refusal() {
        Some(Refusal::ConfirmationRequired) => Error::ConfirmationRequired {
            tool: tool.to_owned(),
        },
        Some(Refusal::NotSandboxTool) => Error::NotSandboxTool {
            tool: tool.to_owned(),
        },
        Some(Refusal::DisabledTool) => Error::Disabled {
            session: session.to_owned(),
            tool: tool.to_owned(),
            enabled: "(see kubectl agent tools)".into(),
        },
        _ => Error::Runner(e),
    }
}

/// The error for a warm sandbox that stayed unbound past the plugin's
/// patience.
pub fn not_bound(session: &str) -> Error {
    Error::NotBound {
        session: session.to_owned(),
        seconds: crate::unbound::PATIENCE.as_secs(),
    }
}
