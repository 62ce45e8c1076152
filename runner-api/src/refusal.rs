//! Why the runner declined to run a call.
//!
//! A refusal travels as a gRPC status whose message is for people and whose
//! metadata entry [`REFUSAL_METADATA_KEY`] is for programs: a client can
//! tell "ask a human to confirm" from "this tool is off" without parsing
//! prose, and the runner may reword its messages freely. The runner builds
//! the status with [`Refusal::status`] and clients read it back with
//! [`Refusal::from_status`], so the wire strings live only here.

use std::fmt;

/// Metadata key carrying the machine-readable reason of a refusal.
pub const REFUSAL_METADATA_KEY: &str = "agentplane-refusal";

/// A reason the runner gives for not running a call. Every status the
/// runner sends for a call it judged (rather than failed) carries one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Refusal {
    /// The tool is `always_ask` and the call was not marked confirmed; the
    /// same call succeeds once a human confirms it.
    ConfirmationRequired,
    /// The session's toolset does not enable the tool.
    DisabledTool,
    /// A web tool (`web_fetch`, `web_search`) reached the runner; the
    /// executor runs those itself.
    NotSandboxTool,
    /// The call id cannot name the call's files.
    InvalidCallId,
    /// The runner is already running as many calls as it may at once.
    Busy,
    /// The runner already remembers as many streamed calls as it may.
    TooManyCalls,
    /// A streamed call with this id is still running.
    CallRunning,
    /// No streamed call with this id is running or remembered.
    UnknownCall,
    /// The sandbox is a warm pool's and not bound to a session yet: no
    /// toolset is in force, so nothing runs. The binding is on its way
    /// (the session that claimed the pod writes it); retry shortly.
    Unbound,
    /// An export or import the runner will not do as asked: a path outside
    /// the workdir or among the runner's own files, a limit over the
    /// runner's maximum, an archive entry refused (the message names it),
    /// a target that exists without overwrite.
    TransferRefused,
}

impl Refusal {
    /// Every kind, for tests and exhaustive documentation.
    pub const ALL: [Refusal; 10] = [
        Refusal::ConfirmationRequired,
        Refusal::DisabledTool,
        Refusal::NotSandboxTool,
        Refusal::InvalidCallId,
        Refusal::Busy,
        Refusal::TooManyCalls,
        Refusal::CallRunning,
        Refusal::UnknownCall,
        Refusal::Unbound,
        Refusal::TransferRefused,
    ];

    /// The value carried under [`REFUSAL_METADATA_KEY`]. The runner also
    /// uses it as the metric's `error.type`, so dashboards and clients
    /// name a refusal alike.
    pub const fn as_str(self) -> &'static str {
        match self {
            Refusal::ConfirmationRequired => "confirmation_required",
            Refusal::DisabledTool => "disabled_tool",
            Refusal::NotSandboxTool => "not_sandbox_tool",
            Refusal::InvalidCallId => "invalid_call_id",
            Refusal::Busy => "busy",
            Refusal::TooManyCalls => "too_many_calls",
            Refusal::CallRunning => "call_running",
            Refusal::UnknownCall => "unknown_call",
            Refusal::Unbound => "unbound",
            Refusal::TransferRefused => "transfer_refused",
        }
    }

    /// The kind named by a wire string; `None` for a kind this build does
    /// not know (a newer runner), which a client treats as a plain refusal.
    pub fn from_wire(s: &str) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// The gRPC code this refusal travels with. Confirmation is
    /// `FAILED_PRECONDITION` (the call may succeed once confirmed); a
    /// disabled tool is `PERMISSION_DENIED` (it never will); a misrouted or
    /// misnamed call is `INVALID_ARGUMENT`; a full runner is
    /// `RESOURCE_EXHAUSTED` (retry later); an unbound warm sandbox is
    /// `UNAVAILABLE` (retry shortly). Clients that predate the
    /// metadata key still get the gist from the code.
    pub const fn code(self) -> tonic::Code {
        match self {
            Refusal::ConfirmationRequired => tonic::Code::FailedPrecondition,
            Refusal::DisabledTool => tonic::Code::PermissionDenied,
            Refusal::NotSandboxTool | Refusal::InvalidCallId | Refusal::TransferRefused => {
                tonic::Code::InvalidArgument
            }
            Refusal::Busy | Refusal::TooManyCalls => tonic::Code::ResourceExhausted,
            Refusal::CallRunning => tonic::Code::AlreadyExists,
            Refusal::UnknownCall => tonic::Code::NotFound,
            Refusal::Unbound => tonic::Code::Unavailable,
        }
    }

    /// The status the runner answers with: this refusal's code, `message`
    /// for people, and the metadata entry for programs.
    pub fn status(self, message: impl Into<String>) -> tonic::Status {
        let mut status = tonic::Status::new(self.code(), message);
        status.metadata_mut().insert(
            REFUSAL_METADATA_KEY,
            tonic::metadata::MetadataValue::from_static(self.as_str()),
        );
        status
    }

    /// The refusal a status carries, if any. A status without the entry
    /// (a runner fault, a broken connection) or with an unknown value is
    /// `None`.
    pub fn from_status(status: &tonic::Status) -> Option<Refusal> {
        status
            .metadata()
            .get(REFUSAL_METADATA_KEY)
            .and_then(|v| v.to_str().ok())
            .and_then(Refusal::from_wire)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_refusal_survives_the_wire() {
        for r in Refusal::ALL {
            let status = r.status("why");
            assert_eq!(status.code(), r.code());
            assert_eq!(status.message(), "why");
            assert_eq!(Refusal::from_status(&status), Some(r));
            assert_eq!(Refusal::from_wire(&r.to_string()), Some(r));
        }
    }

    #[test]
    fn the_wire_strings_are_stable() {
        // Older clients match these strings; changing one is a breaking
        // change of the protocol, not a rename.
        let wire: Vec<&str> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            wire,
            [
                "confirmation_required",
                "disabled_tool",
                "not_sandbox_tool",
                "invalid_call_id",
                "busy",
                "too_many_calls",
                "call_running",
                "unknown_call",
                "unbound",
                "transfer_refused",
            ]
        );
    }

    #[test]
    fn statuses_without_a_known_refusal_are_none() {
        assert_eq!(Refusal::from_status(&tonic::Status::internal("boom")), None);
        let mut odd = tonic::Status::failed_precondition("x");
        odd.metadata_mut().insert(
            REFUSAL_METADATA_KEY,
            tonic::metadata::MetadataValue::from_static("from_the_future"),
        );
        assert_eq!(Refusal::from_status(&odd), None);
    }
}
