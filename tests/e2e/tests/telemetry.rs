//! The telemetry contract, against a real OpenTelemetry Collector: the
//! operator exports its `reconcile AgentSession` span (service
//! `agent-operator`) and the in-pod runner exports `tool.execution.duration`
//! with `gen_ai.tool.name`, both over OTLP/gRPC to the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT`. The collector (OTLP receiver, file
//! exporter; pinned in tests/telemetry) writes what it receives as OTLP JSON
//! lines, and this test reads them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use e2e::{
    Certs, Kubectl, Namespace, Operator, free_port, install_crd, plugin_bin, root, runner_image,
    sandbox_image, wait_for,
};
use serde_json::Value;

/// The node IP of the test cluster (tests/cluster): pods reach the host there.
fn host_ip() -> String {
    std::env::var("AGENTPLANE_HOST_IP").unwrap_or_else(|_| "10.88.0.1".into())
}

/// The collector started by tests/telemetry/collector.sh; stopped on drop.
struct Collector {
    run_dir: tempfile::TempDir,
    out: PathBuf,
}

fn collector_sh(run_dir: &Path, addr: &str, args: &[&str]) -> std::process::Output {
    Command::new("bash")
        .arg(root().join("tests/telemetry/collector.sh"))
        .args(args)
        .env("AGENTPLANE_OTELCOL_RUN", run_dir)
        .env("AGENTPLANE_OTELCOL_ADDR", addr)
        .output()
        .expect("bash runs tests/telemetry/collector.sh")
}

impl Collector {
    /// Builds the collector once (cached), then starts it listening on
    /// `0.0.0.0:{port}`.
    fn start(port: u16) -> Self {
        let run_dir = tempfile::tempdir().expect("tempdir");
        let out = run_dir.path().join("otlp.jsonl");
        let addr = format!("0.0.0.0:{port}");
        let o = collector_sh(run_dir.path(), &addr, &["build"]);
        assert!(
            o.status.success(),
            "collector.sh build failed (needs Go and the module proxy):\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        let o = collector_sh(
            run_dir.path(),
            &addr,
            &["start", out.to_str().expect("utf-8 path")],
        );
        assert!(
            o.status.success(),
            "collector.sh start failed:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        Self { run_dir, out }
    }

    /// Every line written so far, parsed; a line cut mid-write is skipped.
    fn batches(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.run_dir.path().join("otelcol.log")).unwrap_or_default()
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = collector_sh(self.run_dir.path(), "", &["stop"]);
    }
}

fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The string value of `key` in an OTLP JSON attribute list.
fn attr<'a>(attrs: &'a [Value], key: &str) -> Option<&'a str> {
    attrs
        .iter()
        .find(|a| a["key"] == key)
        .and_then(|a| a["value"]["stringValue"].as_str())
}

/// (service.name, span name) of every span received.
fn spans(batches: &[Value]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for b in batches {
        for rs in array(b, "resourceSpans") {
            let service = attr(array(&rs["resource"], "attributes"), "service.name")
                .unwrap_or_default()
                .to_owned();
            for ss in array(rs, "scopeSpans") {
                for s in array(ss, "spans") {
                    out.push((
                        service.clone(),
                        s["name"].as_str().unwrap_or_default().to_owned(),
                    ));
                }
            }
        }
    }
    out
}

/// One data point of a metric received.
#[derive(Debug)]
struct Point {
    service: String,
    metric: String,
    unit: String,
    attrs: Vec<Value>,
    count: u64,
}

fn points(batches: &[Value]) -> Vec<Point> {
    let mut out = Vec::new();
    for b in batches {
        for rm in array(b, "resourceMetrics") {
            let service = attr(array(&rm["resource"], "attributes"), "service.name")
                .unwrap_or_default()
                .to_owned();
            for sm in array(rm, "scopeMetrics") {
                for m in array(sm, "metrics") {
                    for kind in ["histogram", "sum", "gauge", "exponentialHistogram"] {
                        for dp in array(&m[kind], "dataPoints") {
                            out.push(Point {
                                service: service.clone(),
                                metric: m["name"].as_str().unwrap_or_default().to_owned(),
                                unit: m["unit"].as_str().unwrap_or_default().to_owned(),
                                attrs: array(dp, "attributes").to_vec(),
                                // OTLP JSON writes 64-bit integers as strings.
                                count: dp["count"]
                                    .as_str()
                                    .and_then(|c| c.parse().ok())
                                    .or_else(|| dp["count"].as_u64())
                                    .unwrap_or(0),
                            });
                        }
                    }
                }
            }
        }
    }
    out
}

#[test]
fn operator_spans_and_runner_metrics_reach_an_otlp_collector() {
    let k = Kubectl::from_env();
    let port = free_port();
    let collector = Collector::start(port);
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("operator.log");
    let result = std::panic::catch_unwind(|| scenario(&k, &collector, port, &log));
    if let Err(e) = result {
        eprintln!(
            "---- operator log ----\n{}\n---- collector log ----\n{}\n---- collector output ----\n{}",
            std::fs::read_to_string(&log).unwrap_or_default(),
            collector.log(),
            std::fs::read_to_string(&collector.out).unwrap_or_default(),
        );
        std::panic::resume_unwind(e);
    }
}

fn scenario(k: &Kubectl, collector: &Collector, port: u16, log: &Path) {
    install_crd(k);

    // The operator exports to the collector on loopback. No webhook is
    // registered: this test is about telemetry, not admission.
    let certs = Certs::generate();
    let endpoint = format!("http://127.0.0.1:{port}");
    let runner = runner_image();
    // The sandbox's egress policy must let the runner reach the collector on
    // the node IP once the cluster enforces NetworkPolicy.
    let allow = format!("{}/32", host_ip());
    let _op = Operator::start_with_env(
        &k.kubeconfig,
        &certs,
        free_port(),
        log,
        &["--runner-image", &runner, "--egress-allow-cidr", &allow],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            // Export spans each second rather than every five.
            ("OTEL_BSP_SCHEDULE_DELAY", "1000"),
        ],
    );

    // The runner in the pod exports to the host through the node IP, every
    // 2 s rather than the SDK's default 60 s.
    let ns = Namespace::create(
        k,
        "e2e-telemetry",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    );
    let session = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: otel\nspec:\n  image: {image}\n  env:\n    - {{name: OTEL_EXPORTER_OTLP_ENDPOINT, value: \"http://{host}:{port}\"}}\n    - {{name: OTEL_METRIC_EXPORT_INTERVAL, value: \"2000\"}}\n  tools:\n    - type: agent_toolset_20260401\n",
        image = sandbox_image(),
        host = host_ip(),
    );
    let r = k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&session));
    assert!(r.ok, "apply the session: {}", r.stderr);
    wait_for("the session to be Ready", Duration::from_secs(180), || {
        let o = k.get(&["agentsession", "otel", "-n", &ns.name])?;
        (o["status"]["phase"] == "Ready").then_some(())
    });

    // One bash call through the plugin, as a user makes it.
    let out = Command::new(plugin_bin())
        .args(["-n", &ns.name, "bash", "otel", "--", "true"])
        .env("KUBECONFIG", &k.kubeconfig)
        .output()
        .expect("kubectl-agent runs");
    assert!(
        out.status.success(),
        "kubectl agent bash otel -- true: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // Both signals arrive at the collector, each waited for on its own so a
    // timeout names the one missing.
    wait_for(
        "span `reconcile AgentSession` from service agent-operator at the collector",
        Duration::from_secs(60),
        || {
            spans(&collector.batches())
                .iter()
                .any(|(svc, name)| svc == "agent-operator" && name == "reconcile AgentSession")
                .then_some(())
        },
    );
    let points = wait_for(
        "metric tool.execution.duration with gen_ai.tool.name=bash at the collector",
        Duration::from_secs(60),
        || {
            let points = points(&collector.batches());
            points
                .iter()
                .any(|p| {
                    p.metric == "tool.execution.duration"
                        && attr(&p.attrs, "gen_ai.tool.name") == Some("bash")
                })
                .then_some(points)
        },
    );
    let bash: Vec<&Point> = points
        .iter()
        .filter(|p| {
            p.metric == "tool.execution.duration"
                && attr(&p.attrs, "gen_ai.tool.name") == Some("bash")
        })
        .collect();
    for p in &bash {
        assert_eq!(p.service, "agent-sidecar", "{p:?}");
        assert_eq!(p.unit, "s", "{p:?}");
        assert_eq!(
            attr(&p.attrs, "error.type"),
            None,
            "`true` succeeded: {p:?}"
        );
    }
    assert!(
        bash.iter().any(|p| p.count >= 1),
        "a histogram point counting the call: {bash:?}"
    );
}
