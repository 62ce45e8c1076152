//! The NetworkPolicy the operator owns for every sandbox pod: no ingress,
//! and egress only to cluster DNS and the CIDRs the platform lists.
//!
//! A sandbox runs whatever the model writes, so by default it must reach
//! nothing: not the API server, not other tenants' pods, not the cloud's
//! metadata service. A platform that lets sandboxes reach the internet
//! lists `0.0.0.0/0`; link-local ranges (cloud metadata) and the cluster's
//! own ranges are carved out of any listed CIDR that contains them, so a
//! wide allow never opens those.

use std::net::IpAddr;

use crds::{AgentSession, AgentWarmPool};
use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::names::Names;
use crate::session::claim as warm;
use crate::session::pod;

/// Ranges carved out of every allowed CIDR that contains them: link-local
/// (169.254.169.254 is the metadata service on every major cloud).
pub const ALWAYS_EXCEPTED: [&str; 2] = ["169.254.0.0/16", "fe80::/10"];

/// What sandboxes may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressPolicy {
    /// Whether the operator manages a NetworkPolicy per session at all
    /// (off only for clusters that enforce egress some other way).
    pub enabled: bool,
    /// CIDRs sandboxes may reach, besides cluster DNS.
    pub allowed: Vec<Cidr>,
    /// The cluster's pod and service ranges, excepted like link-local.
    pub cluster: Vec<Cidr>,
}

/// An IP range in CIDR notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not a CIDR (e.g. 10.0.0.0/8, 2001:db8::/32)");
        let (addr, prefix) = s.split_once('/').ok_or_else(bad)?;
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad());
        }
        let cidr = Cidr { addr, prefix };
        if cidr.network() != addr {
            return Err(format!(
                "{s:?} has host bits set; the network is {}/{prefix}",
                cidr.network()
            ));
        }
        Ok(cidr)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl Cidr {
    fn bits(addr: IpAddr) -> (u128, u8) {
        match addr {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        }
    }

    fn mask(&self) -> u128 {
        let (_, width) = Self::bits(self.addr);
        if self.prefix == 0 {
            return 0;
        }
        let ones = u128::MAX << (128 - u32::from(self.prefix));
        ones >> (128 - u32::from(width))
    }

    fn network(&self) -> IpAddr {
        let (bits, _) = Self::bits(self.addr);
        let net = bits & self.mask();
        match self.addr {
            IpAddr::V4(_) => IpAddr::V4(u32::try_from(net).unwrap_or(0).into()),
            IpAddr::V6(_) => IpAddr::V6(net.into()),
        }
    }

    /// Whether `ip` lies within this range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        if self.addr.is_ipv4() != ip.is_ipv4() {
            return false;
        }
        let (a, _) = Self::bits(self.addr);
        let (b, _) = Self::bits(ip);
        a & self.mask() == b & self.mask()
    }

    /// Whether `inner` lies within this range and is strictly smaller (a
    /// NetworkPolicy `except` must be).
    pub fn strictly_contains(&self, inner: &Cidr) -> bool {
        inner.prefix > self.prefix && self.contains(inner.addr)
    }
}

/// The session's NetworkPolicy, or `None` when the platform turned them off.
pub fn network_policy(session: &AgentSession, policy: &EgressPolicy) -> Option<NetworkPolicy> {
    let names = Names::of(session);
    let meta = pod::owned_meta(session, names.network_policy.clone());
    build(meta, names.selector(), policy)
}

/// A warm pool's NetworkPolicy: the same rules as a session's, over the
/// pool's unclaimed pods. A claim swaps the pool label for the session's in
/// one update, after the session's own policy exists, so a pod is never
/// without one.
pub fn pool_network_policy(pool: &AgentWarmPool, policy: &EgressPolicy) -> Option<NetworkPolicy> {
    let name = crate::names::object_name(&pool.name_any(), "warm-egress");
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
        warm::POOL_LABEL.to_owned(),
        warm::pool_label(&pool.name_any()),
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
            ingress: None,
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
}
