//! How clients find the gateway: the entry the operator publishes in
//! `kube-public/agentplane-gateway` (its URL, its Service's address and the
//! CA that signed its certificate), read the same way by every client of
//! this workspace (the kubectl plugin, the Managed Agents dispatcher), so a
//! change to the entry's shape is made once.

use std::collections::BTreeMap;
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::error::{Error, Result};
use crate::proto::gateway_client::GatewayClient;

/// The namespace of the entry (readable by every authenticated user).
pub const NAMESPACE: &str = "kube-public";
/// The entry's ConfigMap name.
pub const NAME: &str = "agentplane-gateway";

/// Where the gateway is, as its entry says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The name the gateway's certificate is checked against.
    pub host: String,
    /// Where to connect: the Service's address when published (so that a
    /// client needs no cluster DNS), else `host:port`.
    pub target: String,
    /// The CA that signed the gateway's certificate (PEM).
    pub ca: String,
}

/// `https://HOST[:PORT][/...]` -> (HOST, PORT); IPv6 hosts in brackets.
pub fn host_port(url: &str) -> Option<(String, u16)> {
    let rest = url.strip_prefix("https://")?;
    let authority = rest.split('/').next()?;
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        match after.strip_prefix(':') {
            Some(p) => (host, p.parse().ok()?),
            None if after.is_empty() => (host, 443),
            None => return None,
        }
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, p.parse().ok()?),
            None => (authority, 443),
        }
    };
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

impl Published {
    /// Reads an entry's data (pure).
    pub fn parse(data: &BTreeMap<String, String>) -> Result<Self> {
        let bad =
            |what: &str| Error::Invalid(format!("the gateway entry {NAMESPACE}/{NAME} {what}"));
        let url = data.get("url").ok_or_else(|| bad("has no url"))?;
        let (host, port) = host_port(url)
            .ok_or_else(|| bad(&format!("has url {url:?}, not https://HOST[:PORT]")))?;
        let ca = data
            .get("ca.crt")
            .ok_or_else(|| bad("has no ca.crt"))?
            .clone();
        let target = data
            .get("address")
            .cloned()
            .unwrap_or_else(|| format!("{host}:{port}"));
        Ok(Self { host, target, ca })
    }

    /// An endpoint that trusts only the entry's CA and checks the
    /// certificate against the entry's name.
    pub fn endpoint(&self, connect_timeout: Duration) -> Result<Endpoint> {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(&self.ca))
            .domain_name(self.host.clone());
        Ok(Endpoint::from_shared(format!("https://{}", self.target))
            .map_err(|e| Error::Invalid(format!("the gateway address {:?}: {e}", self.target)))?
            .tls_config(tls)
            .map_err(|e| Error::Tls(format!("the gateway entry's CA: {e}")))?
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true))
    }
}

/// A client over `channel` with the message limits the gateway itself
/// enforces (64 MiB results; requests no larger than `max_request`).
pub fn client(channel: Channel, max_request: usize) -> GatewayClient<Channel> {
    GatewayClient::new(channel)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(max_request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(url: &str, address: Option<&str>) -> BTreeMap<String, String> {
        let mut m = BTreeMap::from([
            ("url".to_owned(), url.to_owned()),
            ("ca.crt".to_owned(), "CA".to_owned()),
        ]);
        if let Some(a) = address {
            m.insert("address".to_owned(), a.to_owned());
        }
        m
    }

    #[test]
    fn urls_name_host_and_port() {
        assert_eq!(
            host_port("https://gw.ns.svc:8443/x"),
            Some(("gw.ns.svc".into(), 8443))
        );
        assert_eq!(host_port("https://gw"), Some(("gw".into(), 443)));
        assert_eq!(
            host_port("https://[fd00::1]:443"),
            Some(("fd00::1".into(), 443))
        );
        assert_eq!(
            host_port("https://[fd00::1]"),
            Some(("fd00::1".into(), 443))
        );
        assert_eq!(host_port("http://gw"), None);
        assert_eq!(host_port("https://"), None);
        assert_eq!(host_port("https://gw:notaport"), None);
        assert_eq!(host_port("https://[fd00::1]x"), None);
    }

    #[test]
    fn entries_say_where_to_connect_and_whom_to_trust() {
        let p = Published::parse(&entry("https://gw.ns.svc:443", Some("10.96.0.9:443"))).unwrap();
        assert_eq!(
            (p.host.as_str(), p.target.as_str()),
            ("gw.ns.svc", "10.96.0.9:443")
        );
        let p = Published::parse(&entry("https://gw.ns.svc:8443", None)).unwrap();
        assert_eq!(p.target, "gw.ns.svc:8443");
        let e = Published::parse(&BTreeMap::new()).unwrap_err().to_string();
        assert!(
            e.contains("kube-public/agentplane-gateway has no url"),
            "{e}"
        );
        let e = Published::parse(&entry("http://gw", None))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not https://HOST"), "{e}");
        let mut m = entry("https://gw", None);
        m.remove("ca.crt");
        let e = Published::parse(&m).unwrap_err().to_string();
        assert!(e.contains("no ca.crt"), "{e}");
    }
}
