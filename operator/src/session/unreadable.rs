//! Sessions stored in a shape this operator cannot read.
//!
//! The CRD schema and the webhook keep bad specs out, but neither is a
//! guarantee: the webhook can be configured to fail open, a CRD can be
//! upgraded ahead of or behind the operator, and anyone allowed to write
//! `status` can write what the typed object refuses. The controller watches
//! sessions through kube's `DeserializeGuard`, so such an object arrives as
//! an error of its own instead of failing the list, and with it the watch of
//! every other session in the cluster. This module turns it into a status
//! the session's author can act on. Pure; the controller does the I/O.

use crds::AgentSession;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

/// The reason of the Ready condition of a session that cannot be read.
pub const REASON: &str = "Unreadable";

/// Where and why `raw` (the object as the API server returns it) fails to
/// decode as an [`AgentSession`]: the JSON path of the first offending
/// field, then serde's message. `None` when it decodes after all (it was
/// fixed since it was watched).
pub fn locate(raw: &Value) -> Option<String> {
    match serde_path_to_error::deserialize::<_, AgentSession>(raw) {
        Ok(_) => None,
        Err(e) => {
            let path = e.path().to_string();
            let at = if path == "." { String::new() } else { path };
            Some(format!("{at}: {}", e.into_inner()))
        }
    }
}

/// The status to apply: phase Invalid and Ready=False naming the problem.
/// No pod, claim or other object is touched for such a session: what runs
/// keeps running (its workspace with it) until the object is readable again.
pub fn status_body(problem: &str, generation: Option<i64>, now: Timestamp) -> Value {
    // Bounded: serde's message quotes the offending value.
    let mut problem = problem.to_owned();
    if problem.len() > 512 {
        let mut cut = 512;
        while !problem.is_char_boundary(cut) {
            cut -= 1;
        }
        problem.truncate(cut);
        problem.push('…');
    }
    json!({
        "apiVersion": format!("{}/{}", crds::GROUP, crds::VERSION),
        "kind": "AgentSession",
        "status": {
            "phase": "Invalid",
            "observedGeneration": generation,
            "conditions": [{
                "type": "Ready",
                "status": "False",
                "reason": REASON,
                "message": format!(
                    "the stored session cannot be read by this operator ({problem}); fix or re-create it -- nothing is started or stopped until then"
                ),
                "observedGeneration": generation,
                "lastTransitionTime": now.to_string(),
            }],
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(spec: Value) -> Value {
        json!({
            "apiVersion": "agentplane.dev/v1alpha1",
            "kind": "AgentSession",
            "metadata": {"name": "s", "namespace": "n"},
            "spec": spec,
        })
    }

    #[test]
    fn a_readable_session_has_no_problem() {
        let ok = session(json!({"image": "img", "workdir": "/w", "tools": []}));
        assert_eq!(locate(&ok), None);
    }

    #[test]
    fn the_problem_names_the_json_path() {
        let bad = session(json!({"image": 7, "workdir": "/w", "tools": []}));
        let got = locate(&bad).expect("a problem");
        assert!(got.starts_with("spec.image: "), "{got}");
        let mut status = session(json!({"image": "img", "workdir": "/w", "tools": []}));
        status["status"] = json!({"endpoint": {"socket": "/s", "port": 70000}});
        let got = locate(&status).expect("a problem");
        assert!(got.starts_with("status.endpoint.port: "), "{got}");
    }

    #[test]
    fn the_status_is_invalid_and_bounded() {
        let body = status_body(&"x".repeat(10_000), Some(3), Timestamp::UNIX_EPOCH);
        let c = &body["status"]["conditions"][0];
        assert_eq!(body["status"]["phase"], "Invalid");
        assert_eq!(c["reason"], REASON);
        assert_eq!(c["status"], "False");
        assert!(c["message"].as_str().expect("message").len() < 700);
    }
}
