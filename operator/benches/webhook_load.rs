//! The admission webhook's HTTPS server under a steady load: `WEBHOOK_RPS`
//! reviews per second (default 200) for `WEBHOOK_SECONDS` (default 60),
//! alternating a valid session, one with errors at several paths and a
//! ~100 KiB UPDATE, over a pool of keep-alive connections as the API server
//! keeps them. Prints p50/p99 and the number of errors (any answer that is
//! not a decided review with the expected verdict). A program that prints
//! figures, not a test.
//!
//!     cargo bench -p operator --bench webhook_load

use std::sync::Arc;
use std::time::{Duration, Instant};

use operator::admission::tls::{ReloadingCert, TlsFiles};
use serde_json::{Value, json};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn review(operation: &str, tools: Value) -> Vec<u8> {
    let object = json!({"apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
        "metadata": {"name": "demo", "namespace": "team-a"},
        "spec": {"image": "busybox", "workdir": "/workspace", "tools": tools}});
    let mut request = json!({
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
        "kind": {"group": "agentplane.dev", "version": "v1alpha1", "kind": "AgentSession"},
        "resource": {"group": "agentplane.dev", "version": "v1alpha1", "resource": "agentsessions"},
        "name": "demo", "namespace": "team-a", "operation": operation,
        "userInfo": {"username": "alice"}, "object": object, "dryRun": false
    });
    if operation == "UPDATE" {
        request["oldObject"] = request["object"].clone();
    }
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": request}),
    )
    .unwrap_or_default()
}

fn bodies() -> Vec<(bool, Vec<u8>)> {
    vec![
        (
            true,
            review(
                "CREATE",
                json!([{"type": "agent_toolset_20260401",
                "configs": [{"name": "write", "permission_policy": {"type": "always_ask"}}]}]),
            ),
        ),
        (
            false,
            review(
                "CREATE",
                json!([{"type": "agent_toolset_20260401",
                "configs": [{"name": "nope"}, {"name": "bash", "permission_polciy": {}}]},
                {"type": "mcp_toolset", "mcp_server_name": "missing"}]),
            ),
        ),
        (
            true,
            review(
                "UPDATE",
                json!([{"type": "agent_toolset_20260401"},
                {"type": "custom", "name": "big", "description": "x".repeat(100_000),
                 "input_schema": {"type": "object"}}]),
            ),
        ),
    ]
}

fn main() -> Res<()> {
    let (rps, seconds) = (env_u64("WEBHOOK_RPS", 200), env_u64("WEBHOOK_SECONDS", 60));
    let dir = tempfile::tempdir()?;
    let key = rcgen::KeyPair::generate()?;
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])?.self_signed(&key)?;
    let files = TlsFiles {
        cert: dir.path().join("tls.crt"),
        key: dir.path().join("tls.key"),
    };
    std::fs::write(&files.cert, cert.pem())?;
    std::fs::write(&files.key, key.serialize_pem())?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
    // The server on its own runtime (two workers, as a 2-core pod), the
    // load on another, so the figures are the server's.
    let reloading = ReloadingCert::load(files)?;
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("server runtime");
        if let Err(e) = rt.block_on(operator::admission::tls::serve(
            addr,
            operator::admission::route::router(Arc::default()),
            reloading,
            std::future::pending::<()>(),
        )) {
            eprintln!("the webhook server stopped: {e}");
        }
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(load(rps, seconds, cert.pem(), addr))
}

async fn load(rps: u64, seconds: u64, ca: String, addr: std::net::SocketAddr) -> Res<()> {
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes())?)
        .resolve("localhost", addr)
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(32)
        .build()?;
    let url = format!("https://localhost:{}/validate", addr.port());
    for _ in 0..200 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let bodies = Arc::new(bodies());
    let total = rps * seconds;
    let gap = Duration::from_secs_f64(1.0 / rps as f64);
    let start = tokio::time::Instant::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        tokio::time::sleep_until(start + gap.mul_f64(i as f64)).await;
        let (client, url, bodies) = (client.clone(), url.clone(), bodies.clone());
        tasks.push(tokio::spawn(async move {
            let (allowed, body) = &bodies[i as usize % bodies.len()];
            let t = Instant::now();
            let resp = client
                .post(&url)
                .header("Content-Type", "application/json")
                .body(body.clone())
                .send()
                .await;
            let ok = match resp {
                Ok(r) if r.status() == 200 => r
                    .json::<Value>()
                    .await
                    .ok()
                    .is_some_and(|v| v["response"]["allowed"] == *allowed),
                _ => false,
            };
            (t.elapsed(), ok)
        }));
    }
    let mut lat = Vec::with_capacity(tasks.len());
    let mut errors = 0u64;
    for t in tasks {
        let (d, ok) = t.await?;
        lat.push(d);
        if !ok {
            errors += 1;
        }
    }
    let wall = start.elapsed();
    lat.sort();
    let p = |q: f64| lat[((lat.len() - 1) as f64 * q).round() as usize];
    println!(
        "webhook: {total} reviews at {rps}/s for {seconds} s (sent over {:.1} s): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms, {errors} errors (a wrong verdict or a non-200 counts)",
        wall.as_secs_f64(),
        p(0.5).as_secs_f64() * 1000.0,
        p(0.99).as_secs_f64() * 1000.0,
        p(1.0).as_secs_f64() * 1000.0
    );
    Ok(())
}
