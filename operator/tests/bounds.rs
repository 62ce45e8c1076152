//! The node bounds a sandbox pod carries (disk, user namespaces), the
//! session policy's cap on them, and the offline check's verdict against
//! the webhook's. Pure: no cluster.

use std::collections::BTreeMap;

use crds::{AgentSession, AgentSessionSpec};
use k8s_openapi::api::core::v1::{Pod, PodStatus, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::core::ObjectMeta;
use operator::admission::check::check_manifest;
use operator::admission::review::decide;
use operator::policy::SessionPolicy;
use operator::quantity;
use operator::resolution::{Listings, resolve};
use operator::sandbox::{DiskBounds, PodConfig};
use operator::session::plan::{self, Observed, PodAction};
use operator::session::pod::build_pod;
use operator::validation::entries;
use serde_json::json;

mod common;
use common::{cfg, now};

fn session(extra: serde_json::Value) -> AgentSession {
    let mut spec = json!({
        "image": "localhost/agentplane/sandbox-base:dev",
        "workdir": "/workspace",
        "tools": [{"type": "agent_toolset_20260401"}],
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    let spec: AgentSessionSpec = serde_json::from_value(spec).expect("spec");
    let mut s = AgentSession::new("demo", spec);
    s.metadata = ObjectMeta {
        name: Some("demo".into()),
        namespace: Some("team-a".into()),
        uid: Some("1f0c2f59-0000-4000-8000-000000000001".into()),
        generation: Some(1),
        ..ObjectMeta::default()
    };
    s
}

fn q(s: &str) -> Quantity {
    Quantity(s.into())
}

/// The chart's defaults, as `values.yaml` sets them.
fn bounded() -> PodConfig {
    PodConfig {
        default_resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), q("100m")),
                ("memory".to_owned(), q("128Mi")),
            ])),
            limits: Some(BTreeMap::from([
                ("cpu".to_owned(), q("1")),
                ("memory".to_owned(), q("1Gi")),
            ])),
            ..ResourceRequirements::default()
        }),
        default_workspace_limit: Some(q("4Gi")),
        disk: DiskBounds {
            tmp: Some(q("1Gi")),
            runner: Some(q("256Mi")),
            layer: Some(q("2Gi")),
            request: Some(q("512Mi")),
        },
        ..cfg()
    }
}

fn sandbox_resources(pod: &Pod) -> ResourceRequirements {
    pod.spec.as_ref().expect("spec").containers[0]
        .resources
        .clone()
        .expect("resources")
}

fn get<'a>(m: &'a Option<BTreeMap<String, Quantity>>, k: &str) -> Option<&'a str> {
    m.as_ref()?.get(k).map(|q| q.0.as_str())
}

#[test]
fn every_emptydir_is_sized_and_the_disk_limit_covers_them() {
    let pod = build_pod(&session(json!({})), &bounded());
    let spec = pod.spec.as_ref().expect("spec");
    for v in spec.volumes.iter().flatten() {
        if let Some(e) = &v.empty_dir {
            assert!(
                e.size_limit.is_some(),
                "emptyDir {} has no sizeLimit",
                v.name
            );
        }
    }
    let r = sandbox_resources(&pod);
    // workspace 4Gi + tmp 1Gi + runner 256Mi + layer 2Gi + runner binary 128Mi
    let want = (4u128 << 30) + (1 << 30) + (256 << 20) + (2 << 30) + (128 << 20);
    assert_eq!(
        get(&r.limits, "ephemeral-storage").and_then(quantity::bytes),
        Some(want)
    );
    assert_eq!(get(&r.requests, "ephemeral-storage"), Some("512Mi"));
    assert_eq!(get(&r.limits, "memory"), Some("1Gi"));
}

#[test]
fn a_session_own_resources_keep_their_values_and_gain_the_missing_bounds() {
    let s = session(json!({"resources": {
        "requests": {"memory": "2Gi"},
        "limits": {"cpu": "50m"},
    }}));
    let r = sandbox_resources(&build_pod(&s, &bounded()));
    assert_eq!(get(&r.requests, "memory"), Some("2Gi"));
    // The default memory limit (1Gi) is below the session's request: the
    // limit is raised to it rather than making a pod the API server refuses.
    assert_eq!(get(&r.limits, "memory"), Some("2Gi"));
    assert_eq!(get(&r.limits, "cpu"), Some("50m"));
    // The default cpu request (100m) is above the session's limit: lowered.
    assert_eq!(get(&r.requests, "cpu"), Some("50m"));
    assert!(get(&r.limits, "ephemeral-storage").is_some());
}

#[test]
fn a_session_disk_limit_is_its_own() {
    let s = session(json!({"resources": {"limits": {"ephemeral-storage": "3Gi"}}}));
    let r = sandbox_resources(&build_pod(&s, &bounded()));
    assert_eq!(get(&r.limits, "ephemeral-storage"), Some("3Gi"));
    assert_eq!(get(&r.requests, "ephemeral-storage"), Some("512Mi"));
}

#[test]
fn an_unbounded_workspace_leaves_the_sum_unset() {
    let no_workspace_limit = PodConfig {
        default_workspace_limit: None,
        ..bounded()
    };
    let r = sandbox_resources(&build_pod(&session(json!({})), &no_workspace_limit));
    assert_eq!(get(&r.limits, "ephemeral-storage"), None);
    assert_eq!(get(&r.requests, "ephemeral-storage"), Some("512Mi"));
}

#[test]
fn user_namespaces_are_offered() {
    let userns = PodConfig {
        host_users: Some(false),
        ..bounded()
    };
    let pod = build_pod(&session(json!({})), &userns);
    assert_eq!(pod.spec.as_ref().and_then(|s| s.host_users), Some(false));
    let pod = build_pod(&session(json!({})), &bounded());
    assert_eq!(pod.spec.as_ref().and_then(|s| s.host_users), None);
}

/// An operator upgraded to disk bounds replaces no running pod built
/// before them (the pod records what it was built with), while a pod made
/// now carries them.
#[test]
fn gaining_disk_bounds_replaces_no_running_pod() {
    let s = session(json!({"resources": {"limits": {"memory": "512Mi"}}}));
    let mut old = build_pod(&s, &cfg());
    old.metadata.uid = Some("pod-uid-1".into());
    old.status = Some(PodStatus {
        phase: Some("Running".into()),
        ..PodStatus::default()
    });
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let observed = Observed {
        pod: Some(old),
        ..Observed::default()
    };
    let p = plan::plan(&s, &observed, &res, &bounded(), now());
    assert_eq!(p.pod, PodAction::Keep, "the upgrade alone replaced the pod");
    let fresh = plan::plan(&s, &Observed::default(), &res, &bounded(), now());
    let PodAction::Create(pod) = fresh.pod else {
        panic!("expected a create");
    };
    assert!(get(&sandbox_resources(&pod).limits, "ephemeral-storage").is_some());
}

fn capped() -> SessionPolicy {
    SessionPolicy {
        max_ephemeral_storage: Some("10Gi".into()),
        ..SessionPolicy::default()
    }
}

#[test]
fn the_policy_caps_a_session_local_disk_naming_the_field() {
    let s = session(json!({
        "resources": {"requests": {"ephemeral-storage": "1Gi"}, "limits": {"ephemeral-storage": "11Gi"}},
        "workspace": {"emptyDir": {"sizeLimit": "20Gi"}},
    }));
    let found = operator::policy::check(&s.spec, &capped());
    let paths: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "spec.resources.limits.ephemeral-storage",
            "spec.workspace.emptyDir.sizeLimit"
        ]
    );
    assert!(
        found[0]
            .message
            .contains("sessionPolicy.maxEphemeralStorage"),
        "{}",
        found[0].message
    );
    let within = session(json!({"resources": {"limits": {"ephemeral-storage": "10Gi"}}}));
    assert!(operator::policy::check(&within.spec, &capped()).is_empty());
    let garbage = session(json!({"resources": {"limits": {"ephemeral-storage": "lots"}}}));
    let found = operator::policy::check(&garbage.spec, &capped());
    assert!(
        found[0].message.contains("not a byte quantity"),
        "{found:?}"
    );
}

#[test]
fn the_charts_own_values_file_reads_as_a_policy() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../charts/agentplane/values.yaml"
    ))
    .expect("values.yaml");
    let p = SessionPolicy::from_chart_values(&text).expect("the chart's values");
    assert!(p.secret_refs.is_empty());
    assert!(
        p.max_ephemeral_storage.is_some(),
        "the chart caps local disk"
    );
}

#[test]
fn a_values_file_with_a_misspelt_policy_key_is_an_error_naming_it() {
    let e = SessionPolicy::from_chart_values("sessionPolicy:\n  secretRef: [a]\n")
        .expect_err("unknown key");
    assert!(e.starts_with("sessionPolicy"), "{e}");
    assert!(e.contains("secretRef"), "{e}");
    let e = SessionPolicy::from_chart_values("sessionPolicy:\n  maxEphemeralStorage: big\n")
        .expect_err("bad quantity");
    assert!(e.contains("maxEphemeralStorage"), "{e}");
    let p = SessionPolicy::from_chart_values("sessionPolicy:\n  secretRefs: [api-key]\n")
        .expect("policy");
    assert!(p.secret_refs.contains("api-key"));
    assert_eq!(
        SessionPolicy::from_chart_values("replicaCount: 2\n").expect("no section"),
        SessionPolicy::default()
    );
}

/// The offline check and the webhook agree on every manifest, under the
/// default policy and a permissive one.
#[test]
fn the_offline_verdict_is_the_webhooks() {
    let specs = [
        json!({"image": "i", "tools": [{"type": "agent_toolset_20260401"}]}),
        json!({"image": "i", "tools": [], "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "api-key", "key": "k"}}}]}),
        json!({"image": "i", "tools": [], "runtimeClassName": "gvisor"}),
        json!({"image": "i", "tools": [{"type": "agent_toolset_20260401", "configs": [{"name": "nope"}]}]}),
        json!({"image": "i", "tools": [], "resources": {"limits": {"ephemeral-storage": "50Gi"}}}),
        json!({"image": "i", "tools": [], "tolerations": [{"operator": "Exists"}]}),
    ];
    let permissive = SessionPolicy {
        secret_refs: ["api-key".to_owned()].into(),
        runtime_classes: ["gvisor".to_owned()].into(),
        tolerations: true,
        ..SessionPolicy::default()
    };
    for policy in [SessionPolicy::default(), permissive, capped()] {
        for spec in &specs {
            let manifest = json!({"apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
                                  "metadata": {"name": "s"}, "spec": spec});
            let verdicts = check_manifest(&manifest.to_string(), &policy).expect("check");
            let offline_valid = verdicts[0].errors.is_empty();
            let review = json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": "u", "kind": {"group": "agentplane.dev", "version": "v1alpha1", "kind": "AgentSession"},
                    "resource": {"group": "agentplane.dev", "version": "v1alpha1", "resource": "agentsessions"},
                    "operation": "CREATE", "userInfo": {}, "name": "s", "namespace": "default",
                    "object": manifest,
                }
            });
            let review: kube::core::admission::AdmissionReview<kube::core::DynamicObject> =
                serde_json::from_value(review).expect("review");
            let req = review.try_into().expect("request");
            let webhook = decide(&req, &policy);
            assert_eq!(
                offline_valid, webhook.allowed,
                "policy {policy:?}, spec {spec}: offline {:?} vs webhook {:?}",
                verdicts[0].errors, webhook.message
            );
            if let Some(message) = &webhook.message {
                for e in &verdicts[0].errors {
                    assert!(
                        message.contains(e.as_str()),
                        "{e} not in the webhook's {message}"
                    );
                }
            }
        }
    }
}

#[test]
fn the_offline_check_denies_a_secret_reference_by_default() {
    let manifest = "apiVersion: agentplane.dev/v1alpha1\nkind: AgentSession\nmetadata: {name: s}\nspec:\n  image: i\n  tools: []\n  env:\n    - name: K\n      valueFrom: {secretKeyRef: {name: api-key, key: k}}\n";
    let v = check_manifest(manifest, &SessionPolicy::default()).expect("check");
    assert_eq!(v[0].errors.len(), 1, "{:?}", v[0].errors);
    assert!(
        v[0].errors[0].starts_with("spec.env[0].valueFrom.secretKeyRef.name"),
        "{:?}",
        v[0].errors
    );
    assert_eq!(v[0].report["valid"], false);
}

fn with_status(mut pod: Pod, status: serde_json::Value) -> Pod {
    pod.metadata.uid = Some("pod-uid-1".into());
    pod.status = Some(serde_json::from_value(status).expect("pod status"));
    pod
}

fn plan_with(s: &AgentSession, pod: Option<Pod>) -> plan::Plan {
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let observed = Observed {
        pod,
        ..Observed::default()
    };
    plan::plan(s, &observed, &res, &bounded(), now())
}

fn limit_condition(p: &plan::Plan) -> Option<(String, String)> {
    p.status
        .conditions
        .iter()
        .find(|c| c.type_ == "LimitReached")
        .map(|c| (c.reason.clone(), c.message.clone()))
}

/// `s`'s pod, running again after the kernel killed its sandbox for memory.
fn oom_killed(s: &AgentSession) -> Pod {
    with_status(
        build_pod(s, &bounded()),
        json!({"phase": "Running", "containerStatuses": [{
            "name": "sandbox", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
            "state": {"running": {"startedAt": "2026-12-04T10:00:05Z"}},
            "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-12-04T10:00:00Z"}},
        }]}),
    )
}

/// The pod cache keeps only the part of a pod's spec plans read
/// (`cache::slim`): the OOM message's memory limit is among it.
#[test]
fn an_oom_killed_sandbox_plans_the_same_from_the_cached_pod() {
    let s = session(json!({}));
    let pod = oom_killed(&s);
    let mut cached = pod.clone();
    operator::session::cache::slim(&mut cached);
    let (whole, slim) = (plan_with(&s, Some(pod)), plan_with(&s, Some(cached)));
    assert_eq!(format!("{whole:?}"), format!("{slim:?}"));
    assert!(limit_condition(&slim).is_some_and(|(_, m)| m.contains("limit 1Gi")));
}

#[test]
fn an_oom_killed_sandbox_shows_in_the_status_with_its_limit() {
    let s = session(json!({}));
    let pod = oom_killed(&s);
    let p = plan_with(&s, Some(pod));
    let (reason, message) = limit_condition(&p).expect("LimitReached");
    assert_eq!(reason, "OOMKilled");
    assert!(
        message.contains("limit 1Gi") && message.contains("restarted"),
        "{message}"
    );
    assert!(
        p.events
            .iter()
            .any(|n| n.warning && n.reason == "OOMKilled"),
        "{:?}",
        p.events
    );
}

#[test]
fn a_runner_that_ended_the_sandbox_at_its_process_limit_is_reported_in_its_words() {
    let s = session(json!({}));
    let pod = with_status(
        build_pod(&s, &bounded()),
        json!({"phase": "Running", "containerStatuses": [{
            "name": "sandbox", "image": "i", "imageID": "", "ready": false, "restartCount": 1,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": runner_api::ended::PROCESS_LIMIT,
                "message": "the sandbox reached its limit of 512 processes; every process in it was ended",
                "finishedAt": "2026-12-04T10:00:00Z"}},
        }]}),
    );
    let (reason, message) = limit_condition(&plan_with(&s, Some(pod))).expect("LimitReached");
    assert_eq!(reason, "ProcessLimit");
    assert!(message.contains("limit of 512 processes"), "{message}");
    // Any other exit is no limit.
    let plain = with_status(
        build_pod(&s, &bounded()),
        json!({"phase": "Running", "containerStatuses": [{
            "name": "sandbox", "image": "i", "imageID": "", "ready": true, "restartCount": 1,
            "state": {"running": {}},
            "lastState": {"terminated": {"exitCode": 1}},
        }]}),
    );
    assert_eq!(limit_condition(&plan_with(&s, Some(plain))), None);
}

#[test]
fn an_evicted_sandbox_is_replaced_and_its_status_keeps_why() {
    let s = session(json!({}));
    let evicted = with_status(
        build_pod(&s, &bounded()),
        json!({"phase": "Failed", "reason": "Evicted",
               "message": "Usage of EmptyDir volume \"tmp\" exceeds the limit \"1Gi\". "}),
    );
    let p = plan_with(&s, Some(evicted));
    assert!(matches!(p.pod, PodAction::Delete { .. }), "{:?}", p.pod);
    let (reason, message) = limit_condition(&p).expect("LimitReached");
    assert_eq!(reason, "Evicted");
    assert!(
        message.contains("\"tmp\" exceeds the limit \"1Gi\""),
        "{message}"
    );
    // The next reconcile finds no pod, creates one, and keeps the reason.
    let mut after = s.clone();
    after.status = Some(p.status.clone());
    let next = plan_with(&after, None);
    assert!(matches!(next.pod, PodAction::Create(_)), "{:?}", next.pod);
    assert_eq!(
        limit_condition(&next).map(|c| c.0).as_deref(),
        Some("Evicted")
    );
    assert!(
        !next.events.iter().any(|n| n.reason == "Evicted"),
        "the same eviction is not announced twice: {:?}",
        next.events
    );
}

#[test]
fn an_evicted_pod_is_deleted_only_after_the_status_that_says_why() {
    let s = session(json!({}));
    let evicted = with_status(
        build_pod(&s, &bounded()),
        json!({"phase": "Failed", "reason": "Evicted", "message": "ephemeral storage"}),
    );
    let observed = Observed {
        pod: Some(evicted),
        ..Observed::default()
    };
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let p = plan::plan(&s, &observed, &res, &bounded(), now());
    assert!(matches!(p.pod, PodAction::Delete { .. }), "{:?}", p.pod);
    assert!(p.deletion_waits_for_status(&observed));

    // A pod replaced because the session changed carries no evidence: it
    // goes at once.
    let mut changed = s.clone();
    changed.spec.workdir = "/elsewhere".into();
    let outdated = Observed {
        pod: Some(with_status(
            build_pod(&s, &bounded()),
            json!({"phase": "Running"}),
        )),
        ..Observed::default()
    };
    let res = resolve(&changed.spec, &entries(&changed.spec), &Listings::new());
    let p = plan::plan(&changed, &outdated, &res, &bounded(), now());
    assert!(matches!(p.pod, PodAction::Delete { .. }), "{:?}", p.pod);
    assert!(!p.deletion_waits_for_status(&outdated));
}
