//! A call on a suspended session: said plainly, or -- when the session
//! opted in with `lifetime.wakeOnCall` and was suspended for idling -- the
//! session is woken (the wake annotation) and the call waits for its pod.

use std::time::Duration;

use crds::{AgentSession, SessionPhase, WAKE_ANNOTATION};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::error::Error;

/// How a suspended session may be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not suspended: call it.
    Serve,
    /// Suspended after idling, and it lets the plugin wake it.
    Wake,
    /// Suspended, and it may not be woken by a call; why and what to type.
    Refuse(String),
}

/// What to do about `session`'s suspension. Pure.
pub fn verdict(session: &AgentSession) -> Verdict {
    let phase = session.status.as_ref().and_then(|s| s.phase);
    if phase != Some(SessionPhase::Suspended) {
        return Verdict::Serve;
    }
    let name = session.metadata.name.as_deref().unwrap_or_default();
    if session.spec.suspended == Some(true) {
        return Verdict::Refuse(format!(
            "it is suspended by its spec; resume it with: kubectl patch agentsession {name} --type merge -p '{{\"spec\":{{\"suspended\":false}}}}'"
        ));
    }
    let wakes = session
        .spec
        .lifetime
        .as_ref()
        .and_then(|l| l.wake_on_call)
        .unwrap_or(false);
    if wakes {
        Verdict::Wake
    } else {
        Verdict::Refuse(format!(
            "it was suspended after idling and does not let calls wake it (spec.lifetime.wakeOnCall); wake it with: kubectl annotate agentsession {name} {WAKE_ANNOTATION}=$(date -u +%Y-%m-%dT%H:%M:%SZ) --overwrite"
        ))
    }
}

/// The session, ready to be called: as given when it is not suspended, or
/// woken and re-read once its pod is ready (within `timeout`).
pub async fn awake(
    sessions: &Api<AgentSession>,
    session: AgentSession,
    timeout: Duration,
) -> Result<AgentSession, Error> {
    let name = session.metadata.name.clone().unwrap_or_default();
    match verdict(&session) {
        Verdict::Serve => return Ok(session),
        Verdict::Refuse(detail) => {
            return Err(Error::Suspended {
                session: name,
                detail,
            });
        }
        Verdict::Wake => {}
    }
    eprintln!("kubectl agent: waking AgentSession {name} ...");
    let body = serde_json::json!({
        "metadata": {"annotations": {WAKE_ANNOTATION: Timestamp::now().to_string()}}
    });
    sessions
        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await?;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let s = sessions.get(&name).await?;
        let status = s.status.as_ref();
        if status.and_then(|st| st.phase) == Some(SessionPhase::Ready)
            && status.and_then(|st| st.pod_name.as_ref()).is_some()
        {
            return Ok(s);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::WakeTimedOut {
                session: name,
                seconds: timeout.as_secs(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn session(spec: serde_json::Value, phase: SessionPhase) -> AgentSession {
        let mut base = json!({"image": "i", "workdir": "/w", "tools": []});
        if let (Some(b), Some(e)) = (base.as_object_mut(), spec.as_object()) {
            b.extend(e.clone());
        }
        let mut s = AgentSession::new("s", serde_json::from_value(base).expect("spec"));
        s.status = Some(crds::AgentSessionStatus {
            phase: Some(phase),
            ..Default::default()
        });
        s
    }

    #[test]
    fn suspended_sessions_are_refused_unless_they_opted_in() {
        assert_eq!(
            verdict(&session(json!({}), SessionPhase::Ready)),
            Verdict::Serve
        );
        let by_spec = session(
            json!({"suspended": true, "lifetime": {"wakeOnCall": true}}),
            SessionPhase::Suspended,
        );
        assert!(
            matches!(verdict(&by_spec), Verdict::Refuse(m) if m.contains("\"suspended\":false"))
        );
        let idle = session(json!({}), SessionPhase::Suspended);
        assert!(matches!(verdict(&idle), Verdict::Refuse(m) if m.contains("wakeOnCall")));
        let opted = session(
            json!({"lifetime": {"wakeOnCall": true}}),
            SessionPhase::Suspended,
        );
        assert_eq!(verdict(&opted), Verdict::Wake);
    }
}
