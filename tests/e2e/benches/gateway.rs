//! The gateway on the real node, side by side with what it fronts. Not a
//! test: prints figures (docs/benchmarks.md). Needs the harness cluster up,
//! the images built and helm on PATH (HELM).
//!
//! Installs the chart with ONE gateway replica, makes `BENCH_SESSIONS`
//! sessions (default 20; this one node runs at most 110 pods) and:
//! 1. latency, one call at a time, of `read` of a 1 KiB file and `bash
//!    true`: the runner directly (its mutual-TLS port from the host, with
//!    the gateway's own client certificate -- the floor), through the
//!    gateway over gRPC and over HTTP/JSON, and through `kubectl agent`
//!    (port-forward); the gateway's overhead is its p50 minus direct's;
//! 2. throughput of that one replica: `BENCH_CALLERS` (default 64)
//!    concurrent callers for `BENCH_SECONDS` (default 10), each calling
//!    `read` on the sessions in turn over gRPC, then over HTTP; calls/s,
//!    p50 and p99, and the gateway process's RSS (VmRSS and VmHWM);
//! 3. warm apply -> first tool result through the Python client
//!    (clients/python/bench_first_result.py) against a warm pool.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e::front::{Front, api_server, secret_data, token, with_token};
use e2e::{Kubectl, Namespace, agent, env_or, helm, percentile, root, sandbox_image, wait_for};
use gateway::proto::gateway_client::GatewayClient;
use gateway::proto::{CallRequest, Session};
use runner_api::proto::RunRequest;
use runner_api::proto::runner_client::RunnerClient;
use serde_json::json;

const RELEASE: &str = "agentplane";
const SYSTEM: &str = "bench-gw-system";
const NS: &str = "bench-gw";
const GATEWAY: &str = "agentplane-gateway";

fn figure(name: &str, value: impl std::fmt::Display) {
    println!("figure: {name} {value}");
}

/// Milliseconds to the microsecond: the overhead asked about is below one.
fn msf(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

fn stats(name: &str, mut d: Vec<Duration>) -> Duration {
    d.sort();
    let p50 = percentile(&d, 0.5);
    figure(&format!("{name}_p50_ms"), msf(p50));
    figure(&format!("{name}_p99_ms"), msf(percentile(&d, 0.99)));
    p50
}

fn main() {
    let k = Kubectl::from_env();
    let chart = root().join("charts/agentplane");
    let _ = helm(&k, &["uninstall", RELEASE, "-n", SYSTEM, "--wait"]);
    let r = helm(
        &k,
        &[
            "install",
            RELEASE,
            chart.to_str().expect("path"),
            "-n",
            SYSTEM,
            "--create-namespace",
            "--wait",
            "--timeout",
            "5m",
            "--set",
            "gateway.replicaCount=1",
            "--set",
            "replicaCount=1",
        ],
    );
    assert!(r.ok, "helm install: {}", r.stderr);
    let result = std::panic::catch_unwind(|| run(&k));
    let _ = helm(&k, &["uninstall", RELEASE, "-n", SYSTEM, "--wait"]);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn run(k: &Kubectl) {
    let sessions: usize = env_or("BENCH_SESSIONS", 20);
    let ns = Namespace::create(k, NS, &[]);
    let mut yaml = format!(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {{name: caller, namespace: {NS}}}\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: caller, namespace: {NS}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: agentplane-session-caller}}\nsubjects: [{{kind: ServiceAccount, name: caller, namespace: {NS}}}]\n"
    );
    for i in 0..sessions {
        yaml.push_str(&format!(
            "---\napiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata: {{name: s{i}, namespace: {NS}}}\nspec:\n  image: {}\n  workdir: /workspace\n  resources: {{requests: {{cpu: 10m, memory: 32Mi}}, limits: {{memory: 256Mi}}}}\n  tools: [{{type: agent_toolset_20260401}}]\n",
            sandbox_image()
        ));
    }
    let r = k.apply(&yaml);
    assert!(r.ok, "{}", r.stderr);
    for i in 0..sessions {
        wait_for(&format!("s{i} Ready"), Duration::from_secs(600), || {
            let s = k.get(&["agentsession", &format!("s{i}"), "-n", NS])?;
            (e2e::condition(&s, "Ready").map(|c| c.0) == Some("True".to_owned())).then_some(())
        });
    }
    figure("sessions", sessions);
    let front = Front::of(k, SYSTEM, GATEWAY);
    let caller = token(k, NS, "caller");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(latency(k, &front, &caller));
    rt.block_on(throughput(&front, &caller, sessions));
    gateway_rss();
    warm_first_result(k, &front, &caller);
    drop(ns);
}

/// The throughput calls' input: a 1 KiB read, or `bash true`.
fn input(tool: &str) -> String {
    if tool == "read" {
        read_input()
    } else {
        json!({"command": "true"}).to_string()
    }
}

fn read_input() -> String {
    json!({"file_path": "/workspace/kib.txt"}).to_string()
}

async fn direct_client(k: &Kubectl) -> RunnerClient<tonic::transport::Channel> {
    let s = k.get(&["agentsession", "s0", "-n", NS]).expect("s0");
    let pod = s["status"]["podName"].as_str().expect("pod").to_owned();
    let p = k.get(&["pod", &pod, "-n", NS]).expect("pod");
    let ip = p["status"]["podIP"].as_str().expect("ip").to_owned();
    let secret = format!("{GATEWAY}-tls");
    let cert = secret_data(k, SYSTEM, &secret, "tls.crt");
    let key = secret_data(k, SYSTEM, &secret, "tls.key");
    let ca = secret_data(k, SYSTEM, &secret, "ca.crt");
    let tls = tonic::transport::ClientTlsConfig::new()
        .ca_certificate(tonic::transport::Certificate::from_pem(&ca))
        .identity(tonic::transport::Identity::from_pem(&cert, &key))
        .domain_name(runner_api::RUNNER_TLS_NAME);
    let ch = tonic::transport::Endpoint::from_shared(format!(
        "https://{ip}:{}",
        runner_api::RUNNER_TLS_PORT
    ))
    .expect("endpoint")
    .tls_config(tls)
    .expect("tls")
    .tcp_nodelay(true)
    .connect()
    .await
    .expect("the runner directly (host -> pod, mutual TLS)");
    RunnerClient::new(ch)
}

async fn latency(k: &Kubectl, front: &Front, caller: &str) {
    let n: usize = env_or("BENCH_CALLS", 300);
    let mut g = GatewayClient::new(front.channel().await);
    let session = Some(Session {
        namespace: NS.into(),
        name: "s0".into(),
    });
    // The 1 KiB file.
    let content = "x".repeat(1023) + "\n";
    g.run(with_token(
        CallRequest {
            session: session.clone(),
            name: "write".into(),
            input_json: json!({"file_path": "/workspace/kib.txt", "content": content}).to_string(),
            ..CallRequest::default()
        },
        caller,
    ))
    .await
    .expect("write");
    let http = front.http();
    let url = front.url(&format!("/v1/namespaces/{NS}/sessions/s0/calls"));
    let mut direct = direct_client(k).await;
    for (tool, input) in [
        ("read", read_input()),
        ("bash", json!({"command": "true"}).to_string()),
    ] {
        let label = if tool == "read" {
            "read_1kib"
        } else {
            "bash_true"
        };
        let mut d = Vec::with_capacity(n);
        let mut gr = Vec::with_capacity(n);
        let mut h = Vec::with_capacity(n);
        for i in 0..n + 20 {
            let t = Instant::now();
            direct
                .run(RunRequest {
                    id: format!("d-{label}-{i}"),
                    name: tool.into(),
                    input_json: input.clone(),
                    confirmed: false,
                })
                .await
                .expect("direct");
            let dd = t.elapsed();
            let t = Instant::now();
            g.run(with_token(
                CallRequest {
                    session: session.clone(),
                    name: tool.into(),
                    input_json: input.clone(),
                    ..CallRequest::default()
                },
                caller,
            ))
            .await
            .expect("gateway grpc");
            let gg = t.elapsed();
            let t = Instant::now();
            let resp = http
                .post(&url)
                .bearer_auth(caller)
                .body(format!(r#"{{"name":"{tool}","input":{input}}}"#))
                .header("content-type", "application/json")
                .send()
                .await
                .expect("gateway http");
            assert!(resp.status().is_success());
            let _ = resp.bytes().await;
            let hh = t.elapsed();
            // The first 20 of each warm up connections and caches.
            if i >= 20 {
                d.push(dd);
                gr.push(gg);
                h.push(hh);
            }
        }
        let base = stats(&format!("{label}_direct"), d);
        let grpc = stats(&format!("{label}_gateway_grpc"), gr);
        let web = stats(&format!("{label}_gateway_http"), h);
        figure(
            &format!("{label}_gateway_grpc_overhead_p50_ms"),
            msf(grpc.saturating_sub(base)),
        );
        figure(
            &format!("{label}_gateway_http_overhead_p50_ms"),
            msf(web.saturating_sub(base)),
        );
        let mut kd = Vec::new();
        for _ in 0..env_or("BENCH_KUBECTL_CALLS", 20usize) {
            let t = Instant::now();
            let (code, _, err) = agent(k, NS, &["call", "s0", tool, &input]);
            assert_eq!(code, 0, "{err}");
            kd.push(t.elapsed());
        }
        stats(&format!("{label}_kubectl_agent"), kd);
    }
}

async fn throughput(front: &Front, caller: &str, sessions: usize) {
    let callers: usize = env_or("BENCH_CALLERS", 64);
    let seconds: u64 = env_or("BENCH_SECONDS", 10);
    figure("callers", callers);
    // Every session gets the 1 KiB file the reads read.
    let mut g = GatewayClient::new(front.channel().await);
    let content = "x".repeat(1023) + "\n";
    for i in 0..sessions {
        g.run(with_token(
            CallRequest {
                session: Some(Session {
                    namespace: NS.into(),
                    name: format!("s{i}"),
                }),
                name: "write".into(),
                input_json: json!({"file_path": "/workspace/kib.txt", "content": content})
                    .to_string(),
                ..CallRequest::default()
            },
            caller,
        ))
        .await
        .expect("write");
    }
    for (proto, tool) in [("grpc", "read"), ("http", "read"), ("grpc", "bash")] {
        let stop = Arc::new(AtomicBool::new(false));
        let channel = front.channel().await;
        let http = front.http();
        let mut tasks = Vec::new();
        for c in 0..callers {
            let stop = Arc::clone(&stop);
            let mut g = GatewayClient::new(channel.clone());
            let http = http.clone();
            let front = front.clone();
            let caller = caller.to_owned();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut i = c;
                while !stop.load(Ordering::Relaxed) {
                    let s = format!("s{}", i % sessions);
                    i += 1;
                    let t = Instant::now();
                    if proto == "grpc" {
                        g.run(with_token(
                            CallRequest {
                                session: Some(Session {
                                    namespace: NS.into(),
                                    name: s,
                                }),
                                name: tool.into(),
                                input_json: input(tool),
                                ..CallRequest::default()
                            },
                            &caller,
                        ))
                        .await
                        .expect("call");
                    } else {
                        let resp = http
                            .post(front.url(&format!("/v1/namespaces/{NS}/sessions/{s}/calls")))
                            .bearer_auth(&caller)
                            .header("content-type", "application/json")
                            .body(format!(r#"{{"name":"{tool}","input":{}}}"#, input(tool)))
                            .send()
                            .await
                            .expect("call");
                        assert!(resp.status().is_success(), "{}", resp.status());
                        let _ = resp.bytes().await;
                    }
                    lat.push(t.elapsed());
                }
                lat
            }));
        }
        let start = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.expect("caller"));
        }
        let took = start.elapsed().as_secs_f64();
        figure(
            &format!("throughput_{proto}_{tool}_calls_per_s"),
            format!("{:.0}", all.len() as f64 / took),
        );
        stats(&format!("throughput_{proto}_{tool}"), all);
    }
}

fn gateway_rss() {
    let out = std::process::Command::new("pgrep")
        .args(["-f", "agent-gateway"])
        .output()
        .expect("pgrep");
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            for key in ["VmRSS:", "VmHWM:"] {
                if let Some(v) = status.lines().find_map(|l| l.strip_prefix(key)) {
                    figure(
                        &format!("gateway_{}_kib", key.trim_end_matches(':').to_lowercase()),
                        v.trim().trim_end_matches("kB").trim(),
                    );
                }
            }
        }
    }
}

fn warm_first_result(k: &Kubectl, front: &Front, caller: &str) {
    let runs: usize = env_or("BENCH_FIRST_RESULT", 10);
    let pool = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentWarmPool\nmetadata: {{name: warm, namespace: {NS}}}\nspec:\n  replicas: 2\n  template:\n    image: {}\n",
        sandbox_image()
    );
    let r = k.apply(&pool);
    assert!(r.ok, "{}", r.stderr);
    // The client creates sessions as the caller: let it.
    let rbac = format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {{name: sessions, namespace: {NS}}}\nrules: [{{apiGroups: [agentplane.dev], resources: [agentsessions], verbs: [create, get, list, watch, delete]}}, {{apiGroups: [agentplane.dev], resources: [agentwarmpools], verbs: [get, list, watch]}}]\n---\napiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: sessions, namespace: {NS}}}\nroleRef: {{apiGroup: rbac.authorization.k8s.io, kind: Role, name: sessions}}\nsubjects: [{{kind: ServiceAccount, name: caller, namespace: {NS}}}]\n"
    );
    assert!(k.apply(&rbac).ok);
    wait_for("two warm pods", Duration::from_secs(300), || {
        let p = k.get(&["agentwarmpool", "warm", "-n", NS])?;
        (p["status"]["readyReplicas"].as_u64()? >= 2).then_some(())
    });
    let dir = tempfile::tempdir().expect("dir");
    let ca = dir.path().join("ca.crt");
    std::fs::write(&ca, &front.ca).expect("ca");
    let (server, api_ca) = api_server(k, dir.path());
    let python = std::env::var("AGENTPLANE_PYTHON").unwrap_or_else(|_| "python3".into());
    let out = std::process::Command::new(python)
        .arg(root().join("clients/python/bench_first_result.py"))
        .args(["--warm-pool", "warm", "-n", &runs.to_string()])
        .env("PYTHONPATH", root().join("clients/python/src"))
        .env("AGENTPLANE_GATEWAY_URL", front.url(""))
        .env("AGENTPLANE_GATEWAY_ADDR", front.addr.to_string())
        .env("AGENTPLANE_GATEWAY_CA", &ca)
        .env("AGENTPLANE_CALLER_TOKEN", caller)
        .env("AGENTPLANE_NAMESPACE", NS)
        .env("AGENTPLANE_API_SERVER", server)
        .env("AGENTPLANE_API_CA", &api_ca)
        .output()
        .expect("python");
    assert!(
        out.status.success(),
        "bench_first_result.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        println!("figure: warm_apply_to_first_result {line}");
    }
}
