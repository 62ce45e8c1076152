//! What the plugin reads from a session's status, and the checks it makes
//! before dialling the runner (the runner checks again: this is for a clear
//! message, not for enforcement).

use crds::{AgentSession, SessionPhase};

use crate::error::Error;

/// The pre-flight verdict for calling `tool` on `session`.
pub fn preflight(session: &AgentSession, tool: &str, confirmed: bool) -> Result<String, Error> {
    let pod = ready_pod(session)?;
    let name = session.metadata.name.clone().unwrap_or_default();
    let status = session.status.clone().unwrap_or_default();
    if toolset::is_web_tool(tool) {
        return Err(Error::NotSandboxTool {
            tool: tool.to_owned(),
        });
    }
    let Some(policy) = status.policies.get(tool) else {
        let enabled: Vec<&str> = status.policies.keys().map(String::as_str).collect();
        return Err(Error::Disabled {
            session: name,
            tool: tool.to_owned(),
            enabled: enabled.join(", "),
        });
    };
    if policy == "always_ask" && !confirmed {
        return Err(Error::ConfirmationRequired {
            tool: tool.to_owned(),
        });
    }
    Ok(pod)
}

/// The pod of a Ready session (what `cp` needs: no tool is called).
pub fn ready_pod(session: &AgentSession) -> Result<String, Error> {
    let name = session.metadata.name.clone().unwrap_or_default();
    let status = session.status.clone().unwrap_or_default();
    if status.phase != Some(SessionPhase::Ready) {
        let phase = status
            .phase
            .map_or_else(|| "unknown".to_owned(), |p| format!("{p:?}"));
        let detail = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map_or_else(
                || "no status yet; is the operator running?".to_owned(),
                |c| format!("{}: {}", c.reason, c.message),
            );
        return Err(Error::NotReady {
            session: name,
            phase,
            detail,
        });
    }
    status.pod_name.ok_or(Error::NotReady {
        session: name,
        phase: "Ready".into(),
        detail: "status names no pod".into(),
    })
}

/// The `tools` table: name, policy, source, one line each.
pub fn tools_table(session: &AgentSession) -> String {
    let status = session.status.clone().unwrap_or_default();
    let mut out = format!("{:<28} {:<13} {}\n", "TOOL", "POLICY", "SOURCE");
    for t in &status.tools {
        out.push_str(&format!(
            "{:<28} {:<13} {}\n",
            t.name,
            t.policy.as_deref().unwrap_or("-"),
            t.source
        ));
    }
    if status.tools.is_empty() {
        out.push_str("(no tools enabled)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crds::{AgentSessionSpec, AgentSessionStatus};

    fn session(phase: Option<SessionPhase>) -> AgentSession {
        let spec: AgentSessionSpec =
            serde_json::from_value(serde_json::json!({"image": "x"})).expect("spec");
        let mut s = AgentSession::new("demo", spec);
        s.status = Some(AgentSessionStatus {
            phase,
            pod_name: Some("demo-sandbox".into()),
            policies: [
                ("bash".to_owned(), "always_allow".to_owned()),
                ("write".to_owned(), "always_ask".to_owned()),
            ]
            .into(),
            ..AgentSessionStatus::default()
        });
        s
    }

    #[test]
    fn preflight_refuses_with_a_reason() {
        let ready = session(Some(SessionPhase::Ready));
        assert_eq!(
            preflight(&ready, "bash", false).expect("ok"),
            "demo-sandbox"
        );
        assert!(matches!(
            preflight(&ready, "write", false),
            Err(Error::ConfirmationRequired { .. })
        ));
        assert!(preflight(&ready, "write", true).is_ok());
        let err = preflight(&ready, "grep", false).expect_err("disabled");
        assert_eq!(
            err.to_string(),
            "tool \"grep\" is not enabled in AgentSession demo; enabled: bash, write"
        );
        assert!(matches!(
            preflight(&ready, "web_fetch", true),
            Err(Error::NotSandboxTool { .. })
        ));
        let pending = session(Some(SessionPhase::Pending));
        assert!(matches!(
            preflight(&pending, "bash", false),
            Err(Error::NotReady { .. })
        ));
    }
}
