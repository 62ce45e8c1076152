//! Warm pools without a cluster: which sessions a pool serves, the pods it
//! keeps, the claim patch, and the plan of a session bound to a warm pod.

use crds::{AgentSession, AgentSessionSpec, AgentWarmPool, AgentWarmPoolSpec, WarmPoolTemplate};
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::core::ObjectMeta;
use operator::names::{
    self, BOUND_ANNOTATION, POOL_LABEL, SESSION_LABEL, SPEC_HASH_ANNOTATION,
    TEMPLATE_HASH_ANNOTATION,
};
use operator::policy::SessionPolicy;
use operator::pool::plan as pool;
use operator::pool::pod::pool_pod;
use operator::resolution::{CondSpec, Listings, resolve};
use operator::session::claim as warm;
use operator::session::plan::{self, Observed, PodAction};
use operator::validation::entries;
use serde_json::json;

mod common;
use common::{cfg, now};

const IMAGE: &str = "localhost/agentplane/sandbox-base:dev";

fn template(extra: serde_json::Value) -> WarmPoolTemplate {
    let mut t = json!({"image": IMAGE});
    if let (Some(t), Some(extra)) = (t.as_object_mut(), extra.as_object()) {
        t.extend(extra.clone());
    }
    serde_json::from_value(t).expect("template")
}

fn pool_with(replicas: i32, t: WarmPoolTemplate) -> AgentWarmPool {
    let mut p = AgentWarmPool::new(
        "python",
        AgentWarmPoolSpec {
            replicas,
            template: t,
        },
    );
    p.metadata = ObjectMeta {
        name: Some("python".into()),
        namespace: Some("team-a".into()),
        uid: Some("pool-uid-0001".into()),
        generation: Some(1),
        ..ObjectMeta::default()
    };
    p
}

fn session(extra: serde_json::Value) -> AgentSession {
    let mut spec = json!({
        "image": IMAGE,
        "tools": [{"type": "agent_toolset_20260401",
                   "configs": [{"name": "write", "enabled": false}]}],
        "warmPool": "python",
    });
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    let spec: AgentSessionSpec = serde_json::from_value(spec).expect("spec");
    let mut s = AgentSession::new("agent-7", spec);
    s.metadata = ObjectMeta {
        name: Some("agent-7".into()),
        namespace: Some("team-a".into()),
        uid: Some("session-uid-0007".into()),
        generation: Some(1),
        ..ObjectMeta::default()
    };
    s
}

fn ready(mut pod: Pod, uid: &str, rv: &str) -> Pod {
    pod.metadata.uid = Some(uid.into());
    pod.metadata.resource_version = Some(rv.into());
    pod.metadata.creation_timestamp = Some(Time(now()));
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: "True".into(),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    pod
}

/// What the API server returns for the claim patch, applied by hand.
fn claimed(pod: &Pod, s: &AgentSession) -> Pod {
    let patch = warm::claim_patch(pod, s, &cfg()).expect("patch");
    let mut v = serde_json::to_value(pod).expect("json");
    merge(&mut v, &patch);
    serde_json::from_value(v).expect("pod")
}

fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

#[test]
fn a_session_asking_for_the_template_matches_and_each_pod_field_is_named_otherwise() {
    let t = template(json!({"env": [{"name": "LANG", "value": "C.UTF-8"}]}));
    // Plain env values are bound late: they never stop a match.
    let s = session(json!({"env": [{"name": "TOKEN", "value": "abc"}]}));
    assert_eq!(warm::mismatch(&s.spec, &t), None);
    let cases = [
        (json!({"image": "other:1"}), "spec.image"),
        (json!({"workdir": "/src"}), "spec.workdir"),
        (
            json!({"resources": {"limits": {"memory": "1Gi"}}}),
            "spec.resources",
        ),
        (
            json!({"runtimeClassName": "gvisor"}),
            "spec.runtimeClassName",
        ),
        (json!({"nodeSelector": {"a": "b"}}), "spec.nodeSelector"),
        (
            json!({"tolerations": [{"key": "k", "operator": "Exists"}]}),
            "spec.tolerations",
        ),
        (
            json!({"workspace": {"volumeClaimTemplate": {"spec": {}}}}),
            "spec.workspace.volumeClaimTemplate",
        ),
        (
            json!({"workspace": {"emptyDir": {"sizeLimit": "1Gi"}}}),
            "spec.workspace.emptyDir.sizeLimit",
        ),
        (
            json!({"lifetime": {"idleTimeoutSeconds": 60}}),
            "spec.lifetime.idleTimeoutSeconds",
        ),
        (
            json!({"lifetime": {"activeDeadlineSeconds": 60}}),
            "spec.lifetime.activeDeadlineSeconds",
        ),
        (
            json!({"env": [{"name": "A", "value": "1"},
                           {"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}),
            "spec.env[1].valueFrom",
        ),
    ];
    for (extra, path) in cases {
        let s = session(extra.clone());
        let why = warm::mismatch(&s.spec, &t).unwrap_or_else(|| panic!("{extra} matched"));
        assert!(why.starts_with(path), "{extra}: {why}");
    }
    // The lifetime the operator enforces itself is fine warm.
    let s = session(json!({"lifetime": {"maxLifetimeSeconds": 600}}));
    assert_eq!(warm::mismatch(&s.spec, &t), None);
}

#[test]
fn a_pool_pod_waits_for_a_binding_and_belongs_to_the_pool() {
    let p = pool_with(2, template(json!({})));
    let pod = pool_pod(&p, "0a1b2c3d", &cfg());
    assert_eq!(pod.name_any(), "python-0a1b2c3d-sandbox");
    assert_eq!(
        pod.labels().get(POOL_LABEL).map(String::as_str),
        Some("python")
    );
    assert!(!pod.labels().contains_key(SESSION_LABEL));
    let owner = &pod.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("AgentWarmPool", "pool-uid-0001")
    );
    assert!(warm::is_warm(&pod));
    let spec = pod.spec.as_ref().expect("spec");
    let args = spec.containers[0].args.clone().unwrap_or_default();
    let at = args
        .iter()
        .position(|a| a == "--await-binding")
        .expect("flag");
    assert_eq!(args[at + 1], "/etc/agentplane/binding.json");
    let toolset = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "toolset")
        .and_then(|v| v.config_map.clone())
        .expect("toolset volume");
    assert_eq!(toolset.optional, Some(true));
    assert_eq!(
        warm::toolset_configmap_name(&pod).as_deref(),
        Some("python-0a1b2c3d-toolset")
    );
}

#[test]
fn the_claim_is_one_preconditioned_patch_that_hands_the_pod_over() {
    let p = pool_with(1, template(json!({})));
    let s = session(json!({"env": [{"name": "TOKEN", "value": "it's"}]}));
    let pod = ready(pool_pod(&p, "0a1b2c3d", &cfg()), "pod-1", "41");
    assert!(warm::claimable(&pod, &p));
    let patch = warm::claim_patch(&pod, &s, &cfg()).expect("patch");
    assert_eq!(patch["metadata"]["resourceVersion"], "41");
    assert_eq!(
        patch["metadata"]["labels"][POOL_LABEL],
        serde_json::Value::Null
    );
    assert_eq!(patch["metadata"]["labels"][SESSION_LABEL], "agent-7");
    let owners = patch["metadata"]["ownerReferences"]
        .as_array()
        .expect("owners");
    assert_eq!(
        owners.len(),
        1,
        "the pool's reference is replaced, not kept"
    );
    assert_eq!(owners[0]["uid"], "session-uid-0007");
    assert_eq!(owners[0]["controller"], true);

    let bound = claimed(&pod, &s);
    assert!(names::owned_by(&bound.metadata, &s));
    assert!(
        !warm::claimable(&bound, &p),
        "a claimed pod is no longer the pool's"
    );
    // A second session cannot claim it: it is not claimable, and a patch
    // made from the old version carries the old resourceVersion.
    let mut other = session(json!({}));
    other.metadata.uid = Some("session-uid-0008".into());
    assert!(!names::owned_by(&bound.metadata, &other));
    // Not-ready, outdated or foreign pods are never claimable.
    let mut not_ready = pod.clone();
    not_ready.status = None;
    assert!(!warm::claimable(&not_ready, &p));
    let newer = pool_with(1, template(json!({"workdir": "/src"})));
    assert!(!warm::claimable(
        &pod,
        &pool_with(1, newer.spec.template.clone())
    ));
    let mut foreign = pod.clone();
    foreign.metadata.owner_references = None;
    assert!(!warm::claimable(&foreign, &p));
}

#[test]
fn a_claimed_pod_is_kept_gets_the_sessions_toolset_and_binding_and_is_nudged_once() {
    let p = pool_with(1, template(json!({})));
    let s = session(json!({"env": [{"name": "TOKEN", "value": "abc"},
                                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]}));
    let pod = claimed(&ready(pool_pod(&p, "0a1b2c3d", &cfg()), "pod-1", "41"), &s);
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    // A claim that just went through: the condition comes from the pod.
    let observed = Observed {
        pod: Some(pod.clone()),
        ..Observed::default()
    };
    let plan = plan::plan(&s, &observed, &res, &cfg(), now());
    // The same from the pod cache's slimmed copy (which ConfigMap it
    // mounts is among what that keeps).
    let mut cached = pod.clone();
    operator::session::cache::slim(&mut cached);
    let from_cache = Observed {
        pod: Some(cached),
        ..Observed::default()
    };
    assert_eq!(
        format!("{:?}", plan::plan(&s, &from_cache, &res, &cfg(), now())),
        format!("{plan:?}")
    );
    // Kept (its recorded spec hash is the session's), nudged once.
    let PodAction::Touch { name, uid, bound } = &plan.pod else {
        panic!("expected a touch, got {:?}", plan.pod);
    };
    assert_eq!(
        (name.as_str(), uid.as_deref()),
        ("python-0a1b2c3d-sandbox", Some("pod-1"))
    );
    let cm = plan.configmap.as_ref().expect("configmap");
    assert_eq!(cm.name_any(), "python-0a1b2c3d-toolset");
    assert_eq!(cm.owner_references()[0].uid, "session-uid-0007");
    let data = cm.data.as_ref().expect("data");
    let binding: runner_api::Binding =
        serde_json::from_str(&data[runner_api::BINDING_FILE]).expect("binding");
    assert_eq!(binding.session, "agent-7");
    assert_eq!(binding.env.len(), 1, "only plain values are bound");
    assert_eq!(binding.env[0].name, "TOKEN");
    let toolset: toolset::ResolvedToolset =
        serde_json::from_str(&data["toolset.json"]).expect("toolset");
    assert_eq!(
        toolset.policy("write"),
        None,
        "the session's own toolset (write disabled) is what is bound"
    );
    assert_eq!(
        plan.status.pod_name.as_deref(),
        Some("python-0a1b2c3d-sandbox")
    );
    let warm_cond = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "WarmPool")
        .expect("WarmPool condition");
    assert_eq!(
        (warm_cond.status.as_str(), warm_cond.reason.as_str()),
        ("True", "Claimed")
    );
    assert_eq!(
        warm_cond.message,
        "claimed warm pod python-0a1b2c3d-sandbox from AgentWarmPool python"
    );
    assert!(plan.events.iter().any(|e| e.reason == "ClaimedWarmPod"));

    // Once the annotation records this data, nothing more is done.
    let mut nudged = pod.clone();
    nudged
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(BOUND_ANNOTATION.into(), bound.clone());
    let observed = Observed {
        pod: Some(nudged.clone()),
        ..Observed::default()
    };
    let again = plan::plan(&s, &observed, &res, &cfg(), now());
    assert_eq!(again.pod, PodAction::Keep);

    // A spec change the pod cannot follow replaces it, as a cold pod's would.
    let mut changed = s.clone();
    changed.spec.env[0].value = Some("new".into());
    let res = resolve(&changed.spec, &entries(&changed.spec), &Listings::new());
    let replaced = plan::plan(&changed, &observed, &res, &cfg(), now());
    assert!(
        matches!(replaced.pod, PodAction::Delete { .. }),
        "{:?}",
        replaced.pod
    );
}

#[test]
fn a_cold_fallback_says_why_and_warns() {
    let s = session(json!({}));
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let observed = Observed {
        warm: Some(CondSpec {
            type_: "WarmPool",
            status: false,
            reason: "PoolExhausted".into(),
            message: "AgentWarmPool python has no ready pod; started cold".into(),
        }),
        ..Observed::default()
    };
    let plan = plan::plan(&s, &observed, &res, &cfg(), now());
    let PodAction::Create(pod) = &plan.pod else {
        panic!("expected a cold pod");
    };
    assert_eq!(pod.name_any(), "agent-7-sandbox");
    assert!(!warm::is_warm(pod));
    let c = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "WarmPool")
        .expect("WarmPool");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "PoolExhausted")
    );
    assert!(
        plan.events
            .iter()
            .any(|e| e.warning && e.reason == "PoolExhausted")
    );
    // The next reconcile (nothing tried) keeps saying it, quietly.
    let mut later = s.clone();
    later.status = Some(plan.status.clone());
    let again = plan::plan(&later, &Observed::default(), &res, &cfg(), now());
    assert!(
        again
            .status
            .conditions
            .iter()
            .any(|c| c.type_ == "WarmPool" && c.reason == "PoolExhausted")
    );
    assert!(!again.events.iter().any(|e| e.reason == "PoolExhausted"));
}

#[test]
fn a_pool_fills_up_in_bounded_steps_and_sheds_what_it_should_not_keep() {
    let p = pool_with(30, template(json!({})));
    let mut n = 0;
    let mut suffix = || {
        n += 1;
        format!("{n:08x}")
    };
    let first = pool::plan(
        &p,
        &[],
        &cfg(),
        &SessionPolicy::default(),
        now(),
        &mut suffix,
    );
    assert_eq!(
        first.create.len(),
        pool::MAX_STARTING.min(pool::MAX_CREATES_PER_RECONCILE)
    );
    // While those start, no more are started.
    let starting: Vec<Pod> = first
        .create
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let mut p = ready(p.clone(), &format!("s{i}"), "1");
            p.status.as_mut().expect("status").conditions = None;
            p
        })
        .collect();
    let second = pool::plan(
        &p,
        &starting,
        &cfg(),
        &SessionPolicy::default(),
        now(),
        &mut suffix,
    );
    assert!(second.create.is_empty(), "{}", second.create.len());
    assert!(first.delete.is_empty());
    assert_eq!(first.status.selector, "agentplane.dev/pool=python");
    assert_eq!(first.requeue, pool::WARMING);

    // 3 wanted; 5 exist: 1 outdated, 1 ended, 3 live of which 1 not ready.
    let p = pool_with(2, template(json!({})));
    let mut pods: Vec<Pod> = (0..5)
        .map(|i| {
            ready(
                pool_pod(&p, &format!("{i:08x}"), &cfg()),
                &format!("u{i}"),
                "1",
            )
        })
        .collect();
    pods[0]
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(TEMPLATE_HASH_ANNOTATION.into(), "old".into());
    pods[1].status.as_mut().expect("status").phase = Some("Failed".into());
    pods[2].status.as_mut().expect("status").conditions = None;
    let plan = pool::plan(
        &p,
        &pods,
        &cfg(),
        &SessionPolicy::default(),
        now(),
        &mut suffix,
    );
    let why: Vec<(&str, &str)> = plan
        .delete
        .iter()
        .map(|(_, uid, why)| (uid.as_deref().unwrap_or_default(), *why))
        .collect();
    assert_eq!(
        why,
        [("u0", "outdated"), ("u1", "ended"), ("u2", "surplus")]
    );
    assert!(plan.create.is_empty());
    assert_eq!((plan.status.replicas, plan.status.ready_replicas), (2, 2));

    // A foreign pod carrying the label is neither counted nor deleted.
    let mut foreign = pods[3].clone();
    foreign.metadata.owner_references = None;
    let plan = pool::plan(
        &p,
        &[foreign],
        &cfg(),
        &SessionPolicy::default(),
        now(),
        &mut suffix,
    );
    assert!(plan.delete.is_empty());
    assert_eq!(plan.create.len(), 2);
}

#[test]
fn a_template_the_policy_refuses_runs_no_pods_and_names_the_field() {
    let p = pool_with(3, template(json!({"runtimeClassName": "privileged-ish"})));
    let pods = vec![ready(pool_pod(&p, "00000001", &cfg()), "u1", "1")];
    let plan = pool::plan(&p, &pods, &cfg(), &SessionPolicy::default(), now(), || {
        "x".into()
    });
    assert!(plan.create.is_empty());
    assert_eq!(plan.delete.len(), 1);
    let why = plan.denied.expect("denied");
    assert!(why.starts_with("spec.template.runtimeClassName"), "{why}");
    let c = plan
        .status
        .conditions
        .iter()
        .find(|c| c.type_ == "PolicyAllowed")
        .expect("PolicyAllowed");
    assert_eq!(c.status, "False");
}

#[test]
fn a_cold_pods_spec_hash_is_what_a_claim_records() {
    // The claim records the hash the session would build cold, so the
    // session's later reconciles compare like with like.
    let p = pool_with(1, template(json!({})));
    let s = session(json!({}));
    let pod = claimed(&ready(pool_pod(&p, "0a1b2c3d", &cfg()), "pod-1", "41"), &s);
    let cold = operator::session::pod::build_pod(&s, &cfg());
    assert_eq!(
        pod.annotations().get(SPEC_HASH_ANNOTATION),
        cold.annotations().get(SPEC_HASH_ANNOTATION)
    );
}

#[test]
fn the_pool_name_is_checked_by_its_path() {
    let s = session(json!({"warmPool": "Not_A_Name"}));
    let findings = operator::validation::check_spec(&s.spec);
    assert!(
        findings.errors.iter().any(|f| f.path == "spec.warmPool"),
        "{:?}",
        findings.errors
    );
    let s = session(json!({"warmPool": "python.v2"}));
    assert!(operator::validation::check_spec(&s.spec).is_valid());
}

#[test]
fn of_two_pods_a_session_keeps_the_oldest_and_deletes_the_other() {
    let p = pool_with(1, template(json!({})));
    let s = session(json!({}));
    let mut warm_pod = claimed(&ready(pool_pod(&p, "0a1b2c3d", &cfg()), "w", "1"), &s);
    warm_pod.metadata.creation_timestamp = Some(Time(Timestamp::from_second(900).expect("t")));
    let mut cold = ready(operator::session::pod::build_pod(&s, &cfg()), "c", "1");
    cold.metadata.creation_timestamp = Some(Time(now()));
    // Both operators see the same pods in any order and decide alike.
    for pods in [
        vec![cold.clone(), warm_pod.clone()],
        vec![warm_pod.clone(), cold.clone()],
    ] {
        let (kept, surplus) = warm::pick(pods);
        assert_eq!(kept.and_then(|p| p.metadata.uid).as_deref(), Some("w"));
        assert_eq!(
            surplus,
            vec![("agent-7-sandbox".to_owned(), Some("c".to_owned()))]
        );
    }
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let observed = Observed {
        pod: Some(warm_pod),
        surplus: vec![("agent-7-sandbox".into(), Some("c".into()))],
        ..Observed::default()
    };
    let plan = plan::plan(&s, &observed, &res, &cfg(), now());
    assert_eq!(plan.delete_pods, observed.surplus);
    assert!(
        plan.pod_events
            .iter()
            .any(|e| e.reason == "DeletedSurplusPod")
    );
    // A pod being deleted is not surplus; alone, it is waited for.
    let mut going = cold;
    going.metadata.deletion_timestamp = Some(Time(now()));
    let (kept, surplus) = warm::pick(vec![going]);
    assert!(kept.is_some() && surplus.is_empty());
}
