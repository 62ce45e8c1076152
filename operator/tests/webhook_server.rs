//! The webhook's HTTPS server as the API server meets it: a real TLS
//! listener on loopback, driven with a real HTTP client.

use std::time::Duration;

use operator::admission::tls::{ReloadingCert, TlsFiles};
use serde_json::{Value, json};

struct Served {
    url: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = rcgen::KeyPair::generate().expect("key");
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    let cert = params.self_signed(&key).expect("cert");
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    std::fs::write(&files.cert, cert.pem()).expect("write");
    std::fs::write(&files.key, key.serialize_pem()).expect("write");
    let reloading = ReloadingCert::load(files).expect("loads");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let addr = format!("127.0.0.1:{port}").parse().expect("addr");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(operator::admission::tls::serve(
        addr,
        operator::admission::route::router(std::sync::Arc::default()),
        reloading,
        async move {
            let _ = stopped.await;
        },
    ));
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(cert.pem().as_bytes()).expect("pem"))
        .resolve("localhost", addr)
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client");
    for _ in 0..100 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Served {
        url: format!("https://localhost:{port}/validate"),
        client,
        _dir: dir,
        stop: Some(stop),
    }
}

/// An UPDATE review whose object and old object each carry `pad` bytes in
/// a custom tool's description.
fn update(pad: usize) -> Vec<u8> {
    let spec = json!({
        "image": "localhost/agentplane/sandbox-base:dev",
        "workdir": "/workspace",
        "tools": [
            {"type": "agent_toolset_20260401"},
            {"type": "custom", "name": "big", "description": "x".repeat(pad),
             "input_schema": {"type": "object"}}
        ]
    });
    let object = json!({"apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
                        "metadata": {"name": "demo", "namespace": "team-a"}, "spec": spec});
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "agentplane.dev", "version": "v1alpha1", "kind": "AgentSession"},
            "resource": {"group": "agentplane.dev", "version": "v1alpha1", "resource": "agentsessions"},
            "name": "demo",
            "namespace": "team-a",
            "operation": "UPDATE",
            "userInfo": {"username": "alice"},
            "object": object,
            "oldObject": object,
            "dryRun": false
        }
    }))
    .expect("serialises")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_update_of_a_session_near_the_object_size_limit_is_decided() {
    let s = serve().await;
    // Each copy ~1.4 MiB: over axum's 2 MB default together, within the
    // API server's object limit each.
    let body = update(1_400_000);
    assert!(body.len() > 2 << 20, "{}", body.len());
    let resp = s
        .client
        .post(&s.url)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status(), 200);
    let review: Value = resp.json().await.expect("json");
    assert_eq!(review["response"]["allowed"], true, "{review}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_is_refused_and_the_server_keeps_serving() {
    let s = serve().await;
    let huge = vec![b' '; operator::admission::route::MAX_REVIEW_BYTES + 1];
    let resp = s
        .client
        .post(&s.url)
        .header("Content-Type", "application/json")
        .body(huge)
        .send()
        .await
        .expect("answered");
    assert_eq!(resp.status(), 413);
    let ok = s
        .client
        .post(&s.url)
        .header("Content-Type", "application/json")
        .body(update(10))
        .send()
        .await
        .expect("answered");
    assert_eq!(ok.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_sends_no_headers_is_cut_off() {
    use tokio::io::AsyncReadExt;
    let s = serve().await;
    // A TCP connection that never starts TLS: closed at the handshake
    // timeout instead of holding a connection slot forever.
    let port: u16 = s
        .url
        .split(':')
        .nth(2)
        .and_then(|p| p.split('/').next()?.parse().ok())
        .expect("port");
    let mut idle = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(30), idle.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the idle connection was not closed: {read:?}"
    );
}
