//! The crate's one error type.
//!
//! A tool-level failure (missing file, bad regex, non-zero exit) is not an
//! [`Error`]: it is a [`crate::ToolResult`] with `is_error` set, because the
//! model reads it and can recover. An [`Error`] means the call was not run as
//! asked — refused by the session's policy, malformed by the executor, or hit
//! by a fault of the runner itself — and it travels as a gRPC status so an
//! executor can act on it without parsing text.

use std::path::PathBuf;

/// Metadata key carrying the machine-readable reason of a policy refusal.
pub const REFUSAL_METADATA_KEY: &str = "agentplane-refusal";

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

    /// The gRPC transport failed (bind, connect).
    #[error("{context}: {source}")]
    Transport {
        context: String,
        #[source]
        source: tonic::transport::Error,
    },

    /// The runner answered a call with a status instead of a result.
    #[error("the runner refused the call: {code:?}: {message}")]
    Status {
        code: tonic::Code,
        message: String,
        refusal: Option<String>,
    },

    /// Telemetry could not be set up as configured.
    #[error("telemetry: {0}")]
    Telemetry(String),
}

impl Error {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// The value of the metric's `error.type` attribute for this error.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::ConfirmationRequired { .. } => "confirmation_required",
            Error::DisabledTool { .. } => "disabled_tool",
            Error::NotSandboxTool { .. } => "not_sandbox_tool",
            Error::Busy { .. } => "busy",
            Error::CallRunning { .. } => "call_running",
            Error::TooManyCalls { .. } => "too_many_calls",
            Error::UnknownCall { .. } => "unknown_call",
            Error::InvalidCallId { .. } => "invalid_call_id",
            Error::Io { .. } => "io",
            Error::SupervisorGone => "supervisor_gone",
            Error::ToolsetFile { .. } => "toolset_file",
            Error::Usage(_) => "usage",
            Error::Transport { .. } => "transport",
            Error::Status { .. } => "status",
            Error::Telemetry(_) => "telemetry",
        }
    }

    /// The refusal reason carried in [`REFUSAL_METADATA_KEY`], for policy refusals.
    pub fn refusal(&self) -> Option<&'static str> {
        match self {
            Error::ConfirmationRequired { .. }
            | Error::DisabledTool { .. }
            | Error::NotSandboxTool { .. } => Some(self.kind()),
            _ => None,
        }
    }

    /// The gRPC status this error travels as.
    ///
    /// Confirmation is `FailedPrecondition` (the call may succeed once a human
    /// confirms it); a disabled tool is `PermissionDenied` (it never will);
    /// a web tool or a bad call id is `InvalidArgument` (the executor routed
    /// or named the call wrongly); a runner fault is `Internal`.
    pub fn to_status(&self) -> tonic::Status {
        let code = match self {
            Error::ConfirmationRequired { .. } => tonic::Code::FailedPrecondition,
            Error::DisabledTool { .. } => tonic::Code::PermissionDenied,
            Error::NotSandboxTool { .. } | Error::InvalidCallId { .. } => {
                tonic::Code::InvalidArgument
            }
            Error::Busy { .. } | Error::TooManyCalls { .. } => tonic::Code::ResourceExhausted,
            Error::CallRunning { .. } => tonic::Code::AlreadyExists,
            Error::UnknownCall { .. } => tonic::Code::NotFound,
            Error::Status { code, .. } => *code,
            _ => tonic::Code::Internal,
        };
        let mut status = tonic::Status::new(code, self.to_string());
        if let Some(reason) = self.refusal() {
            status.metadata_mut().insert(
                REFUSAL_METADATA_KEY,
                tonic::metadata::MetadataValue::from_static(reason),
            );
        }
        status
    }

    /// Rebuilds the client-side view of a status the runner sent.
    pub fn from_status(status: &tonic::Status) -> Self {
        let refusal = status
            .metadata()
            .get(REFUSAL_METADATA_KEY)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        Error::Status {
            code: status.code(),
            message: status.message().to_owned(),
            refusal,
        }
    }
}
