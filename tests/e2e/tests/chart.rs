//! The path a user walks, on the real node: the chart installed with the
//! project's own images, a session applied, every tool called through
//! `kubectl agent`, the session deleted, the release upgraded and removed.

use std::time::Duration;

use e2e::{Kubectl, Namespace, agent, helm, root, sandbox_image, wait_for};

const RELEASE: &str = "agentplane";
const RELEASE_NS: &str = "agentplane-e2e";

#[test]
fn helm_install_session_tools_upgrade_uninstall() {
    let k = Kubectl::from_env();
    let chart = root().join("charts/agentplane");
    let chart = chart.to_str().expect("path");
    let _ = helm(&k, &["uninstall", RELEASE, "-n", RELEASE_NS, "--wait"]);
    let r = helm(
        &k,
        &[
            "install",
            RELEASE,
            chart,
            "-n",
            RELEASE_NS,
            "--create-namespace",
            "--wait",
            "--timeout",
            "5m",
        ],
    );
    assert!(r.ok, "helm install: {}\n{}", r.stdout, r.stderr);
    let result = std::panic::catch_unwind(|| walk(&k, chart));
    if result.is_err() {
        eprintln!(
            "{}",
            k.run(
                &[
                    "-n",
                    RELEASE_NS,
                    "logs",
                    "-l",
                    "app.kubernetes.io/name=agentplane-operator",
                    "--tail=80",
                    "--prefix"
                ],
                None
            )
            .stdout
        );
    }
    let _ = helm(&k, &["uninstall", RELEASE, "-n", RELEASE_NS, "--wait"]);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

fn walk(k: &Kubectl, chart: &str) {
    // Two replicas, one leader.
    let deploy = k
        .get(&["deployment", "-n", RELEASE_NS, "agentplane"])
        .expect("deployment");
    assert_eq!(deploy["status"]["readyReplicas"], 2);
    let lease = wait_for("the leader lease", Duration::from_secs(60), || {
        let l = k.get(&["lease", "-n", RELEASE_NS, "agentplane"])?;
        l["spec"]["holderIdentity"].as_str().map(str::to_owned)
    });
    assert!(lease.starts_with("agentplane-"), "{lease}");
    let t = helm(k, &["test", RELEASE, "-n", RELEASE_NS, "--timeout", "2m"]);
    assert!(t.ok, "helm test: {}\n{}", t.stdout, t.stderr);

    let ns = Namespace::create(
        k,
        "e2e-chart",
        &[("pod-security.kubernetes.io/enforce", "restricted")],
    );
    write_guard(k, &ns.name);
    let session = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: walk\nspec:\n  image: {}\n  workdir: /workspace\n  tools:\n    - type: agent_toolset_20260401\n      configs:\n        - {{name: write, permission_policy: {{type: always_ask}}}}\n        - {{name: grep, enabled: false}}\n",
        sandbox_image()
    );
    wait_for(
        "the webhook to admit the session",
        Duration::from_secs(60),
        || {
            k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&session))
                .ok
                .then_some(())
        },
    );
    wait_for("the session to be Ready", Duration::from_secs(180), || {
        let o = k.get(&["agentsession", "walk", "-n", &ns.name])?;
        (o["status"]["phase"] == "Ready").then_some(())
    });

    // tools: from status.
    let (code, out, err) = agent(k, &ns.name, &["tools", "walk"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("bash") && out.contains("always_ask") && !out.contains("grep "),
        "{out}"
    );

    // Every enabled tool works through the plugin; bash state persists.
    let (code, out, err) = agent(
        k,
        &ns.name,
        &[
            "bash",
            "walk",
            "--",
            "cd /workspace && mkdir -p src && export GREETING=hello",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = agent(
        k,
        &ns.name,
        &["bash", "walk", "--", "cd src; echo $GREETING from $(pwd)"],
    );
    assert_eq!((code, out.trim()), (0, "hello from /workspace/src"));
    let (code, out, err) = agent(
        k,
        &ns.name,
        &[
            "call",
            "walk",
            "write",
            r#"{"file_path":"src/a.txt","content":"one\ntwo\n"}"#,
        ],
    );
    assert_eq!(code, 2, "write is always_ask: {out}{err}");
    assert!(
        err.contains("requires confirmation") && err.contains("--confirm"),
        "{err}"
    );
    let (code, out, err) = agent(
        k,
        &ns.name,
        &[
            "call",
            "walk",
            "write",
            r#"{"file_path":"src/a.txt","content":"one\ntwo\n"}"#,
            "--confirm",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, _) = agent(
        k,
        &ns.name,
        &[
            "call",
            "walk",
            "edit",
            r#"{"file_path":"src/a.txt","old_string":"two","new_string":"deux"}"#,
        ],
    );
    assert_eq!(code, 0, "{out}");
    let (code, out, _) = agent(
        k,
        &ns.name,
        &[
            "call",
            "walk",
            "read",
            r#"{"file_path":"/workspace/src/a.txt"}"#,
        ],
    );
    assert_eq!((code, out.as_str()), (0, "one\ndeux\n"));
    let (code, out, _) = agent(
        k,
        &ns.name,
        &["call", "walk", "glob", r#"{"pattern":"**/*.txt"}"#],
    );
    assert!(code == 0 && out.contains("/workspace/src/a.txt"), "{out}");
    let (code, out, err) = agent(
        k,
        &ns.name,
        &["call", "walk", "grep", r#"{"pattern":"deux"}"#],
    );
    assert_eq!(code, 2, "grep is disabled: {out}{err}");
    assert!(err.contains("not enabled"), "{err}");
    let (code, out, _) = agent(k, &ns.name, &["bash", "walk", "--", "exit 3"]);
    assert_eq!(code, 1, "a failing command is a tool error: {out}");
    assert!(out.contains('3'), "{out}");

    // Hostile reads: files whose size lies and devices are errors, and the
    // runner (the sandbox container's process) never restarts for them.
    for input in [
        r#"{"file_path":"/proc/self/pagemap"}"#,
        r#"{"file_path":"/proc/self/pagemap","view_range":[1,10]}"#,
        r#"{"file_path":"/dev/zero"}"#,
    ] {
        let (code, out, err) = agent(k, &ns.name, &["call", "walk", "read", input]);
        assert_eq!(code, 1, "{input}: a tool error: {out}{err}");
    }
    // Streamed through the port-forward as it runs.
    let (code, out, err) = agent(
        k,
        &ns.name,
        &[
            "bash",
            "walk",
            "--follow",
            "--",
            "echo a; sleep 1; echo b >&2; echo c",
        ],
    );
    assert_eq!((code, out.as_str(), err.as_str()), (0, "a\nc\n", "b\n"));
    let (code, out, _) = agent(k, &ns.name, &["bash", "walk", "--", "echo still"]);
    assert_eq!((code, out.as_str()), (0, "still\n"));
    let restarts = k.must(&[
        "get",
        "pod",
        "walk-sandbox",
        "-n",
        &ns.name,
        "-o",
        "jsonpath={.status.containerStatuses[*].restartCount}",
    ]);
    assert!(
        restarts.split_whitespace().all(|n| n == "0"),
        "restart counts: {restarts}"
    );

    // helm upgrade keeps sessions, and ships a warm pool from values.
    let pool_image = format!("warmPools[0].template.image={}", sandbox_image());
    let pool_ns = format!("warmPools[0].namespace={}", ns.name);
    let r = helm(
        k,
        &[
            "upgrade",
            RELEASE,
            chart,
            "-n",
            RELEASE_NS,
            "--wait",
            "--set",
            "replicaCount=1",
            "--set",
            "warmPools[0].name=chart-pool",
            "--set",
            &pool_ns,
            "--set",
            "warmPools[0].replicas=1",
            "--set",
            &pool_image,
        ],
    );
    assert!(r.ok, "helm upgrade: {}", r.stderr);
    let (code, out, err) = agent(
        k,
        &ns.name,
        &["bash", "walk", "--", "cat /workspace/src/a.txt"],
    );
    assert_eq!((code, out.as_str()), (0, "one\ndeux\n"), "{err}");

    // The pool runs under the chart's RBAC, write guard and the namespace's
    // restricted pod security, and a session claims from it.
    wait_for("the chart's warm pool", Duration::from_secs(180), || {
        let o = k.get(&["agentwarmpool", "chart-pool", "-n", &ns.name])?;
        (o["status"]["readyReplicas"] == 1).then_some(())
    });
    let warm = format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: warm\nspec:\n  image: {}\n  warmPool: chart-pool\n  tools: [{{type: agent_toolset_20260401}}]\n",
        sandbox_image()
    );
    // The upgrade just scaled the operator down: the webhook Service may
    // still route a first call to the replica that is going away.
    wait_for(
        "the webhook to admit the warm session",
        Duration::from_secs(60),
        || {
            k.run(&["apply", "-n", &ns.name, "-f", "-"], Some(&warm))
                .ok
                .then_some(())
        },
    );
    let o = wait_for("the warm session", Duration::from_secs(120), || {
        let o = k.get(&["agentsession", "warm", "-n", &ns.name])?;
        (o["status"]["phase"] == "Ready").then_some(o)
    });
    assert_eq!(
        e2e::status_reason(&o, "WarmPool"),
        Some(("True".into(), "Claimed".into())),
        "{o}"
    );
    let (code, out, err) = agent(k, &ns.name, &["bash", "warm", "--", "echo warm"]);
    assert_eq!((code, out.trim()), (0, "warm"), "{err}");

    // Deleting the session removes its pod.
    k.must(&["delete", "agentsession", "walk", "-n", &ns.name]);
    wait_for("the sandbox pod to go", Duration::from_secs(120), || {
        k.get(&["pod", "walk-sandbox", "-n", &ns.name])
            .is_none()
            .then_some(())
    });

    // helm uninstall leaves only what the chart documents: the CRD.
    let r = helm(k, &["uninstall", RELEASE, "-n", RELEASE_NS, "--wait"]);
    assert!(r.ok, "helm uninstall: {}", r.stderr);
    assert!(
        k.get(&["validatingwebhookconfiguration", RELEASE])
            .is_none()
    );
    assert!(k.get(&["clusterrole", RELEASE]).is_none());
    // Operator pods terminate after uninstall returns; give them their grace period.
    wait_for(
        "every release object to go",
        Duration::from_secs(90),
        || {
            let left = k.must(&[
                "get",
                "all,secret,configmap,role,rolebinding,serviceaccount,pdb",
                "-n",
                RELEASE_NS,
                "-l",
                "app.kubernetes.io/instance=agentplane",
                "-o",
                "name",
            ]);
            left.trim().is_empty().then_some(())
        },
    );
    assert!(
        k.get(&["crd", "agentsessions.agentplane.dev"]).is_some(),
        "the CRD stays, as NOTES.txt says"
    );
}

/// The operator's ClusterRole lets it write ConfigMaps (and pods, claims,
/// NetworkPolicies) anywhere; the chart's admission policy narrows that to
/// objects carrying its label. Acting as the operator's service account:
/// an unlabelled ConfigMap can be neither created nor changed, a labelled
/// one can.
fn write_guard(k: &Kubectl, ns: &str) {
    let operator = format!("--as=system:serviceaccount:{RELEASE_NS}:{RELEASE}");
    let cm = |name: &str, labelled: bool| {
        let labels = if labelled {
            "\n  labels:\n    app.kubernetes.io/managed-by: agentplane"
        } else {
            ""
        };
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}{labels}\ndata:\n  k: v\n"
        )
    };
    let r = k.run(
        &["create", "-n", ns, &operator, "-f", "-"],
        Some(&cm("foreign", false)),
    );
    assert!(
        !r.ok && r.stderr.contains("may only write objects labelled"),
        "the operator created an unlabelled ConfigMap: {}{}",
        r.stdout,
        r.stderr
    );
    // Someone else's ConfigMap: the operator cannot patch it.
    k.must(&[
        "create",
        "configmap",
        "theirs",
        "-n",
        ns,
        "--from-literal=k=v",
    ]);
    let r = k.run(
        &[
            "patch", "configmap", "theirs", "-n", ns, &operator, "--type=merge", "-p",
            r#"{"metadata":{"labels":{"app.kubernetes.io/managed-by":"agentplane"}},"data":{"k":"stolen"}}"#,
        ],
        None,
    );
    assert!(
        !r.ok
            && r.stderr
                .contains("may only change or delete objects it labelled"),
        "the operator relabelled someone's ConfigMap: {}{}",
        r.stdout,
        r.stderr
    );
    assert_eq!(
        k.must(&[
            "get",
            "configmap",
            "theirs",
            "-n",
            ns,
            "-o",
            "jsonpath={.data.k}"
        ]),
        "v"
    );
    // Its own kind of object goes through.
    let r = k.run(
        &["create", "-n", ns, &operator, "-f", "-"],
        Some(&cm("ours", true)),
    );
    assert!(r.ok, "a labelled ConfigMap: {}{}", r.stdout, r.stderr);
    k.must(&["delete", "configmap", "ours", "theirs", "-n", ns]);

    // Nobody else may make an object a session or pool owns (a claim on a
    // volume they filled, a pod that looks like a pool's): not even an
    // administrator, by accident.
    for (kind, owner) in [("AgentSession", "walk"), ("AgentWarmPool", "pool")] {
        let forged = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: forged\n  ownerReferences:\n    - {{apiVersion: agentplane.dev/v1alpha1, kind: {kind}, name: {owner}, uid: 00000000-0000-4000-8000-000000000001, controller: true}}\ndata:\n  k: v\n"
        );
        let r = k.run(&["create", "-n", ns, "-f", "-"], Some(&forged));
        assert!(
            !r.ok && r.stderr.contains("only the agentplane operator may make"),
            "an object owned by a {kind} was made by someone else: {}{}",
            r.stdout,
            r.stderr
        );
    }
}
