//! Checkpoints and forks on the real node, installed by the chart (the
//! operator in its pod, reaching runners over the gateway's mutual TLS): a
//! session makes files, `cd`s and exports a variable; a checkpoint of it
//! becomes Ready with its data on a claim it owns; three forks start from
//! it, each with the files and the bash state (cwd, variable); the source
//! and every fork then change differently, and each sees only its own
//! changes. A fourth fork names the source session instead of a
//! checkpoint: it takes its own checkpoint of the source (owned by it) and
//! starts from the source's state at that moment. The checkpoint's spec
//! cannot be changed; deleting it takes its claim, and deleting the fork by
//! name takes the checkpoint it made.
//!
//! Then the VolumeSnapshot path, on the harness's CSI driver with
//! snapshots (StorageClass `agentplane-snapshot`): a session on a claim in
//! that class is checkpointed as a VolumeSnapshot (chosen by itself), cut
//! while its runner held the workspace; two forks' claims are made from
//! the snapshot, each with the files and bash's state of that moment (and
//! its own env); each fork's changes are its own; a fork
//! with an emptyDir workspace says it needs a claim.

use std::time::Duration;

use e2e::release::Release;
use e2e::{Kubectl, Namespace, agent, condition, sandbox_image, wait_for};
use serde_json::Value;

const RELEASE: &str = "agentplane";
const RELEASE_NS: &str = "agentplane-ckpt";
const NS: &str = "e2e-ckpt";
const T: Duration = Duration::from_secs(240);
const FORKS: [&str; 3] = ["fork-a", "fork-b", "fork-c"];
const BY_NAME: &str = "fork-by-name";
/// The checkpoint `fork-by-name` takes of its source: `<fork>-from`.
const BY_NAME_CKPT: &str = "fork-by-name-from";

#[test]
fn a_checkpoint_forks_three_independent_sessions_with_their_shell_state() {
    let k = Kubectl::from_env();
    // The claims of the VolumeSnapshot walk name the harness's class with
    // snapshots, which the session policy must allow.
    let allow = format!("sessionPolicy.storageClasses={{{SNAPSHOT_CLASS}}}");
    let release = Release::install(&k, RELEASE, RELEASE_NS, &["--set", &allow]);
    let result = std::panic::catch_unwind(|| walk(&k));
    if result.is_err() {
        release.dump(
            120,
            NS,
            &[
                "agentcheckpoints",
                "agentsessions",
                "volumesnapshots",
                "pods",
                "pvc",
                "events",
            ],
        );
    }
    drop(release);
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// A session's YAML; `from` is (`checkpoint` or `session`, the name).
fn session(name: &str, from: Option<(&str, &str)>) -> String {
    let from = from
        .map(|(kind, c)| format!("  from: {{{kind}: {c}}}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {}\n  tools: [{{type: agent_toolset_20260401}}]\n{from}",
        sandbox_image()
    )
}

fn apply(k: &Kubectl, yaml: &str) {
    let r = k.run(&["apply", "-n", NS, "-f", "-"], Some(yaml));
    assert!(r.ok, "apply: {}\n{yaml}", r.stderr);
}

fn wait_phase(k: &Kubectl, kind: &str, name: &str, want: &str) -> Value {
    wait_for(&format!("{kind} {name} to be {want}"), T, || {
        let o = k.get(&[kind, name, "-n", NS])?;
        (o["status"]["phase"] == want).then_some(o)
    })
}

/// One bash call in `session`; its output, trimmed. Fails on an error.
fn bash(k: &Kubectl, session: &str, command: &str) -> String {
    let (code, out, err) = agent(k, NS, &["bash", session, "--", command]);
    assert_eq!(code, 0, "{session}: {command}: {out}{err}");
    out.trim().to_owned()
}

fn walk(k: &Kubectl) {
    let _ns = Namespace::create(k, NS, &[]);

    // The source does work: files, a directory change, an export.
    apply(k, &session("src", None));
    wait_phase(k, "agentsession", "src", "Ready");
    bash(
        k,
        "src",
        "mkdir -p proj/sub && echo base > proj/a.txt && echo deep > proj/sub/b.txt && cd proj && export CKPT_VAR=from-source",
    );
    assert_eq!(
        bash(k, "src", "echo $(pwd) $CKPT_VAR"),
        "/workspace/proj from-source"
    );

    // A fork asked for before its checkpoint exists waits and says why.
    apply(k, &session(FORKS[0], Some(("checkpoint", "snap"))));
    let early = wait_for("fork-a's Checkpoint condition", T, || {
        let o = k.get(&["agentsession", FORKS[0], "-n", NS])?;
        condition(&o, "Checkpoint")
    });
    assert_eq!(early.0, "False", "{early:?}");
    assert!(
        k.get(&["pod", &format!("{}-sandbox", FORKS[0]), "-n", NS])
            .is_none(),
        "no pod before the checkpoint is Ready"
    );

    // The checkpoint: Ready, counted, on a claim it owns.
    apply(
        k,
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentCheckpoint\nmetadata:\n  name: snap\nspec:\n  source: {session: src}\n",
    );
    let snap = wait_phase(k, "agentcheckpoint", "snap", "Ready");
    assert!(snap["status"]["entries"].as_u64() >= Some(4), "{snap}");
    assert_eq!(
        snap["status"]["method"], "Archive",
        "an emptyDir workspace is archived: {snap}"
    );
    assert!(snap["status"]["takenAt"].is_string(), "{snap}");
    let claim = k
        .get(&["pvc", "snap-ckpt", "-n", NS])
        .expect("the checkpoint's claim");
    assert_eq!(
        claim["metadata"]["ownerReferences"][0]["uid"], snap["metadata"]["uid"],
        "the claim is the checkpoint's"
    );
    // Provisioned for it by the cluster's default StorageClass, as on a
    // real cluster (the harness runs local-path-provisioner).
    assert_eq!(claim["status"]["phase"], "Bound", "{claim}");
    let pv = claim["spec"]["volumeName"]
        .as_str()
        .expect("bound to a volume");
    let pv = k.get(&["pv", pv]).expect("the claim's volume");
    assert_eq!(
        pv["metadata"]["annotations"]["pv.kubernetes.io/provisioned-by"], "rancher.io/local-path",
        "{pv}"
    );
    // The sink ran fenced (the take went through it): its own policy,
    // the checkpoint's, with no egress at all.
    let fence = k
        .get(&["networkpolicy", "snap-ckpt-sink-egress", "-n", NS])
        .expect("the sink's NetworkPolicy");
    assert_eq!(
        fence["metadata"]["ownerReferences"][0]["uid"], snap["metadata"]["uid"],
        "the sink's policy is the checkpoint's"
    );
    assert!(
        fence["spec"]["policyTypes"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t == "Egress")),
        "{fence}"
    );
    assert!(
        fence["spec"]["egress"]
            .as_array()
            .is_none_or(|rules| rules.is_empty()),
        "the sink reaches nothing: {fence}"
    );
    wait_for("the sink pod to go", T, || {
        k.get(&["pod", "snap-ckpt-sink", "-n", NS])
            .is_none()
            .then_some(())
    });
    // Immutable.
    let r = k.run(
        &[
            "patch",
            "agentcheckpoint",
            "snap",
            "-n",
            NS,
            "--type=merge",
            "-p",
            r#"{"spec":{"shellState":false}}"#,
        ],
        None,
    );
    assert!(!r.ok && r.stderr.contains("immutable"), "{}", r.stderr);

    // The source goes on after the checkpoint; the forks must not see it.
    bash(
        k,
        "src",
        "echo after > after.txt && export CKPT_VAR=changed-later && cd sub",
    );

    for fork in &FORKS[1..] {
        apply(k, &session(fork, Some(("checkpoint", "snap"))));
    }
    for (i, fork) in FORKS.iter().enumerate() {
        let o = wait_phase(k, "agentsession", fork, "Ready");
        assert_eq!(
            condition(&o, "Checkpoint").map(|c| c.0),
            Some("True".into()),
            "{o}"
        );
        // The checkpoint's state: cwd, variable, files; not the source's later work.
        assert_eq!(
            bash(
                k,
                fork,
                "echo $(pwd) $CKPT_VAR $(cat a.txt) $(cat sub/b.txt) $(test -e after.txt && echo leaked || echo clean)"
            ),
            "/workspace/proj from-source base deep clean"
        );
        // Each fork changes differently.
        bash(
            k,
            fork,
            &format!("echo {fork} > mine.txt && echo {i} >> a.txt && export FORK_VAR={fork}"),
        );
    }

    // Each sees only its own changes.
    for (i, fork) in FORKS.iter().enumerate() {
        assert_eq!(
            bash(
                k,
                fork,
                "echo $(cat mine.txt) $FORK_VAR $(cat a.txt | tr '\\n' ,) $(ls | tr '\\n' ,)"
            ),
            format!("{fork} {fork} base,{i}, a.txt,mine.txt,sub,")
        );
    }
    assert_eq!(
        bash(
            k,
            "src",
            "echo $(pwd) $CKPT_VAR $(cat ../a.txt) $(ls .. | tr '\\n' ,) ${FORK_VAR:-none}"
        ),
        "/workspace/proj/sub changed-later base a.txt,after.txt,sub, none"
    );

    fork_by_name(k);

    // Deleting the checkpoint deletes its claim (kept only while forks'
    // pods still mount it).
    k.must(&["delete", "agentcheckpoint", "snap", "-n", NS, "--wait=true"]);
    wait_for(
        "the checkpoint's claim to go or be terminating",
        T,
        || match k.get(&["pvc", "snap-ckpt", "-n", NS]) {
            None => Some(()),
            Some(c) => (!c["metadata"]["deletionTimestamp"].is_null()).then_some(()),
        },
    );
    // Deleting the fork by name deletes the checkpoint it took (and, with
    // that, its claim).
    k.must(&["delete", "agentsession", BY_NAME, "-n", NS, "--wait=true"]);
    wait_for("the fork's own checkpoint to go", T, || {
        k.get(&["agentcheckpoint", BY_NAME_CKPT, "-n", NS])
            .is_none()
            .then_some(())
    });

    volume_snapshots(k);
}

/// The harness's StorageClass whose driver takes snapshots
/// (tests/cluster/cluster.sh, docs/cluster.md "Storage").
const SNAPSHOT_CLASS: &str = "agentplane-snapshot";

/// A session on a claim; `class` names its StorageClass (none: left out).
fn claim_session(name: &str, class: Option<&str>, from: Option<&str>) -> String {
    let class = class
        .map(|c| format!("storageClassName: {c}, "))
        .unwrap_or_default();
    let from = from
        .map(|c| format!("  from: {{checkpoint: {c}}}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata:\n  name: {name}\nspec:\n  image: {}\n  tools: [{{type: agent_toolset_20260401}}]\n  env: [{{name: PLAIN_ENV, value: from-spec}}]\n  workspace:\n    volumeClaimTemplate:\n      spec: {{{class}accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 64Mi}}}}}}\n{from}",
        sandbox_image()
    )
}

fn volume_snapshots(k: &Kubectl) {
    apply(k, &claim_session("vsrc", Some(SNAPSHOT_CLASS), None));
    wait_phase(k, "agentsession", "vsrc", "Ready");
    bash(
        k,
        "vsrc",
        "mkdir -p proj && echo base > proj/a.txt && ln -s a.txt proj/link && cd proj && export VS_VAR='held state' && greet() { echo \"hi $1\"; }",
    );
    apply(
        k,
        "apiVersion: agentplane.dev/v1alpha1\nkind: AgentCheckpoint\nmetadata:\n  name: vsnap\nspec:\n  source: {session: vsrc}\n",
    );
    let ckpt = wait_phase(k, "agentcheckpoint", "vsnap", "Ready");
    assert_eq!(ckpt["status"]["method"], "VolumeSnapshot", "{ckpt}");
    assert_eq!(ckpt["status"]["volumeSnapshot"], "vsnap-ckpt", "{ckpt}");
    assert_eq!(ckpt["status"]["storageClassName"], SNAPSHOT_CLASS, "{ckpt}");
    let vs = k
        .get(&["volumesnapshot", "vsnap-ckpt", "-n", NS])
        .expect("the checkpoint's VolumeSnapshot");
    assert_eq!(
        vs["metadata"]["ownerReferences"][0]["uid"], ckpt["metadata"]["uid"],
        "the snapshot is the checkpoint's: {vs}"
    );
    assert_eq!(vs["status"]["readyToUse"], true, "{vs}");
    assert_eq!(
        vs["metadata"]["annotations"]["agentplane.dev/cut-while-held"], "true",
        "cut while the runner held the workspace: {vs}"
    );
    // The source goes on; its forks must not see that.
    bash(k, "vsrc", "echo later > a.txt && export VS_VAR=later");

    let forks = ["vfork-1", "vfork-2"];
    for fork in forks {
        apply(k, &claim_session(fork, None, Some("vsnap")));
    }
    for (i, fork) in forks.iter().enumerate() {
        let o = wait_phase(k, "agentsession", fork, "Ready");
        assert_eq!(
            o["status"]["fromSnapshot"]["volumeSnapshot"], "vsnap-ckpt",
            "{o}"
        );
        let claim = k
            .get(&["pvc", &format!("{fork}-workspace"), "-n", NS])
            .expect("the fork's claim");
        assert_eq!(claim["spec"]["storageClassName"], SNAPSHOT_CLASS, "{claim}");
        assert_eq!(
            claim["spec"]["dataSourceRef"]["kind"], "VolumeSnapshot",
            "{claim}"
        );
        assert_eq!(
            claim["spec"]["dataSourceRef"]["name"], "vsnap-ckpt",
            "{claim}"
        );
        assert_eq!(
            bash(
                k,
                fork,
                "echo $(pwd) \"$VS_VAR\" $(greet fork) $(cat a.txt) $(readlink link) $PLAIN_ENV"
            ),
            "/workspace/proj held state hi fork base a.txt from-spec"
        );
        bash(
            k,
            fork,
            &format!("echo {fork} > mine.txt && echo {i} >> a.txt"),
        );
    }
    for (i, fork) in forks.iter().enumerate() {
        assert_eq!(
            bash(k, fork, "echo $(cat mine.txt) $(cat a.txt | tr '\\n' ,)"),
            format!("{fork} base,{i},")
        );
    }
    assert_eq!(
        bash(k, "vsrc", "echo $(cat a.txt) $(ls | tr '\\n' ,) $VS_VAR"),
        "later a.txt,link, later"
    );

    // A fork whose workspace cannot be made from a snapshot says so.
    apply(k, &session("vfork-empty", Some(("checkpoint", "vsnap"))));
    let why = wait_for("vfork-empty's Checkpoint condition", T, || {
        let o = k.get(&["agentsession", "vfork-empty", "-n", NS])?;
        condition(&o, "Checkpoint").filter(|c| c.1 == "CheckpointNeedsClaim")
    });
    assert!(why.2.contains("volumeClaimTemplate"), "{why:?}");
}

/// A fork that names the source session: it takes its own checkpoint of
/// the source, owned by it, and starts from the source as it was then --
/// after the three forks' checkpoint, before what the source does next.
fn fork_by_name(k: &Kubectl) {
    apply(k, &session(BY_NAME, Some(("session", "src"))));
    let ckpt = wait_phase(k, "agentcheckpoint", BY_NAME_CKPT, "Ready");
    let fork = k
        .get(&["agentsession", BY_NAME, "-n", NS])
        .expect("the fork");
    let owner = &ckpt["metadata"]["ownerReferences"][0];
    assert_eq!(
        (&owner["kind"], &owner["uid"], &owner["controller"]),
        (
            &Value::from("AgentSession"),
            &fork["metadata"]["uid"],
            &Value::from(true)
        ),
        "the checkpoint is the fork's: {ckpt}"
    );
    assert_eq!(ckpt["spec"]["source"]["session"], "src", "{ckpt}");
    assert_eq!(
        ckpt["metadata"]["labels"]["app.kubernetes.io/managed-by"], "agentplane",
        "{ckpt}"
    );
    // The source goes on once its checkpoint is taken; the fork must not
    // see that.
    bash(k, "src", "echo later > later.txt");
    let o = wait_phase(k, "agentsession", BY_NAME, "Ready");
    assert_eq!(
        condition(&o, "Checkpoint").map(|c| c.0),
        Some("True".into()),
        "{o}"
    );
    assert_eq!(
        bash(
            k,
            BY_NAME,
            "echo $(pwd) $CKPT_VAR $(cat ../after.txt) $(cat b.txt) $(test -e later.txt && echo leaked || echo clean)"
        ),
        "/workspace/proj/sub changed-later after deep clean"
    );
}
