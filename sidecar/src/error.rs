//! The crate's one error type.
//!
//! A tool-level failure (missing file, bad regex, non-zero exit) is not an
//! [`Error`]: it is a [`crate::ToolResult`] with `is_error` set, because the
//! model reads it and can recover. An [`Error`] means the call was not run as
//! asked — refused by the session's policy, malformed by the executor, or hit
//! by a fault of the runner itself — and it travels as a gRPC status so an
//! executor can act on it without parsing text.

use std::path::PathBuf;

use runner_api::Refusal;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The tool is `always_ask` and the call did not say a human confirmed it.
    #[error(
        "tool `{tool}` requires confirmation: the session's toolset sets it to always_ask and this call was not marked confirmed"
    )]
    ConfirmationRequired { tool: String },

    /// The session's resolved toolset does not enable the tool.
    #[error("tool `{tool}` is disabled by the session's toolset")]
    DisabledTool { tool: String },

    /// A web tool reached the runner; the executor runs those itself.
    #[error(
        "`{tool}` is not a sandbox tool: web tools run in the executor's process, not in the sandbox runner"
    )]
    NotSandboxTool { tool: String },

    /// The runner is already running as many calls as it may.
    #[error(
        "the runner is already running {limit} calls, the most it runs at once (serve --max-concurrent-calls); retry when one has finished"
    )]
    Busy { limit: usize },

    /// A streamed call with this id is still running.
    #[error("a call with id {id:?} is still running; attach to it, or use another id")]
    CallRunning { id: String },

    /// The runner remembers as many streamed calls as it may.
    #[error("the runner already tracks {limit} streamed calls; retry when one has finished")]
    TooManyCalls { limit: usize },

    /// No streamed call with this id is running or kept.
    #[error(
        "no call with id {id:?}: it was never started as a streamed call here, or finished more than 10 minutes ago"
    )]
    UnknownCall { id: String },

    /// A warm pool's sandbox not yet bound to a session: no toolset is in
    /// force, so nothing runs until the operator writes the binding.
    #[error(
        "this sandbox is a warm pool's and not bound to a session yet; retry shortly (the session that claimed it is writing its binding)"
    )]
    Unbound,

    /// An export or import the runner will not do as asked (the message
    /// says what: a path, a limit, the archive entry refused).
    #[error("{message}")]
    TransferRefused { message: String },

    /// An export or import is already running; they run one at a time.
    #[error(
        "an export or import is already running on this runner; they run one at a time, retry when it has finished"
    )]
    TransferBusy,

    /// The call id cannot name the call's files.
    #[error("invalid call id: {reason}")]
    InvalidCallId { id: String, reason: String },

    /// The runner could not do its own part of the work (state dir, spawn).
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },

    /// The process supervisor stopped, so a child's exit can no longer be seen.
    #[error("the runner's process supervisor has stopped; restart the runner")]
    SupervisorGone,

    /// The `--toolset` file could not be read or does not resolve.
    #[error("toolset file {path}: {message}")]
    ToolsetFile { path: PathBuf, message: String },

    /// A command-line value the runner cannot use.
    #[error("{0}")]
    Usage(String),

    /// The gRPC server failed (serving on a listener).
    #[error("{context}: {source}")]
    Transport {
        context: String,
        #[source]
        source: tonic::transport::Error,
    },

    /// Calling a running runner failed (`call`, `health`, `tools`).
    #[error(transparent)]
    Client(#[from] runner_api::Error),

    /// Telemetry could not be set up as configured.
    #[error("telemetry: {0}")]
    Telemetry(String),

    /// The runner ended the sandbox at one of its bounds (see
    /// [`crate::watch`]) and exits with the code that says which.
    #[error("{message}")]
    SandboxEnded {
        why: runner_api::ended::Ended,
        message: String,
    },
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The value of the metric's `error.type` attribute for this error. A
    /// refusal is named by its wire string, so the metric and the status's
    /// metadata say the same thing.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::ConfirmationRequired { .. }
            | Error::DisabledTool { .. }
            | Error::NotSandboxTool { .. }
            | Error::InvalidCallId { .. }
            | Error::Busy { .. }
            | Error::TooManyCalls { .. }
            | Error::CallRunning { .. }
            | Error::UnknownCall { .. }
            | Error::TransferRefused { .. }
            | Error::TransferBusy
            | Error::Unbound => self.refusal().map_or("refused", Refusal::as_str),
            Error::Io { .. } => "io",
            Error::SupervisorGone => "supervisor_gone",
            Error::ToolsetFile { .. } => "toolset_file",
            Error::Usage(_) => "usage",
            Error::Transport { .. } => "transport",
            Error::Client(_) => "client",
            Error::Telemetry(_) => "telemetry",
            Error::SandboxEnded { .. } => "sandbox_ended",
        }
    }

    /// The refusal this error is: every case where the runner judged the
    /// call (policy, routing, naming, capacity) rather than failed at it.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::ConfirmationRequired { .. } => Some(Refusal::ConfirmationRequired),
            Error::DisabledTool { .. } => Some(Refusal::DisabledTool),
            Error::NotSandboxTool { .. } => Some(Refusal::NotSandboxTool),
            Error::InvalidCallId { .. } => Some(Refusal::InvalidCallId),
            Error::Busy { .. } => Some(Refusal::Busy),
            Error::TooManyCalls { .. } => Some(Refusal::TooManyCalls),
            Error::CallRunning { .. } => Some(Refusal::CallRunning),
            Error::UnknownCall { .. } => Some(Refusal::UnknownCall),
            Error::Unbound => Some(Refusal::Unbound),
            Error::TransferRefused { .. } => Some(Refusal::TransferRefused),
            Error::TransferBusy => Some(Refusal::Busy),
            Error::Io { .. }
            | Error::SupervisorGone
            | Error::ToolsetFile { .. }
            | Error::Usage(_)
            | Error::Transport { .. }
            | Error::Client(_)
            | Error::Telemetry(_)
            | Error::SandboxEnded { .. } => None,
        }
    }

    /// The gRPC status this error travels as: a refusal with its code and
    /// metadata (see [`Refusal::code`]), anything else as `INTERNAL`, the
    /// runner's own fault.
    pub fn to_status(&self) -> tonic::Status {
        match self.refusal() {
            Some(r) => r.status(self.to_string()),
            None => tonic::Status::internal(self.to_string()),
        }
    }

    /// The exit code of `call`, `health` and `tools` when they end with
    /// this error (the convention in [`runner_api::exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Client(e) => e.exit_code(),
            Error::Usage(_) => runner_api::exit::REFUSED,
            _ => runner_api::exit::COULD_NOT_CALL,
        }
    }
}
