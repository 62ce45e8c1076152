//! Warm pools on the real cluster: a session claims a running pod of its
//! pool (the same pod, by UID), its toolset and environment are bound late
//! and enforced, the pool starts a replacement; an empty pool and a spec
//! the pool cannot serve start cold and say why; and with two operators
//! racing over the same claims while one is killed, no pod ever belongs to
//! two sessions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use e2e::{
    Certs, Kubectl, Namespace, Operator, agent, condition, fail_with_log, free_port, install_crd,
    runner_image, sandbox_image, wait_for,
};
use serde_json::Value;

const T: Duration = Duration::from_secs(180);
const NS: &str = "e2e-warm";

fn pool_yaml(replicas: u32) -> String {
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentWarmPool\nmetadata:\n  name: py\nspec:\n  replicas: {replicas}\n  template:\n    image: {}\n    env: [{{name: POOLVAR, value: from-the-pool}}]\n",
        sandbox_image()
    )
}

fn session_yaml(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {}\n  warmPool: py\n  tools: [{{type: agent_toolset_20260401, configs: [{{name: write, enabled: false}}]}}]\n{extra}",
        sandbox_image()
    )
}

/// The pool's unclaimed pods: name -> (uid, ready).
fn pool_pods(k: &Kubectl) -> BTreeMap<String, (String, bool)> {
    let Some(list) = k.get(&["pods", "-n", NS, "-l", "agentplane.dev/pool=py"]) else {
        return BTreeMap::new();
    };
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let ready = p["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (
                p["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                (
                    p["metadata"]["uid"].as_str().unwrap_or_default().to_owned(),
                    ready,
                ),
            )
        })
        .collect()
}

fn wait_pool_ready(k: &Kubectl, n: usize) -> BTreeMap<String, (String, bool)> {
    wait_for(&format!("{n} ready pods in pool py"), T, || {
        let pods = pool_pods(k);
        let ready = pods.values().filter(|(_, r)| *r).count();
        let status = k.get(&["agentwarmpool", "py", "-n", NS])?;
        (ready == n && pods.len() == n && status["status"]["readyReplicas"] == n as u64)
            .then_some(pods)
    })
}

fn wait_ready(k: &Kubectl, name: &str) -> Value {
    wait_for(&format!("session {name} Ready"), T, || {
        let o = k.get(&["agentsession", name, "-n", NS])?;
        (o["status"]["phase"] == "Ready").then_some(o)
    })
}

#[test]
fn claim_replenish_fall_back_and_never_share_a_pod() {
    let k = Kubectl::from_env();
    let logs = tempfile::tempdir().expect("tempdir");
    let log = logs.path().join("operator.log");
    let result = std::panic::catch_unwind(|| scenario(&k, &log));
    let _ = k.run(
        &["delete", "namespace", NS, "--wait=true", "--timeout=120s"],
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
    let op = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        log,
        &["--runner-image", &runner],
    );
    let _ns = Namespace::create(k, NS, &[]);
    let r = k.run(&["apply", "-n", NS, "-f", "-"], Some(&pool_yaml(2)));
    assert!(r.ok, "{}", r.stderr);
    let warm = wait_pool_ready(k, 2);

    // A claim: the session runs in one of the pool's pods, the same pod.
    let extra = "  env: [{name: GREETING, value: \"it's warm\"}]\n";
    let r = k.run(
        &["apply", "-n", NS, "-f", "-"],
        Some(&session_yaml("a", extra)),
    );
    assert!(r.ok, "{}", r.stderr);
    let o = wait_ready(k, "a");
    let pod = o["status"]["podName"].as_str().expect("podName").to_owned();
    let (uid, _) = warm.get(&pod).unwrap_or_else(|| {
        panic!("session a runs in {pod}, not one of the pool's warm pods {warm:?}")
    });
    let now = k.get(&["pod", &pod, "-n", NS]).expect("the claimed pod");
    assert_eq!(
        now["metadata"]["uid"].as_str(),
        Some(uid.as_str()),
        "same pod"
    );
    let owner = &now["metadata"]["ownerReferences"][0];
    assert_eq!(
        (owner["kind"].as_str(), owner["uid"].as_str()),
        (Some("AgentSession"), o["metadata"]["uid"].as_str())
    );
    let (status, reason, _) = condition(&o, "WarmPool").expect("WarmPool condition");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "Claimed"));

    // Bound late: the session's env over the pool's, its toolset enforced.
    let (code, out, err) = agent(k, NS, &["bash", "a", "--", "echo \"$GREETING\" $POOLVAR"]);
    assert_eq!((code, out.trim()), (0, "it's warm from-the-pool"), "{err}");
    let (code, _, err) = agent(
        k,
        NS,
        &[
            "call",
            "a",
            "write",
            r#"{"file_path":"/workspace/x","content":"no"}"#,
        ],
    );
    assert_ne!(code, 0, "write is disabled in the session's toolset: {err}");
    assert!(err.contains("write"), "{err}");
    let (code, out, err) = agent(
        k,
        NS,
        &["call", "a", "read", r#"{"file_path":"/etc/hostname"}"#],
    );
    assert_eq!(code, 0, "{out}{err}");

    // Replenished: two ready pods again, the claimed one not among them.
    let refilled = wait_pool_ready(k, 2);
    assert!(!refilled.contains_key(&pod), "{refilled:?}");

    // Exhausted (scaled to zero through the scale subresource): cold.
    k.must(&["scale", "agentwarmpool", "py", "-n", NS, "--replicas=0"]);
    wait_for("the pool to empty", T, || {
        pool_pods(k).is_empty().then_some(())
    });
    let r = k.run(
        &["apply", "-n", NS, "-f", "-"],
        Some(&session_yaml("b", "")),
    );
    assert!(r.ok, "{}", r.stderr);
    let o = wait_ready(k, "b");
    assert_eq!(o["status"]["podName"], "b-sandbox");
    let (status, reason, message) = condition(&o, "WarmPool").expect("WarmPool");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "PoolExhausted"),
        "{message}"
    );
    // A spec the template cannot serve: cold, naming the field.
    let r = k.run(
        &["apply", "-n", NS, "-f", "-"],
        Some(&session_yaml("c", "  workdir: /src\n")),
    );
    assert!(r.ok, "{}", r.stderr);
    k.must(&["scale", "agentwarmpool", "py", "-n", NS, "--replicas=2"]);
    let o = wait_ready(k, "c");
    let (status, reason, message) = condition(&o, "WarmPool").expect("WarmPool");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "TemplateMismatch")
    );
    assert!(message.starts_with("spec.workdir"), "{message}");
    assert_eq!(o["status"]["podName"], "c-sandbox");

    // Claims racing: a second operator (no leader election, so both
    // reconcile every session) and the first one killed while six sessions
    // claim from a pool of two. Every session ends Ready in a pod of its
    // own; no pod is controlled by two sessions or named by two statuses.
    wait_pool_ready(k, 2);
    let log2 = log.with_file_name("operator-2.log");
    let op2 = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        &log2,
        &["--runner-image", &runner],
    );
    let racers: Vec<String> = (0..6).map(|i| format!("race-{i}")).collect();
    let all: String = racers
        .iter()
        .map(|n| format!("---\n{}", session_yaml(n, "")))
        .collect();
    let r = k.run(&["apply", "-n", NS, "-f", "-"], Some(&all));
    assert!(r.ok, "{}", r.stderr);
    std::thread::sleep(Duration::from_millis(300));
    op.kill();
    let op3 = Operator::start(
        &k.kubeconfig,
        &certs,
        free_port(),
        log,
        &["--runner-image", &runner],
    );
    for name in &racers {
        wait_ready(k, name);
    }
    // Two operators may have acted on one session at once (one claiming,
    // one starting cold); the session keeps one pod and deletes the other.
    let session_of = e2e::sessions_by_uid(k, NS);
    let uid_of_session = |name: &str| {
        session_of
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(uid, _)| uid.clone())
            .unwrap_or_default()
    };
    let mut pods_of = BTreeMap::new();
    for name in &racers {
        let uid = uid_of_session(name);
        let pod = wait_for(&format!("{name} to run in one pod"), T, || {
            let pods = k.get(&[
                "pods",
                "-n",
                NS,
                "-l",
                &format!("agentplane.dev/session={name}"),
            ])?;
            let live: Vec<&Value> = pods["items"]
                .as_array()?
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .filter(|p| p["metadata"]["ownerReferences"][0]["uid"] == uid.as_str())
                .collect();
            let o = k.get(&["agentsession", name, "-n", NS])?;
            let named = o["status"]["podName"].as_str()?.to_owned();
            (live.len() == 1
                && live[0]["metadata"]["name"] == named.as_str()
                && o["status"]["phase"] == "Ready")
                .then_some(named)
        });
        pods_of.insert(name.clone(), pod);
    }
    let distinct: BTreeSet<&String> = pods_of.values().collect();
    assert_eq!(
        distinct.len(),
        racers.len(),
        "a pod named by two sessions: {pods_of:?}"
    );
    let pods = k.get(&["pods", "-n", NS]).expect("pods");
    let mut claimed_warm = 0;
    for p in pods["items"].as_array().into_iter().flatten() {
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        let controllers: Vec<&Value> = p["metadata"]["ownerReferences"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|o| o["controller"] == true)
            .collect();
        assert_eq!(controllers.len(), 1, "pod {name}: {controllers:?}");
        if controllers[0]["kind"] == "AgentSession" {
            let owner = &session_of[controllers[0]["uid"].as_str().unwrap_or_default()];
            assert_eq!(
                p["metadata"]["labels"]["agentplane.dev/session"].as_str(),
                Some(owner.as_str()),
                "pod {name} is labelled for another session than its owner"
            );
            if p["metadata"]["annotations"]["agentplane.dev/warm-pool"].is_string() {
                claimed_warm += 1;
                assert!(
                    p["metadata"]["labels"]["agentplane.dev/pool"].is_null(),
                    "claimed pod {name} still carries the pool label"
                );
            }
        }
    }
    // Session a's and at least one racer's; the rest claimed replenished
    // pods or started cold.
    assert!(claimed_warm >= 2, "{claimed_warm} warm pods claimed");
    // Each racer answers from its own pod.
    for name in &racers {
        let (code, out, err) = agent(k, NS, &["bash", name, "--", "cat /etc/hostname"]);
        assert_eq!(code, 0, "{name}: {err}");
        assert_eq!(
            out.trim(),
            pods_of[name],
            "{name} answered from another pod"
        );
    }
    wait_pool_ready(k, 2);
    drop(op2);
    drop(op3);
}
