//! A pool's pod: built by the session wing's builder exactly as a
//! tool-less session's would be (a warm pod must be the pod a session
//! would get, or a claim would hand over something else), then labelled
//! and owned as the pool's.

use std::collections::BTreeMap;

use crds::{AgentSession, AgentWarmPool};
use k8s_openapi::api::core::v1::Pod;
use kube::{Resource, ResourceExt};

use crate::names::{
    POOL_LABEL, SESSION_LABEL, TEMPLATE_HASH_ANNOTATION, WARM_ANNOTATION, pool_label,
};
use crate::sandbox::PodConfig;
use crate::session::claim::{template_hash, template_spec};
use crate::session::pod::build_warm_pod;

/// One new pod of `pool`, named from `suffix` (random, so that names never
/// collide with a pod being deleted): built as a tool-less session would
/// be, then labelled and owned as the pool's.
pub fn pool_pod(pool: &AgentWarmPool, suffix: &str, cfg: &PodConfig) -> Pod {
    let pool_name = pool.name_any();
    // Short enough that `{base}-sandbox` is the pod's name with no digest.
    let head: String = pool_name.chars().take(40).collect();
    let base = format!("{}-{suffix}", head.trim_end_matches(['-', '.']));
    let mut template = AgentSession::new(&base, template_spec(&pool.spec.template));
    template.metadata.namespace = pool.namespace();
    let mut pod = build_warm_pod(&template, cfg);
    let labels = pod.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.remove(SESSION_LABEL);
    labels.insert(POOL_LABEL.to_owned(), pool_label(&pool_name));
    pod.metadata.owner_references = pool.controller_owner_ref(&()).map(|o| vec![o]);
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(
        TEMPLATE_HASH_ANNOTATION.to_owned(),
        template_hash(&pool.spec.template),
    );
    annotations.insert(WARM_ANNOTATION.to_owned(), pool_name);
    pod
}
