//! A call that reaches a warm pool's sandbox before its binding does.
//!
//! A session served from a warm pool is Ready as soon as it claims a pod,
//! but the runner learns its session from files the operator writes into
//! the pod's ConfigMap, which the kubelet syncs a moment later. Until then
//! the runner refuses every call as [`Refusal::Unbound`]. The wait is short
//! and certain to end, so the plugin retries rather than failing the user.

use std::time::Duration;

use runner_api::Refusal;

/// The pause between tries: short, because the runner binds on the call
/// that finds the files, and a try costs one small request.
pub const PAUSE: Duration = Duration::from_millis(50);

/// How long the plugin waits for a sandbox to be bound before giving up.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// What to do after a call failed with `e`, `waited` after the first
/// unbound refusal (zero on the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Unbound, with time left: pause [`PAUSE`] and call again.
    Retry,
    /// Unbound for longer than [`PATIENCE`]: fail with [`Error::NotBound`](crate::error::Error::NotBound).
    GiveUp,
    /// Not an unbound refusal: the error is the call's answer.
    Fail,
}

/// The retry decision for one failed try.
pub fn next(e: &runner_api::Error, waited: Duration) -> Next {
    match e.refusal() {
        Some(Refusal::Unbound) if waited < PATIENCE => Next::Retry,
        Some(Refusal::Unbound) => Next::GiveUp,
        _ => Next::Fail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unbound_is_retried_and_only_for_ten_seconds() {
        let unbound = runner_api::Error::from(Refusal::Unbound.status("not bound yet"));
        assert_eq!(next(&unbound, Duration::ZERO), Next::Retry);
        assert_eq!(next(&unbound, Duration::from_millis(9_950)), Next::Retry);
        assert_eq!(next(&unbound, PATIENCE), Next::GiveUp);
        assert_eq!(next(&unbound, Duration::from_secs(60)), Next::GiveUp);
        for r in Refusal::ALL.into_iter().filter(|r| *r != Refusal::Unbound) {
            let e = runner_api::Error::from(r.status("no"));
            assert_eq!(next(&e, Duration::ZERO), Next::Fail, "{r}");
        }
        // UNAVAILABLE without the mark is a broken connection, not a
        // sandbox waiting for its session.
        let broken = runner_api::Error::from(tonic::Status::unavailable("connection reset"));
        assert_eq!(next(&broken, Duration::ZERO), Next::Fail);
    }
}
