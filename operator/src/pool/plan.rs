//! What one reconcile of a warm pool decides, as a pure function of the
//! pool and its unclaimed pods: pods to start, pods to remove, the status.
//!
//! A pool is a standing cost, so every decision errs towards fewer pods: a
//! pod from an older template, a pod that ended, and any pod above
//! `replicas` goes (the not-yet-ready first, since a ready one is what a
//! session is about to claim); new pods are started at most
//! [`MAX_CREATES_PER_RECONCILE`] at a time and with at most
//! [`MAX_STARTING`] not ready, so a pool scaled to its maximum, or drained
//! by a burst of claims, cannot flood the API server or the node.

use std::time::Duration;

use crds::{AgentWarmPool, AgentWarmPoolStatus};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::names::{self, controlled_by};
use crate::policy::{self, SessionPolicy};
use crate::pool::pod::pool_pod;
use crate::resolution::CondSpec;
use crate::sandbox::PodConfig;
use crate::session::claim;
use crate::session::egress;
use crate::session::status;

/// Most pods one reconcile starts.
pub const MAX_CREATES_PER_RECONCILE: usize = 20;
/// Most pods of one pool starting (not ready yet) at once. Starting a pod
/// is the node's most expensive moment; a burst of claims on a large pool
/// must not turn into a burst of pod starts that slows the claims (and
/// every other tenant on the node) down. Like a Deployment's surge.
pub const MAX_STARTING: usize = 10;
/// How soon a pool that is not fully warm is looked at again (pod events
/// and claims also wake it).
pub const WARMING: Duration = Duration::from_secs(5);
/// How soon a full pool is looked at again.
pub const STEADY: Duration = Duration::from_secs(60);

/// Everything one pool reconcile does.
#[derive(Debug, Clone)]
pub struct PoolPlan {
    /// The pool's NetworkPolicy, applied before any pod starts.
    pub network_policy: Option<NetworkPolicy>,
    /// Pods to create.
    pub create: Vec<Pod>,
    /// Pods to delete: (name, UID precondition, why).
    pub delete: Vec<Deletion>,
    pub status: AgentWarmPoolStatus,
    pub requeue: Duration,
    /// A Warning event to publish when the policy refuses the template.
    pub denied: Option<String>,
}

/// Decides one pool reconcile. `pods` are the pods carrying the pool's
/// label; only those the pool controls count. `suffix` names each new pod.
pub fn plan(
    pool: &AgentWarmPool,
    pods: &[Pod],
    cfg: &PodConfig,
    session_policy: &SessionPolicy,
    now: Timestamp,
    mut suffix: impl FnMut() -> String,
) -> PoolPlan {
    let uid = pool.metadata.uid.as_deref();
    let ours = pods.iter().filter(|p| controlled_by(&p.metadata, uid));
    let denied = policy_denial(pool, session_policy);
    let want = if denied.is_some() {
        0
    } else {
        usize::try_from(pool.spec.replicas.clamp(0, crds::pool::MAX_POOL_REPLICAS)).unwrap_or(0)
    };
    let hash = claim::template_hash(&pool.spec.template);
    let (live, delete) = keep_or_delete(ours, &hash, want);
    let missing = want.saturating_sub(live.len());
    let starting = live.iter().filter(|p| !claim::pod_ready(p)).count();
    let room = MAX_STARTING.saturating_sub(starting);
    let create: Vec<Pod> = (0..missing.min(MAX_CREATES_PER_RECONCILE).min(room))
        .map(|_| pool_pod(pool, &suffix(), cfg))
        .collect();
    let ready = live.iter().filter(|p| claim::pod_ready(p)).count();
    let previous = pool
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let specs = conditions(denied.as_deref(), ready, want);
    let status = AgentWarmPoolStatus {
        replicas: i32::try_from(live.len()).unwrap_or(i32::MAX),
        ready_replicas: i32::try_from(ready).unwrap_or(i32::MAX),
        selector: names::pool_selector(&pool.name_any()),
        observed_generation: pool.metadata.generation,
        conditions: status::conditions(&specs, previous, pool.metadata.generation, now),
    };
    PoolPlan {
        network_policy: egress::pool_network_policy(pool, &cfg.egress),
        requeue: if ready >= want && delete.is_empty() {
            STEADY
        } else {
            WARMING
        },
        create,
        delete,
        status,
        denied,
    }
}

/// Why the platform's session policy refuses the pool's template, each
/// finding under its `spec.template` path; `None` when it allows it.
fn policy_denial(pool: &AgentWarmPool, session_policy: &SessionPolicy) -> Option<String> {
    let spec = claim::template_spec(&pool.spec.template);
    let findings = policy::check(&spec, session_policy);
    (!findings.is_empty()).then(|| {
        findings
            .iter()
            .map(|f| {
                format!(
                    "spec.template{}: {}",
                    f.path.trim_start_matches("spec"),
                    f.message
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// Pod deletion as a pool decides it: (name, UID precondition, why).
pub type Deletion = (String, Option<String>, &'static str);

/// Splits the pool's pods into the live ones it keeps and the ones to
/// delete: ended, built from another template, or above `want`.
fn keep_or_delete<'p>(
    ours: impl Iterator<Item = &'p Pod>,
    hash: &str,
    want: usize,
) -> (Vec<&'p Pod>, Vec<Deletion>) {
    let mut delete = Vec::new();
    let mut live: Vec<&Pod> = Vec::new();
    for p in ours {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            delete.push((p.name_any(), p.metadata.uid.clone(), "ended"));
        } else if p
            .annotations()
            .get(names::TEMPLATE_HASH_ANNOTATION)
            .map(String::as_str)
            != Some(hash)
        {
            delete.push((p.name_any(), p.metadata.uid.clone(), "outdated"));
        } else {
            live.push(p);
        }
    }
    if live.len() > want {
        // Not-ready pods first, then the youngest: the oldest ready pods are
        // the ones sessions are most likely claiming right now.
        live.sort_by_key(|p| {
            (
                claim::pod_ready(p),
                std::cmp::Reverse(p.metadata.creation_timestamp.clone().map(|t| t.0)),
            )
        });
        for p in live.drain(..live.len() - want) {
            delete.push((p.name_any(), p.metadata.uid.clone(), "surplus"));
        }
    }
    (live, delete)
}

/// The pool's `PolicyAllowed` and `Ready` conditions.
fn conditions(denied: Option<&str>, ready: usize, want: usize) -> Vec<CondSpec> {
    let allowed = match denied {
        Some(why) => CondSpec {
            type_: "PolicyAllowed",
            status: false,
            reason: "PolicyDenied".into(),
            message: format!("the template asks for what the platform does not allow: {why}"),
        },
        None => CondSpec {
            type_: "PolicyAllowed",
            status: true,
            reason: "Allowed".into(),
            message: "the template is within the platform's session policy".into(),
        },
    };
    let message = format!("{ready} of {want} pods are ready to be claimed");
    let ready = if ready >= want && denied.is_none() {
        CondSpec {
            type_: "Ready",
            status: true,
            reason: "Warm".into(),
            message,
        }
    } else {
        CondSpec {
            type_: "Ready",
            status: false,
            reason: if denied.is_some() {
                "PolicyDenied".into()
            } else {
                "Warming".into()
            },
            message,
        }
    };
    vec![allowed, ready]
}
