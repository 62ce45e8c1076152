//! Claude Managed Agents sessions through the plane, on the real node. Not
//! a test: prints figures (docs/benchmarks.md). Needs the harness cluster
//! up, the images built, helm on PATH (HELM) and the Python venv
//! (AGENTPLANE_PYTHON) for the stand-in of the API.
//!
//! Installs the chart with the dispatcher pointed at the stand-in
//! (tests/managed/standin.py, no artificial latency) and measures:
//! 1. work item queued -> first tool result posted, with a warm pool,
//!    `BENCH_FIRST` runs (default 10) one after the other, the pool full
//!    before each; beside it, the stand-in's own round trip from the host;
//! 2. the dispatcher's per-call overhead: a session of `BENCH_CALLS`
//!    (default 50) `bash true` calls, tool_use emitted -> result posted,
//!    against the same call made directly through the gateway (the path
//!    the dispatcher itself takes), one at a time;
//! 3. `BENCH_BURST` (default 100) work items queued at once
//!    (tests/managed/script-bench.json, five calls each): all complete,
//!    sessions per second, the dispatcher's peak RSS.

use std::time::{Duration, Instant};

use e2e::front::{Front, token, with_token};
use e2e::standin::{StandIn, environment_yaml, script};
use e2e::{Kubectl, Namespace, env_or, helm, node_ip, percentile, root, sandbox_image, wait_for};
use futures::StreamExt;
use gateway::proto::gateway_client::GatewayClient;
use gateway::proto::{CallRequest, Session, call_event};
use serde_json::{Value, json};

const RELEASE: &str = "agentplane";
const SYSTEM: &str = "bench-ma-system";
const NS: &str = "bench-ma";
const KEY: &str = "sk-ant-env-bench";

fn figure(name: &str, value: impl std::fmt::Display) {
    println!("figure: {name} {value}");
}

fn msf(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64() * 1000.0)
}

fn stats(name: &str, mut d: Vec<Duration>) -> (Duration, Duration) {
    d.sort();
    let (p50, p99) = (percentile(&d, 0.5), percentile(&d, 0.99));
    figure(&format!("{name}_p50_ms"), msf(p50));
    figure(&format!("{name}_p99_ms"), msf(p99));
    (p50, p99)
}

fn main() {
    let k = Kubectl::from_env();
    let standin = StandIn::start(&node_ip(&k), &[KEY], 30);
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
            "--set",
            "managedAgents.enabled=true",
            "--set",
            &format!("managedAgents.apiUrl={}", standin.url),
            "--set",
            "gateway.replicaCount=1",
            "--wait",
            "--timeout",
            "5m",
        ],
    );
    assert!(r.ok, "helm install: {}\n{}", r.stdout, r.stderr);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&k, &standin)));
    if result.is_err() {
        eprintln!("stand-in log:\n{}", standin.log_tail());
    }
    let _ = helm(&k, &["uninstall", RELEASE, "-n", SYSTEM, "--wait"]);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn setup(k: &Kubectl, pool: usize, concurrent: usize) {
    let image = sandbox_image();
    let mut yaml = environment_yaml(NS, KEY, pool, concurrent, 1);
    yaml.push_str(&format!(
        r#"---
apiVersion: v1
kind: ServiceAccount
metadata: {{name: caller, namespace: {NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: caller, namespace: {NS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: agentplane-session-caller}}
subjects: [{{kind: ServiceAccount, name: caller, namespace: {NS}}}]
---
apiVersion: agentplane.dev/v1alpha1
kind: AgentSession
metadata: {{name: direct, namespace: {NS}}}
spec:
  image: {image}
  workdir: /workspace
  tools: [{{type: agent_toolset_20260401}}]
"#
    ));
    let r = k.apply(&yaml);
    assert!(r.ok, "bench objects: {}", r.stderr);
}

fn pool_full(k: &Kubectl, pool: usize) {
    wait_for("the warm pool to be full", Duration::from_secs(180), || {
        let p = k.get(&["agentwarmpool", "claude", "-n", NS])?;
        (p["status"]["readyReplicas"].as_u64()? as usize >= pool).then_some(())
    });
}

fn secs(v: &Value) -> Duration {
    Duration::from_secs_f64(v.as_f64().unwrap_or(0.0).max(0.0))
}

fn bash_steps(n: usize) -> Value {
    json!({"id_prefix": "calls", "agent": {"tools": [{"type": "agent_toolset_20260401"}]},
           "steps": (0..n).map(|i| json!({"id": format!("t{i}"), "type": "tool_use", "name": "bash",
                                           "evaluated_permission": "allow", "input": {"command": "true"}}))
                          .collect::<Vec<_>>()})
}

fn run(k: &Kubectl, s: &StandIn) {
    let ns = Namespace::create(k, NS, &[]);
    let pool: usize = env_or("BENCH_POOL", 4);
    let concurrent: usize = env_or("BENCH_CONCURRENT", 20);
    setup(k, pool, concurrent);
    wait_for("the environment to poll", Duration::from_secs(120), || {
        let e = k.get(&["agentenvironment", "claude", "-n", NS])?;
        (e2e::condition(&e, "Ready").map(|c| c.0).as_deref() == Some("True")).then_some(())
    });
    wait_for("the direct session", Duration::from_secs(180), || {
        let e = k.get(&["agentsession", "direct", "-n", NS])?;
        (e2e::condition(&e, "Ready").map(|c| c.0).as_deref() == Some("True")).then_some(())
    });

    // 1. queued -> first result, warm.
    let http = reqwest::blocking::Client::new();
    let rtt: Vec<Duration> = (0..20)
        .map(|_| {
            let t = Instant::now();
            http.get(format!("{}/_standin/healthz", s.url))
                .send()
                .expect("healthz");
            t.elapsed()
        })
        .collect();
    stats("standin_round_trip", rtt);
    let mut first = Vec::new();
    for _ in 0..env_or("BENCH_FIRST", 10) {
        pool_full(k, pool);
        let items = s.enqueue(&bash_steps(1), 1);
        let r = s.finished(&items, Duration::from_secs(120));
        let sess = &r["sessions"][&items[0].1];
        first.push(secs(&sess["first_result_at"]).saturating_sub(secs(&sess["enqueued_at"])));
    }
    stats("queued_to_first_result_warm", first);

    // 2. per call: through the dispatcher vs directly through the gateway.
    let calls: usize = env_or("BENCH_CALLS", 50);
    pool_full(k, pool);
    let items = s.enqueue(&bash_steps(calls), 1);
    let r = s.finished(&items, Duration::from_secs(300));
    let per: Vec<Duration> = r["results"][&items[0].1]
        .as_array()
        .expect("results")
        .iter()
        .map(|x| secs(&x["posted_at"]).saturating_sub(secs(&x["emitted_at"])))
        .collect();
    let (disp50, disp99) = stats("dispatcher_call", per);
    let front = Front::of(k, SYSTEM, "agentplane-gateway");
    let caller = token(k, NS, "caller");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let direct = rt.block_on(async {
        let mut g = GatewayClient::new(front.channel().await);
        let mut out = Vec::new();
        for i in 0..calls + 5 {
            let t = Instant::now();
            let req = CallRequest {
                session: Some(Session {
                    namespace: NS.into(),
                    name: "direct".into(),
                }),
                id: format!("direct-{i}"),
                name: "bash".into(),
                input_json: r#"{"command":"true"}"#.into(),
                approval: String::new(),
            };
            let mut st = g
                .run_stream(with_token(req, &caller))
                .await
                .expect("run")
                .into_inner();
            while let Some(ev) = st.next().await {
                if let Some(call_event::Event::Result(_)) = ev.expect("event").event {
                    break;
                }
            }
            if i >= 5 {
                out.push(t.elapsed());
            }
        }
        out
    });
    let (dir50, dir99) = stats("gateway_direct_call", direct);
    figure(
        "dispatcher_overhead_p50_ms",
        msf(disp50.saturating_sub(dir50)),
    );
    figure(
        "dispatcher_overhead_p99_ms",
        msf(disp99.saturating_sub(dir99)),
    );

    // 3. a burst of work items.
    let burst: usize = env_or("BENCH_BURST", 100);
    pool_full(k, pool);
    let t = Instant::now();
    let items = s.enqueue(&script("script-bench.json"), burst);
    let r = s.finished(&items, Duration::from_secs(1800));
    let took = t.elapsed();
    let answered: usize = items
        .iter()
        .map(|(_, id)| r["results"][id].as_array().map_or(0, Vec::len))
        .sum();
    let twice = items
        .iter()
        .flat_map(|(_, id)| r["results"][id].as_array().cloned().unwrap_or_default())
        .filter(|x| x["count"] != 1)
        .count();
    figure("burst_items", burst);
    figure("burst_results_posted", answered);
    figure("burst_results_posted_twice", twice);
    figure("burst_seconds", format!("{:.1}", took.as_secs_f64()));
    figure(
        "burst_sessions_per_second",
        format!("{:.2}", burst as f64 / took.as_secs_f64()),
    );
    let out = std::process::Command::new("pgrep")
        .args(["-f", "agent-dispatcher"])
        .output()
        .expect("pgrep");
    for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            for key in ["VmRSS:", "VmHWM:"] {
                if let Some(v) = status.lines().find_map(|l| l.strip_prefix(key)) {
                    figure(
                        &format!(
                            "dispatcher_{}_kib",
                            key.trim_end_matches(':').to_lowercase()
                        ),
                        v.trim().trim_end_matches("kB").trim(),
                    );
                }
            }
        }
    }
    drop(ns);
}
