//! A burst of sessions applied at once, each to Ready with a real pod on
//! the one-node harness cluster: sessions/s from the apply to the last
//! Ready, p50/p99 apply-to-Ready, the operator's peak RSS. Not a test:
//! prints figures. `BENCH_BURST` sessions (default 100; the kubelet runs at
//! most 110 pods, so a thousand Ready sessions need more nodes than the
//! harness has -- `--bench sessions` reconciles 1 000 without starting
//! their pods).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use e2e::{
    Certs, Kubectl, Namespace, Operator, env_or, free_port, install_crd, peak_rss_kib, percentile,
    runner_image, sandbox_image,
};

fn main() {
    let n: usize = env_or("BENCH_BURST", 100);
    let k = Kubectl::from_env();
    install_crd(&k);
    let logs = tempfile::tempdir().expect("tempdir");
    let certs = Certs::generate();
    let runner = runner_image();
    let op = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        &logs.path().join("operator.log"),
        &["--runner-image", &runner],
    );
    let ns = Namespace::create(&k, "bench-burst", &[]);
    let mut yaml = String::new();
    for i in 0..n {
        yaml.push_str(&format!(
            "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: b-{i:04}\nspec:\n  image: {}\n  tools: [{{type: agent_toolset_20260401}}]\n  resources: {{requests: {{cpu: 1m, memory: 16Mi}}, limits: {{memory: 256Mi}}}}\n---\n",
            sandbox_image()
        ));
    }
    let t0 = Instant::now();
    let r = k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&yaml));
    assert!(r.ok, "{}", r.stderr);
    let mut ready_at: HashMap<String, Duration> = HashMap::new();
    while ready_at.len() < n && t0.elapsed() < Duration::from_secs(1200) {
        if let Some(list) = k.get(&["agentsessions", "-n", &ns.name]) {
            for s in list["items"].as_array().into_iter().flatten() {
                if s["status"]["phase"] == "Ready" {
                    let name = s["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned();
                    ready_at.entry(name).or_insert_with(|| t0.elapsed());
                }
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut lat: Vec<Duration> = ready_at.values().copied().collect();
    lat.sort();
    let p = |q: f64| percentile(&lat, q);
    let rss = format!("{} kB", peak_rss_kib(op.pid()).unwrap_or(0));
    println!(
        "burst of {n} sessions applied at once: {} Ready; last at {:.1} s ({:.2} sessions/s); apply->Ready p50 {:.1} s, p99 {:.1} s (polled every 0.5 s); operator peak RSS {rss}",
        lat.len(),
        p(1.0).as_secs_f64(),
        lat.len() as f64 / p(1.0).as_secs_f64().max(0.001),
        p(0.5).as_secs_f64(),
        p(0.99).as_secs_f64()
    );
    drop(ns);
}
