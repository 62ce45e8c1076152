//! The CRD the chart ships is the one the types generate.

use kube::CustomResourceExt;

const COMMITTED: &str =
    include_str!("../../charts/agentplane/crds/agentsessions.agentplane.dev.yaml");
const COMMITTED_POOL: &str =
    include_str!("../../charts/agentplane/crds/agentwarmpools.agentplane.dev.yaml");

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
