//! Stall budgets: how long a process may go without progress before its work
//! is reclaimed, and the floor under which a budget would cancel a healthy
//! step on every retry instead of catching a wedge.

use std::time::Duration;

use crate::duration;
use crate::error::ToolsetError;
use crate::{DEFAULT_STALL_BUDGET, MAX_TIMEOUT};

/// What a step that hits its own cap needs on top of the cap to answer: the
/// kill grace past the deadline and the trip back over the transport.
const ANSWER_GRACE: Duration = Duration::from_secs(60);

/// The shortest stall budget a healthy run survives: the longest single step
/// it may spend inside one silent interval, plus a minute. Every deployment
/// has a step of [`MAX_TIMEOUT`] (one `bash` call); `longest_step` names any
/// longer one the caller knows about.
pub fn stall_floor(longest_step: Duration) -> Duration {
    longest_step.max(MAX_TIMEOUT).saturating_add(ANSWER_GRACE)
}

/// Refuses a default budget that the caller's longest step has outgrown,
/// naming both knobs and the value that would work. The unset budget is the
/// common case (nobody tunes a stall knob, people do raise a clone timeout),
/// so it needs the same floor as a set one.
pub fn check_stall_default(
    name: &str,
    step_name: &str,
    default: Duration,
    longest_step: Duration,
) -> Result<(), ToolsetError> {
    let floor = stall_floor(longest_step);
    if default >= floor {
        return Ok(());
    }
    Err(ToolsetError::StallDefaultBelowFloor {
        name: name.to_owned(),
        step_name: step_name.to_owned(),
        default,
        floor,
        longest_step: longest_step.max(MAX_TIMEOUT),
    })
}

/// Reads the stall budget set in the environment variable `name` (its value
/// is `value`; empty means unset and yields [`DEFAULT_STALL_BUDGET`], which a
/// caller with a step longer than [`MAX_TIMEOUT`] checks with
/// [`check_stall_default`]).
///
/// A malformed value fails rather than falling back, and so does a
/// non-positive one: it parses, but a consumer's defaulting would replace
/// it, starting a process whose bound is silently not the configured one. A
/// typo and a negative get different messages. There is no off switch.
pub fn parse_stall_timeout(
    name: &str,
    value: &str,
    longest_step: Duration,
) -> Result<Duration, ToolsetError> {
    if value.is_empty() {
        return Ok(DEFAULT_STALL_BUDGET);
    }
    let parsed = duration::parse(value).ok_or_else(|| ToolsetError::StallMalformed {
        name: name.to_owned(),
        value: value.to_owned(),
    })?;
    if parsed.negative || parsed.magnitude.is_zero() {
        return Err(ToolsetError::StallNotPositive {
            name: name.to_owned(),
            value: value.to_owned(),
            default: DEFAULT_STALL_BUDGET,
        });
    }
    let floor = stall_floor(longest_step);
    if parsed.magnitude < floor {
        return Err(ToolsetError::StallBelowFloor {
            name: name.to_owned(),
            value: value.to_owned(),
            floor,
            longest_step: longest_step.max(MAX_TIMEOUT),
        });
    }
    Ok(parsed.magnitude)
}
