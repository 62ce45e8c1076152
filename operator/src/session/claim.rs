//! Warm pools as pure data: which session a pool can serve, the pods a pool
//! keeps, and the one patch that hands a pod from a pool to a session.
//!
//! A claim must never bind one pod to two sessions, whatever the operator
//! does between its API calls (it may be killed after any of them, and two
//! replicas may overlap during a leader change). So a claim is a single
//! merge patch carrying the pod's `resourceVersion` as its precondition:
//! it moves the pod's controller reference from the pool to the session,
//! swaps the pool label for the session's labels, and records the hash of
//! the pod the session would have built cold. Two claims on one pod cannot
//! both succeed (the second sees a newer version and gets 409), and a claim
//! either happened whole or not at all. Everything after it -- writing the
//! session's toolset and binding into the pod's ConfigMap, nudging the
//! kubelet -- is idempotent and repeated by the next reconcile if cut off.

use std::collections::BTreeMap;

use crds::{AgentSession, AgentSessionSpec, AgentWarmPool, WarmPoolTemplate};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{Resource, ResourceExt};
use runner_api::{BINDING_FILE, Binding, BoundEnv};
use sha2::{Digest, Sha256};
use toolset::ResolvedToolset;

use crate::names::{
    Names, POOL_LABEL, SESSION_LABEL, SPEC_HASH_ANNOTATION, TEMPLATE_HASH_ANNOTATION,
    WARM_ANNOTATION, controlled_by, pool_label,
};
use crate::resolution::CondSpec;
use crate::sandbox::PodConfig;
use crate::session::pod;

/// A stable digest of a pool's template.
pub fn template_hash(template: &WarmPoolTemplate) -> String {
    let bytes = serde_json::to_vec(template).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..8])
}

/// The pool's template as a session spec without tools: what the pool's
/// pods are built from, and what the session policy is checked against.
pub fn template_spec(template: &WarmPoolTemplate) -> AgentSessionSpec {
    template.session_spec()
}

/// Whether `pod` started in a warm pool (claimed or not).
pub fn is_warm(pod: &Pod) -> bool {
    pod.annotations().contains_key(WARM_ANNOTATION)
}

/// Whether a pod's Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Whether `pod` is an unclaimed pod of `pool` built from its current
/// template, ready to serve: the only pods a session may claim.
pub fn claimable(pod: &Pod, pool: &AgentWarmPool) -> bool {
    controlled_by(&pod.metadata, pool.metadata.uid.as_deref())
        && pod.metadata.deletion_timestamp.is_none()
        && pod.labels().get(POOL_LABEL) == Some(&pool_label(&pool.name_any()))
        && !pod.labels().contains_key(SESSION_LABEL)
        && pod.annotations().get(TEMPLATE_HASH_ANNOTATION)
            == Some(&template_hash(&pool.spec.template))
        && pod_ready(pod)
}

/// Why `spec` cannot be served by a pod of `template`: the first field that
/// differs, by its path in the session. `None` when a pool's pod is exactly
/// what the session would get cold, less what is bound late (the toolset,
/// plain environment values, the session's name).
pub fn mismatch(spec: &AgentSessionSpec, template: &WarmPoolTemplate) -> Option<String> {
    let differs = |path: &str, ours: String, theirs: String| {
        Some(format!(
            "{path} ({ours}) is not the pool template's ({theirs}); a pod cannot change it once it runs"
        ))
    };
    if spec.image != template.image {
        return differs("spec.image", spec.image.clone(), template.image.clone());
    }
    if spec.workdir != template.workdir {
        return differs(
            "spec.workdir",
            spec.workdir.clone(),
            template.workdir.clone(),
        );
    }
    if spec.resources != template.resources {
        return differs(
            "spec.resources",
            show(&spec.resources),
            show(&template.resources),
        );
    }
    if spec.runtime_class_name != template.runtime_class_name {
        return differs(
            "spec.runtimeClassName",
            show(&spec.runtime_class_name),
            show(&template.runtime_class_name),
        );
    }
    if spec.node_selector != template.node_selector {
        return differs(
            "spec.nodeSelector",
            show(&spec.node_selector),
            show(&template.node_selector),
        );
    }
    if spec.tolerations != template.tolerations {
        return differs(
            "spec.tolerations",
            show(&spec.tolerations),
            show(&template.tolerations),
        );
    }
    if let Some(why) = workspace_mismatch(spec, template) {
        return Some(why);
    }
    if let Some(l) = &spec.lifetime {
        let runner_flags = [
            ("activeDeadlineSeconds", l.active_deadline_seconds),
            ("idleTimeoutSeconds", l.idle_timeout_seconds),
            ("idleSuspendSeconds", l.idle_suspend_seconds),
        ];
        if let Some((field, _)) = runner_flags.iter().find(|(_, v)| v.is_some()) {
            return Some(format!(
                "spec.lifetime.{field} is fixed when a pod starts; a warm pool's pods run without it"
            ));
        }
    }
    if spec.suspended.is_some() {
        return Some(
            "spec.suspended needs a persistent workspace, which a warm pool's pods do not have"
                .into(),
        );
    }
    spec.env.iter().enumerate().find_map(|(i, e)| {
        let reference = e.value_from.is_some();
        (reference && !template.env.contains(e)).then(|| {
            format!(
                "spec.env[{i}].valueFrom is resolved by the kubelet when a pod starts, so it cannot be bound to a running pod (unless the pool's template has the same entry)"
            )
        })
    })
}

fn workspace_mismatch(spec: &AgentSessionSpec, template: &WarmPoolTemplate) -> Option<String> {
    let ours = match &spec.workspace {
        Some(w) if w.volume_claim_template.is_some() => {
            return Some(
                "spec.workspace.volumeClaimTemplate: a persistent workspace belongs to its session and cannot be made ahead of it"
                    .into(),
            );
        }
        Some(w) => w.empty_dir.as_ref().and_then(|e| e.size_limit.clone()),
        None => None,
    };
    let theirs = template
        .empty_dir
        .as_ref()
        .and_then(|e| e.size_limit.clone());
    (ours != theirs).then(|| {
        format!(
            "spec.workspace.emptyDir.sizeLimit ({}) is not the pool template's ({})",
            ours.map_or_else(|| "unset".to_owned(), |q| q.0),
            theirs.map_or_else(|| "unset".to_owned(), |q| q.0)
        )
    })
}

/// A value for a message: compact JSON, "unset" for nothing, long values
/// cut.
fn show<T: serde::Serialize>(v: &T) -> String {
    let s = serde_json::to_string(v).unwrap_or_default();
    if s == "null" || s == "{}" || s == "[]" {
        return "unset".into();
    }
    toolset::truncate_runes(&s, 120).to_string()
}

/// What the claimed pod's runner is told besides the toolset.
pub fn binding(session: &AgentSession) -> Binding {
    Binding {
        session: session.name_any(),
        env: session
            .spec
            .env
            .iter()
            .filter(|e| e.value_from.is_none())
            .map(|e| BoundEnv {
                name: e.name.clone(),
                value: e.value.clone().unwrap_or_default(),
            })
            .collect(),
    }
}

/// The name of the ConfigMap a pod mounts as its toolset.
pub fn toolset_configmap_name(pod: &Pod) -> Option<String> {
    pod.spec
        .as_ref()?
        .volumes
        .as_ref()?
        .iter()
        .find(|v| v.name == crate::session::pod::TOOLSET_VOLUME)?
        .config_map
        .as_ref()
        .map(|c| c.name.clone())
}

/// The claimed pod's toolset ConfigMap: the session's toolset and its
/// binding, owned by the session (like a cold session's).
pub fn bound_configmap(
    session: &AgentSession,
    resolved: &ResolvedToolset,
    pod: &Pod,
) -> Option<ConfigMap> {
    let name = toolset_configmap_name(pod)?;
    let mut cm = pod::toolset_configmap_named(session, resolved, name);
    let binding = serde_json::to_string_pretty(&binding(session)).unwrap_or_default();
    cm.data
        .get_or_insert_with(BTreeMap::new)
        .insert(BINDING_FILE.to_owned(), binding);
    Some(cm)
}

/// The hash [`BOUND_ANNOTATION`] records for a ConfigMap's data.
pub fn data_hash(cm: &ConfigMap) -> String {
    let bytes = serde_json::to_vec(&cm.data).unwrap_or_default();
    hex::encode(&Sha256::digest(&bytes)[..8])
}

/// The claim: one merge patch, preconditioned on the pod's resourceVersion,
/// that makes the session the pod's controller, gives it the session's
/// labels instead of the pool's, and records the spec hash of the pod the
/// session would have built (so that a later change of the session's spec
/// replaces the pod as it would a cold one). `None` for a pod without a
/// resourceVersion or a session without a UID (nothing to precondition on).
pub fn claim_patch(
    pod: &Pod,
    session: &AgentSession,
    cfg: &PodConfig,
) -> Option<serde_json::Value> {
    let rv = pod.metadata.resource_version.as_deref()?;
    let owner = session.controller_owner_ref(&())?;
    let mut labels: serde_json::Map<String, serde_json::Value> = Names::of(session)
        .labels()
        .into_iter()
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    labels.insert(POOL_LABEL.to_owned(), serde_json::Value::Null);
    let built = pod::build_pod(session, &pod::config_of(pod, cfg));
    let hash = built
        .annotations()
        .get(SPEC_HASH_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    Some(serde_json::json!({
        "metadata": {
            "resourceVersion": rv,
            "labels": labels,
            "ownerReferences": [owner],
            "annotations": { SPEC_HASH_ANNOTATION: hash },
        }
    }))
}

/// Which of the pods a session controls it runs in, and which are surplus.
/// Two operator replicas that overlap (a leader change) can both act on a
/// session that has no pod: one claims a warm pod while the other starts a
/// cold one. Both must then keep the same pod and delete the other, so the
/// rule depends only on the pods: the oldest live pod (by creation, then
/// name) is kept -- a warm pod, started before the session existed, wins
/// over a cold one. With no live pod, a pod being deleted is returned so
/// that the plan waits for it.
pub fn pick(mut pods: Vec<Pod>) -> (Option<Pod>, Vec<(String, Option<String>)>) {
    pods.sort_by(|a, b| {
        let key = |p: &Pod| {
            (
                p.metadata.deletion_timestamp.is_some(),
                p.metadata.creation_timestamp.clone().map(|t| t.0),
                p.name_any(),
            )
        };
        key(a).cmp(&key(b))
    });
    let mut it = pods.into_iter();
    let Some(first) = it.next() else {
        return (None, Vec::new());
    };
    let surplus = it
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.name_any(), p.metadata.uid.clone()))
        .collect();
    (Some(first), surplus)
}

/// `WarmPool=True` for a session running in `pod`, when `pod` started in a
/// pool. Derived from the pod rather than remembered, so a reconcile that
/// reads an older copy of the session's status still writes it.
pub fn claimed_condition(pod: &Pod) -> Option<CondSpec> {
    let pool = pod.annotations().get(WARM_ANNOTATION)?;
    Some(CondSpec {
        type_: "WarmPool",
        status: true,
        reason: "Claimed".into(),
        message: format!(
            "claimed warm pod {} from AgentWarmPool {pool}",
            pod.name_any()
        ),
    })
}
