//! Figures on the real cluster (not a test: prints, asserts nothing about
//! time). Needs the harness cluster up, the images built and the operator
//! and kubectl-agent binaries (see docs/benchmarks.md for the command).
//!
//! 1. The operator under load: N sessions (default 1000) applied in batches
//!    of 50; sessions/s from the first apply to the last status written,
//!    p50/p99 apply-to-status latency, the operator's peak RSS. Their pods
//!    carry a node selector no node matches, so the whole reconcile path
//!    (ConfigMap, pod, status) runs while the one 2-core node is not asked
//!    to start 1000 containers.
//! 2. The user path: M sessions (default 20) one after another, apply ->
//!    Ready -> first tool result through kubectl agent (p50, p90).
//! 3. One tool call through the plugin vs the same command through
//!    `kubectl exec`, medians over 20 calls each.

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::{
    Certs, Kubectl, Namespace, Operator, env_or, free_port, install_crd, ms, peak_rss_kib,
    percentile, plugin_bin, sandbox_image, wait_for,
};

fn session_yaml(name: &str, image: &str, extra: &str) -> String {
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {image}\n{extra}  tools:\n    - type: agent_toolset_20260401\n---\n"
    )
}

fn main() {
    let k = Kubectl::from_env();
    install_crd(&k);
    let image = sandbox_image();
    let logs = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let certs = Certs::generate();
    let op = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        &logs.path().join("operator.log"),
        &[],
    );
    let pid = op.pid();

    // 1. The operator under load.
    let n: usize = env_or("BENCH_SESSIONS", 1000);
    let ns = Namespace::create(&k, "bench-load", &[]);
    let unschedulable = "  nodeSelector: {agentplane.dev/bench: none}\n";
    let start = Instant::now();
    let mut applied: HashMap<String, Instant> = HashMap::new();
    let mut seen: HashMap<String, Duration> = HashMap::new();
    let poll = |seen: &mut HashMap<String, Duration>, applied: &HashMap<String, Instant>| {
        if let Some(list) = k.get(&["agentsessions", "-n", &ns.name]) {
            for item in list["items"].as_array().into_iter().flatten() {
                let name = item["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                if item["status"]["observedGeneration"].is_number()
                    && !seen.contains_key(&name)
                    && let Some(t) = applied.get(&name)
                {
                    seen.insert(name, t.elapsed());
                }
            }
        }
    };
    for batch in 0..n.div_ceil(50) {
        let mut yaml = String::new();
        let mut names = Vec::new();
        for i in batch * 50..((batch + 1) * 50).min(n) {
            let name = format!("load-{i:04}");
            yaml.push_str(&session_yaml(&name, &image, unschedulable));
            names.push(name);
        }
        let r = k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&yaml));
        assert!(r.ok, "apply batch {batch}: {}", r.stderr);
        let now = Instant::now();
        for name in names {
            applied.insert(name, now);
        }
        poll(&mut seen, &applied);
    }
    while seen.len() < n && start.elapsed() < Duration::from_secs(1800) {
        std::thread::sleep(Duration::from_millis(200));
        poll(&mut seen, &applied);
    }
    let total = start.elapsed();
    let mut lat: Vec<Duration> = seen.values().copied().collect();
    lat.sort();
    println!(
        "operator load: {} of {n} sessions got status in {:.1} s: {:.1} sessions/s",
        seen.len(),
        total.as_secs_f64(),
        seen.len() as f64 / total.as_secs_f64()
    );
    println!(
        "  apply-to-status latency p50 {} p99 {} (polled every 200 ms)",
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99))
    );
    println!(
        "  operator peak RSS (VmHWM): {:.1} MiB",
        peak_rss_kib(pid).unwrap_or(0) as f64 / 1024.0
    );
    drop(ns);

    // 2. apply -> Ready -> first tool result, one session at a time.
    let m: usize = env_or("BENCH_USER_SESSIONS", 20);
    let ns = Namespace::create(
        &k,
        "bench-user",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    );
    let plugin = plugin_bin();
    let agent = |args: &[&str]| {
        Command::new(&plugin)
            .args(["-n", &ns.name])
            .args(args)
            .env("KUBECONFIG", &k.kubeconfig)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    let mut to_ready = Vec::new();
    let mut to_result = Vec::new();
    for i in 0..m {
        let name = format!("user-{i:02}");
        let t0 = Instant::now();
        let r = k.run(
            &["apply", "-n", &ns.name, "-f", "-"],
            Some(&session_yaml(&name, &image, "")),
        );
        assert!(r.ok, "{}", r.stderr);
        wait_for("Ready", Duration::from_secs(180), || {
            let o = k.get(&["agentsession", &name, "-n", &ns.name])?;
            (o["status"]["phase"] == "Ready").then_some(())
        });
        to_ready.push(t0.elapsed());
        assert!(
            agent(&["bash", &name, "--", "true"]),
            "first tool call on {name}"
        );
        to_result.push(t0.elapsed());
        if i + 1 < m {
            k.must(&[
                "delete",
                "agentsession",
                &name,
                "-n",
                &ns.name,
                "--wait=false",
            ]);
        }
    }
    to_ready.sort();
    to_result.sort();
    println!(
        "user path over {m} sessions: apply->Ready p50 {} p90 {}; apply->first tool result p50 {} p90 {}",
        ms(percentile(&to_ready, 0.5)),
        ms(percentile(&to_ready, 0.9)),
        ms(percentile(&to_result, 0.5)),
        ms(percentile(&to_result, 0.9))
    );

    // 3. The same command through the plugin and through kubectl exec.
    let last = format!("user-{:02}", m - 1);
    let pod = format!("{last}-sandbox");
    let mut via_plugin = Vec::new();
    let mut via_exec = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        assert!(agent(&["bash", &last, "--", "echo hi"]));
        via_plugin.push(t.elapsed());
        let t = Instant::now();
        let r = k.run(
            &[
                "exec",
                "-n",
                &ns.name,
                &pod,
                "-c",
                "sandbox",
                "--",
                "/bin/bash",
                "-c",
                "echo hi",
            ],
            None,
        );
        assert!(r.ok, "{}", r.stderr);
        via_exec.push(t.elapsed());
    }
    via_plugin.sort();
    via_exec.sort();
    let (p, e) = (percentile(&via_plugin, 0.5), percentile(&via_exec, 0.5));
    println!(
        "one bash call, median of 20: kubectl agent {} vs kubectl exec {} (ratio {:.2})",
        ms(p),
        ms(e),
        p.as_secs_f64() / e.as_secs_f64()
    );
    drop(ns);
    op.kill();
}
