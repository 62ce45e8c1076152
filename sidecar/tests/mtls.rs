//! The runner's listener for the gateway, over a real TCP port: only a
//! client certificate from the platform's CA issued for client
//! authentication gets a call through. A runner certificate (what a
//! tenant can read from their namespace's Secret) does not, nor a
//! certificate from another CA, nor no certificate at all.

mod common;

use std::time::Duration;

use common::Sidecar;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use runner_api::Client;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

struct Pem {
    cert: String,
    key: String,
}

fn ca(name: &str) -> (Issuer<'static, KeyPair>, String) {
    let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("key");
    let cert = p.self_signed(&key).expect("ca");
    (Issuer::new(p, key), cert.pem())
}

fn leaf(issuer: &Issuer<'_, KeyPair>, usages: &[ExtendedKeyUsagePurpose]) -> Pem {
    let mut p = CertificateParams::new(vec![runner_api::RUNNER_TLS_NAME.to_owned()]).expect("p");
    p.extended_key_usages = usages.to_vec();
    let key = KeyPair::generate().expect("key");
    let cert = p.signed_by(&key, issuer).expect("signed");
    Pem {
        cert: cert.pem(),
        key: key.serialize_pem(),
    }
}

async fn call(port: u16, ca: &str, identity: Option<&Pem>) -> Result<String, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name(runner_api::RUNNER_TLS_NAME);
    if let Some(id) = identity {
        tls = tls.identity(Identity::from_pem(&id.cert, &id.key));
    }
    let ch = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let mut c = Client::from_channel(ch);
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        c.run("mtls-1", "bash", r#"{"command":"echo through"}"#, false),
    )
    .await
    .map_err(|_| "timed out".to_owned())?
    .map_err(|e| e.to_string())?;
    Ok(r.content)
}

#[tokio::test]
async fn only_the_gateways_certificate_gets_a_call_through() {
    let (issuer, ca_pem) = ca("platform CA");
    let runner = leaf(&issuer, &[ExtendedKeyUsagePurpose::ServerAuth]);
    let gateway = leaf(
        &issuer,
        &[
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
    );
    let (foreign, _) = ca("another CA");
    let stranger = leaf(&foreign, &[ExtendedKeyUsagePurpose::ClientAuth]);

    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("tls.crt"), &runner.cert).expect("crt");
    std::fs::write(dir.path().join("tls.key"), &runner.key).expect("key");
    std::fs::write(dir.path().join("ca.crt"), &ca_pem).expect("ca");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("port");
    let listen = format!("127.0.0.1:{port}");
    let tls_dir = dir.path().to_string_lossy().into_owned();
    let _runner = Sidecar::start_with(&["--listen-tls", &listen, "--tls-dir", &tls_dir]).await;

    let through = call(port, &ca_pem, Some(&gateway)).await;
    assert!(
        through.as_deref().is_ok_and(|c| c.contains("through")),
        "the gateway's certificate: {through:?}"
    );
    for (who, id) in [
        ("no certificate", None),
        (
            "a runner's certificate (server authentication only)",
            Some(&runner),
        ),
        ("a certificate from another CA", Some(&stranger)),
    ] {
        let r = call(port, &ca_pem, id).await;
        assert!(r.is_err(), "{who} got through: {r:?}");
    }
}

#[tokio::test]
async fn a_tls_directory_that_is_not_one_is_named() {
    let dir = tempfile::tempdir().expect("dir");
    std::fs::write(dir.path().join("tls.crt"), "not a certificate").expect("crt");
    std::fs::write(dir.path().join("tls.key"), "x").expect("key");
    std::fs::write(dir.path().join("ca.crt"), "x").expect("ca");
    let out = std::process::Command::new(common::BIN)
        .args([
            "serve",
            "--socket",
            &dir.path().join("s.sock").to_string_lossy(),
            "--workdir",
            &dir.path().to_string_lossy(),
            "--listen-tls",
            "127.0.0.1:0",
            "--tls-dir",
            &dir.path().to_string_lossy(),
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tls.crt") && err.contains("not PEM"), "{err}");
}
