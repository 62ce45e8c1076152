//! The webhook's decisions on AdmissionReview fixtures, snapshotted.

use operator::admission::review::review;
use operator::policy::SessionPolicy;
use serde_json::{Value, json};

fn request(op: &str, spec: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "agentplane.dev", "version": "v1alpha1", "kind": "AgentSession"},
            "resource": {"group": "agentplane.dev", "version": "v1alpha1", "resource": "agentsessions"},
            "requestKind": {"group": "agentplane.dev", "version": "v1alpha1", "kind": "AgentSession"},
            "requestResource": {"group": "agentplane.dev", "version": "v1alpha1", "resource": "agentsessions"},
            "name": "demo",
            "namespace": "team-a",
            "operation": op,
            "userInfo": {"username": "alice"},
            "object": {"apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
                       "metadata": {"name": "demo", "namespace": "team-a"}, "spec": spec},
            "oldObject": null,
            "dryRun": false,
            "options": null
        }
    }))
    .expect("serialises")
}

fn answer(op: &str, spec: Value) -> Value {
    let (_, resp) = review(&request(op, spec), &SessionPolicy::default()).expect("a review");
    serde_json::to_value(resp).expect("json")
}

#[test]
fn allows_a_valid_session() {
    insta::assert_json_snapshot!(
        "allow",
        answer(
            "CREATE",
            json!({"image": "busybox", "tools": [{"type": "agent_toolset_20260401"}]})
        )
    );
}

#[test]
fn denies_a_misspelt_policy_naming_its_path() {
    let resp = answer(
        "CREATE",
        json!({"image": "busybox", "tools": [
        {"type": "agent_toolset_20260401", "configs": [{"name": "bash", "permission_polciy": {"type": "always_ask"}}]}]}),
    );
    assert_eq!(resp["response"]["allowed"], false);
    assert!(
        resp["response"]["status"]["message"]
            .as_str()
            .expect("message")
            .starts_with("spec.tools[0].configs[0].permission_polciy: unknown key")
    );
    insta::assert_json_snapshot!("deny_misspelt", resp);
}

#[test]
fn warns_without_denying() {
    let resp = answer(
        "UPDATE",
        json!({"image": "busybox", "tools": [
        {"type": "agent_toolset_20260401", "configs": [{"name": "web_fetch", "enabled": true}]}]}),
    );
    assert_eq!(resp["response"]["allowed"], true);
    assert_eq!(
        resp["response"]["warnings"].as_array().map(Vec::len),
        Some(1)
    );
    insta::assert_json_snapshot!("warn_web_tool", resp);
}

#[test]
fn a_spec_that_is_not_a_spec_is_denied() {
    let resp = answer("CREATE", json!({"tools": "nope"}));
    assert_eq!(resp["response"]["allowed"], false);
    let message = resp["response"]["status"]["message"]
        .as_str()
        .expect("message");
    // The denial names the path of what does not fit, not only `spec`.
    assert!(
        message.starts_with("spec.tools: invalid type: string \"nope\""),
        "{message}"
    );
    let resp = answer(
        "CREATE",
        json!({"mcpServers": [{"name": "a", "type": "url"}]}),
    );
    let message = resp["response"]["status"]["message"]
        .as_str()
        .expect("message");
    assert!(
        message.starts_with("spec.mcpServers[0]: missing field `url`"),
        "{message}"
    );
}

#[test]
fn delete_is_always_allowed() {
    let resp = answer(
        "DELETE",
        json!({"image": "x", "tools": [{"type": "bogus"}]}),
    );
    assert_eq!(resp["response"]["allowed"], true);
}

#[test]
fn garbage_is_not_a_review() {
    assert!(review(b"{}", &SessionPolicy::default()).is_err());
    assert!(review(b"not json", &SessionPolicy::default()).is_err());
}

#[test]
fn a_secret_reference_is_denied_unless_the_platform_allows_it() {
    let spec = json!({
        "image": "busybox",
        "env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}],
        "tools": [{"type": "agent_toolset_20260401"}]
    });
    let body = request("CREATE", spec);
    let (denied, _) = review(&body, &SessionPolicy::default()).expect("a review");
    assert!(!denied.allowed);
    let msg = denied.message.unwrap_or_default();
    assert!(
        msg.starts_with("spec.env[0].valueFrom.secretKeyRef.name: Secret \"db\""),
        "{msg}"
    );
    let allowing = SessionPolicy {
        secret_refs: ["db".to_owned()].into(),
        ..SessionPolicy::default()
    };
    let (allowed, _) = review(&body, &allowing).expect("a review");
    assert!(allowed.allowed, "{:?}", allowed.message);
}

/// Every denial names a path first (the admission_review fuzz target's
/// invariant), the request without an object included.
#[test]
fn a_create_without_an_object_is_denied_naming_it() {
    let mut body: Value = serde_json::from_slice(&request("CREATE", json!({}))).expect("json");
    body["request"]["object"] = Value::Null;
    let (decision, _) = review(
        &serde_json::to_vec(&body).expect("json"),
        &SessionPolicy::default(),
    )
    .expect("a review");
    assert!(!decision.allowed);
    assert_eq!(
        decision.message.as_deref(),
        Some("request.object: required but missing")
    );
}
