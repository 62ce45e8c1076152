//! Where the operator may open connections on a session's behalf (MCP
//! servers named in a spec): public addresses, and private ones only when
//! the platform lists them.
//!
//! The operator runs inside the cluster, next to the API server, other
//! tenants' services and the cloud's metadata endpoint. A URL in a spec is
//! the session author's choice, so without this an author could make the
//! operator call any of those and read the outcome back from status. Names
//! are checked after resolution (a public name can resolve to a private
//! address), and literal addresses before any connection.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::cidr::Cidr;

/// Ranges never reached unless listed: loopback, private, carrier-grade
/// NAT, link-local (cloud metadata), unique-local, unspecified, multicast.
const NON_PUBLIC: [&str; 13] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/3",
    "::/128",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// [`NON_PUBLIC`], parsed once rather than on every resolution.
fn non_public() -> &'static [Cidr] {
    static PARSED: std::sync::LazyLock<Vec<Cidr>> =
        std::sync::LazyLock::new(|| NON_PUBLIC.iter().filter_map(|c| c.parse().ok()).collect());
    &PARSED
}

/// The destinations the operator may reach for MCP listings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Destinations {
    /// Non-public ranges the platform allows (e.g. an in-cluster MCP
    /// server's Service range).
    pub allowed: Vec<Cidr>,
}

impl Destinations {
    /// Whether `ip` may be reached.
    pub fn permits(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        let public = !non_public().iter().any(|c| c.contains(ip));
        public || self.allowed.iter().any(|c| c.contains(ip))
    }

    /// Why `ip` may not be reached, for an error message.
    pub fn refusal(ip: IpAddr) -> String {
        format!(
            "{ip} is not a public address; the operator reaches private, loopback and link-local addresses only when the platform allows them (--mcp-allow-cidr)"
        )
    }
}

/// A resolver that drops the addresses [`Destinations`] does not permit, so
/// a name is only ever connected to on an allowed address.
#[derive(Debug, Clone)]
pub struct GuardedResolver {
    pub destinations: Arc<Destinations>,
}

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let destinations = Arc::clone(&self.destinations);
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found
                .iter()
                .copied()
                .filter(|a| destinations.permits(a.ip()))
                .collect();
            match (allowed.is_empty(), found.first()) {
                (false, _) => Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs),
                (true, Some(first)) => Err(Destinations::refusal(first.ip()).into()),
                (true, None) => Err(format!("{host} has no address").into()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_public_addresses_unless_listed() {
        let none = Destinations::default();
        for denied in [
            "127.0.0.1",
            "10.96.0.1",
            "172.20.1.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
        ] {
            let ip: IpAddr = denied.parse().expect("ip");
            assert!(!none.permits(ip), "{denied} permitted");
        }
        for allowed in ["1.1.1.1", "203.0.113.7", "2606:4700::1111"] {
            assert!(none.permits(allowed.parse().expect("ip")), "{allowed}");
        }
        let lo = Destinations {
            allowed: vec!["127.0.0.0/8".parse().expect("cidr")],
        };
        assert!(lo.permits("127.0.0.1".parse().expect("ip")));
        assert!(!lo.permits("169.254.169.254".parse().expect("ip")));
    }
}
