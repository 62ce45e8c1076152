//! The gateway as a client on the host sees it: its Service's ClusterIP
//! (kube-proxy routes it from the node), its DNS name for the certificate
//! check (the test cluster has no cluster DNS), and its CA from the Secret
//! the operator writes.

use std::net::SocketAddr;
use std::time::Duration;

use base64::Engine;

use crate::{Kubectl, wait_for};

/// Where a chart-installed gateway is and how to trust it.
#[derive(Debug, Clone)]
pub struct Front {
    pub addr: SocketAddr,
    pub host: String,
    pub ca: String,
}

/// A Secret's key, decoded.
pub fn secret_data(k: &Kubectl, ns: &str, name: &str, key: &str) -> Vec<u8> {
    let secret = wait_for(
        &format!("Secret {ns}/{name}"),
        Duration::from_secs(60),
        || k.get(&["secret", "-n", ns, name]),
    );
    base64::engine::general_purpose::STANDARD
        .decode(secret["data"][key].as_str().unwrap_or_default())
        .expect("base64")
}

impl Front {
    /// The gateway `service` of the release in `ns`.
    pub fn of(k: &Kubectl, ns: &str, service: &str) -> Self {
        let svc = k
            .get(&["service", "-n", ns, service])
            .expect("the gateway's Service");
        let ip = svc["spec"]["clusterIP"].as_str().expect("clusterIP");
        let port = svc["spec"]["ports"][0]["port"].as_u64().unwrap_or(443);
        let ca = secret_data(k, ns, &format!("{service}-tls"), "ca.crt");
        Front {
            addr: SocketAddr::new(ip.parse().expect("ip"), u16::try_from(port).expect("port")),
            host: format!("{service}.{ns}.svc"),
            ca: String::from_utf8(ca).expect("pem"),
        }
    }

    /// `https://<dns name>:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://{}:{}{path}", self.host, self.addr.port())
    }

    /// An HTTP client that trusts the gateway's CA and reaches its name at
    /// the Service's address.
    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(self.ca.as_bytes()).expect("ca"))
            .resolve(&self.host, self.addr)
            .timeout(Duration::from_secs(180))
            .build()
            .expect("client")
    }

    /// A gRPC channel to the gateway.
    pub async fn channel(&self) -> tonic::transport::Channel {
        let tls = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca))
            .domain_name(self.host.clone());
        tonic::transport::Endpoint::from_shared(format!("https://{}", self.addr))
            .expect("endpoint")
            .tls_config(tls)
            .expect("tls")
            .tcp_nodelay(true)
            .connect()
            .await
            .expect("connect to the gateway")
    }
}

/// A gRPC request with a bearer token.
pub fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("header"),
    );
    r
}

/// A token of `sa` in `ns`, good for an hour.
pub fn token(k: &Kubectl, ns: &str, sa: &str) -> String {
    k.must(&["create", "token", sa, "-n", ns, "--duration", "1h"])
        .trim()
        .to_owned()
}

/// The API server's URL and a file with its CA, from the kubeconfig.
pub fn api_server(k: &Kubectl, dir: &std::path::Path) -> (String, std::path::PathBuf) {
    use base64::Engine;
    let kc: serde_json::Value =
        serde_json::from_str(&k.must(&["config", "view", "--raw", "--minify", "-o", "json"]))
            .expect("kubeconfig");
    let cluster = &kc["clusters"][0]["cluster"];
    let server = cluster["server"].as_str().expect("server").to_owned();
    let path = dir.join("api-ca.crt");
    match (
        cluster["certificate-authority-data"].as_str(),
        cluster["certificate-authority"].as_str(),
    ) {
        (Some(d), _) => std::fs::write(
            &path,
            base64::engine::general_purpose::STANDARD
                .decode(d)
                .expect("base64"),
        )
        .expect("write"),
        (None, Some(p)) => {
            std::fs::copy(p, &path).expect("copy");
        }
        _ => panic!("the kubeconfig names no CA"),
    }
    (server, path)
}
