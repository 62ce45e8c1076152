//! The Secrets behind the gateway <-> runner link (see [`crate::certs`]):
//! the CA in the operator's namespace, the gateway's certificate in its
//! namespace, and one runner certificate per tenant namespace that has
//! sandboxes, each made when missing and issued again when its CA changed
//! or its end is near.
//!
//! Every operator replica bootstraps the CA at start; two racing replicas
//! both try to create it, one wins (409 for the other), and both then use
//! what was stored.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use time::OffsetDateTime;

use crate::certs::{self, Pair};
use crate::error::{Error, Result};

/// The runner certificate's Secret in every namespace with sandboxes.
pub const RUNNER_TLS_SECRET: &str = "agentplane-runner-tls";
/// When a stored certificate ends (Unix seconds), kept beside it.
const NOT_AFTER_ANNOTATION: &str = "agentplane.dev/not-after";
const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const CERT: &str = "tls.crt";
const KEY: &str = "tls.key";

/// Issues and keeps runner certificates for the namespaces that need one.
pub struct RunnerTls {
    ca: Pair,
    /// Namespaces whose Secret was seen current, with its end.
    known: Mutex<HashMap<String, i64>>,
}

impl std::fmt::Debug for RunnerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerTls").finish_non_exhaustive()
    }
}

fn labels() -> BTreeMap<String, String> {
    [(
        "app.kubernetes.io/managed-by".to_owned(),
        "agentplane".to_owned(),
    )]
    .into()
}

fn text(secret: &Secret, key: &str) -> Option<String> {
    let data = secret.data.as_ref()?.get(key)?;
    String::from_utf8(data.0.clone()).ok()
}

fn not_after(secret: &Secret) -> Option<i64> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(NOT_AFTER_ANNOTATION)?
        .parse()
        .ok()
}

fn secret(namespace: &str, name: &str, pair: &Pair, ca_pem: &str, ca_key: bool) -> Secret {
    let mut data = BTreeMap::new();
    if ca_key {
        data.insert(CA_CERT.to_owned(), ByteString(pair.cert_pem.clone().into()));
        data.insert(CA_KEY.to_owned(), ByteString(pair.key_pem.clone().into()));
    } else {
        data.insert(CERT.to_owned(), ByteString(pair.cert_pem.clone().into()));
        data.insert(KEY.to_owned(), ByteString(pair.key_pem.clone().into()));
        data.insert(CA_CERT.to_owned(), ByteString(ca_pem.to_owned().into()));
    }
    Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            labels: Some(labels()),
            annotations: Some(
                [(NOT_AFTER_ANNOTATION.to_owned(), pair.not_after.to_string())].into(),
            ),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".to_owned()),
        data: Some(data),
        ..Secret::default()
    }
}

/// The CA from its Secret, made first if there is none.
pub async fn ensure_ca(client: &Client, namespace: &str, name: &str) -> Result<Pair> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    for _ in 0..2 {
        if let Some(s) = api.get_opt(name).await? {
            return match (text(&s, CA_CERT), text(&s, CA_KEY)) {
                (Some(cert_pem), Some(key_pem)) => Ok(Pair {
                    cert_pem,
                    key_pem,
                    not_after: not_after(&s).unwrap_or(i64::MAX),
                }),
                _ => Err(Error::Tls(format!(
                    "Secret {namespace}/{name} has no {CA_CERT} and {CA_KEY}; delete it and the operator makes a new CA (every runner and gateway certificate is then issued again)"
                ))),
            };
        }
        let ca = certs::new_ca(OffsetDateTime::now_utc())?;
        let made = secret(namespace, name, &ca, "", true);
        match api.create(&PostParams::default(), &made).await {
            Ok(_) => {
                tracing::info!(secret = %format!("{namespace}/{name}"), "made the runner CA");
                return Ok(ca);
            }
            // Another replica made it first: use theirs.
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Tls(format!(
        "Secret {namespace}/{name} could not be made or read"
    )))
}

/// Writes `name` with a fresh certificate unless the stored one is from
/// `ca` and not near its end. Whether it wrote.
async fn keep_current(
    api: &Api<Secret>,
    namespace: &str,
    name: &str,
    ca: &Pair,
    issue: impl Fn() -> Result<Pair>,
) -> Result<i64> {
    let now = OffsetDateTime::now_utc();
    if let Some(s) = api.get_opt(name).await?
        && text(&s, CA_CERT).as_deref() == Some(ca.cert_pem.as_str())
        && text(&s, CERT).is_some()
        && text(&s, KEY).is_some()
        && let Some(end) = not_after(&s)
        && !certs::due(end, now)
    {
        return Ok(end);
    }
    let pair = issue()?;
    let wanted = secret(namespace, name, &pair, &ca.cert_pem, false);
    api.patch(
        name,
        &PatchParams::apply(crate::names::FIELD_MANAGER).force(),
        &Patch::Apply(&wanted),
    )
    .await?;
    tracing::info!(secret = %format!("{namespace}/{name}"), "issued a certificate");
    Ok(pair.not_after)
}

/// Where clients learn of the gateway: a ConfigMap in `kube-public`
/// (readable by every authenticated user, by the chart's Role there) with
/// its URL, its Service's address and the CA that signed its certificate.
pub const DIRECTORY_NAMESPACE: &str = "kube-public";
pub const DIRECTORY_NAME: &str = "agentplane-gateway";

/// The directory entry for a gateway Service (pure).
pub fn directory(service: &Service, namespace: &str, ca_pem: &str) -> ConfigMap {
    let name = service.metadata.name.clone().unwrap_or_default();
    let spec = service.spec.as_ref();
    let port = spec
        .and_then(|s| s.ports.as_ref())
        .and_then(|p| p.first())
        .map_or(443, |p| p.port);
    let mut data = BTreeMap::from([
        (
            "url".to_owned(),
            format!("https://{name}.{namespace}.svc:{port}"),
        ),
        ("ca.crt".to_owned(), ca_pem.to_owned()),
    ]);
    if let Some(ip) = spec
        .and_then(|s| s.cluster_ip.as_deref())
        .filter(|ip| !ip.is_empty() && *ip != "None")
    {
        let addr = match ip.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => format!("[{ip}]:{port}"),
            _ => format!("{ip}:{port}"),
        };
        data.insert("address".to_owned(), addr);
    }
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(DIRECTORY_NAME.to_owned()),
            namespace: Some(DIRECTORY_NAMESPACE.to_owned()),
            labels: Some(labels()),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// Publishes the gateway's directory entry; a missing Service or a refused
/// write is logged, not fatal (clients then use port-forward).
async fn publish(client: &Client, namespace: &str, service: &str, ca: &Pair) {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let svc = match services.get_opt(service).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            tracing::warn!(service, "the gateway's Service is missing; not published");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the gateway's Service; not published");
            return;
        }
    };
    let cm = directory(&svc, namespace, &ca.cert_pem);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), DIRECTORY_NAMESPACE);
    if let Err(e) = api
        .patch(
            DIRECTORY_NAME,
            &PatchParams::apply(crate::names::FIELD_MANAGER).force(),
            &Patch::Apply(&cm),
        )
        .await
    {
        tracing::warn!(error = %e, "cannot publish the gateway in {DIRECTORY_NAMESPACE}/{DIRECTORY_NAME}");
    }
}

/// At start: the CA, the gateway's certificate from it, and the gateway's
/// directory entry for clients.
pub async fn bootstrap(
    client: &Client,
    operator_namespace: &str,
    ca_secret: &str,
    gateway_namespace: &str,
    gateway_secret: &str,
    gateway_dns: &[String],
) -> Result<Arc<RunnerTls>> {
    let ca = ensure_ca(client, operator_namespace, ca_secret).await?;
    let api: Api<Secret> = Api::namespaced(client.clone(), gateway_namespace);
    keep_current(&api, gateway_namespace, gateway_secret, &ca, || {
        certs::gateway_cert(&ca, gateway_dns, OffsetDateTime::now_utc())
    })
    .await?;
    if let Some(service) = gateway_dns.first() {
        publish(client, gateway_namespace, service, &ca).await;
    }
    Ok(Arc::new(RunnerTls {
        ca,
        known: Mutex::new(HashMap::new()),
    }))
}

impl RunnerTls {
    /// Makes sure `namespace` holds a current runner certificate before a
    /// sandbox pod that mounts it is made. Remembered, so a namespace costs
    /// one read per operator start, not one per reconcile.
    pub async fn ensure(&self, client: &Client, namespace: &str) -> Result<()> {
        let now = OffsetDateTime::now_utc();
        let fresh = self
            .known
            .lock()
            .ok()
            .and_then(|k| k.get(namespace).copied())
            .is_some_and(|end| !certs::due(end, now));
        if fresh {
            return Ok(());
        }
        let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
        let end = keep_current(&api, namespace, RUNNER_TLS_SECRET, &self.ca, || {
            certs::runner_cert(&self.ca, OffsetDateTime::now_utc())
        })
        .await?;
        if let Ok(mut k) = self.known.lock() {
            k.insert(namespace.to_owned(), end);
        }
        Ok(())
    }

    /// A client identity towards runners (and checkpoint sinks), minted in
    /// memory from the CA: the certificate and key, and the CA's
    /// certificate to check the server's against (all PEM).
    pub fn client_identity(&self) -> Result<(Pair, String)> {
        let pair = certs::operator_client_cert(&self.ca, OffsetDateTime::now_utc())?;
        Ok((pair, self.ca.cert_pem.clone()))
    }

    /// Forgets what was seen of `namespace` (its Secret was changed or
    /// removed), so the next [`RunnerTls::ensure`] reads it again.
    pub fn forget(&self, namespace: &str) {
        if let Ok(mut k) = self.known.lock() {
            k.remove(namespace);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};

    #[test]
    fn the_directory_names_the_url_the_address_and_the_ca() {
        let svc = Service {
            metadata: ObjectMeta {
                name: Some("agentplane-gateway".into()),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                cluster_ip: Some("10.96.0.12".into()),
                ports: Some(vec![ServicePort {
                    port: 443,
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        };
        let cm = directory(&svc, "agentplane-system", "PEM");
        let data = cm.data.expect("data");
        assert_eq!(
            data["url"],
            "https://agentplane-gateway.agentplane-system.svc:443"
        );
        assert_eq!(data["address"], "10.96.0.12:443");
        assert_eq!(data["ca.crt"], "PEM");
        assert_eq!(cm.metadata.namespace.as_deref(), Some("kube-public"));
    }
}
