//! The crate's one error type.
//!
//! Every message is the body of an admission denial or a startup refusal, so
//! each names what was wrong and where: the JSON path inside the entry for a
//! toolset, the environment variable for a stall budget. The path is kept as a
//! separate field so that a caller that knows where the entry sits (the
//! webhook knows it is `spec.tools[3]`) can prefix it without reparsing text.

use std::time::Duration;

use crate::duration::format_duration;

/// What a toolset entry, a call id or a stall budget got wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolsetError {
    /// The bytes are not JSON at all.
    #[error("{}: not valid JSON: {message}", show(path))]
    Syntax { path: String, message: String },

    /// The same key twice in one object: a decoder would silently keep one of
    /// them, and at a permission boundary "which one" must not be a guess.
    #[error("{}: duplicate key (a JSON object may name each key once)", show(path))]
    DuplicateKey { path: String },

    /// A key the schema does not define, most often a typo.
    #[error("{}: unknown key; allowed here: {allowed}", show(path))]
    UnknownKey { path: String, allowed: String },

    /// A value of the wrong JSON type (null included: null is not "absent").
    #[error("{}: expected {expected}, found {found}", show(path))]
    WrongType {
        path: String,
        expected: &'static str,
        found: &'static str,
    },

    /// A required key is absent.
    #[error("{}: required but missing", show(path))]
    Missing { path: String },

    /// A required string is empty.
    #[error("{}: must not be empty", show(path))]
    Empty { path: String },

    /// The entry is not of the kind the function handles.
    #[error("{}: expected {expected:?}, found {found}", show(path))]
    WrongEntryType {
        path: String,
        expected: &'static str,
        found: String,
    },

    /// A `configs[]` name that is not a tool of the agent toolset.
    #[error(
        "{}: {name:?} is not a tool of agent_toolset_20260401; known tools: {known}",
        show(path)
    )]
    UnknownTool {
        path: String,
        name: String,
        known: String,
    },

    /// Two `configs[]` entries for one tool: which one applies would depend on
    /// reading order, so neither is taken.
    #[error("{}: tool {name:?} is configured twice (first at {first})", show(path))]
    DuplicateTool {
        path: String,
        name: String,
        first: String,
    },

    /// A permission policy type this platform cannot evaluate. Defaulting it
    /// would run a tool without the confirmation its author may have meant, so
    /// it is refused wherever a live tool carries it.
    #[error(
        "{}: permission policy type {value:?} cannot be evaluated; expected \"always_allow\" or \"always_ask\"",
        show(path)
    )]
    UnevaluablePolicy { path: String, value: String },

    /// A second entry of a kind a session may hold once.
    #[error(
        "{}: a second {kind} entry (the first is at {first}); a session holds at most one",
        show(path)
    )]
    DuplicateToolset {
        path: String,
        kind: &'static str,
        first: String,
    },

    /// A call id that cannot safely name a file in the sandbox.
    #[error("call id {id:?} cannot name an output file: {reason}")]
    InvalidCallId { id: String, reason: &'static str },

    /// A stall budget that does not parse as a duration.
    #[error("{name}={value:?}: not a duration (write it like \"45m\", \"1h30m\" or \"90s\")")]
    StallMalformed { name: String, value: String },

    /// A stall budget that parses but is zero or negative. There is no off
    /// switch, and a non-positive value would silently become the default.
    #[error(
        "{name}={value:?}: must be positive; a stall budget has no off switch (unset it to use the default, {})",
        format_duration(*default)
    )]
    StallNotPositive {
        name: String,
        value: String,
        default: Duration,
    },

    /// A stall budget under the floor of the longest step: it would cancel a
    /// healthy step on every retry.
    #[error(
        "{name}={value:?}: below the floor of {}: the longest step ({}) plus a minute for it to answer; set {name} to at least {}",
        format_duration(*floor), format_duration(*longest_step), format_duration(*floor)
    )]
    StallBelowFloor {
        name: String,
        value: String,
        floor: Duration,
        longest_step: Duration,
    },

    /// The default stall budget, which nobody set, is under the floor of a step
    /// an operator lengthened.
    #[error(
        "{name} is unset and its default ({}) is below the floor of {} that {step_name} ({}) needs; set {name} to at least {} or lower {step_name}",
        format_duration(*default), format_duration(*floor), format_duration(*longest_step), format_duration(*floor)
    )]
    StallDefaultBelowFloor {
        name: String,
        step_name: String,
        default: Duration,
        floor: Duration,
        longest_step: Duration,
    },
}

/// The root of an entry has an empty path; messages call it "entry" so that
/// they never start with a bare colon.
fn show(path: &str) -> &str {
    if path.is_empty() { "entry" } else { path }
}

impl ToolsetError {
    /// The JSON path inside the entry the error is about, for errors that have
    /// one ("" is the entry itself).
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::Syntax { path, .. }
            | Self::DuplicateKey { path }
            | Self::UnknownKey { path, .. }
            | Self::WrongType { path, .. }
            | Self::Missing { path }
            | Self::Empty { path }
            | Self::WrongEntryType { path, .. }
            | Self::UnknownTool { path, .. }
            | Self::DuplicateTool { path, .. }
            | Self::UnevaluablePolicy { path, .. }
            | Self::DuplicateToolset { path, .. } => Some(path),
            _ => None,
        }
    }

    /// Re-roots the error under `prefix`, the path of the entry in its
    /// document (`spec.tools[0]`), so that the message names the full path.
    #[must_use]
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        let join = |path: &mut String| {
            *path = crate::path::join(prefix, path);
        };
        match &mut self {
            Self::Syntax { path, .. }
            | Self::DuplicateKey { path }
            | Self::UnknownKey { path, .. }
            | Self::WrongType { path, .. }
            | Self::Missing { path }
            | Self::Empty { path }
            | Self::WrongEntryType { path, .. }
            | Self::UnevaluablePolicy { path, .. } => join(path),
            Self::UnknownTool { path, .. } => join(path),
            Self::DuplicateTool { path, first, .. }
            | Self::DuplicateToolset { path, first, .. } => {
                join(path);
                join(first);
            }
            _ => {}
        }
        self
    }
}
