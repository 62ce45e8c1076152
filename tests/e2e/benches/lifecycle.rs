//! Suspend -> resume -> first tool result on the real cluster, next to the
//! cold path (apply -> first tool result) in the same run. Not a test:
//! prints figures. Needs the harness cluster up, the images built and the
//! operator and kubectl-agent binaries (see docs/benchmarks.md).
//!
//! One session with a persistent workspace (provisioned by the cluster's
//! default StorageClass) is suspended and resumed N times (default
//! 10); each resume is timed from the `suspended: false` patch to the first
//! `kubectl agent bash` result, which also checks the exported variable
//! survived. The cold figure is the same session shape applied fresh.

use std::time::{Duration, Instant};

use e2e::{
    Certs, Kubectl, Namespace, Operator, agent, env_or, free_port, install_crd, ms, percentile,
    runner_image, sandbox_image, wait_for,
};

const T: Duration = Duration::from_secs(180);

fn main() {
    let n: usize = env_or("BENCH_CYCLES", 10);
    let k = Kubectl::from_env();
    install_crd(&k);
    let logs = tempfile::tempdir().expect("tempdir");
    let certs = Certs::generate();
    let runner = runner_image();
    let _op = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        &logs.path().join("operator.log"),
        &["--runner-image", &runner],
    );
    let ns = Namespace::create(&k, "bench-lifecycle", &[]);
    let bash = |name: &str, cmd: &str| -> String {
        let (code, out, err) = agent(&k, &ns.name, &["bash", name, "--", cmd]);
        assert_eq!(code, 0, "{err}");
        out
    };
    let ready = |name: &str| {
        wait_for("Ready", T, || {
            let o = k.get(&["agentsession", name, "-n", &ns.name])?;
            (o["status"]["phase"] == "Ready").then_some(())
        })
    };
    let yaml = |name: &str| {
        format!(
            "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {}\n  tools: [{{type: agent_toolset_20260401}}]\n  workspace:\n    volumeClaimTemplate:\n      spec:\n        accessModes: [ReadWriteOnce]\n        resources: {{requests: {{storage: 1Gi}}}}\n",
            sandbox_image()
        )
    };
    let mut cold = Vec::new();
    let mut resumed = Vec::new();
    for i in 0..n.max(1) {
        // Cold: a fresh session on a fresh volume.
        let name = format!("cold-{i:02}");
        let t0 = Instant::now();
        let r = k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&yaml(&name)));
        assert!(r.ok, "{}", r.stderr);
        ready(&name);
        bash(&name, "export KEPT=yes");
        cold.push(t0.elapsed());
        // Suspend, then time the resume to the first result.
        let patch = |v: bool| {
            k.must(&[
                "patch",
                "agentsession",
                &name,
                "-n",
                &ns.name,
                "--type=merge",
                "-p",
                &format!(r#"{{"spec":{{"suspended":{v}}}}}"#),
            ]);
        };
        patch(true);
        wait_for("the pod to go", T, || {
            k.get(&["pod", &format!("{name}-sandbox"), "-n", &ns.name])
                .is_none()
                .then_some(())
        });
        let t1 = Instant::now();
        patch(false);
        ready(&name);
        let out = bash(&name, "echo $KEPT");
        resumed.push(t1.elapsed());
        assert_eq!(out.trim(), "yes", "bash state survived the suspension");
        k.must(&[
            "delete",
            "agentsession",
            &name,
            "-n",
            &ns.name,
            "--wait=true",
        ]);
    }
    cold.sort();
    resumed.sort();
    println!(
        "over {} sessions: cold apply->first tool result p50 {} p90 {}; resume (suspended:false)->first tool result p50 {} p90 {} (bash state checked)",
        cold.len(),
        ms(percentile(&cold, 0.5)),
        ms(percentile(&cold, 0.9)),
        ms(percentile(&resumed, 0.5)),
        ms(percentile(&resumed, 0.9))
    );
}
