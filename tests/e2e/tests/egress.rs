//! Sandbox egress, enforced: the NetworkPolicy the operator writes for a
//! session is not only stored but keeps the sandbox from connecting out,
//! and the operator's allow-list (`--egress-allow-cidr`, chart value
//! `sandboxEgress.allowedCIDRs`) opens exactly what it lists.
//!
//! Needs a cluster that enforces NetworkPolicy. The target is a TCP
//! listener this test opens on the node IP: a connection from a pod to it
//! crosses the node's netfilter hooks, where a policy engine filters pod
//! egress. A control pod that no policy selects must reach the listener,
//! so a cluster that enforces nothing fails here instead of passing.
//!
//! The connections are made with the runner's bash tool through
//! `kubectl agent bash`, as a model's call would make them: bash's
//! `/dev/tcp`, bounded by coreutils `timeout` (both in the sandbox image).
//!
//! Cluster DNS is not checked: the test cluster runs no DNS server (no
//! `k8s-app=kube-dns` pods), so the DNS rule of the policy has nothing to
//! reach.

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use e2e::{
    Certs, Kubectl, Namespace, Operator, fail_with_log, free_port, install_crd, node_ip,
    plugin_bin, runner_image, sandbox_image, wait_for,
};
use serde_json::Value;

/// How long a policy change may take to reach the node's rules.
const ENFORCED: Duration = Duration::from_secs(60);
/// Seconds one connection attempt may take inside the sandbox.
const CONNECT_S: u32 = 5;

/// The cluster's pod and service ranges (tests/cluster/cluster.sh), given
/// to the operator as a platform would give them.
fn cluster_cidrs() -> [String; 2] {
    let env = |k: &str, d: &str| std::env::var(k).unwrap_or_else(|_| d.to_owned());
    [
        env("AGENTPLANE_POD_CIDR", "10.88.0.0/16"),
        env("AGENTPLANE_SERVICE_CIDR", "10.96.0.0/16"),
    ]
}

/// A TCP listener on the node IP that greets every connection with a
/// token, so that a pod that prints the token has reached this listener
/// and nothing else. The accepting thread lives as long as the test.
struct Target {
    ip: String,
    port: u16,
    token: String,
}

impl Target {
    fn listen(ip: &str) -> Self {
        let l = TcpListener::bind((ip, 0))
            .unwrap_or_else(|e| panic!("cannot listen on the node IP {ip}: {e}"));
        let port = l.local_addr().expect("local addr").port();
        let token = format!("agentplane-egress-{port}");
        let greeting = format!("{token}\n");
        std::thread::spawn(move || {
            for mut s in l.incoming().flatten() {
                let _ = s.write_all(greeting.as_bytes());
            }
        });
        Self {
            ip: ip.to_owned(),
            port,
            token,
        }
    }

    /// A bash command that connects, reads the greeting and always exits 0,
    /// printing `REACHED <greeting>` or `BLOCKED rc=N` (124: timed out,
    /// i.e. dropped; 1: refused or unreachable, i.e. rejected).
    fn probe(&self) -> String {
        format!(
            "if timeout {CONNECT_S} bash -c 'exec 3<>/dev/tcp/{ip}/{port} && read -r -t {CONNECT_S} g <&3 && echo \"REACHED $g\"'; then :; else echo \"BLOCKED rc=$?\"; fi",
            ip = self.ip,
            port = self.port
        )
    }
}

/// What one probe saw.
#[derive(Debug, PartialEq)]
enum Seen {
    Reached,
    Blocked(String),
}

/// Reads a probe's output; anything but its two answers is a failure of
/// the means (the plugin, the pod), not an outcome, and fails the test.
/// The answer is looked for on its own line anywhere in stdout: the bash
/// tool prints the command's stderr (bash's "Connection refused") after
/// its stdout, in the same stream.
fn seen(target: &Target, who: &str, code: Option<i32>, out: &str, err: &str) -> Seen {
    let line = out
        .lines()
        .map(str::trim)
        .find(|l| l.starts_with("REACHED ") || l.starts_with("BLOCKED rc="))
        .unwrap_or_default();
    if code == Some(0) && line == format!("REACHED {}", target.token) {
        return Seen::Reached;
    }
    if code == Some(0) && line.starts_with("BLOCKED rc=") {
        let detail = format!("{} {}", out.trim(), err.trim());
        return Seen::Blocked(format!("{line} ({})", detail.trim()));
    }
    panic!("probe from {who} did not run (exit {code:?}): stdout {out:?}, stderr {err:?}")
}

/// Probes from the session's sandbox with its bash tool.
fn from_session(k: &Kubectl, ns: &str, session: &str, target: &Target) -> Seen {
    let o = Command::new(plugin_bin())
        .args(["-n", ns, "bash", session, "--"])
        .arg(target.probe())
        .env("KUBECONFIG", &k.kubeconfig)
        .output()
        .expect("kubectl-agent runs");
    seen(
        target,
        &format!("session {session}"),
        o.status.code(),
        &String::from_utf8_lossy(&o.stdout),
        &String::from_utf8_lossy(&o.stderr),
    )
}

/// Probes from a plain pod with `kubectl exec`.
fn from_pod(k: &Kubectl, ns: &str, pod: &str, target: &Target) -> Seen {
    let r = k.run(
        &["exec", "-n", ns, pod, "--", "bash", "-c", &target.probe()],
        None,
    );
    let code = if r.ok { Some(0) } else { None };
    seen(target, &format!("pod {pod}"), code, &r.stdout, &r.stderr)
}

/// Probes until `want` is seen, bounded by [`ENFORCED`]; the message names
/// the last outcome.
fn until(what: &str, want: fn(&Seen) -> bool, mut probe: impl FnMut() -> Seen) {
    let mut last = None;
    let start = std::time::Instant::now();
    loop {
        let s = probe();
        if want(&s) {
            return;
        }
        assert!(
            start.elapsed() < ENFORCED,
            "{what}: still {s:?} after {ENFORCED:?} (before: {last:?})"
        );
        last = Some(s);
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn reached(s: &Seen) -> bool {
    *s == Seen::Reached
}

fn blocked(s: &Seen) -> bool {
    matches!(s, Seen::Blocked(_))
}

/// A pod no NetworkPolicy selects, in the sandbox image, idling.
fn control_pod(k: &Kubectl, ns: &str) -> &'static str {
    let name = "egress-control";
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{app: egress-control}}\nspec:\n  terminationGracePeriodSeconds: 0\n  containers:\n    - name: sh\n      image: {image}\n      imagePullPolicy: IfNotPresent\n      command: [sleep, \"900\"]\n",
        image = sandbox_image()
    );
    let r = k.run(&["apply", "-n", ns, "-f", "-"], Some(&yaml));
    assert!(r.ok, "create the control pod: {}", r.stderr);
    k.must(&[
        "wait",
        "-n",
        ns,
        "--for=condition=Ready",
        &format!("pod/{name}"),
        "--timeout=120s",
    ]);
    name
}

/// The session's NetworkPolicy once its egress rules satisfy `ok`.
fn policy_when(k: &Kubectl, ns: &str, np: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    wait_for(what, ENFORCED, || {
        let p = k.get(&["networkpolicy", np, "-n", ns])?;
        ok(&p["spec"]["egress"]).then_some(p)
    })
}

fn start_operator(k: &Kubectl, certs: &Certs, log: &Path, allow: Option<&str>) -> Operator {
    let runner = runner_image();
    let cidrs = cluster_cidrs();
    let mut args = vec!["--runner-image", runner.as_str()];
    for c in &cidrs {
        args.extend(["--cluster-cidr", c.as_str()]);
    }
    if let Some(a) = allow {
        args.extend(["--egress-allow-cidr", a]);
    }
    Operator::start(&k.kubeconfig, certs, free_port(), log, &args)
}

#[test]
fn sandbox_egress_is_enforced_and_the_allow_list_opens_it() {
    let k = Kubectl::from_env();
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("operator.log");
    if let Err(e) = std::panic::catch_unwind(|| scenario(&k, &log)) {
        fail_with_log(&log, e);
    }
}

fn scenario(k: &Kubectl, log: &Path) {
    install_crd(k);
    let ns = Namespace::create(k, "e2e-egress", &[]);
    let target = Target::listen(&node_ip(k));

    // The control: a pod no policy selects reaches the listener, so the
    // path is open and any refusal below is the policy's doing.
    let control = control_pod(k, &ns.name);
    until(
        "the control pod (no policy) reaching the node listener",
        reached,
        || from_pod(k, &ns.name, control, &target),
    );

    // Default egress (DNS only): the session's sandbox cannot connect.
    let certs = Certs::generate();
    let op = start_operator(k, &certs, log, None);
    let session = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: sealed\nspec:\n  image: {image}\n  tools:\n    - type: agent_toolset_20260401\n",
        image = sandbox_image()
    );
    let r = k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&session));
    assert!(r.ok, "apply the session: {}", r.stderr);
    wait_for(
        "the sealed session to be Ready",
        Duration::from_secs(180),
        || {
            let o = k.get(&["agentsession", "sealed", "-n", &ns.name])?;
            (o["status"]["phase"] == "Ready").then_some(())
        },
    );
    policy_when(
        k,
        &ns.name,
        "sealed-egress",
        "the DNS-only NetworkPolicy of session sealed",
        |e| e.as_array().map(Vec::len) == Some(1),
    );
    until(
        "the sealed sandbox being refused by the DNS-only policy",
        blocked,
        || from_session(k, &ns.name, "sealed", &target),
    );
    // The listener still answers others: the refusal is the sandbox's alone.
    // Probed until seen (bounded): while the policy engine re-syncs its
    // chains after a burst of changes (a previous test's namespace going
    // away), one probe can be dropped.
    until(
        "the control pod still reaching the listener while the sandbox is refused",
        reached,
        || from_pod(k, &ns.name, control, &target),
    );

    // The platform lists the node IP: the same sandbox now connects. A /32
    // inside --cluster-cidr is listed on purpose, so nothing is carved out.
    drop(op);
    let allow = format!("{}/32", target.ip);
    let _op = start_operator(k, &certs, log, Some(&allow));
    let np = policy_when(
        k,
        &ns.name,
        "sealed-egress",
        &format!("the NetworkPolicy of session sealed to allow {allow}"),
        |e| e[1]["to"][0]["ipBlock"]["cidr"] == allow.as_str(),
    );
    assert!(
        np["spec"]["egress"][1]["to"][0]["ipBlock"]["except"].is_null(),
        "a narrow explicit allow has nothing carved out: {np}"
    );
    until(
        &format!("the sealed sandbox reaching {allow} once the policy allows it"),
        reached,
        || from_session(k, &ns.name, "sealed", &target),
    );
}
