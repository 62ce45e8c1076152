//! A session's life on the real cluster: suspended and resumed with its
//! workspace and bash state, suspended after idling and woken by a call,
//! ended at its lifetime. The workspace claim is provisioned by the
//! cluster's default StorageClass (local-path-provisioner in the harness).

use std::time::Duration;

use e2e::{
    Certs, Kubectl, Namespace, Operator, agent, fail_with_log, free_port, install_crd,
    runner_image, sandbox_image, status_reason, wait_for,
};
use serde_json::Value;

const T: Duration = Duration::from_secs(180);

fn phase(k: &Kubectl, ns: &str, name: &str) -> Option<(String, Value)> {
    let o = k.get(&["agentsession", name, "-n", ns])?;
    Some((o["status"]["phase"].as_str()?.to_owned(), o))
}

fn wait_phase(k: &Kubectl, ns: &str, name: &str, want: &str) -> Value {
    wait_for(&format!("{name} to be {want}"), T, || {
        phase(k, ns, name).and_then(|(p, o)| (p == want).then_some(o))
    })
}

fn pod_gone(k: &Kubectl, ns: &str, pod: &str) {
    wait_for(&format!("pod {pod} to go"), T, || {
        k.get(&["pod", pod, "-n", ns]).is_none().then_some(())
    });
}

#[test]
fn suspend_resume_idle_wake_and_lifetime() {
    let k = Kubectl::from_env();
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("operator.log");
    let result = std::panic::catch_unwind(|| scenario(&k, &log));
    let _ = k.run(
        &[
            "delete",
            "namespace",
            "e2e-lifecycle",
            "--wait=true",
            "--timeout=90s",
        ],
        None,
    );
    if let Err(e) = result {
        fail_with_log(&log, e);
    }
}

fn scenario(k: &Kubectl, log: &std::path::Path) {
    install_crd(k);
    let certs = Certs::generate();
    let runner = runner_image();
    let _op = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        log,
        &["--runner-image", &runner],
    );
    let ns = Namespace::create(k, "e2e-lifecycle", &[]);
    let keep = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: keep\nspec:\n  image: {}\n  tools: [{{type: agent_toolset_20260401}}]\n  workspace:\n    volumeClaimTemplate:\n      spec:\n        accessModes: [ReadWriteOnce]\n        resources: {{requests: {{storage: 1Gi}}}}\n  lifetime: {{idleSuspendSeconds: 20, wakeOnCall: true}}\n",
        sandbox_image()
    );
    let r = k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&keep));
    assert!(r.ok, "{}", r.stderr);
    wait_phase(k, &ns.name, "keep", "Ready");
    let (code, out, err) = agent(
        k,
        &ns.name,
        &[
            "bash",
            "keep",
            "--",
            "mkdir -p /workspace/d && cd /workspace/d && echo hi > f && export FOO=bar",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");

    let suspend = |on: bool| {
        let patch = format!(r#"{{"spec":{{"suspended":{on}}}}}"#);
        k.must(&[
            "patch",
            "agentsession",
            "keep",
            "-n",
            &ns.name,
            "--type=merge",
            "-p",
            &patch,
        ]);
    };
    // Suspended by the spec: the pod goes, the claim stays, calls are
    // refused with what to type.
    suspend(true);
    let o = wait_phase(k, &ns.name, "keep", "Suspended");
    assert_eq!(
        status_reason(&o, "Suspended"),
        Some(("True".into(), "Requested".into()))
    );
    pod_gone(k, &ns.name, "keep-sandbox");
    assert!(
        k.get(&["pvc", "keep-workspace", "-n", &ns.name]).is_some(),
        "the claim is kept"
    );
    let (code, _, err) = agent(k, &ns.name, &["bash", "keep", "--", "true"]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("suspended by its spec") && err.contains("\"suspended\":false"),
        "{err}"
    );

    // Resumed: a new pod, the same files, cwd and variables.
    suspend(false);
    wait_phase(k, &ns.name, "keep", "Ready");
    let (code, out, err) = agent(
        k,
        &ns.name,
        &["bash", "keep", "--", "echo $FOO $(pwd) $(cat f)"],
    );
    assert_eq!((code, out.trim()), (0, "bar /workspace/d hi"), "{err}");

    // Idle for 20 s: suspended, not ended.
    let o = wait_phase(k, &ns.name, "keep", "Suspended");
    assert_eq!(
        status_reason(&o, "Suspended"),
        Some(("True".into(), "Idle".into()))
    );
    pod_gone(k, &ns.name, "keep-sandbox");
    // A call wakes it (wakeOnCall) and is served where it left off.
    let (code, out, err) = agent(k, &ns.name, &["bash", "keep", "--", "echo $FOO $(pwd)"]);
    assert_eq!((code, out.trim()), (0, "bar /workspace/d"), "{err}");
    assert!(err.contains("waking"), "{err}");

    // A lifetime: the session ends, phase Finished, pod gone.
    let brief = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: brief\nspec:\n  image: {}\n  tools: [{{type: agent_toolset_20260401}}]\n  lifetime: {{maxLifetimeSeconds: 30}}\n",
        sandbox_image()
    );
    let r = k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&brief));
    assert!(r.ok, "{}", r.stderr);
    wait_phase(k, &ns.name, "brief", "Ready");
    let o = wait_phase(k, &ns.name, "brief", "Finished");
    assert_eq!(
        status_reason(&o, "Ready"),
        Some(("False".into(), "Finished".into()))
    );
    pod_gone(k, &ns.name, "brief-sandbox");
    let (code, _, err) = agent(k, &ns.name, &["bash", "brief", "--", "true"]);
    assert_eq!(code, 3, "a finished session serves nothing: {err}");
}
