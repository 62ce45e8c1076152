//! The session controller's caches of the objects it makes: its pods
//! (whole, less their managed fields) and the metadata of its ConfigMaps,
//! claims and NetworkPolicies, fed by the watches that already wake a
//! session when one of them changes.
//!
//! Why: at ten thousand sessions every periodic resync read four objects
//! from the API server per session, although the same watches had just
//! delivered them (the scale bench measured ~130 requests/s at idle). A
//! reconcile now reads these caches first and asks the API server only
//! about what the cache does not hold, so a miss -- a watch that has not
//! caught up with an object made a moment ago -- costs the read it always
//! did, and a hit costs nothing. A hit may be a little old; every action
//! taken on it is idempotent or guarded by a UID precondition, and the
//! watch event that makes it current wakes the session again.
//!
//! Before every cache has listed once, reconciles read the API server as
//! they did before.

use std::sync::Mutex;

use crds::AgentSession;
use futures::FutureExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::{Resource, ResourceExt};

use crate::names::{self, Names, owned_by};

/// The read side: cheap to clone, read by every reconcile.
#[derive(Clone)]
pub struct Caches {
    pods: Store<Pod>,
    configmaps: Store<PartialObjectMeta<ConfigMap>>,
    claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
    network_policies: Store<PartialObjectMeta<NetworkPolicy>>,
    writers: std::sync::Arc<Mutex<Option<Writers>>>,
}

/// The write side, taken once by the controller's watches.
pub struct Writers {
    pub pods: Writer<Pod>,
    pub configmaps: Writer<PartialObjectMeta<ConfigMap>>,
    pub claims: Writer<PartialObjectMeta<PersistentVolumeClaim>>,
    pub network_policies: Writer<PartialObjectMeta<NetworkPolicy>>,
}

impl std::fmt::Debug for Writers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writers").finish_non_exhaustive()
    }
}

impl Default for Caches {
    fn default() -> Self {
        let (pods, pods_w) = reflector::store();
        let (configmaps, configmaps_w) = reflector::store();
        let (claims, claims_w) = reflector::store();
        let (network_policies, network_policies_w) = reflector::store();
        Self {
            pods,
            configmaps,
            claims,
            network_policies,
            writers: std::sync::Arc::new(Mutex::new(Some(Writers {
                pods: pods_w,
                configmaps: configmaps_w,
                claims: claims_w,
                network_policies: network_policies_w,
            }))),
        }
    }
}

impl std::fmt::Debug for Caches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caches")
            .field("ready", &self.ready())
            .field("pods", &self.pods.len())
            .finish_non_exhaustive()
    }
}

/// Drops what a pod carries that no reconcile reads and that is a large
/// part of its size: the managed-fields bookkeeping.
pub fn slim(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
}

impl Caches {
    /// The writers; the first caller (the controller's watches) gets them.
    /// While nobody has taken them, or before each cache has listed once,
    /// [`Caches::ready`] is false and reconciles read the API server.
    pub fn take_writers(&self) -> Option<Writers> {
        crate::context::take(&self.writers)
    }

    /// Whether every cache has listed once (never blocks).
    pub fn ready(&self) -> bool {
        fn listed<K>(store: &Store<K>) -> bool
        where
            K: Resource + Clone + 'static,
            K::DynamicType: std::hash::Hash + Eq + Clone,
        {
            matches!(store.wait_until_ready().now_or_never(), Some(Ok(())))
        }
        listed(&self.pods)
            && listed(&self.configmaps)
            && listed(&self.claims)
            && listed(&self.network_policies)
    }

    /// The cached pod `ns/name`.
    pub fn pod(&self, ns: &str, name: &str) -> Option<Pod> {
        self.pods
            .get(&ObjectRef::new(name).within(ns))
            .map(|p| p.as_ref().clone())
    }

    /// The cached pod the session's status names (a claimed warm pod has
    /// the pool's name), when the session controls it. A lookup by name,
    /// not a scan: at ten thousand pods a scan per reconcile would be the
    /// cost this cache removes.
    pub fn recorded_pod(&self, ns: &str, session: &AgentSession) -> Option<Pod> {
        let name = session.status.as_ref()?.pod_name.as_deref()?;
        self.pod(ns, name)
            .filter(|p| owned_by(&p.metadata, session))
            .filter(|p| p.labels().get(names::SESSION_LABEL) == Some(&Names::of(session).label))
    }

    pub fn configmap(&self, ns: &str, name: &str) -> Option<ObjectMeta> {
        meta(&self.configmaps, ns, name)
    }

    pub fn claim(&self, ns: &str, name: &str) -> Option<ObjectMeta> {
        meta(&self.claims, ns, name)
    }

    pub fn network_policy(&self, ns: &str, name: &str) -> Option<ObjectMeta> {
        meta(&self.network_policies, ns, name)
    }
}

fn meta<K>(store: &Store<PartialObjectMeta<K>>, ns: &str, name: &str) -> Option<ObjectMeta>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    store
        .get(&ObjectRef::new(name).within(ns))
        .map(|m| m.metadata.clone())
}
