//! The CRD the chart ships is the one the types generate.

use kube::CustomResourceExt;

const COMMITTED: &str =
    include_str!("../../charts/agentplane/crds/agentsessions.agentplane.dev.yaml");
const COMMITTED_POOL: &str =
    include_str!("../../charts/agentplane/crds/agentwarmpools.agentplane.dev.yaml");
const COMMITTED_ENVIRONMENT: &str =
    include_str!("../../charts/agentplane/crds/agentenvironments.agentplane.dev.yaml");
const COMMITTED_CHECKPOINT: &str =
    include_str!("../../charts/agentplane/crds/agentcheckpoints.agentplane.dev.yaml");

#[test]
fn committed_crds_match_the_types() {
    let generated = crds::crd_yaml().expect("renders");
    assert!(
        generated == COMMITTED,
        "charts/agentplane/crds/agentsessions.agentplane.dev.yaml is stale: run\n  cargo run -p crds --bin crdgen > charts/agentplane/crds/agentsessions.agentplane.dev.yaml"
    );
    let generated = crds::pool_crd_yaml().expect("renders");
    assert!(
        generated == COMMITTED_POOL,
        "charts/agentplane/crds/agentwarmpools.agentplane.dev.yaml is stale: run\n  cargo run -p crds --bin crdgen -- agentwarmpools > charts/agentplane/crds/agentwarmpools.agentplane.dev.yaml"
    );
    let generated = crds::environment_crd_yaml().expect("renders");
    assert!(
        generated == COMMITTED_ENVIRONMENT,
        "charts/agentplane/crds/agentenvironments.agentplane.dev.yaml is stale: run\n  cargo run -p crds --bin crdgen -- agentenvironments > charts/agentplane/crds/agentenvironments.agentplane.dev.yaml"
    );
    let generated = crds::checkpoint_crd_yaml().expect("renders");
    assert!(
        generated == COMMITTED_CHECKPOINT,
        "charts/agentplane/crds/agentcheckpoints.agentplane.dev.yaml is stale: run\n  cargo run -p crds --bin crdgen -- agentcheckpoints > charts/agentplane/crds/agentcheckpoints.agentplane.dev.yaml"
    );
}

#[test]
fn a_checkpoint_spec_is_immutable() {
    let crd = crds::AgentCheckpoint::crd();
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("json");
    let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
    let rules = spec["x-kubernetes-validations"].as_array().expect("rules");
    assert!(
        rules.iter().any(|r| r["rule"] == "self == oldSelf"),
        "spec must carry self == oldSelf: {rules:?}"
    );
}

#[test]
fn a_fork_names_a_checkpoint_or_a_session_and_cannot_change_it() {
    let crd = crds::AgentSession::crd();
    let schema = serde_json::to_value(&crd.spec.versions[0].schema).expect("json");
    let from = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["from"];
    for field in ["checkpoint", "session"] {
        assert_eq!(from["properties"][field]["type"], "string", "{from}");
    }
    assert!(
        from["required"].is_null(),
        "neither is required alone: {from}"
    );
    let rules = from["x-kubernetes-validations"].as_array().expect("rules");
    for rule in [
        "has(self.checkpoint) != has(self.session)",
        "self == oldSelf",
    ] {
        assert!(
            rules.iter().any(|r| r["rule"] == rule),
            "from must carry {rule}: {rules:?}"
        );
    }
    let spec: crds::AgentSessionSpec = serde_json::from_value(serde_json::json!({
        "image": "busybox", "from": {"session": "src"}
    }))
    .expect("a fork from a session's name");
    let from = spec.from.expect("from");
    assert_eq!(
        (from.checkpoint, from.session.as_deref()),
        (None, Some("src"))
    );
}

#[test]
fn an_environment_is_bounded_and_shows_its_queue() {
    let crd = crds::AgentEnvironment::crd();
    assert_eq!(crd.spec.names.short_names, Some(vec!["agenv".to_owned()]));
    let version = &crd.spec.versions[0];
    let columns: Vec<_> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        ["Environment", "Ready", "Running", "Queued", "Oldest", "Age"]
    );
    let schema = serde_json::to_value(&version.schema).expect("json");
    let spec = &schema["openAPIV3Schema"]["properties"]["spec"];
    let cap = &spec["properties"]["maxConcurrentSessions"];
    assert_eq!(
        cap["maximum"].as_f64(),
        Some(f64::from(crds::environment::MAX_CONCURRENT_SESSIONS))
    );
    assert_eq!(cap["minimum"].as_f64(), Some(1.0));
    let required: Vec<_> = spec["required"]
        .as_array()
        .expect("required")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for field in ["environmentId", "keySecretRef", "sandbox"] {
        assert!(required.contains(&field), "{field} must be required");
    }
}

#[test]
fn the_pool_scales_like_a_deployment() {
    let crd = crds::AgentWarmPool::crd();
    assert_eq!(crd.spec.names.short_names, Some(vec!["awp".to_owned()]));
    let version = &crd.spec.versions[0];
    let scale = version
        .subresources
        .as_ref()
        .and_then(|s| s.scale.as_ref())
        .expect("scale subresource");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(
        scale.label_selector_path.as_deref(),
        Some(".status.selector")
    );
    let schema = serde_json::to_value(&version.schema).expect("json");
    let replicas = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["replicas"];
    assert_eq!(
        replicas["maximum"].as_f64(),
        Some(f64::from(crds::pool::MAX_POOL_REPLICAS))
    );
    assert_eq!(replicas["minimum"].as_f64(), Some(0.0));
}

#[test]
fn the_crd_names_and_columns_are_what_users_type() {
    let crd = crds::AgentSession::crd();
    assert_eq!(
        crd.metadata.name.as_deref(),
        Some("agentsessions.agentplane.dev")
    );
    assert_eq!(crd.spec.names.short_names, Some(vec!["ags".to_owned()]));
    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    assert!(
        version
            .subresources
            .as_ref()
            .and_then(|s| s.status.as_ref())
            .is_some()
    );
    let columns: Vec<_> = version
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Phase", "Suspended", "Pod", "Tools", "Age"]);
    let schema = serde_json::to_value(&version.schema).expect("json");
    let tools = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["tools"];
    assert_eq!(
        tools["items"]["x-kubernetes-preserve-unknown-fields"], true,
        "spec.tools must keep the client's bytes"
    );
}
