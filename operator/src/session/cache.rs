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

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use crds::AgentSession;
use futures::FutureExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::names::{self, Names, owned_by};

/// The read side: cheap to clone, read by every reconcile.
#[derive(Clone)]
pub struct Caches {
    pods: Store<Pod>,
    configmaps: Store<PartialObjectMeta<ConfigMap>>,
    claims: Store<PartialObjectMeta<PersistentVolumeClaim>>,
    network_policies: Store<PartialObjectMeta<NetworkPolicy>>,
    by_session: Arc<Mutex<SessionIndex>>,
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
            by_session: Arc::default(),
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

/// Drops what a cached pod carries that no reconcile reads: the
/// managed-fields bookkeeping and most of its spec (the scale bench: about
/// 30 KiB of operator memory per cached sandbox pod, most of it spec).
///
/// What a plan reads of a pod's spec is kept, and only that: the toolset
/// volume (which ConfigMap a claimed warm pod mounts), the install
/// container's image (the runner image of a pod from before the built-with
/// annotation), the sandbox container's resources (its memory limit, named
/// in `LimitReached`) and the node. Metadata and status are kept whole. A
/// plan made from a slimmed pod is the plan made from the whole one
/// (operator/tests/plan.rs, `a_cached_pod_plans_like_the_whole_pod`);
/// whoever reads more of the spec must keep it here.
pub fn slim(pod: &mut Pod) {
    use crate::session::pod::{INSTALL_CONTAINER, SANDBOX_CONTAINER, TOOLSET_VOLUME};
    pod.managed_fields_mut().clear();
    let Some(spec) = pod.spec.take() else {
        return;
    };
    let kept = |c: &k8s_openapi::api::core::v1::Container, with_image: bool| {
        k8s_openapi::api::core::v1::Container {
            name: c.name.clone(),
            image: c.image.clone().filter(|_| with_image),
            resources: c.resources.clone().filter(|_| !with_image),
            ..Default::default()
        }
    };
    pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        containers: spec
            .containers
            .iter()
            .filter(|c| c.name == SANDBOX_CONTAINER)
            .map(|c| kept(c, false))
            .collect(),
        init_containers: spec.init_containers.map(|cs| {
            cs.iter()
                .filter(|c| c.name == INSTALL_CONTAINER)
                .map(|c| kept(c, true))
                .collect()
        }),
        volumes: spec.volumes.map(|vs| {
            vs.into_iter()
                .filter(|v| v.name == TOOLSET_VOLUME)
                .collect()
        }),
        node_name: spec.node_name,
        ..Default::default()
    });
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

    /// Every cached pod labelled for `session` that it controls: a claimed
    /// warm pod has the pool's name, and two operators racing may each
    /// have claimed or started one, so the status's pod name alone would
    /// hide the surplus. Found through [`SessionIndex`], not a scan: at ten
    /// thousand pods a scan per reconcile would be the cost this cache
    /// removes.
    pub fn session_pods(&self, ns: &str, session: &AgentSession) -> Vec<Pod> {
        let label = Names::of(session).label;
        let names = self
            .by_session
            .lock()
            .map(|index| index.names(ns, &label))
            .unwrap_or_default();
        names
            .iter()
            .filter_map(|name| self.pod(ns, name))
            .filter(|p| owned_by(&p.metadata, session))
            .filter(|p| p.labels().get(names::SESSION_LABEL) == Some(&label))
            .collect()
    }

    /// Feeds the session index from the pod watch; called with each event
    /// after the store has applied it, so a name in the index is in the
    /// store too, except for a moment after a deletion (and a lookup skips
    /// a name the store no longer holds).
    pub fn index_pod_event(&self, event: &watcher::Event<Pod>) {
        if let Ok(mut index) = self.by_session.lock() {
            index.apply(event);
        }
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

/// Which pods carry each session's label, by namespace: the one question
/// a reconcile asks of the pod cache that a name lookup cannot answer.
/// Kept from the same watch events as the store, with the store's relist
/// semantics (a relist replaces the whole index when it is done).
#[derive(Debug, Default)]
pub struct SessionIndex {
    /// (namespace, session label) -> pod names.
    sessions: HashMap<(String, String), BTreeSet<String>>,
    /// (namespace, pod name) -> its session label, to move or drop it.
    pods: HashMap<(String, String), String>,
    /// The relist under way, swapped in on `InitDone`.
    relist: Option<Box<SessionIndex>>,
}

impl SessionIndex {
    pub fn apply(&mut self, event: &watcher::Event<Pod>) {
        match event {
            watcher::Event::Apply(pod) => self.upsert(pod),
            watcher::Event::Delete(pod) => self.remove(pod),
            watcher::Event::Init => self.relist = Some(Box::default()),
            watcher::Event::InitApply(pod) => {
                if let Some(next) = self.relist.as_mut() {
                    next.upsert(pod);
                }
            }
            watcher::Event::InitDone => {
                if let Some(next) = self.relist.take() {
                    self.sessions = next.sessions;
                    self.pods = next.pods;
                }
            }
        }
    }

    /// The pod names under `label` in `ns`.
    pub fn names(&self, ns: &str, label: &str) -> Vec<String> {
        self.sessions
            .get(&(ns.to_owned(), label.to_owned()))
            .map(|names| names.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn key(pod: &Pod) -> Option<(String, String)> {
        Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
    }

    fn upsert(&mut self, pod: &Pod) {
        self.remove(pod);
        let (Some(key), Some(label)) = (Self::key(pod), pod.labels().get(names::SESSION_LABEL))
        else {
            return;
        };
        self.sessions
            .entry((key.0.clone(), label.clone()))
            .or_default()
            .insert(key.1.clone());
        self.pods.insert(key, label.clone());
    }

    fn remove(&mut self, pod: &Pod) {
        let Some(key) = Self::key(pod) else { return };
        let Some(label) = self.pods.remove(&key) else {
            return;
        };
        let session = (key.0, label);
        if let Some(names) = self.sessions.get_mut(&session) {
            names.remove(&key.1);
            if names.is_empty() {
                self.sessions.remove(&session);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(ns: &str, name: &str, session: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: session.map(|s| [(names::SESSION_LABEL.to_owned(), s.to_owned())].into()),
                ..ObjectMeta::default()
            },
            ..Pod::default()
        }
    }

    #[test]
    fn two_pods_of_one_session_are_both_found() {
        let mut index = SessionIndex::default();
        index.apply(&watcher::Event::Apply(pod(
            "ns",
            "race-1-sandbox",
            Some("race-1"),
        )));
        index.apply(&watcher::Event::Apply(pod("ns", "py-abc", Some("race-1"))));
        index.apply(&watcher::Event::Apply(pod(
            "other",
            "py-abc",
            Some("race-1"),
        )));
        assert_eq!(index.names("ns", "race-1"), ["py-abc", "race-1-sandbox"]);
        assert_eq!(index.names("other", "race-1"), ["py-abc"]);
        assert!(index.names("ns", "race-2").is_empty());
    }

    #[test]
    fn a_relabelled_or_deleted_pod_leaves_its_session() {
        let mut index = SessionIndex::default();
        index.apply(&watcher::Event::Apply(pod("ns", "p", Some("a"))));
        index.apply(&watcher::Event::Apply(pod("ns", "p", Some("b"))));
        assert!(index.names("ns", "a").is_empty());
        assert_eq!(index.names("ns", "b"), ["p"]);
        index.apply(&watcher::Event::Apply(pod("ns", "p", None)));
        assert!(index.names("ns", "b").is_empty());
        index.apply(&watcher::Event::Apply(pod("ns", "q", Some("b"))));
        index.apply(&watcher::Event::Delete(pod("ns", "q", Some("b"))));
        assert!(index.names("ns", "b").is_empty());
        assert!(index.pods.is_empty() && index.sessions.is_empty());
    }

    #[test]
    fn a_relist_replaces_the_index_when_done() {
        let mut index = SessionIndex::default();
        index.apply(&watcher::Event::Apply(pod("ns", "gone", Some("a"))));
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(pod("ns", "kept", Some("a"))));
        // Until the relist is done the index answers as before it.
        assert_eq!(index.names("ns", "a"), ["gone"]);
        index.apply(&watcher::Event::InitDone);
        assert_eq!(index.names("ns", "a"), ["kept"]);
    }
}
