//! Two operators behind one Lease on the real API server, as the chart runs
//! them. The standby watches while it stands by; when the leader is killed
//! it takes the lease with every session already in its store, reconciles a
//! session created while the lease moved, and duplicates nothing the dead
//! leader made.

use std::path::Path;
use std::time::{Duration, Instant};

use e2e::{
    Certs, Kubectl, Namespace, Operator, fail_with_log, free_port, install_crd, register_webhook,
    runner_image, sandbox_image, unregister_webhook, wait_for,
};

const WEBHOOK: &str = "agentplane-e2e-failover";
const LEASE: &str = "e2e-failover";
const T: Duration = Duration::from_secs(120);

fn session(name: &str) -> String {
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {image}\n  tools:\n    - type: agent_toolset_20260401\n",
        image = sandbox_image()
    )
}

fn holder(k: &Kubectl, ns: &str) -> Option<String> {
    k.get(&["lease", LEASE, "-n", ns])?["spec"]["holderIdentity"]
        .as_str()
        .map(str::to_owned)
}

fn ready(k: &Kubectl, ns: &str, name: &str) -> bool {
    k.get(&["agentsession", name, "-n", ns])
        .is_some_and(|o| o["status"]["phase"] == "Ready")
}

#[test]
fn a_standby_takes_over_with_its_caches_listed() {
    let k = Kubectl::from_env();
    let logs = tempfile::tempdir().expect("tempdir");
    let (first, second) = (logs.path().join("op-a.log"), logs.path().join("op-b.log"));
    let result = std::panic::catch_unwind(|| scenario(&k, &first, &second));
    unregister_webhook(&k, WEBHOOK);
    if let Err(e) = result {
        eprintln!(
            "---- op-a (the leader killed) ----\n{}",
            std::fs::read_to_string(&first).unwrap_or_default()
        );
        fail_with_log(&second, e);
    }
}

fn scenario(k: &Kubectl, first: &Path, second: &Path) {
    install_crd(k);
    let ns = Namespace::create(k, "e2e-failover", &[]);
    let certs = Certs::generate();
    let runner = runner_image();
    // A lease a little shorter than the chart's; the renew deadline stays
    // long enough that a leader on a busy machine does not step down early.
    let args = [
        "--runner-image",
        &runner,
        "--leader-elect",
        "--lease-namespace",
        &ns.name,
        "--lease-name",
        LEASE,
        "--lease-duration-seconds",
        "8",
        "--lease-renew-deadline-seconds",
        "6",
        "--lease-retry-period-seconds",
        "2",
    ];
    let op_a = Operator::start_with_env(
        &k.kubeconfig,
        &certs,
        free_port(),
        first,
        &args,
        &[("POD_NAME", "op-a")],
    );
    wait_for("op-a to lead", T, || {
        (holder(k, &ns.name).as_deref() == Some("op-a")).then_some(())
    });
    // The standby serves the webhook the API server calls, as every
    // replica does, and outlives the leader.
    let port_b = free_port();
    let op_b = Operator::start_with_env(
        &k.kubeconfig,
        &certs,
        port_b,
        second,
        &args,
        &[("POD_NAME", "op-b")],
    );
    let r = register_webhook(k, WEBHOOK, &certs.ca_pem, port_b);
    assert!(r.ok, "register webhook: {}", r.stderr);
    let before = ["before-0", "before-1", "before-2"];
    for name in before {
        wait_for("the webhook to admit a session", T, || {
            k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&session(name)))
                .ok
                .then_some(())
        });
    }
    for name in before {
        wait_for(&format!("{name} Ready under op-a"), T, || {
            ready(k, &ns.name, name).then_some(())
        });
    }
    let standby_log = || std::fs::read_to_string(second).unwrap_or_default();
    wait_for("the standby's session watch to list", T, || {
        standby_log()
            .contains("the session watch has listed")
            .then_some(())
    });
    assert!(
        !standby_log().contains("leading:"),
        "op-b led before op-a was killed"
    );

    // The leader dies as a node would take it; a session arrives while the
    // lease is still op-a's.
    let killed = Instant::now();
    op_a.kill();
    let r = k.run(
        &["apply", "-n", &ns.name, "-f", "-"],
        Some(&session("after")),
    );
    assert!(r.ok, "the standby's webhook admits: {}", r.stderr);
    wait_for("op-b to take the lease", T, || {
        (holder(k, &ns.name).as_deref() == Some("op-b")).then_some(())
    });
    let took = killed.elapsed();
    wait_for(
        "the session made during the fail-over to be Ready",
        T,
        || ready(k, &ns.name, "after").then_some(()),
    );
    eprintln!(
        "lease moved after {:.1} s; the new session Ready after {:.1} s",
        took.as_secs_f64(),
        killed.elapsed().as_secs_f64()
    );

    // op-b led with every session op-a had made already in its store.
    let log = standby_log();
    let leading = log
        .lines()
        .find(|l| l.contains("leading:"))
        .unwrap_or_else(|| panic!("op-b never said it leads:\n{log}"));
    let stored: usize = leading
        .split("sessions=")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no session count in {leading:?}"));
    assert!(
        stored >= before.len(),
        "op-b led with {stored} stored sessions, not the {} op-a made: {leading}",
        before.len()
    );

    // Nothing the dead leader made was made again, nothing was lost.
    for name in before.iter().chain(&["after"]) {
        wait_for(&format!("{name} Ready under op-b"), T, || {
            ready(k, &ns.name, name).then_some(())
        });
        for kind in ["pods", "configmaps", "networkpolicies"] {
            let objects = e2e::session_objects(k, kind, &ns.name, name);
            assert_eq!(
                objects.len(),
                1,
                "{name}: {} {kind}: {:?}",
                objects.len(),
                objects
                    .iter()
                    .map(|o| o["metadata"]["name"].clone())
                    .collect::<Vec<_>>()
            );
        }
    }
    drop(op_b);
}
