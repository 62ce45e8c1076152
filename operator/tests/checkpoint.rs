//! Checkpoints without a cluster: the sizes a checkpoint gets, the step
//! each reconcile takes from what it observed, the statuses of waiting,
//! retrying, failing and being taken, the claim and sink pod it owns, and
//! a fork's condition and pod.

use crds::{AgentCheckpoint, AgentSession, CheckpointPhase};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::ResourceExt;
use operator::checkpoint::plan::{
    self, MAX_ATTEMPTS, Observed, Settings, Step, Taken, after_failure, decide, fork_condition,
    refused_status, sizes,
};
use operator::checkpoint::{build, fork};
use operator::resolution::{CondSpec, Listings, resolve};
use operator::session::plan::{self as session_plan, Observed as SessionObserved, PodAction};
use operator::validation::entries;
use serde_json::json;

mod common;
use common::{cfg, now};

const GIB: u64 = 1 << 30;

fn checkpoint(spec: serde_json::Value) -> AgentCheckpoint {
    let mut c = AgentCheckpoint::new("snap", serde_json::from_value(spec).expect("spec"));
    c.metadata.namespace = Some("team-a".into());
    c.metadata.uid = Some("ckpt-uid".into());
    c.metadata.generation = Some(1);
    c
}

fn plain() -> AgentCheckpoint {
    checkpoint(json!({"source": {"session": "src"}}))
}

fn ready_session() -> AgentSession {
    let mut s: AgentSession = serde_json::from_value(json!({
        "apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
        "metadata": {"name": "src", "namespace": "team-a", "uid": "s-uid"},
        "spec": {"image": "busybox", "tools": []},
        "status": {"phase": "Ready", "podName": "src-sandbox"}
    }))
    .expect("session");
    s.metadata.generation = Some(1);
    s
}

fn pod(name: &str, ip: Option<&str>, ready: bool, phase: &str, owner: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("{name}-uid")),
            owner_references: owner.map(|uid| {
                vec![OwnerReference {
                    uid: uid.into(),
                    controller: Some(true),
                    ..OwnerReference::default()
                }]
            }),
            ..ObjectMeta::default()
        },
        status: Some(PodStatus {
            pod_ip: ip.map(Into::into),
            phase: Some(phase.into()),
            conditions: Some(vec![PodCondition {
                type_: "Ready".into(),
                status: if ready { "True" } else { "False" }.into(),
                ..PodCondition::default()
            }]),
            ..PodStatus::default()
        }),
        ..Pod::default()
    }
}

fn owned_meta(name: &str, owner: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        owner_references: Some(vec![OwnerReference {
            uid: owner.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]),
        ..ObjectMeta::default()
    }
}

fn wait_reason(step: &Step) -> &str {
    match step {
        Step::Wait { reason, .. } => reason,
        other => panic!("not a wait: {other:?}"),
    }
}

#[test]
fn sizes_default_to_the_platforms_and_max_bytes_is_bounded_by_its_largest() {
    let s = Settings::default();
    let d = sizes(&plain(), &s).expect("default");
    assert_eq!(d.volume_bytes, GIB);
    assert!(d.content_bytes < d.archive_bytes && d.archive_bytes < d.volume_bytes);
    // A small maxBytes still gets the default volume, and that bound.
    let small = sizes(
        &checkpoint(json!({"source": {"session": "src"}, "maxBytes": 1000})),
        &s,
    )
    .expect("small");
    assert_eq!((small.volume_bytes, small.content_bytes), (GIB, 1000));
    // A larger one gets a volume with room for tar's headers.
    let big = sizes(
        &checkpoint(json!({"source": {"session": "src"}, "maxBytes": 1_500_000_000u64})),
        &s,
    )
    .expect("big");
    assert!(big.volume_bytes > 1_500_000_000 && big.volume_bytes <= 2 * GIB);
    // Past the largest volume: refused, naming the flag and what fits.
    let e = sizes(
        &checkpoint(json!({"source": {"session": "src"}, "maxBytes": 2 * GIB})),
        &s,
    )
    .expect_err("too large");
    assert!(
        e.contains("--checkpoint-max-size") && e.contains("at most"),
        "{e}"
    );
    let step = decide(
        &checkpoint(json!({"source": {"session": "src"}, "maxBytes": 3 * GIB})),
        &Observed {
            session: None,
            session_pod: None,
            claim: None,
            sink: None,
            tls: true,
        },
        &s,
    );
    assert!(
        matches!(step, Step::Fail { ref reason, .. } if reason == "TooLarge"),
        "{step:?}"
    );
}

#[test]
fn a_checkpoint_waits_for_its_session_then_makes_its_claim_and_sink_then_takes() {
    let s = Settings::default();
    let c = plain();
    let session = ready_session();
    let src_pod = pod(
        "src-sandbox",
        Some("10.0.0.5"),
        true,
        "Running",
        Some("s-uid"),
    );
    let none = Observed {
        session: None,
        session_pod: None,
        claim: None,
        sink: None,
        tls: true,
    };
    assert_eq!(wait_reason(&decide(&c, &none, &s)), "SessionNotFound");
    let mut pending = ready_session();
    pending.status.as_mut().expect("status").phase = Some(crds::SessionPhase::Pending);
    let waiting = Observed {
        session: Some(&pending),
        ..none
    };
    assert_eq!(wait_reason(&decide(&c, &waiting, &s)), "SessionNotReady");
    let not_ready_pod = pod(
        "src-sandbox",
        Some("10.0.0.5"),
        false,
        "Running",
        Some("s-uid"),
    );
    let o = Observed {
        session: Some(&session),
        session_pod: Some(&not_ready_pod),
        ..none
    };
    assert_eq!(wait_reason(&decide(&c, &o, &s)), "SessionNotReady");
    // Without the gateway's mutual TLS no runner can be reached.
    let o = Observed {
        session: Some(&session),
        session_pod: Some(&src_pod),
        tls: false,
        ..none
    };
    assert_eq!(wait_reason(&decide(&c, &o, &s)), "RunnerTlsOff");
    // Ready session: make the claim and the sink.
    let o = Observed {
        session: Some(&session),
        session_pod: Some(&src_pod),
        ..none
    };
    assert_eq!(
        decide(&c, &o, &s),
        Step::Create {
            claim: true,
            sink: true
        }
    );
    let claim = owned_meta("snap-ckpt", "ckpt-uid");
    let starting = pod("snap-ckpt-sink", None, false, "Pending", Some("ckpt-uid"));
    let o = Observed {
        claim: Some(&claim),
        sink: Some(&starting),
        ..o
    };
    assert_eq!(wait_reason(&decide(&c, &o, &s)), "SinkStarting");
    let ready = pod(
        "snap-ckpt-sink",
        Some("10.0.0.9"),
        true,
        "Running",
        Some("ckpt-uid"),
    );
    let o = Observed {
        sink: Some(&ready),
        ..o
    };
    match decide(&c, &o, &s) {
        Step::Take {
            source,
            sink,
            sizes,
        } => {
            assert_eq!(source.to_string(), "10.0.0.5:7443");
            assert_eq!(sink.to_string(), "10.0.0.9:7443");
            assert_eq!(sizes.volume_bytes, GIB);
        }
        other => panic!("not a take: {other:?}"),
    }
    // A sink that ended without the checkpoint being recorded is replaced.
    let ended = pod(
        "snap-ckpt-sink",
        Some("10.0.0.9"),
        false,
        "Failed",
        Some("ckpt-uid"),
    );
    let o = Observed {
        sink: Some(&ended),
        ..o
    };
    assert!(
        matches!(decide(&c, &o, &s), Step::ReplaceSink { ref name, .. } if name == "snap-ckpt-sink")
    );
}

#[test]
fn objects_under_its_names_that_are_not_its_own_fail_the_checkpoint() {
    let s = Settings::default();
    let c = plain();
    let session = ready_session();
    let src_pod = pod(
        "src-sandbox",
        Some("10.0.0.5"),
        true,
        "Running",
        Some("s-uid"),
    );
    let foreign_claim = owned_meta("snap-ckpt", "someone-else");
    let o = Observed {
        session: Some(&session),
        session_pod: Some(&src_pod),
        claim: Some(&foreign_claim),
        sink: None,
        tls: true,
    };
    match decide(&c, &o, &s) {
        Step::Fail { reason, message } => {
            assert_eq!(reason, "NameTaken");
            assert!(message.contains("snap-ckpt"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let foreign_pod = pod("snap-ckpt-sink", Some("10.0.0.9"), true, "Running", None);
    let o = Observed {
        claim: None,
        sink: Some(&foreign_pod),
        ..o
    };
    assert!(matches!(decide(&c, &o, &s), Step::Fail { ref reason, .. } if reason == "NameTaken"));
}

#[test]
fn failures_are_retried_with_back_off_then_the_checkpoint_fails_naming_the_error() {
    let mut c = plain();
    for n in 1..MAX_ATTEMPTS {
        let (status, retry) = after_failure(&c, "connection refused", now());
        assert_eq!(status.attempts, Some(n));
        assert_eq!(status.phase, Some(CheckpointPhase::Pending));
        assert!(retry.is_some());
        assert!(status.conditions[0].message.contains("connection refused"));
        c.status = Some(status);
    }
    let (status, retry) = after_failure(&c, "connection refused", now());
    assert_eq!(retry, None);
    assert_eq!(status.phase, Some(CheckpointPhase::Failed));
    assert_eq!(status.conditions[0].reason, "TakeFailed");
    assert!(status.conditions[0].message.contains("connection refused"));
    c.status = Some(status);
    // Failed (or Ready) is settled: nothing more is done.
    let o = Observed {
        session: None,
        session_pod: None,
        claim: None,
        sink: None,
        tls: true,
    };
    assert_eq!(decide(&c, &o, &Settings::default()), Step::Settled);
}

#[test]
fn a_taken_checkpoint_reports_what_it_holds() {
    let c = plain();
    let taken = Taken {
        entries: 7,
        file_bytes: 1234,
        skipped: 1,
    };
    let st = plan::ready_status(&c, taken, now());
    assert_eq!(st.phase, Some(CheckpointPhase::Ready));
    assert_eq!(
        (st.entries, st.size_bytes, st.skipped),
        (Some(7), Some(1234), Some(1))
    );
    assert!(st.taken_at.is_some());
    assert_eq!(st.conditions[0].status, "True");
    assert!(st.conditions[0].message.contains("snap-ckpt"));
}

#[test]
fn the_claim_and_the_sink_pod_are_the_checkpoints_and_hardened() {
    let c = plain();
    let s = Settings {
        storage_class: Some("fast".into()),
        ..Settings::default()
    };
    let sz = sizes(&c, &s).expect("sizes");
    let claim = build::claim(&c, &sz, &s);
    assert_eq!(claim.name_any(), "snap-ckpt");
    let owner = &claim.metadata.owner_references.as_ref().expect("owner")[0];
    assert_eq!(
        (owner.uid.as_str(), owner.controller),
        ("ckpt-uid", Some(true))
    );
    let spec = claim.spec.expect("spec");
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        spec.resources.and_then(|r| r.requests).expect("requests")["storage"].0,
        GIB.to_string()
    );
    let pod = build::sink_pod(
        &c,
        &sz,
        &s,
        "localhost/agentplane/runner:dev",
        "IfNotPresent",
    );
    assert_eq!(pod.name_any(), "snap-ckpt-sink");
    assert_eq!(
        pod.metadata.owner_references.as_ref().expect("owner")[0].uid,
        "ckpt-uid"
    );
    let spec = pod.spec.expect("spec");
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert!(spec.active_deadline_seconds.is_some());
    let container = &spec.containers[0];
    let command = container.command.clone().expect("command");
    assert_eq!(command[..2], ["/agent-sidecar", "checkpoint-sink"]);
    assert!(command.contains(&sz.archive_bytes.to_string()));
    let sc = container.security_context.clone().expect("hardened");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert!(container.readiness_probe.is_some());
}

#[test]
fn the_sink_is_fenced_no_egress_and_only_the_operator_in() {
    use operator::sandbox::{EgressPolicy, GatewaySource};
    let c = plain();
    let s = Settings::default();
    let sz = sizes(&c, &s).expect("sizes");
    let pod = build::sink_pod(&c, &sz, &s, "runner:dev", "IfNotPresent");
    let operator_pods = GatewaySource {
        namespace: "agentplane-system".into(),
        pod_labels: [(
            "app.kubernetes.io/name".to_owned(),
            "agentplane-operator".to_owned(),
        )]
        .into(),
    };
    let policy = EgressPolicy {
        enabled: true,
        allowed: vec!["0.0.0.0/0".parse().expect("cidr")],
        operator: Some(operator_pods),
        ..EgressPolicy::default()
    };
    let np = build::sink_policy(&c, &policy).expect("a policy");
    assert_eq!(np.name_any(), "snap-ckpt-sink-egress");
    assert_eq!(
        np.metadata.owner_references.as_ref().expect("owner")[0].uid,
        "ckpt-uid"
    );
    let spec = np.spec.expect("spec");
    // It selects the sink pod, and only pods with all of the sink's labels.
    let selector = spec
        .pod_selector
        .and_then(|s| s.match_labels)
        .expect("labels");
    let labels = pod.metadata.labels.clone().expect("pod labels");
    assert!(
        selector.iter().all(|(k, v)| labels.get(k) == Some(v)),
        "{selector:?}"
    );
    assert_eq!(
        selector["app.kubernetes.io/name"],
        "agentplane-checkpoint-sink"
    );
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Ingress".to_owned(), "Egress".to_owned()][..])
    );
    // No egress at all, whatever sandboxes may reach.
    assert_eq!(spec.egress, Some(Vec::new()));
    let ingress = spec.ingress.expect("ingress");
    assert_eq!(ingress.len(), 1);
    let from = ingress[0].from.as_ref().expect("from");
    assert_eq!(from.len(), 1);
    assert_eq!(
        from[0]
            .pod_selector
            .as_ref()
            .and_then(|s| s.match_labels.as_ref())
            .expect("pods")["app.kubernetes.io/name"],
        "agentplane-operator"
    );
    let ports = ingress[0].ports.as_ref().expect("ports");
    assert_eq!(ports.len(), 1);
    assert_eq!(
        ports[0].port,
        Some(
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(
                runner_api::RUNNER_TLS_PORT
            ))
        )
    );

    // An operator outside the cluster has no pods to admit: egress is
    // still fenced, ingress is left to the mutual TLS.
    let outside = EgressPolicy {
        enabled: true,
        ..EgressPolicy::default()
    };
    let spec = build::sink_policy(&c, &outside)
        .and_then(|n| n.spec)
        .expect("spec");
    assert_eq!(
        spec.policy_types.as_deref(),
        Some(&["Egress".to_owned()][..])
    );
    assert_eq!(spec.egress, Some(Vec::new()));
    assert!(spec.ingress.is_none());
    // Policies off: none.
    assert!(build::sink_policy(&c, &EgressPolicy::default()).is_none());
}

#[test]
fn a_fork_waits_for_its_checkpoint_then_mounts_it_read_only_and_restores() {
    // The condition from the checkpoint's state.
    let own = owned_meta("snap-ckpt", "ckpt-uid");
    assert_eq!(fork_condition("snap", None, None).1, "CheckpointNotFound");
    let mut c = plain();
    assert!(!fork_condition("snap", Some(&c), Some(&own)).0);
    c.status = Some(after_failure(&c, "x", now()).0);
    assert_eq!(
        fork_condition("snap", Some(&c), Some(&own)).1,
        "CheckpointNotReady"
    );
    c.status = Some(plan::failed_status(&c, "TooLarge", "too large", now()));
    let (ok, reason, message) = fork_condition("snap", Some(&c), Some(&own));
    assert!(!ok);
    assert_eq!(reason, "CheckpointFailed");
    assert!(message.contains("too large"), "{message}");
    c.status = Some(plan::ready_status(&c, Taken::default(), now()));
    assert!(fork_condition("snap", Some(&c), Some(&own)).0);
    // Ready, but its claim gone or replaced by someone else's: no fork.
    let planted = owned_meta("snap-ckpt", "someone-else");
    for claim in [None, Some(&planted)] {
        let (ok, reason, _) = fork_condition("snap", Some(&c), claim);
        assert!(!ok);
        assert_eq!(reason, "CheckpointDataMissing");
    }

    // The session: no pod while the checkpoint is not Ready.
    let s: AgentSession = serde_json::from_value(json!({
        "apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
        "metadata": {"name": "f1", "namespace": "team-a", "uid": "f1-uid"},
        "spec": {"image": "busybox", "tools": [{"type": "agent_toolset_20260401"}],
                 "from": {"checkpoint": "snap"}}
    }))
    .expect("session");
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let cond = |status: bool| CondSpec {
        type_: "Checkpoint",
        status,
        reason: "R".into(),
        message: "m".into(),
    };
    let waiting = SessionObserved {
        fork: Some(cond(false)),
        ..SessionObserved::default()
    };
    let p = session_plan::plan(&s, &waiting, &res, &cfg(), now());
    assert_eq!(p.pod, PodAction::Keep, "no pod yet");
    // The checkpoint's changes wake it; no timer of its own.
    assert_eq!(p.requeue, session_plan::RESYNC);
    let refused = SessionObserved {
        fork: Some(CondSpec {
            reason: "CheckpointRefused".into(),
            ..cond(false)
        }),
        ..SessionObserved::default()
    };
    let again = session_plan::plan(&s, &refused, &res, &cfg(), now());
    assert_eq!(
        again.requeue,
        session_plan::POD_NOT_READY,
        "nothing to watch after a refused create: tried again"
    );
    let st = &p.status;
    assert_ne!(st.phase, Some(crds::SessionPhase::Ready));
    assert!(
        st.conditions
            .iter()
            .any(|c| c.type_ == "Checkpoint" && c.status == "False"),
        "{:?}",
        st.conditions
    );
    // Ready: a pod that mounts the claim read-only and restores from it.
    let ready = SessionObserved {
        fork: Some(cond(true)),
        ..SessionObserved::default()
    };
    let p = session_plan::plan(&s, &ready, &res, &cfg(), now());
    let PodAction::Create(pod) = p.pod else {
        panic!("a pod: {:?}", p.pod);
    };
    let spec = pod.spec.expect("spec");
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "checkpoint")
        .expect("the checkpoint volume");
    let pvc = volume.persistent_volume_claim.as_ref().expect("a claim");
    assert_eq!(
        (pvc.claim_name.as_str(), pvc.read_only),
        ("snap-ckpt", Some(true))
    );
    let sandbox = &spec.containers[0];
    let mount = sandbox
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "checkpoint")
        .expect("mounted");
    assert_eq!(mount.read_only, Some(true));
    let args = sandbox.args.clone().expect("args");
    let at = args
        .iter()
        .position(|a| a == "--restore-from")
        .expect("--restore-from");
    assert_eq!(args[at + 1], mount.mount_path);
}

#[test]
fn the_webhook_names_a_bad_checkpoint_name_and_warns_that_a_warm_fork_starts_cold() {
    let spec = |from: &str, pool: Option<&str>| -> crds::AgentSessionSpec {
        let mut v = json!({"image": "busybox", "tools": [], "from": {"checkpoint": from}});
        if let Some(p) = pool {
            v["warmPool"] = json!(p);
        }
        serde_json::from_value(v).expect("spec")
    };
    let bad = operator::validation::check_spec(&spec("Not_A_Name", None));
    assert!(
        bad.errors
            .iter()
            .any(|f| f.path == "spec.from.checkpoint" && f.message.contains("Not_A_Name")),
        "{:?}",
        bad.errors
    );
    let warm = operator::validation::check_spec(&spec("snap", Some("py")));
    assert!(warm.errors.is_empty(), "{:?}", warm.errors);
    assert!(
        warm.warnings.iter().any(|w| w.contains("starts cold")),
        "{:?}",
        warm.warnings
    );
}

fn fork_by_name(name: &str, from: serde_json::Value) -> AgentSession {
    serde_json::from_value(json!({
        "apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
        "metadata": {"name": name, "namespace": "team-a", "uid": format!("{name}-uid")},
        "spec": {"image": "busybox", "tools": [{"type": "agent_toolset_20260401"}],
                 "from": from}
    }))
    .expect("session")
}

#[test]
fn a_fork_from_a_session_name_takes_a_checkpoint_named_after_it_and_owned_by_it() {
    // The name: `<fork>-from`; a long fork name is cut and given a digest
    // of the whole name, so two long names sharing a head differ.
    assert_eq!(fork::taken_name("f2"), "f2-from");
    let long_a = format!("{}a", "x".repeat(240));
    let long_b = format!("{}b", "x".repeat(240));
    let (a, b) = (fork::taken_name(&long_a), fork::taken_name(&long_b));
    assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
    assert!(a.ends_with("-from") && a.starts_with("xxx"), "{a}");
    assert_ne!(a, b);
    assert_eq!(a, fork::taken_name(&long_a), "deterministic");

    // The checkpoint a fork starts from: the named one, or its own.
    let named = fork_by_name("f1", json!({"checkpoint": "snap"}));
    assert_eq!(fork::checkpoint_of(&named).as_deref(), Some("snap"));
    let s = fork_by_name("f2", json!({"session": "src"}));
    assert_eq!(fork::checkpoint_of(&s).as_deref(), Some("f2-from"));
    let mut plain = s.clone();
    plain.spec.from = None;
    assert_eq!(fork::checkpoint_of(&plain), None);

    // Its own: in its namespace, the platform's, controlled by the fork,
    // the whole workdir of the source with bash's state.
    let c = fork::taken_checkpoint(&s, "src").expect("a checkpoint");
    assert_eq!(c.metadata.name.as_deref(), Some("f2-from"));
    assert_eq!(c.metadata.namespace.as_deref(), Some("team-a"));
    let labels = c.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("agentplane")
    );
    assert_eq!(
        labels.get("agentplane.dev/session").map(String::as_str),
        Some("f2")
    );
    let owners = c.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (
            owners[0].kind.as_str(),
            owners[0].name.as_str(),
            owners[0].uid.as_str(),
            owners[0].controller
        ),
        ("AgentSession", "f2", "f2-uid", Some(true))
    );
    assert_eq!(c.spec.source.session, "src");
    assert_eq!(c.spec.source.path, "");
    assert!(c.spec.shell_state);
    assert_eq!(c.spec.max_bytes, None);
    // A fork without a UID could not own it: none is made.
    let mut unsaved = s.clone();
    unsaved.metadata.uid = None;
    assert!(fork::taken_checkpoint(&unsaved, "src").is_none());
}

fn held(source: fork::Source) -> CondSpec {
    match source {
        fork::Source::Hold(c) => c,
        other => panic!("not held: {other:?}"),
    }
}

#[test]
fn a_fork_from_a_session_name_makes_its_checkpoint_once_and_adopts_nothing() {
    let s = fork_by_name("f2", json!({"session": "src"}));
    // Nothing under its name: made.
    let fork::Source::Create(made) = fork::decide(&s, None) else {
        panic!("made");
    };
    assert_eq!(made.metadata.name.as_deref(), Some("f2-from"));
    // Its own: started from, as a fork of a named checkpoint is.
    let mut own = *made.clone();
    own.metadata.uid = Some("own-uid".into());
    match fork::decide(&s, Some(own)) {
        fork::Source::Use(Some(c)) => assert_eq!(c.metadata.uid.as_deref(), Some("own-uid")),
        other => panic!("used: {other:?}"),
    }
    // Someone else's under that name (even one of the same source): not
    // adopted; the condition names it.
    let mut foreign = *made.clone();
    foreign.metadata.owner_references = None;
    let c = held(fork::decide(&s, Some(foreign)));
    assert_eq!(
        (c.type_, c.status, c.reason.as_str()),
        ("Checkpoint", false, "NameTaken")
    );
    assert!(
        c.message.contains("AgentCheckpoint f2-from"),
        "{}",
        c.message
    );
    assert!(c.message.contains("src"), "{}", c.message);
    let other_fork = fork::taken_checkpoint(&fork_by_name("f3", json!({"session": "src"})), "src")
        .expect("f3's");
    let mut renamed = other_fork;
    renamed.metadata.name = Some("f2-from".into());
    assert_eq!(held(fork::decide(&s, Some(renamed))).reason, "NameTaken");
    // Made before and gone since: not taken again (it would be a later
    // state than the fork started from).
    let mut after = s.clone();
    after.status = Some(crds::AgentSessionStatus {
        conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
            type_: "Checkpoint".into(),
            status: "False".into(),
            reason: "CheckpointNotReady".into(),
            message: "waiting".into(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now()),
        }],
        ..crds::AgentSessionStatus::default()
    });
    let c = held(fork::decide(&after, None));
    assert_eq!(c.reason, "CheckpointNotFound");
    assert!(
        c.message.contains("f2-from") && c.message.contains("src"),
        "{}",
        c.message
    );
    // A name that was taken is still made once it is free.
    let mut was_taken = after.clone();
    if let Some(st) = was_taken.status.as_mut() {
        st.conditions[0].reason = "NameTaken".into();
    }
    assert!(matches!(
        fork::decide(&was_taken, None),
        fork::Source::Create(_)
    ));
    // A session that names itself would wait for itself forever.
    let me = fork_by_name("me", json!({"session": "me"}));
    assert_eq!(held(fork::decide(&me, None)).reason, "ForkOfItself");
    // A fork of a named checkpoint makes nothing.
    let named = fork_by_name("f1", json!({"checkpoint": "snap"}));
    assert!(matches!(
        fork::decide(&named, None),
        fork::Source::Use(None)
    ));
}

#[test]
fn a_fork_from_a_session_name_mounts_its_own_checkpoint() {
    let s = fork_by_name("f2", json!({"session": "src"}));
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let ready = SessionObserved {
        fork: Some(CondSpec {
            type_: "Checkpoint",
            status: true,
            reason: "CheckpointReady".into(),
            message: "started from AgentCheckpoint f2-from".into(),
        }),
        ..SessionObserved::default()
    };
    let p = session_plan::plan(&s, &ready, &res, &cfg(), now());
    let PodAction::Create(pod) = p.pod else {
        panic!("a pod: {:?}", p.pod);
    };
    let spec = pod.spec.expect("spec");
    let claim = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "checkpoint")
        .and_then(|v| v.persistent_volume_claim.clone())
        .expect("the checkpoint's claim");
    assert_eq!(claim.claim_name, plan::claim_name("f2-from"));
    assert_eq!(claim.read_only, Some(true));
    let args = spec.containers[0].args.clone().unwrap_or_default();
    assert!(args.iter().any(|a| a == "--restore-from"), "{args:?}");
}

#[test]
fn the_webhook_wants_exactly_one_source_named_as_an_object() {
    let check = |from: serde_json::Value| {
        let spec: crds::AgentSessionSpec =
            serde_json::from_value(json!({"image": "busybox", "tools": [], "from": from}))
                .expect("spec");
        operator::validation::check_spec(&spec).errors
    };
    assert!(check(json!({"session": "src"})).is_empty());
    for both_or_neither in [json!({"session": "src", "checkpoint": "snap"}), json!({})] {
        let errors = check(both_or_neither);
        assert!(
            errors
                .iter()
                .any(|f| f.path == "spec.from" && f.message.contains("exactly one")),
            "{errors:?}"
        );
    }
    let errors = check(json!({"session": "Not_A_Name"}));
    assert!(
        errors
            .iter()
            .any(|f| f.path == "spec.from.session" && f.message.contains("Not_A_Name")),
        "{errors:?}"
    );
}

#[test]
fn a_checkpoint_wakes_exactly_the_forks_that_start_from_it() {
    let by_checkpoint = fork_by_name("f1", json!({"checkpoint": "snap"}));
    let by_session = fork_by_name("f2", json!({"session": "src"}));
    let plain = ready_session();
    assert!(fork::waits_on(&by_checkpoint, "team-a", "snap"));
    assert!(
        !fork::waits_on(&by_checkpoint, "team-b", "snap"),
        "another namespace's snap"
    );
    assert!(!fork::waits_on(&by_checkpoint, "team-a", "other"));
    // A fork by session name waits on the checkpoint it takes.
    assert!(fork::waits_on(
        &by_session,
        "team-a",
        &fork::taken_name("f2")
    ));
    assert!(!fork::waits_on(&by_session, "team-a", "src"));
    assert!(!fork::waits_on(&plain, "team-a", "snap"));
}

#[test]
fn a_refused_transfer_fails_at_once_naming_the_refusal() {
    let c = plain();
    let st = refused_status(
        &c,
        "the session's runner refused the export: proj: not found",
        now(),
    );
    assert_eq!(st.phase, Some(CheckpointPhase::Failed));
    assert_eq!(st.attempts, Some(1));
    let cond = &st.conditions[0];
    assert_eq!(cond.reason, plan::TRANSFER_REFUSED);
    assert!(
        cond.message.contains("not retried") && cond.message.contains("proj: not found"),
        "{}",
        cond.message
    );
}
