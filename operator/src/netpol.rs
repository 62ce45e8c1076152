//! NetworkPolicy pieces every policy the operator writes shares: a peer
//! naming a component's pods (the gateway's, the operator's) and the
//! runner's mutual-TLS port, the only port anything may reach on a
//! sandbox or a checkpoint sink.

use k8s_openapi::api::networking::v1::{NetworkPolicyPeer, NetworkPolicyPort};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::sandbox::GatewaySource;

/// Pods with `g`'s labels in `g`'s namespace.
pub fn peer(g: &GatewaySource) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(
                [(
                    "kubernetes.io/metadata.name".to_owned(),
                    g.namespace.clone(),
                )]
                .into(),
            ),
            ..LabelSelector::default()
        }),
        pod_selector: Some(LabelSelector {
            match_labels: Some(g.pod_labels.clone()),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// The runner's mutual-TLS port, TCP.
pub fn runner_tls_port() -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(i32::from(runner_api::RUNNER_TLS_PORT))),
        protocol: Some("TCP".into()),
        end_port: None,
    }
}
