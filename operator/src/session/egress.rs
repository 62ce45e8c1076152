//! The NetworkPolicy the operator owns for every sandbox pod: no ingress but
//! the gateway's (to the runner's mutual-TLS port), and egress only to
//! cluster DNS and the CIDRs the platform lists.
//!
//! A sandbox runs whatever the model writes, so by default it must reach
//! nothing: not the API server, not other tenants' pods, not the cloud's
//! metadata service. A platform that lets sandboxes reach the internet
//! lists `0.0.0.0/0`; link-local ranges (cloud metadata) and the cluster's
//! own ranges are carved out of any listed CIDR that contains them, so a
//! wide allow never opens those.

use crds::{AgentSession, AgentWarmPool};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::cidr::Cidr;
use crate::names::{self, Names, owned_meta};
use crate::netpol::{peer, runner_tls_port};
use crate::sandbox::{EgressPolicy, GatewaySource};

/// Ranges carved out of every allowed CIDR that contains them: link-local
/// (169.254.169.254 is the metadata service on every major cloud).
pub const ALWAYS_EXCEPTED: [&str; 2] = ["169.254.0.0/16", "fe80::/10"];

/// The session's NetworkPolicy, or `None` when the platform turned them off.
pub fn network_policy(session: &AgentSession, policy: &EgressPolicy) -> Option<NetworkPolicy> {
    let names = Names::of(session);
    let meta = owned_meta(session, names.network_policy.clone());
    build(meta, names.selector(), policy)
}

/// A warm pool's NetworkPolicy: the same rules as a session's, over the
/// pool's unclaimed pods. A claim swaps the pool label for the session's in
/// one update, after the session's own policy exists, so a pod is never
/// without one.
pub fn pool_network_policy(pool: &AgentWarmPool, policy: &EgressPolicy) -> Option<NetworkPolicy> {
    let name = names::object_name(&pool.name_any(), "warm-egress");
    let meta = ObjectMeta {
        name: Some(name),
        namespace: pool.namespace(),
        labels: Some(
            [(
                "app.kubernetes.io/managed-by".to_owned(),
                "agentplane".to_owned(),
            )]
            .into(),
        ),
        owner_references: pool.controller_owner_ref(&()).map(|o| vec![o]),
        ..ObjectMeta::default()
    };
    let selector = [(
        names::POOL_LABEL.to_owned(),
        names::pool_label(&pool.name_any()),
    )]
    .into();
    build(meta, selector, policy)
}

fn build(
    metadata: ObjectMeta,
    selector: std::collections::BTreeMap<String, String>,
    policy: &EgressPolicy,
) -> Option<NetworkPolicy> {
    if !policy.enabled {
        return None;
    }
    let denied: Vec<Cidr> = ALWAYS_EXCEPTED
        .iter()
        .filter_map(|c| c.parse().ok())
        .chain(policy.cluster.iter().copied())
        .collect();
    let mut egress = vec![dns_rule()];
    if !policy.allowed.is_empty() {
        egress.push(NetworkPolicyEgressRule {
            to: Some(
                policy
                    .allowed
                    .iter()
                    .map(|cidr| NetworkPolicyPeer {
                        ip_block: Some(block(cidr, &denied)),
                        ..NetworkPolicyPeer::default()
                    })
                    .collect(),
            ),
            ports: None,
        });
    }
    Some(NetworkPolicy {
        metadata,
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: policy
                .gateway
                .as_ref()
                .map(|g| vec![gateway_rule(g, policy.operator.as_ref())]),
            egress: Some(egress),
        }),
    })
}

fn block(cidr: &Cidr, denied: &[Cidr]) -> IPBlock {
    let except: Vec<String> = denied
        .iter()
        .filter(|d| cidr.strictly_contains(d))
        .map(ToString::to_string)
        .collect();
    IPBlock {
        cidr: cidr.to_string(),
        except: (!except.is_empty()).then_some(except),
    }
}

/// The gateway's pods (and the operator's, which takes checkpoints), to
/// the runner's mutual-TLS port only.
fn gateway_rule(g: &GatewaySource, operator: Option<&GatewaySource>) -> NetworkPolicyIngressRule {
    NetworkPolicyIngressRule {
        from: Some(std::iter::once(g).chain(operator).map(peer).collect()),
        ports: Some(vec![runner_tls_port()]),
    }
}

/// Cluster DNS (kube-dns / CoreDNS pods in any namespace), port 53.
fn dns_rule() -> NetworkPolicyEgressRule {
    let port = |protocol: &str| NetworkPolicyPort {
        port: Some(IntOrString::Int(53)),
        protocol: Some(protocol.into()),
        end_port: None,
    };
    NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            namespace_selector: Some(LabelSelector::default()),
            pod_selector: Some(LabelSelector {
                match_labels: Some([("k8s-app".to_owned(), "kube-dns".to_owned())].into()),
                ..LabelSelector::default()
            }),
            ip_block: None,
        }]),
        ports: Some(vec![port("UDP"), port("TCP")]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().expect("cidr")
    }

    #[test]
    fn cidrs_parse_and_contain() {
        assert!(c("0.0.0.0/0").strictly_contains(&c("169.254.0.0/16")));
        assert!(c("10.0.0.0/8").strictly_contains(&c("10.96.0.0/12")));
        assert!(!c("10.96.0.0/12").strictly_contains(&c("10.0.0.0/8")));
        assert!(
            !c("10.0.0.0/8").strictly_contains(&c("10.0.0.0/8")),
            "not strictly"
        );
        assert!(
            !c("0.0.0.0/0").strictly_contains(&c("fe80::/10")),
            "families"
        );
        assert!(c("::/0").strictly_contains(&c("fe80::/10")));
        assert!(c("192.168.1.0/24").strictly_contains(&c("192.168.1.128/25")));
        assert!(!c("192.168.1.0/24").strictly_contains(&c("192.168.2.0/25")));
        for bad in ["10.0.0.0", "10.0.0.0/33", "10.0.0.1/8", "x/8", "::/129"] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn wide_allows_except_link_local_and_the_cluster() {
        let policy = EgressPolicy {
            enabled: true,
            allowed: vec![c("0.0.0.0/0"), c("203.0.113.0/24")],
            cluster: vec![c("10.88.0.0/16"), c("10.96.0.0/12")],
            gateway: None,
            operator: None,
        };
        let mut s = AgentSession::new(
            "demo",
            serde_json::from_value(serde_json::json!({"image": "busybox", "tools": []}))
                .expect("spec"),
        );
        s.metadata.namespace = Some("team-a".into());
        s.metadata.uid = Some("uid-1".into());
        let np = network_policy(&s, &policy).expect("enabled");
        let spec = np.spec.expect("spec");
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_owned(), "Egress".to_owned()])
        );
        assert!(spec.ingress.is_none(), "no ingress at all");
        let egress = spec.egress.expect("egress");
        assert_eq!(egress.len(), 2, "DNS, then the allow-list");
        let blocks: Vec<IPBlock> = egress[1]
            .to
            .iter()
            .flatten()
            .filter_map(|p| p.ip_block.clone())
            .collect();
        assert_eq!(blocks[0].cidr, "0.0.0.0/0");
        assert_eq!(
            blocks[0].except.clone().unwrap_or_default(),
            ["169.254.0.0/16", "10.88.0.0/16", "10.96.0.0/12"]
        );
        assert_eq!(blocks[1].cidr, "203.0.113.0/24");
        assert_eq!(blocks[1].except, None, "nothing to carve out of it");
        assert_eq!(
            np.metadata.owner_references.map(|o| o[0].uid.clone()),
            Some("uid-1".to_owned())
        );

        let closed = network_policy(
            &s,
            &EgressPolicy {
                enabled: true,
                ..EgressPolicy::default()
            },
        )
        .expect("enabled");
        assert_eq!(
            closed.spec.and_then(|s| s.egress).map(|e| e.len()),
            Some(1),
            "DNS only"
        );
        assert!(network_policy(&s, &EgressPolicy::default()).is_none());
    }

    #[test]
    fn the_operator_is_admitted_beside_the_gateway_when_its_labels_are_given() {
        let source = |ns: &str, app: &str| GatewaySource {
            namespace: ns.into(),
            pod_labels: [("app.kubernetes.io/name".to_owned(), app.to_owned())].into(),
        };
        let policy = EgressPolicy {
            enabled: true,
            gateway: Some(source("agentplane-system", "agentplane-gateway")),
            operator: Some(source("agentplane-system", "agentplane-operator")),
            ..EgressPolicy::default()
        };
        let s = AgentSession::new(
            "demo",
            serde_json::from_value(serde_json::json!({"image": "busybox", "tools": []}))
                .expect("spec"),
        );
        let ingress = network_policy(&s, &policy)
            .and_then(|np| np.spec)
            .and_then(|s| s.ingress)
            .expect("ingress");
        assert_eq!(ingress.len(), 1, "one rule, to the TLS port");
        let apps: Vec<String> = ingress[0]
            .from
            .iter()
            .flatten()
            .filter_map(|p| p.pod_selector.as_ref()?.match_labels.as_ref())
            .map(|l| l["app.kubernetes.io/name"].clone())
            .collect();
        assert_eq!(apps, ["agentplane-gateway", "agentplane-operator"]);
        // Without a gateway no runner listens on the pod network: nobody
        // is admitted, the operator neither.
        let no_gateway = EgressPolicy {
            gateway: None,
            ..policy
        };
        let spec = network_policy(&s, &no_gateway)
            .and_then(|np| np.spec)
            .expect("spec");
        assert!(spec.ingress.is_none());
    }

    #[test]
    fn the_gateway_alone_is_admitted_and_only_to_the_runners_tls_port() {
        let policy = EgressPolicy {
            enabled: true,
            gateway: Some(GatewaySource {
                namespace: "agentplane-system".into(),
                pod_labels: [(
                    "app.kubernetes.io/component".to_owned(),
                    "gateway".to_owned(),
                )]
                .into(),
            }),
            ..EgressPolicy::default()
        };
        let s = AgentSession::new(
            "demo",
            serde_json::from_value(serde_json::json!({"image": "busybox", "tools": []}))
                .expect("spec"),
        );
        let spec = network_policy(&s, &policy)
            .and_then(|np| np.spec)
            .expect("spec");
        let ingress = spec.ingress.expect("one rule");
        assert_eq!(ingress.len(), 1);
        let from = ingress[0].from.clone().expect("from");
        assert_eq!(from.len(), 1, "one peer: both selectors must match");
        let ns = from[0].namespace_selector.clone().expect("namespace");
        assert_eq!(
            ns.match_labels.expect("labels")["kubernetes.io/metadata.name"],
            "agentplane-system"
        );
        assert!(from[0].pod_selector.is_some());
        let ports = ingress[0].ports.clone().expect("ports");
        assert_eq!(
            ports[0].port,
            Some(IntOrString::Int(i32::from(runner_api::RUNNER_TLS_PORT)))
        );
    }
}
