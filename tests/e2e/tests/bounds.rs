//! Bounds at the node that neither an agent nor a tenant can lift, on the
//! real cluster with the chart installed: a namespace admin cannot remove
//! a session's fences (egress policy, toolset, pod, claim) nor open a
//! sandbox's traffic with a policy of their own; a break-glass user's
//! deletion is put back; what `kubectl agent tools` lists is what the
//! runner serves; a sandbox that writes past its /tmp bound is evicted and
//! replaced, its persistent workspace kept, its neighbour untouched; a
//! fork bomb and an out-of-memory command end their own sandbox (which
//! restarts and says why) while a neighbour keeps answering and the
//! operator keeps reconciling. The neighbour's latency before and during
//! each attack is printed as `figure:` lines (docs/reliability.md).

use std::time::{Duration, Instant};

use e2e::release::Release;
use e2e::{Kubectl, Namespace, agent, condition, ms, sandbox_image, wait_for};
use serde_json::Value;

const RELEASE: &str = "bounds";
const RELEASE_NS: &str = "agentplane-bounds";
const T: Duration = Duration::from_secs(180);

#[test]
fn fences_hold_against_a_namespace_admin_and_disk_bounds_evict() {
    let k = Kubectl::from_env();
    let release = Release::install(
        &k,
        RELEASE,
        RELEASE_NS,
        &[
            "--set",
            "replicaCount=1",
            // A small /tmp, so that filling it is quick.
            "--set",
            "sandboxDefaults.tmpSize=64Mi",
        ],
    );
    let result = std::panic::catch_unwind(|| scenario(&k));
    if result.is_err() {
        release.print_logs("agentplane-operator", 120);
    }
    drop(release);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn session(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {}\n  workdir: /workspace\n  tools:\n    - type: agent_toolset_20260401\n      configs: [{{name: grep, enabled: false}}]\n{extra}",
        sandbox_image()
    )
}

fn ready(k: &Kubectl, ns: &str, name: &str) -> Value {
    wait_for(&format!("{name} to be Ready"), T, || {
        let o = k.get(&["agentsession", name, "-n", ns])?;
        (o["status"]["phase"] == "Ready").then_some(o)
    })
}

fn pod_uid(k: &Kubectl, ns: &str, session: &str) -> Option<String> {
    let o = k.get(&["agentsession", session, "-n", ns])?;
    let pod = o["status"]["podName"].as_str()?;
    let p = k.get(&["pod", pod, "-n", ns])?;
    p["metadata"]["uid"].as_str().map(str::to_owned)
}

fn scenario(k: &Kubectl) {
    let ns = Namespace::create(
        k,
        "e2e-bounds",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    );
    let ns = ns.name.as_str();
    k.must(&["create", "serviceaccount", "tenant", "-n", ns]);
    k.must(&[
        "create",
        "rolebinding",
        "tenant-admin",
        "-n",
        ns,
        "--clusterrole=admin",
        &format!("--serviceaccount={ns}:tenant"),
    ]);
    let keeper = session(
        "keeper",
        "  workspace:\n    volumeClaimTemplate:\n      spec:\n        accessModes: [ReadWriteOnce]\n        resources: {requests: {storage: 1Gi}}\n",
    );
    let hog = session("hog", "  resources:\n    limits: {memory: 64Mi}\n");
    for yaml in [
        session("fenced", ""),
        session("neighbour", ""),
        keeper,
        session("bomber", ""),
        hog,
    ] {
        wait_for(
            "the webhook to admit a session",
            Duration::from_secs(60),
            || {
                k.run(&["apply", "-n", ns, "-f", "-"], Some(&yaml))
                    .ok
                    .then_some(())
            },
        );
    }
    for s in ["fenced", "neighbour", "keeper", "bomber", "hog"] {
        ready(k, ns, s);
    }
    tenant_cannot_remove_fences(k, ns);
    break_glass_is_restored(k, ns);
    status_lists_what_the_runner_serves(k, ns);
    let before = neighbour_latency(k, ns, 15);
    println!(
        "figure: neighbour bash before any attack: {}",
        summary(&before)
    );
    disk_past_its_bound_is_evicted(k, ns);
    a_fork_bomb_ends_its_own_sandbox(k, ns);
    running_out_of_memory_ends_its_own_sandbox(k, ns);
}

/// `kubectl agent bash neighbour -- true`, `n` times: each call's time.
fn neighbour_latency(k: &Kubectl, ns: &str, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            let (code, out, err) = agent(k, ns, &["bash", "neighbour", "--", "true"]);
            assert_eq!(code, 0, "the neighbour stopped answering: {out}{err}");
            t.elapsed()
        })
        .collect()
}

fn summary(samples: &[Duration]) -> String {
    let mut sorted = samples.to_vec();
    sorted.sort();
    format!(
        "{} calls, p50 {}, p99 {}",
        sorted.len(),
        ms(e2e::percentile(&sorted, 0.5)),
        ms(e2e::percentile(&sorted, 0.99))
    )
}

/// Calls the neighbour until `done` says the attack is over, at most
/// `max` calls: the neighbour's latency during it.
fn during(k: &Kubectl, ns: &str, max: usize, mut done: impl FnMut() -> bool) -> Vec<Duration> {
    let mut out = Vec::new();
    while out.len() < max && (out.len() < 5 || !done()) {
        out.extend(neighbour_latency(k, ns, 1));
    }
    out
}

fn limit_reached(k: &Kubectl, ns: &str, name: &str, reason: &str) -> Option<String> {
    let o = k.get(&["agentsession", name, "-n", ns])?;
    let (status, r, message) = condition(&o, "LimitReached")?;
    (status == "True" && r == reason).then_some(message)
}

/// A classic fork bomb in one sandbox: its call ends with a notice, its
/// sandbox restarts and says so; the neighbour answers throughout and the
/// operator brings up a session applied mid-attack.
fn a_fork_bomb_ends_its_own_sandbox(k: &Kubectl, ns: &str) {
    let bomb = std::thread::spawn({
        let (k, ns) = (k.clone(), ns.to_owned());
        move || {
            agent(
                &k,
                &ns,
                &["bash", "bomber", "--", ":(){ :|:& };:; sleep 60"],
            )
        }
    });
    let late = session("late", "");
    let applied = k.run(&["apply", "-n", ns, "-f", "-"], Some(&late));
    assert!(
        applied.ok,
        "a session applied during the attack: {}",
        applied.stderr
    );
    let samples = during(k, ns, 200, || {
        limit_reached(k, ns, "bomber", "ProcessLimit").is_some()
    });
    println!(
        "figure: neighbour bash during a fork bomb: {}",
        summary(&samples)
    );
    let (code, out, err) = bomb.join().expect("bomb thread");
    assert_ne!(code, 0, "the bomb's call says it failed: {out}");
    assert!(
        out.contains("reached its limit of") || err.contains("reached its limit of") || code == 3,
        "the bomb's call ends with the limit named, or the connection to the ended sandbox broke: {out}{err}"
    );
    let message = wait_for("bomber's LimitReached", T, || {
        limit_reached(k, ns, "bomber", "ProcessLimit")
    });
    assert!(message.contains("processes"), "{message}");
    ready(k, ns, "late");
    ready(k, ns, "bomber");
    let (code, out, err) = agent(k, ns, &["bash", "bomber", "--", "echo back"]);
    assert_eq!((code, out.trim()), (0, "back"), "{err}");
}

/// A command past its sandbox's 64Mi: the sandbox ends and restarts, its
/// status names the limit; the neighbour answers throughout.
fn running_out_of_memory_ends_its_own_sandbox(k: &Kubectl, ns: &str) {
    let hog = std::thread::spawn({
        let (k, ns) = (k.clone(), ns.to_owned());
        move || {
            agent(
                &k,
                &ns,
                &[
                    "bash",
                    "hog",
                    "--",
                    "x=$(head -c 300000000 /dev/zero | tr '\\0' a); echo ${#x}",
                ],
            )
        }
    });
    let samples = during(k, ns, 200, || {
        limit_reached(k, ns, "hog", "OOMKilled").is_some()
    });
    println!(
        "figure: neighbour bash during an out-of-memory kill: {}",
        summary(&samples)
    );
    let (code, out, err) = hog.join().expect("hog thread");
    assert_ne!(code, 0, "{out}{err}");
    let message = wait_for("hog's LimitReached", T, || {
        limit_reached(k, ns, "hog", "OOMKilled")
    });
    assert!(
        message.contains("64Mi"),
        "the condition names the limit: {message}"
    );
    ready(k, ns, "hog");
    let (code, out, err) = agent(k, ns, &["bash", "hog", "--", "echo back"]);
    assert_eq!((code, out.trim()), (0, "back"), "{err}");
}

/// With the stock `admin` role in their namespace, a tenant can neither
/// delete nor change what fences their sandbox, nor add a policy that
/// opens its traffic; a policy that leaves sandboxes out, or only denies,
/// goes through.
fn tenant_cannot_remove_fences(k: &Kubectl, ns: &str) {
    let tenant = format!("--as=system:serviceaccount:{ns}:tenant");
    let denied = |what: &str, args: &[&str], stdin: Option<&str>, says: &str| {
        let mut all: Vec<&str> = args.to_vec();
        all.extend(["-n", ns, &tenant]);
        let r = k.run(&all, stdin);
        assert!(
            !r.ok && r.stderr.contains(says),
            "a namespace admin could {what}: {}{}",
            r.stdout,
            r.stderr
        );
    };
    let fence = "is a fence the agentplane platform set";
    denied(
        "delete the egress policy",
        &["delete", "networkpolicy", "fenced-egress"],
        None,
        fence,
    );
    denied(
        "rewrite the toolset",
        &[
            "patch",
            "configmap",
            "fenced-toolset",
            "--type=merge",
            "-p",
            r#"{"data":{"toolset.json":"{}"}}"#,
        ],
        None,
        fence,
    );
    denied(
        "relabel the sandbox pod out of its policy",
        &[
            "label",
            "pod",
            "fenced-sandbox",
            "agentplane.dev/session-",
            "--overwrite",
        ],
        None,
        fence,
    );
    denied(
        "delete the sandbox pod",
        &["delete", "pod", "fenced-sandbox"],
        None,
        fence,
    );
    denied(
        "delete the workspace claim",
        &["delete", "pvc", "keeper-workspace", "--wait=false"],
        None,
        fence,
    );
    let open_all = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: open\nspec:\n  podSelector: {}\n  policyTypes: [Egress]\n  egress: [{}]\n";
    denied(
        "open every pod's egress, sandboxes included",
        &["create", "-f", "-"],
        Some(open_all),
        "must leave agentplane sandbox pods out",
    );
    let others = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: others\nspec:\n  podSelector:\n    matchExpressions: [{key: app.kubernetes.io/name, operator: NotIn, values: [agentplane-sandbox]}]\n  policyTypes: [Egress]\n  egress: [{}]\n";
    let deny_all = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: deny-all\nspec:\n  podSelector: {}\n  policyTypes: [Ingress, Egress]\n";
    for (what, yaml) in [
        ("a policy that leaves sandboxes out", others),
        ("a deny-only policy", deny_all),
    ] {
        let r = k.run(&["create", "-n", ns, &tenant, "-f", "-"], Some(yaml));
        assert!(
            r.ok,
            "a namespace admin could not create {what}: {}",
            r.stderr
        );
    }
    // The tenant's own objects stay theirs.
    let r = k.run(
        &[
            "create",
            "configmap",
            "mine",
            "-n",
            ns,
            &tenant,
            "--from-literal=a=b",
        ],
        None,
    );
    assert!(r.ok, "{}", r.stderr);
    let r = k.run(&["delete", "configmap", "mine", "-n", ns, &tenant], None);
    assert!(r.ok, "{}", r.stderr);
}

/// A break-glass user (system:masters) may delete a fence; the operator
/// puts it back, and a rewritten toolset is rewritten back.
fn break_glass_is_restored(k: &Kubectl, ns: &str) {
    let before = k
        .get(&["networkpolicy", "fenced-egress", "-n", ns])
        .expect("policy");
    let old_uid = before["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let started = Instant::now();
    k.must(&[
        "delete",
        "networkpolicy",
        "fenced-egress",
        "-n",
        ns,
        "--wait=true",
    ]);
    wait_for(
        "the egress policy to be back",
        Duration::from_secs(60),
        || {
            let np = k.get(&["networkpolicy", "fenced-egress", "-n", ns])?;
            (np["metadata"]["uid"].as_str()? != old_uid).then_some(())
        },
    );
    println!(
        "figure: deleted egress policy restored {} after the delete returned",
        ms(started.elapsed())
    );
    let toolset = || {
        k.must(&[
            "get",
            "configmap",
            "fenced-toolset",
            "-n",
            ns,
            "-o",
            "jsonpath={.data.toolset\\.json}",
        ])
    };
    let original = toolset();
    let started = Instant::now();
    k.must(&[
        "patch",
        "configmap",
        "fenced-toolset",
        "-n",
        ns,
        "--type=merge",
        "-p",
        r#"{"data":{"toolset.json":"{\"tools\":[]}"}}"#,
    ]);
    wait_for(
        "the toolset to be rewritten back",
        Duration::from_secs(60),
        || (toolset() == original).then_some(()),
    );
    println!(
        "figure: rewritten toolset restored {} after the patch",
        ms(started.elapsed())
    );
}

/// The tools `kubectl agent tools` lists (from status) are the ones the
/// runner serves, after the fences were tried.
fn status_lists_what_the_runner_serves(k: &Kubectl, ns: &str) {
    let (code, out, err) = agent(k, ns, &["tools", "fenced"]);
    assert_eq!(code, 0, "{err}");
    let mut listed: Vec<String> = out
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    listed.sort();
    // The runner's own answer, asked inside the sandbox.
    let served = wait_for("the runner's tool list", Duration::from_secs(30), || {
        let r = k.run(
            &[
                "exec",
                "-n",
                ns,
                "fenced-sandbox",
                "-c",
                "sandbox",
                "--",
                runner_api::SANDBOX_BIN,
                "tools",
                "--socket",
                runner_api::RUNNER_SOCKET,
            ],
            None,
        );
        let tools: Vec<Value> = serde_json::from_str(r.stdout.trim()).ok()?;
        let mut names: Vec<String> = tools
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        Some(names)
    });
    assert_eq!(
        listed, served,
        "kubectl agent tools and the runner disagree"
    );
    assert!(
        !served.iter().any(|t| t == "grep"),
        "grep is disabled: {served:?}"
    );
}

/// Writing past /tmp's bound ends that sandbox (the kubelet evicts it); the
/// session says which limit, gets a new pod, and keeps its persistent
/// workspace; a neighbour's pod is the same pod throughout.
fn disk_past_its_bound_is_evicted(k: &Kubectl, ns: &str) {
    let (code, out, err) = agent(
        k,
        ns,
        &["bash", "keeper", "--", "echo kept > /workspace/kept.txt"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let neighbour = pod_uid(k, ns, "neighbour").expect("neighbour pod");
    let keeper = pod_uid(k, ns, "keeper").expect("keeper pod");
    // The call may end any way: the pod can be evicted while it runs.
    let fill = std::thread::spawn({
        let (k, ns) = (k.clone(), ns.to_owned());
        move || {
            agent(
                &k,
                &ns,
                &[
                    "bash",
                    "keeper",
                    "--",
                    "dd if=/dev/zero of=/tmp/fill bs=1M count=128 2>&1 | tail -1; sleep 60",
                ],
            )
        }
    });
    let samples = during(k, ns, 400, || {
        limit_reached(k, ns, "keeper", "Evicted").is_some()
    });
    println!(
        "figure: neighbour bash during a disk fill and eviction: {}",
        summary(&samples)
    );
    let _ = fill.join();
    let start = Instant::now();
    let o = loop {
        let seen = k.get(&["agentsession", "keeper", "-n", ns]).filter(|o| {
            condition(o, "LimitReached")
                .is_some_and(|(status, reason, _)| status == "True" && reason == "Evicted")
        });
        if let Some(o) = seen {
            break o;
        }
        if start.elapsed() > T {
            // What the kubelet and the operator left, to tell an eviction
            // that never came from a status that lost it.
            for args in [
                vec!["get", "pods", "-n", ns, "-o", "wide"],
                vec![
                    "get",
                    "pods",
                    "-n",
                    ns,
                    "-o",
                    "jsonpath={range .items[*]}{.metadata.name} {.metadata.uid} {.status.phase} {.status.reason} {.status.message}{\"\\n\"}{end}",
                ],
                vec![
                    "get",
                    "agentsession",
                    "keeper",
                    "-n",
                    ns,
                    "-o",
                    "jsonpath={.metadata.resourceVersion} {.status.conditions}",
                ],
                vec!["get", "events", "-n", ns, "--sort-by=.lastTimestamp"],
            ] {
                let r = k.run(&args, None);
                println!("kubectl {}:\n{}{}", args.join(" "), r.stdout, r.stderr);
            }
            panic!("timed out after {T:?} waiting for keeper's LimitReached condition");
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let (_, _, message) = condition(&o, "LimitReached").expect("condition");
    assert!(
        message.contains("tmp") && message.contains("64Mi"),
        "the condition names the bound: {message}"
    );
    ready(k, ns, "keeper");
    let now = wait_for("keeper's new pod", T, || {
        pod_uid(k, ns, "keeper").filter(|u| *u != keeper)
    });
    assert_ne!(now, keeper);
    let (code, out, err) = agent(k, ns, &["bash", "keeper", "--", "cat /workspace/kept.txt"]);
    assert_eq!((code, out.trim()), (0, "kept"), "{err}");
    assert_eq!(
        pod_uid(k, ns, "neighbour").as_deref(),
        Some(neighbour.as_str()),
        "the neighbour's pod was replaced"
    );
    let (code, out, err) = agent(k, ns, &["bash", "neighbour", "--", "echo fine"]);
    assert_eq!((code, out.trim()), (0, "fine"), "{err}");
}
