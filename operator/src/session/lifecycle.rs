//! Where a session is in its life: running, suspended (by request or after
//! idling) or finished (its lifetime is over). Pure: the plan asks, the
//! controller carries the answer out.
//!
//! Suspension removes the pod and keeps everything else -- the workspace
//! claim, and with it bash's state, which the runner keeps on a persistent
//! workspace (`pod::state_dir`). An idle suspension is remembered in the
//! status (`Suspended=True`, reason `Idle`, since when) and lifted by a wake
//! request: the `agentplane.dev/wake` annotation holding a later time,
//! which `kubectl agent` sets for a session that opted in (`wakeOnCall`).

use std::time::Duration;

use crds::AgentSession;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

pub use crds::WAKE_ANNOTATION;

/// Reasons of the `Suspended` condition.
pub const BY_REQUEST: &str = "Requested";
pub const IDLE: &str = "Idle";

/// What the session should be doing now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stage {
    /// A pod should run.
    Running,
    /// No pod; `reason` is [`BY_REQUEST`] or [`IDLE`]; `since` is when
    /// (kept from the previous status when it already was).
    Suspended {
        reason: &'static str,
        since: Timestamp,
    },
    /// The lifetime is over: no pod, ever again; the claim goes too when
    /// the spec says `workspaceOnFinish: Delete`.
    Finished {
        at: Timestamp,
        delete_workspace: bool,
    },
}

/// The session's stage at `now`, given its pod as observed.
pub fn stage(session: &AgentSession, pod: Option<&Pod>, now: Timestamp) -> Stage {
    let lifetime = session.spec.lifetime.as_ref();
    if let Some(end) = deadline(session)
        && now >= end
    {
        return Stage::Finished {
            at: end,
            delete_workspace: lifetime.and_then(|l| l.workspace_on_finish.as_deref())
                == Some("Delete"),
        };
    }
    let previous = suspended_since(session);
    if session.spec.suspended == Some(true) {
        let since = match previous {
            Some((BY_REQUEST, t)) => t,
            _ => now,
        };
        return Stage::Suspended {
            reason: BY_REQUEST,
            since,
        };
    }
    if lifetime.and_then(|l| l.idle_suspend_seconds).is_none() {
        return Stage::Running;
    }
    // Suspended for idling before, and no wake request since.
    if let Some((IDLE, since)) = previous
        && wake_requested(session).is_none_or(|w| w <= since)
    {
        return Stage::Suspended {
            reason: IDLE,
            since,
        };
    }
    // The runner exited after its idle time: that is the suspension.
    if pod_ended_idle(pod) && wake_requested(session).is_none_or(|w| w <= pod_started(pod)) {
        return Stage::Suspended {
            reason: IDLE,
            since: now,
        };
    }
    Stage::Running
}

/// When the session's lifetime ends, if it has one.
pub fn deadline(session: &AgentSession) -> Option<Timestamp> {
    let secs = session.spec.lifetime.as_ref()?.max_lifetime_seconds?;
    let created = session.metadata.creation_timestamp.as_ref()?.0;
    created
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(secs))
        .ok()
}

/// How long until the deadline, for the requeue.
pub fn until_deadline(session: &AgentSession, now: Timestamp) -> Option<Duration> {
    let end = deadline(session)?;
    let left = end.duration_since(now);
    Some(Duration::try_from(left).unwrap_or(Duration::ZERO))
}

/// The wake request's time, if the annotation holds a valid one.
pub fn wake_requested(session: &AgentSession) -> Option<Timestamp> {
    session
        .metadata
        .annotations
        .as_ref()?
        .get(WAKE_ANNOTATION)?
        .parse()
        .ok()
}

/// `Suspended=True` in the previous status: its reason and since when.
fn suspended_since(session: &AgentSession) -> Option<(&'static str, Timestamp)> {
    let c = session
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Suspended" && c.status == "True")?;
    let reason = match c.reason.as_str() {
        BY_REQUEST => BY_REQUEST,
        IDLE => IDLE,
        _ => return None,
    };
    Some((reason, c.last_transition_time.0))
}

/// Whether the pod ended because its runner exited after the idle time (a
/// runner exits 0 only then; the pod's restart policy is OnFailure).
fn pod_ended_idle(pod: Option<&Pod>) -> bool {
    pod.and_then(|p| p.status.as_ref())
        .and_then(|s| s.phase.as_deref())
        == Some("Succeeded")
}

fn pod_started(pod: Option<&Pod>) -> Timestamp {
    pod.and_then(|p| p.metadata.creation_timestamp.as_ref())
        .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use serde_json::json;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).expect("t")
    }

    fn session(spec_extra: serde_json::Value) -> AgentSession {
        let mut spec = json!({"image": "i", "workdir": "/w", "tools": []});
        if let (Some(o), Some(e)) = (spec.as_object_mut(), spec_extra.as_object()) {
            o.extend(e.clone());
        }
        let mut s = AgentSession::new("s", serde_json::from_value(spec).expect("spec"));
        s.metadata.creation_timestamp = Some(Time(at(1_000)));
        s
    }

    fn with_suspended(mut s: AgentSession, reason: &str, since: i64) -> AgentSession {
        s.status = Some(crds::AgentSessionStatus {
            conditions: vec![Condition {
                type_: "Suspended".into(),
                status: "True".into(),
                reason: reason.into(),
                message: String::new(),
                observed_generation: None,
                last_transition_time: Time(at(since)),
            }],
            ..Default::default()
        });
        s
    }

    fn ended_pod(created: i64) -> Pod {
        let mut p = Pod::default();
        p.metadata.creation_timestamp = Some(Time(at(created)));
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        p
    }

    #[test]
    fn the_lifetime_counts_from_creation_and_finishes() {
        let s =
            session(json!({"lifetime": {"maxLifetimeSeconds": 60, "workspaceOnFinish": "Delete"}}));
        assert_eq!(stage(&s, None, at(1_059)), Stage::Running);
        assert_eq!(until_deadline(&s, at(1_030)), Some(Duration::from_secs(30)));
        assert_eq!(
            stage(&s, None, at(1_060)),
            Stage::Finished {
                at: at(1_060),
                delete_workspace: true
            }
        );
        // Even a suspended session finishes.
        let mut s = s;
        s.spec.suspended = Some(true);
        assert!(matches!(stage(&s, None, at(2_000)), Stage::Finished { .. }));
    }

    #[test]
    fn suspension_by_request_keeps_its_start() {
        let s = session(json!({"suspended": true}));
        assert_eq!(
            stage(&s, None, at(5_000)),
            Stage::Suspended {
                reason: BY_REQUEST,
                since: at(5_000)
            }
        );
        let s = with_suspended(s, BY_REQUEST, 4_000);
        assert_eq!(
            stage(&s, None, at(5_000)),
            Stage::Suspended {
                reason: BY_REQUEST,
                since: at(4_000)
            }
        );
    }

    #[test]
    fn an_idle_exit_suspends_until_a_later_wake() {
        let s = session(json!({"lifetime": {"idleSuspendSeconds": 30}}));
        assert_eq!(stage(&s, None, at(2_000)), Stage::Running);
        let pod = ended_pod(1_500);
        assert_eq!(
            stage(&s, Some(&pod), at(2_000)),
            Stage::Suspended {
                reason: IDLE,
                since: at(2_000)
            }
        );
        // Remembered in the status once the pod is gone.
        let mut s = with_suspended(s, IDLE, 2_000);
        assert!(matches!(
            stage(&s, None, at(3_000)),
            Stage::Suspended { .. }
        ));
        // A wake request older than the suspension does nothing; a newer one wakes.
        let wake = |s: &mut AgentSession, t: i64| {
            s.metadata.annotations = Some([(WAKE_ANNOTATION.to_owned(), at(t).to_string())].into());
        };
        wake(&mut s, 1_900);
        assert!(matches!(
            stage(&s, None, at(3_000)),
            Stage::Suspended { .. }
        ));
        wake(&mut s, 2_500);
        assert_eq!(stage(&s, None, at(3_000)), Stage::Running);
        // Without idle suspension configured an ended pod is not a suspension.
        let plain = session(json!({}));
        assert_eq!(stage(&plain, Some(&pod), at(2_000)), Stage::Running);
    }
}
