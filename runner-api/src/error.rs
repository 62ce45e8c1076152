//! What can go wrong calling the runner, worded for the person who has to
//! act on it.
//!
//! A tool that fails is not an [`Error`]: it is a
//! [`ToolResult`](crate::ToolResult) with `is_error` set, which the model
//! reads. An [`Error`] means the call was not run as asked, and its variant
//! says whose move it is: [`Error::Refused`] (change the call),
//! [`Error::Connect`] and [`Error::Broken`] (fix the way to the runner and
//! retry), [`Error::Failed`] (look at the runner).

use crate::exit;
use crate::refusal::Refusal;

/// The runner-api crate's one error type.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No connection to the runner could be opened.
    #[error(
        "cannot connect to the runner at {target}: {detail} (is `agent-sidecar serve` listening there, and may this user open it?)"
    )]
    Connect { target: String, detail: String },

    /// The runner judged the call and declined to run it. `refusal` says
    /// why in a form a program can act on; it is `None` only for a status
    /// from a runner that names no reason (or one this build does not know).
    #[error("the runner refused the call ({code:?}): {message}")]
    Refused {
        code: tonic::Code,
        message: String,
        refusal: Option<Refusal>,
    },

    /// The connection to the runner broke before the answer arrived; the
    /// call may still be running in the sandbox.
    #[error("the connection to the runner broke ({code:?}): {message}")]
    Broken { code: tonic::Code, message: String },

    /// The runner failed on its side (it could not start bash, its state
    /// directory is unwritable) or does not implement the method.
    #[error("the runner failed the call ({code:?}): {message}; see the runner's log")]
    Failed { code: tonic::Code, message: String },
}

impl Error {
    /// Classifies a status a call ended with. The runner marks every
    /// refusal with a [`Refusal`]; the codes it uses for refusals also
    /// count as refusals without the mark, so a runner that predates a
    /// kind still reads as "refused" rather than "failed". The codes a
    /// broken connection produces (and h2's wording for a stream reset
    /// mid-frame) are [`Error::Broken`]: the runner never sends them.
    pub fn from_status(status: &tonic::Status) -> Error {
        use tonic::Code;
        let code = status.code();
        let message = status.message().to_owned();
        let refusal = Refusal::from_status(status);
        match code {
            _ if refusal.is_some() => Error::Refused {
                code,
                message,
                refusal,
            },
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::PermissionDenied
            | Code::ResourceExhausted
            | Code::AlreadyExists
            | Code::NotFound
            | Code::OutOfRange => Error::Refused {
                code,
                message,
                refusal,
            },
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::DeadlineExceeded => {
                Error::Broken { code, message }
            }
            Code::Internal if message.contains("h2 protocol error") => {
                Error::Broken { code, message }
            }
            _ => Error::Failed { code, message },
        }
    }

    /// Why the runner refused the call, when it did and said so.
    pub fn refusal(&self) -> Option<Refusal> {
        match self {
            Error::Refused { refusal, .. } => *refusal,
            _ => None,
        }
    }

    /// The gRPC code the call ended with (none when it never started).
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            Error::Connect { .. } => None,
            Error::Refused { code, .. }
            | Error::Broken { code, .. }
            | Error::Failed { code, .. } => Some(*code),
        }
    }

    /// Whether reconnecting and trying again (or re-attaching to a streamed
    /// call) may help.
    pub fn is_connection_broken(&self) -> bool {
        matches!(self, Error::Broken { .. })
    }

    /// The exit code of a CLI that ends with this error (see [`exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Refused { .. } => exit::REFUSED,
            Error::Connect { .. } | Error::Broken { .. } | Error::Failed { .. } => {
                exit::COULD_NOT_CALL
            }
        }
    }
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Error {
        Error::from_status(&status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_sorted_by_whose_move_it_is() {
        let refused = Error::from(Refusal::DisabledTool.status("off"));
        assert_eq!(refused.refusal(), Some(Refusal::DisabledTool));
        assert_eq!(refused.exit_code(), exit::REFUSED);

        let unmarked = Error::from(tonic::Status::resource_exhausted("full"));
        assert!(matches!(unmarked, Error::Refused { refusal: None, .. }));
        assert_eq!(unmarked.exit_code(), exit::REFUSED);

        for s in [
            tonic::Status::unavailable("transport error"),
            tonic::Status::cancelled("gone"),
            tonic::Status::internal("h2 protocol error: stream reset"),
        ] {
            let e = Error::from(s);
            assert!(e.is_connection_broken(), "{e}");
            assert_eq!(e.exit_code(), exit::COULD_NOT_CALL);
        }

        let fault = Error::from(tonic::Status::internal("cannot start /bin/bash"));
        assert!(matches!(fault, Error::Failed { .. }));
        assert!(!fault.is_connection_broken());
        assert_eq!(fault.exit_code(), exit::COULD_NOT_CALL);
    }
}
