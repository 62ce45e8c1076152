//! The reconcile plan, table by table: what one reconcile decides for each
//! combination of session, observed pod and resolution, without a cluster.

use std::time::Duration;

use crds::{AgentSession, AgentSessionSpec, AgentSessionStatus, SessionPhase};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::core::ObjectMeta;
use operator::context::{self, Backoff, Note};
use operator::names::SPEC_HASH_ANNOTATION;
use operator::resolution::{Listings, resolve};
use operator::sandbox::PodConfig;
use operator::session::plan::{self, Observed, Plan, PodAction};
use operator::session::pod::{build_pod, workspace_claim as build_claim};
use operator::validation::entries;
use serde_json::json;

mod common;
use common::{cfg, now};

fn session(tools: serde_json::Value, extra: serde_json::Value) -> AgentSession {
    let mut spec = json!({
        "image": "localhost/agentplane/sandbox-base:dev",
        "workdir": "/workspace",
        "tools": tools,
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
        generation: Some(2),
        ..ObjectMeta::default()
    };
    s
}

fn valid() -> AgentSession {
    session(json!([{"type": "agent_toolset_20260401"}]), json!({}))
}

fn invalid() -> AgentSession {
    session(
        json!([{"type": "agent_toolset_20260401", "configs": [{"name": "nope"}]}]),
        json!({}),
    )
}

fn with_mcp() -> AgentSession {
    session(
        json!([{"type": "agent_toolset_20260401"},
               {"type": "mcp_toolset", "mcp_server_name": "gh"}]),
        json!({"mcpServers": [{"type": "url", "name": "gh", "url": "https://mcp.example.invalid/mcp"}]}),
    )
}

/// The pod the operator would build for `s`, running and (un)ready.
fn running(s: &AgentSession, ready: bool) -> Pod {
    let mut pod = build_pod(s, &cfg());
    pod.metadata.uid = Some("pod-uid-1".into());
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    pod
}

fn plan_for(s: &AgentSession, pod: Option<Pod>, listings: &Listings) -> Plan {
    let res = resolve(&s.spec, &entries(&s.spec), listings);
    let observed = Observed {
        pod,
        ..Observed::default()
    };
    plan::plan(s, &observed, &res, &cfg(), now())
}

fn reasons(notes: &[Note]) -> Vec<(bool, &str)> {
    notes
        .iter()
        .map(|n| (n.warning, n.reason.as_str()))
        .collect()
}

fn ready_reason(p: &Plan) -> (&str, &str) {
    let c = p
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    (c.status.as_str(), c.reason.as_str())
}

#[test]
fn no_pod_creates_one_and_looks_again_soon() {
    let s = valid();
    let p = plan_for(&s, None, &Listings::new());
    let PodAction::Create(pod) = &p.pod else {
        panic!("expected a create, got {:?}", p.pod);
    };
    assert_eq!(pod.metadata.name.as_deref(), Some("demo-sandbox"));
    assert!(
        p.configmap.is_some(),
        "the toolset ConfigMap is applied first"
    );
    assert_eq!(reasons(&p.pod_events), [(false, "CreatedPod")]);
    assert_eq!(p.status.phase, Some(SessionPhase::Pending));
    assert_eq!(p.status.pod_name.as_deref(), Some("demo-sandbox"));
    assert_eq!(p.requeue, plan::POD_NOT_READY);
}

#[test]
fn a_changed_spec_replaces_the_observed_pod_by_uid() {
    let s = valid();
    let mut old = running(&s, true);
    old.metadata
        .annotations
        .get_or_insert_default()
        .insert(SPEC_HASH_ANNOTATION.into(), "outdated".into());
    let p = plan_for(&s, Some(old), &Listings::new());
    assert_eq!(
        p.pod,
        PodAction::Delete {
            name: "demo-sandbox".into(),
            uid: Some("pod-uid-1".into())
        }
    );
    assert_eq!(reasons(&p.pod_events), [(false, "ReplacingPod")]);
    assert_eq!(p.status.pod_name, None);
    assert_eq!(p.requeue, plan::POD_GOING);
}

#[test]
fn a_pod_being_deleted_is_waited_for() {
    let s = valid();
    let mut going = running(&s, true);
    going.metadata.deletion_timestamp = Some(Time(now()));
    let p = plan_for(&s, Some(going), &Listings::new());
    assert_eq!(p.pod, PodAction::WaitForDeletion);
    assert!(p.pod_events.is_empty());
    assert_eq!(p.requeue, plan::POD_GOING);
}

#[test]
fn a_ready_pod_is_kept_and_the_session_resyncs_slowly() {
    let s = valid();
    let p = plan_for(&s, Some(running(&s, true)), &Listings::new());
    assert_eq!(p.pod, PodAction::Keep);
    assert_eq!(p.status.phase, Some(SessionPhase::Ready));
    assert_eq!(reasons(&p.events), [(false, "Ready")]);
    assert_eq!(p.requeue, plan::RESYNC);
}

/// The pod cache keeps only the part of a pod's spec plans read
/// (`cache::slim`): every plan from a cached pod is the plan from the whole
/// one -- current, outdated, unready, going, built before the built-with
/// annotation (its runner image read from the install container).
#[test]
fn a_cached_pod_plans_like_the_whole_pod() {
    let s = valid();
    let outdated = {
        let mut pod = running(&s, true);
        pod.annotations_mut()
            .insert(SPEC_HASH_ANNOTATION.into(), "other".into());
        pod
    };
    let legacy = {
        let mut pod = running(&s, true);
        pod.annotations_mut()
            .remove(operator::session::pod::BUILT_WITH_ANNOTATION);
        pod
    };
    let going = {
        let mut pod = running(&s, false);
        pod.metadata.deletion_timestamp = Some(Time(now()));
        pod
    };
    let pods = [
        ("ready", running(&s, true)),
        ("unready", running(&s, false)),
        ("outdated", outdated),
        ("legacy", legacy),
        ("going", going),
    ];
    for (what, pod) in pods {
        let mut cached = pod.clone();
        operator::session::cache::slim(&mut cached);
        assert!(
            serde_json::to_vec(&cached).unwrap().len()
                < serde_json::to_vec(&pod).unwrap().len() / 2,
            "{what}: the cached pod is not much smaller"
        );
        let whole = plan_for(&s, Some(pod), &Listings::new());
        let slim = plan_for(&s, Some(cached), &Listings::new());
        assert_eq!(format!("{whole:?}"), format!("{slim:?}"), "{what}");
    }
}

#[test]
fn a_refused_status_is_retried_soon_whatever_the_plan_says() {
    let s = valid();
    let ready = plan_for(&s, Some(running(&s, true)), &Listings::new());
    assert_eq!(ready.requeue_after(true), plan::RESYNC);
    assert_eq!(ready.requeue_after(false), plan::STATUS_REFUSED);
    // Never later than the plan's own requeue.
    let going = {
        let mut pod = running(&s, true);
        pod.metadata.deletion_timestamp = Some(Time(now()));
        plan_for(&s, Some(pod), &Listings::new())
    };
    assert!(going.requeue_after(false) <= going.requeue);
    assert!(plan::STATUS_REFUSED < plan::POD_NOT_READY);
}

#[test]
fn requeue_intervals() {
    let s = valid();
    let m = with_mcp();
    let down: Listings = [("gh".to_owned(), Err("connection refused".to_owned()))].into();
    let cases: [(&str, Plan, Duration); 5] = [
        (
            "ready",
            plan_for(&s, Some(running(&s, true)), &Listings::new()),
            plan::RESYNC,
        ),
        (
            "not ready",
            plan_for(&s, Some(running(&s, false)), &Listings::new()),
            plan::POD_NOT_READY,
        ),
        (
            "mcp down, pod ready",
            plan_for(&m, Some(running(&m, true)), &down),
            plan::MCP_RETRY,
        ),
        (
            "mcp down, pod not ready",
            plan_for(&m, Some(running(&m, false)), &down),
            plan::POD_NOT_READY,
        ),
        (
            "invalid",
            plan_for(&invalid(), None, &Listings::new()),
            plan::RESYNC,
        ),
    ];
    for (what, p, want) in cases {
        assert_eq!(p.requeue, want, "{what}");
    }
}

#[test]
fn an_invalid_toolset_stops_the_pod_and_says_why() {
    let s = invalid();
    let pod = running(&valid(), true);
    let p = plan_for(&s, Some(pod), &Listings::new());
    assert!(matches!(p.pod, PodAction::Delete { .. }), "{:?}", p.pod);
    assert!(
        p.configmap.is_none(),
        "nothing is applied for an invalid toolset"
    );
    assert_eq!(reasons(&p.pod_events), [(true, "StoppedPod")]);
    assert_eq!(p.status.phase, Some(SessionPhase::Invalid));
    assert_eq!(reasons(&p.events), [(true, "InvalidToolset")]);
    let msg = &p.events[0].message;
    assert!(msg.contains("spec.tools[0].configs[0].name"), "{msg}");

    let none = plan_for(&s, None, &Listings::new());
    assert_eq!(none.pod, PodAction::Keep);
    assert!(none.pod_events.is_empty());
}

#[test]
fn a_failed_pod_apply_is_a_condition_and_a_warning() {
    let s = valid();
    let mut p = plan_for(&s, None, &Listings::new());
    p.apply_failed(
        None,
        "Kubernetes API request failed: pods is forbidden",
        now(),
    );
    assert_eq!(ready_reason(&p), ("False", "ApplyFailed"));
    assert_eq!(p.status.phase, Some(SessionPhase::Pending));
    assert_eq!(p.status.pod_name, None, "no pod was made");
    assert!(p.pod_events.is_empty(), "CreatedPod would be a lie");
    assert!(
        reasons(&p.events).contains(&(true, "ApplyFailed")),
        "{:?}",
        p.events
    );

    // The same failure again is not a new event.
    let first = p.status.clone();
    let mut again = plan_for(&with_status(&s, first), None, &Listings::new());
    again.apply_failed(
        Some(&p.status),
        "Kubernetes API request failed: pods is forbidden",
        Timestamp::from_second(2_000).expect("t"),
    );
    assert!(again.events.is_empty(), "{:?}", again.events);
    let since = |p: &Plan| {
        p.status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.last_transition_time.clone())
    };
    assert_eq!(since(&again), since(&p), "the transition time is kept");
}

fn with_status(s: &AgentSession, st: AgentSessionStatus) -> AgentSession {
    let mut s = s.clone();
    s.status = Some(st);
    s
}

#[test]
fn a_steady_state_publishes_nothing() {
    let s = valid();
    let first = plan_for(&s, Some(running(&s, true)), &Listings::new());
    let again = plan_for(
        &with_status(&s, first.status.clone()),
        Some(running(&s, true)),
        &Listings::new(),
    );
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert!(again.pod_events.is_empty());
    assert!(
        !again.changes_status(Some(&first.status), None),
        "a steady state writes no status:\n{:#?}\n{:#?}",
        first.status,
        again.status
    );
    assert!(
        first.changes_status(None, None),
        "a first status is written"
    );
    let changed = plan_for(
        &with_status(&s, first.status.clone()),
        Some(running(&s, false)),
        &Listings::new(),
    );
    assert!(
        changed.changes_status(Some(&first.status), None),
        "a pod that stops being ready is written"
    );
}

#[test]
fn the_status_apply_is_conditional_on_the_version_planned_from() {
    let mut s = valid();
    s.metadata.resource_version = Some("4711".into());
    let plan = plan_for(&s, Some(running(&s, true)), &Listings::new());
    let body = plan.status_apply(&s);
    assert_eq!(body["metadata"]["resourceVersion"], "4711");
    assert_eq!(body["kind"], "AgentSession");
    assert_eq!(
        body["status"],
        serde_json::to_value(&plan.status).expect("status serialises")
    );
}

#[test]
fn the_workspace_claim_is_created_only_when_missing() {
    let s = session(
        json!([{"type": "agent_toolset_20260401"}]),
        json!({"workspace": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}}}}}}),
    );
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let missing = Observed::default();
    let present = Observed {
        claim: build_claim(&s, None).map(|c| c.metadata),
        ..Observed::default()
    };
    assert!(
        plan::plan(&s, &missing, &res, &cfg(), now())
            .claim
            .is_some()
    );
    assert!(
        plan::plan(&s, &present, &res, &cfg(), now())
            .claim
            .is_none()
    );
}

#[test]
fn backoff_counts_each_failure_once() {
    let b = Backoff::default();
    let waits: Vec<u64> = (0..10).map(|_| b.failed("team-a/demo").as_secs()).collect();
    assert_eq!(waits, [2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    assert_eq!(b.failed("team-a/other").as_secs(), 2, "per session");
    b.succeeded("team-a/demo");
    assert_eq!(b.failed("team-a/demo").as_secs(), 2, "a success resets it");
    assert_eq!(context::backoff(u32::MAX), context::MAX_BACKOFF);
}

#[test]
fn an_object_the_session_does_not_own_is_neither_adopted_nor_deleted() {
    let s = valid();
    let mut theirs = running(&s, true);
    theirs.metadata.owner_references = None;
    let p = plan_for(&s, Some(theirs.clone()), &Listings::new());
    assert_eq!(p.pod, PodAction::Keep);
    assert!(
        p.configmap.is_none() && p.claim.is_none(),
        "nothing is applied"
    );
    assert_eq!(ready_reason(&p), ("False", "NameConflict"));
    assert_eq!(reasons(&p.events), [(true, "NameConflict")]);
    assert!(
        p.events[0].message.contains("pod demo-sandbox"),
        "{:?}",
        p.events
    );

    // Owned by another object of the same name (another UID): still foreign.
    let mut other = theirs;
    let mut owner = build_pod(&s, &cfg()).metadata.owner_references.unwrap();
    owner[0].uid = "someone-else".into();
    other.metadata.owner_references = Some(owner);
    let p = plan_for(&s, Some(other), &Listings::new());
    assert_eq!(ready_reason(&p), ("False", "NameConflict"));

    // A ConfigMap under the session's name that it does not own.
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let observed = Observed {
        configmap: Some(ObjectMeta {
            name: Some("demo-toolset".into()),
            ..ObjectMeta::default()
        }),
        ..Observed::default()
    };
    let p = plan::plan(&s, &observed, &res, &cfg(), now());
    assert!(p.configmap.is_none() && p.pod == PodAction::Keep);
    assert!(
        p.events[0].message.contains("ConfigMap demo-toolset"),
        "{:?}",
        p.events
    );
}

#[test]
fn a_spec_the_policy_denies_runs_no_pod() {
    let s = session(
        json!([{"type": "agent_toolset_20260401"}]),
        json!({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}]}),
    );
    let mut res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let denied = operator::policy::check(&s.spec, &operator::policy::SessionPolicy::default());
    operator::resolution::apply_policy(&mut res, &denied);
    // A pod made before the policy tightened is stopped as well.
    let observed = Observed {
        pod: Some(running(&valid(), true)),
        ..Observed::default()
    };
    let p = plan::plan(&s, &observed, &res, &cfg(), now());
    assert!(matches!(p.pod, PodAction::Delete { .. }), "{:?}", p.pod);
    assert!(p.configmap.is_none());
    assert_eq!(p.status.phase, Some(SessionPhase::Invalid));
    assert!(
        reasons(&p.events).contains(&(true, "PolicyDenied")),
        "{:?}",
        p.events
    );
    assert!(
        p.events.iter().any(|e| e
            .message
            .contains("spec.env[0].valueFrom.secretKeyRef.name")),
        "{:?}",
        p.events
    );
}

#[test]
fn a_new_runner_image_does_not_replace_running_pods() {
    let s = valid();
    let old = running(&s, true); // built with localhost/agentplane/runner:dev
    let upgraded = PodConfig {
        runner_image: "localhost/agentplane/runner:v2".into(),
        ..cfg()
    };
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let observed = Observed {
        pod: Some(old),
        ..Observed::default()
    };
    let p = plan::plan(&s, &observed, &res, &upgraded, now());
    assert_eq!(p.pod, PodAction::Keep, "the upgrade alone replaced the pod");
    // A pod made from now on gets the new runner.
    let fresh = plan::plan(&s, &Observed::default(), &res, &upgraded, now());
    let PodAction::Create(pod) = fresh.pod else {
        panic!("expected a create");
    };
    assert_eq!(
        operator::session::pod::runner_image(&pod),
        Some("localhost/agentplane/runner:v2")
    );
    // A spec change still replaces it, with the new runner then.
    let mut changed = s.clone();
    changed.spec.image = "other".into();
    let observed = Observed {
        pod: Some(running(&s, true)),
        ..Observed::default()
    };
    let p = plan::plan(&changed, &observed, &res, &upgraded, now());
    assert!(matches!(p.pod, PodAction::Delete { .. }), "{:?}", p.pod);
}

#[test]
fn defaults_bound_new_pods_and_changing_them_replaces_none() {
    use k8s_openapi::api::core::v1::ResourceRequirements;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let s = valid();
    let bounded = PodConfig {
        default_resources: Some(ResourceRequirements {
            limits: Some([("memory".to_owned(), Quantity("1Gi".into()))].into()),
            ..ResourceRequirements::default()
        }),
        default_workspace_limit: Some(Quantity("4Gi".into())),
        ..cfg()
    };
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let PodAction::Create(pod) = plan::plan(&s, &Observed::default(), &res, &bounded, now()).pod
    else {
        panic!("expected a create");
    };
    let spec = pod.spec.as_ref().expect("spec");
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref());
    assert_eq!(limits.map(|l| &l["memory"]), Some(&Quantity("1Gi".into())));
    let workspace = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "workspace")
        .and_then(|v| v.empty_dir.as_ref())
        .and_then(|e| e.size_limit.clone());
    assert_eq!(workspace, Some(Quantity("4Gi".into())));

    // A pod made before the defaults existed is not replaced for them.
    let observed = Observed {
        pod: Some(running(&s, true)),
        ..Observed::default()
    };
    assert_eq!(
        plan::plan(&s, &observed, &res, &bounded, now()).pod,
        PodAction::Keep
    );
}

#[test]
fn the_sandbox_network_policy_comes_with_the_pod_and_is_never_taken_over() {
    let s = valid();
    let fenced = PodConfig {
        egress: operator::sandbox::EgressPolicy {
            enabled: true,
            ..Default::default()
        },
        ..cfg()
    };
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let p = plan::plan(&s, &Observed::default(), &res, &fenced, now());
    let np = p
        .network_policy
        .expect("a NetworkPolicy for a runnable session");
    assert_eq!(np.metadata.name.as_deref(), Some("demo-egress"));
    assert!(
        plan::plan(&s, &Observed::default(), &res, &cfg(), now())
            .network_policy
            .is_none(),
        "off when the platform turned it off"
    );
    let observed = Observed {
        network_policy: Some(ObjectMeta {
            name: Some("demo-egress".into()),
            ..ObjectMeta::default()
        }),
        ..Observed::default()
    };
    let p = plan::plan(&s, &observed, &res, &fenced, now());
    assert!(p.network_policy.is_none() && p.pod == PodAction::Keep);
    assert_eq!(ready_reason(&p), ("False", "NameConflict"));
}

#[test]
fn a_pod_as_the_api_server_returns_it_is_current() {
    use k8s_openapi::api::core::v1::ResourceRequirements;
    // The API server writes `resources: {}` into a container that had none;
    // that is not a change of the session.
    let s = valid();
    let mut pod = running(&s, true);
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers[0].resources = Some(ResourceRequirements::default());
    }
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let observed = Observed {
        pod: Some(pod.clone()),
        ..Observed::default()
    };
    assert_eq!(
        plan::plan(&s, &observed, &res, &cfg(), now()).pod,
        PodAction::Keep
    );

    // A pod from before the built-with annotation: built with no defaults.
    let mut legacy = pod;
    legacy
        .metadata
        .annotations
        .as_mut()
        .map(|a| a.remove(operator::session::pod::BUILT_WITH_ANNOTATION));
    let observed = Observed {
        pod: Some(legacy),
        ..Observed::default()
    };
    assert_eq!(
        plan::plan(&s, &observed, &res, &cfg(), now()).pod,
        PodAction::Keep
    );
}

/// What a failed or overflowing MCP resolution does to a running sandbox:
/// nothing. The pod (and its workspace) is kept, and `Degraded` says what
/// is missing until the server lists again.
#[test]
fn a_resolution_failure_degrades_the_session_and_keeps_its_pod() {
    let m = with_mcp();
    let pod = running(&m, true);
    let tool = |i: usize| toolset::McpTool {
        name: format!("t{i}"),
        description: String::new(),
        input_schema: json!({"type": "object"}),
    };
    let listings = |listed: Result<Vec<toolset::McpTool>, String>| -> Listings {
        [("gh".to_owned(), listed)].into()
    };
    let cases = [
        (
            "server down",
            listings(Err("unreachable".into())),
            Some("ServerUnavailable"),
        ),
        (
            "129 tools",
            listings(Ok((0..129).map(tool).collect())),
            Some("TooManyTools"),
        ),
        ("listed", listings(Ok(vec![tool(1)])), None),
    ];
    for (what, listed, degraded) in cases {
        let p = plan_for(&m, Some(pod.clone()), &listed);
        assert_eq!(p.pod, PodAction::Keep, "{what}: the running pod is kept");
        assert!(
            p.configmap.is_some(),
            "{what}: the runner's toolset is still applied"
        );
        let c = p
            .status
            .conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .unwrap_or_else(|| panic!("{what}: a Degraded condition"));
        match degraded {
            Some(reason) => {
                assert_eq!(
                    (c.status.as_str(), c.reason.as_str()),
                    ("True", reason),
                    "{what}"
                );
                assert_eq!(
                    p.status.phase,
                    Some(SessionPhase::Ready),
                    "{what}: still serving"
                );
            }
            None => assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", "Complete"),
                "{what}"
            ),
        }
    }
    // A session whose spec is invalid runs nothing, so it is not "degraded".
    let p = plan_for(&invalid(), None, &Listings::new());
    assert!(p.status.conditions.iter().all(|c| c.type_ != "Degraded"));
}

/// The platform's read-only root: new pods get it on their sandbox and
/// install containers; running pods are not replaced for it.
#[test]
fn a_read_only_root_reaches_new_pods_only() {
    let s = valid();
    let ro = PodConfig {
        read_only_root: true,
        ..cfg()
    };
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let fresh = plan::plan(&s, &Observed::default(), &res, &ro, now());
    let PodAction::Create(pod) = fresh.pod else {
        panic!("expected a create");
    };
    let spec = pod.spec.as_ref().expect("spec");
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        let sc = c.security_context.as_ref().expect("security context");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
    }
    let observed = Observed {
        pod: Some(running(&s, true)),
        ..Observed::default()
    };
    let p = plan::plan(&s, &observed, &res, &ro, now());
    assert_eq!(
        p.pod,
        PodAction::Keep,
        "turning it on replaced a running pod"
    );
}

/// A long-named session whose objects an earlier release named (32-bit
/// digest) keeps them: with `status.objectNames: digest32` the plan finds
/// its running pod under the old name and keeps it, and the status keeps
/// saying so; a new session gets the 128-bit names.
#[test]
fn a_session_named_by_an_earlier_release_keeps_its_objects() {
    use operator::names::{DIGEST32, Names, Scheme};
    let long = "s".repeat(60);
    let mut s = valid();
    s.metadata.name = Some(long.clone());
    let old = Names::with(&long, Scheme::Digest32);
    let new = Names::with(&long, Scheme::Current);
    assert_ne!(old.pod, new.pod);
    s.status = Some(AgentSessionStatus {
        object_names: Some(DIGEST32.into()),
        ..AgentSessionStatus::default()
    });
    let pod = running(&s, true);
    assert_eq!(pod.metadata.name.as_deref(), Some(old.pod.as_str()));
    let p = plan_for(&s, Some(pod), &Listings::new());
    assert_eq!(p.pod, PodAction::Keep);
    assert_eq!(p.status.object_names.as_deref(), Some(DIGEST32));
    assert_eq!(p.status.pod_name.as_deref(), Some(old.pod.as_str()));
    assert_eq!(
        p.configmap
            .as_ref()
            .and_then(|c| c.metadata.name.as_deref()),
        Some(old.configmap.as_str())
    );
    // Without the record, the current names.
    s.status = None;
    let p = plan_for(&s, None, &Listings::new());
    let PodAction::Create(pod) = p.pod else {
        panic!("expected a create");
    };
    assert_eq!(pod.metadata.name.as_deref(), Some(new.pod.as_str()));
    assert_eq!(p.status.object_names, None);
}

fn persistent(extra: serde_json::Value) -> AgentSession {
    let mut fields = json!({"workspace": {"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}}}}});
    if let (Some(f), Some(e)) = (fields.as_object_mut(), extra.as_object()) {
        f.extend(e.clone());
    }
    let mut s = session(json!([{"type": "agent_toolset_20260401"}]), fields);
    s.metadata.creation_timestamp = Some(Time(Timestamp::from_second(900).expect("t")));
    s
}

fn cond<'a>(p: &'a Plan, type_: &str) -> Option<(&'a str, &'a str)> {
    p.status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.as_str(), c.reason.as_str()))
}

/// Suspending deletes the pod by UID and keeps the claim; un-suspending
/// makes a new pod; each step says so once.
#[test]
fn suspend_removes_the_pod_and_resume_brings_one_back() {
    let s = persistent(json!({"suspended": true}));
    let claim_meta = build_claim(&s, None).expect("claim").metadata;
    let observed = Observed {
        pod: Some(running(&s, true)),
        claim: Some(claim_meta.clone()),
        ..Observed::default()
    };
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let p = plan::plan(&s, &observed, &res, &cfg(), now());
    assert_eq!(
        p.pod,
        PodAction::Delete {
            name: "demo-sandbox".into(),
            uid: Some("pod-uid-1".into())
        }
    );
    assert!(
        p.claim.is_none() && p.delete_claim.is_none(),
        "the claim is kept"
    );
    assert_eq!(p.status.phase, Some(SessionPhase::Suspended));
    assert_eq!(cond(&p, "Suspended"), Some(("True", "Requested")));
    assert_eq!(cond(&p, "Ready"), Some(("False", "Suspended")));
    assert_eq!(p.status.pod_name, None);
    assert!(
        reasons(&p.events).contains(&(false, "Suspended")),
        "{:?}",
        p.events
    );
    assert!(reasons(&p.pod_events).contains(&(false, "DeletedPod")));
    // Once the pod is gone, a suspended session is quiet.
    let quiet = with_status(&s, p.status.clone());
    let observed = Observed {
        claim: Some(claim_meta.clone()),
        ..Observed::default()
    };
    let p2 = plan::plan(&quiet, &observed, &res, &cfg(), now());
    assert_eq!(p2.pod, PodAction::Keep);
    assert!(
        p2.events.is_empty() && p2.pod_events.is_empty(),
        "{:?}",
        p2.events
    );
    // Resumed: a new pod, and a Resumed event.
    let mut resumed = quiet.clone();
    resumed.spec.suspended = Some(false);
    let p3 = plan::plan(&resumed, &observed, &res, &cfg(), now());
    assert!(matches!(p3.pod, PodAction::Create(_)), "{:?}", p3.pod);
    assert_eq!(cond(&p3, "Suspended"), Some(("False", "Running")));
    assert!(
        reasons(&p3.events).contains(&(false, "Resumed")),
        "{:?}",
        p3.events
    );
}

/// The bash state of a session with a persistent workspace lives on it, so
/// a resumed pod starts where the suspended one stopped.
#[test]
fn a_persistent_session_keeps_bash_state_on_its_workspace() {
    assert_eq!(
        operator::session::pod::state_dir(&persistent(json!({}))),
        "/workspace/.agentplane/state"
    );
    assert_eq!(
        operator::session::pod::state_dir(&valid()),
        runner_api::STATE_DIR
    );
}

/// The lifetime's end: no pod, phase Finished, and the claim deleted by UID
/// only when the spec says so and the session controls it.
#[test]
fn a_finished_session_stops_and_deletes_its_workspace_only_if_asked() {
    let ended = |on_finish: &str| {
        persistent(json!({"lifetime": {"maxLifetimeSeconds": 50, "workspaceOnFinish": on_finish}}))
    };
    for (policy, deletes) in [("Keep", false), ("Delete", true)] {
        let s = ended(policy);
        let mut claim = build_claim(&s, None).expect("claim").metadata;
        claim.uid = Some("claim-uid".into());
        let observed = Observed {
            pod: Some(running(&s, true)),
            claim: Some(claim.clone()),
            ..Observed::default()
        };
        let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
        let p = plan::plan(&s, &observed, &res, &cfg(), now());
        assert!(matches!(p.pod, PodAction::Delete { .. }), "{policy}");
        assert_eq!(p.status.phase, Some(SessionPhase::Finished), "{policy}");
        assert_eq!(cond(&p, "Ready"), Some(("False", "Finished")));
        assert_eq!(
            p.delete_claim,
            deletes.then(|| ("demo-workspace".to_owned(), Some("claim-uid".to_owned()))),
            "{policy}"
        );
        assert!(
            reasons(&p.events).contains(&(false, "Finished")),
            "{policy}"
        );
        // A claim someone else controls is never deleted.
        let mut foreign = claim.clone();
        foreign.owner_references = None;
        let observed = Observed {
            claim: Some(foreign),
            ..Observed::default()
        };
        let p = plan::plan(&s, &observed, &res, &cfg(), now());
        assert_eq!(p.delete_claim, None);
    }
    // Before the end, the session runs and looks again at the deadline.
    let mut s = ended("Keep");
    s.spec
        .lifetime
        .as_mut()
        .expect("lifetime")
        .max_lifetime_seconds = Some(200);
    let p = plan_for(&s, Some(running(&s, true)), &Listings::new());
    assert_eq!(p.pod, PodAction::Keep);
    assert_eq!(p.requeue, Duration::from_secs(100));
}

/// An idle exit suspends a session that asked for it; a wake request made
/// after it brings a new pod.
#[test]
fn an_idle_exit_suspends_and_a_wake_replaces_the_ended_pod() {
    let s = persistent(json!({"lifetime": {"idleSuspendSeconds": 30}}));
    let mut ended = running(&s, false);
    ended.metadata.creation_timestamp = Some(Time(Timestamp::from_second(950).expect("t")));
    ended.status.as_mut().expect("status").phase = Some("Succeeded".into());
    let p = plan_for(&s, Some(ended.clone()), &Listings::new());
    assert!(matches!(p.pod, PodAction::Delete { .. }));
    assert_eq!(cond(&p, "Suspended"), Some(("True", "Idle")));
    assert_eq!(p.status.phase, Some(SessionPhase::Suspended));
    // Woken while the ended pod is still there: it is replaced.
    let mut woken = with_status(&s, p.status.clone());
    woken.metadata.annotations = Some(
        [(
            operator::session::lifecycle::WAKE_ANNOTATION.to_owned(),
            Timestamp::from_second(1_500).expect("t").to_string(),
        )]
        .into(),
    );
    let later = Timestamp::from_second(2_000).expect("t");
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let observed = Observed {
        pod: Some(ended),
        ..Observed::default()
    };
    let p = plan::plan(&woken, &observed, &res, &cfg(), later);
    assert!(matches!(p.pod, PodAction::Delete { .. }), "{:?}", p.pod);
    assert!(reasons(&p.pod_events).contains(&(false, "Resuming")));
    let p = plan::plan(&woken, &Observed::default(), &res, &cfg(), later);
    assert!(matches!(p.pod, PodAction::Create(_)));
}

/// The session cache holds each distinct set of tool definitions once
/// (`session::bulk`): the cached session has none of its own, a reconcile
/// still tells a steady status from a changed one, a version the cache did
/// not hold is judged changed (and written, conditionally), and deleted or
/// no-longer-listed sessions leave.
#[test]
fn the_cached_status_shares_its_tools_and_still_tells_a_change() {
    use kube::core::DeserializeGuard;
    use kube::runtime::watcher::Event;
    use operator::session::bulk::{Bulk, MAX_SHARED, StatusBulk};

    let s = valid();
    let first = plan_for(&s, Some(running(&s, true)), &Listings::new());
    assert!(!first.status.tools.is_empty());
    let bulk = StatusBulk::default();
    let cache = |ns: &str, rv: &str, status: AgentSessionStatus| {
        let mut c = with_status(&s, status);
        c.metadata.namespace = Some(ns.into());
        c.metadata.resource_version = Some(rv.into());
        let mut w = DeserializeGuard(Ok(c));
        bulk.slim(&mut w);
        w.0.expect("decoded")
    };
    let a = cache("team-a", "10", first.status.clone());
    let b = cache("team-b", "11", first.status.clone());
    assert!(a.status.as_ref().expect("status").tools.is_empty());
    assert!(a.status.as_ref().expect("status").toolsets.is_empty());
    assert_eq!(bulk.counts(), (2, 1), "two sessions, one shared value");
    let held = bulk.of(&a).expect("held for the version read");
    assert_eq!(held.tools, first.status.tools);
    assert_eq!(held.toolsets, first.status.toolsets);

    let steady = plan_for(&a, Some(running(&s, true)), &Listings::new());
    assert!(!steady.changes_status(a.status.as_ref(), Some(&held)));
    let unready = plan_for(&a, Some(running(&s, false)), &Listings::new());
    assert!(unready.changes_status(a.status.as_ref(), Some(&held)));
    let other_tools = Bulk {
        tools: held.tools[1..].to_vec(),
        toolsets: held.toolsets.clone(),
    };
    assert!(steady.changes_status(a.status.as_ref(), Some(&other_tools)));
    let mut newer = a.clone();
    newer.metadata.resource_version = Some("12".into());
    assert!(bulk.of(&newer).is_none(), "another version is not answered");
    assert!(steady.changes_status(newer.status.as_ref(), None));

    bulk.apply(&Event::Delete(DeserializeGuard(Ok(a.clone()))));
    assert_eq!(bulk.counts().0, 1);
    let c = cache("team-c", "13", first.status.clone());
    assert_eq!(bulk.counts().0, 2);
    bulk.apply(&Event::Init);
    bulk.apply(&Event::InitApply(DeserializeGuard(Ok(b.clone()))));
    bulk.apply(&Event::InitDone);
    assert_eq!(bulk.counts().0, 1, "a relist keeps only what it listed");
    assert!(bulk.of(&c).is_none() && bulk.of(&b).is_some());

    // Past the most distinct values shared, a new one stays in its session.
    let distinct = |i: usize| {
        let mut st = first.status.clone();
        st.tools[0].description = format!("variant {i}");
        st
    };
    let kept: Vec<AgentSession> = (0..MAX_SHARED)
        .map(|i| cache(&format!("ns-{i}"), "1", distinct(i)))
        .collect();
    assert_eq!(bulk.counts().1, MAX_SHARED);
    let beyond = cache("ns-beyond", "1", distinct(MAX_SHARED));
    assert_eq!(
        beyond.status.as_ref().expect("status").tools.len(),
        first.status.tools.len(),
        "not shared: kept in the session"
    );
    assert!(bulk.of(&beyond).is_none());
    drop(kept);
}
