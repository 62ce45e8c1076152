//! Why a runner (`agent-sidecar serve`) ended, as the exit code its
//! container's termination shows: the operator reads it from the pod's
//! status (with the message the runner wrote to the termination log) and
//! says in the session's status what happened. A runner in a sandbox has
//! no credential to write anything else; its exit is its one report.

/// The sandbox reached its process limit: the runner ended every process
/// in it and exited, so that the kubelet restarts it clean (the workspace
/// and bash's state are kept).
pub const PROCESS_LIMIT: i32 = 75;

/// A process in the sandbox was killed by the kernel's out-of-memory
/// killer: the runner ended every process in it and exited, as Kubernetes
/// itself does on nodes that kill a container's processes as a group.
pub const OUT_OF_MEMORY: i32 = 76;

/// Where the runner writes why it ended (the pod's default
/// `terminationMessagePath`), at most [`MAX_MESSAGE_BYTES`].
pub const TERMINATION_LOG: &str = "/dev/termination-log";

/// The kubelet keeps at most 4096 bytes of a termination message.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// A runner exit the operator reports, by its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    ProcessLimit,
    OutOfMemory,
}

impl Ended {
    /// The report an exit code stands for; `None` for any other.
    pub fn from_exit_code(code: i32) -> Option<Self> {
        match code {
            PROCESS_LIMIT => Some(Self::ProcessLimit),
            OUT_OF_MEMORY => Some(Self::OutOfMemory),
            _ => None,
        }
    }

    /// The exit code.
    pub fn exit_code(self) -> i32 {
        match self {
            Self::ProcessLimit => PROCESS_LIMIT,
            Self::OutOfMemory => OUT_OF_MEMORY,
        }
    }

    /// The reason of the session's `LimitReached` condition.
    pub fn reason(self) -> &'static str {
        match self {
            Self::ProcessLimit => "ProcessLimit",
            Self::OutOfMemory => "OOMKilled",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_stay_clear_of_the_cli_convention() {
        for e in [Ended::ProcessLimit, Ended::OutOfMemory] {
            assert_eq!(Ended::from_exit_code(e.exit_code()), Some(e));
            assert!(e.exit_code() > i32::from(crate::exit::COULD_NOT_CALL));
            assert!(e.exit_code() < 126, "shell-reserved codes start at 126");
        }
        assert_eq!(Ended::from_exit_code(0), None);
        assert_eq!(Ended::from_exit_code(1), None);
    }
}
