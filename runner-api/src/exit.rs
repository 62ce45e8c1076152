//! The exit codes of the CLIs that call the runner (`agent-sidecar call |
//! health | tools` and `kubectl agent`), one convention for both so that a
//! script can branch on them without knowing which one it ran.
//!
//! The split follows what the caller should do next: read the tool's
//! output (1), change the call (2), or fix the connection and retry (3).

/// The call was made and the tool succeeded (or the runner is serving).
pub const OK: u8 = 0;
/// The call was made and the tool reported an error (`is_error`), which
/// the model would read; for `health`, the runner answered NOT_SERVING.
pub const TOOL_ERROR: u8 = 1;
/// The call was refused or malformed: a usage error, an input that is not
/// a JSON object, or a refusal by the runner (policy, busy, bad call id).
/// Retrying the same call unchanged gets the same answer (except busy).
pub const REFUSED: u8 = 2;
/// The call could not be made or did not complete: the runner is
/// unreachable, the connection broke, or the runner failed on its side.
pub const COULD_NOT_CALL: u8 = 3;
/// Interrupted by the user (Ctrl-C): 128 + SIGINT, as shells report it.
pub const INTERRUPTED: u8 = 130;
