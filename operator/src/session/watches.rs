//! The session controller's watches, run from the moment the process
//! starts, whether or not this replica leads.
//!
//! Why: a standby that lists nothing until it takes the lease starts its
//! leadership by listing every session, pod, ConfigMap, claim and
//! NetworkPolicy in the cluster. At ten thousand sessions that list, and the
//! look at every session it triggers, kept new sessions waiting half a
//! minute after the lease had moved. A standby that watches all along
//! holds current caches when it takes over; its first reconcile can start
//! at once. The cost is the standby's memory: it holds the same caches as
//! the leader (docs/architecture.md, "Leader election").
//!
//! While standing by, the watches only keep the stores. The changes they
//! see reach the controller once this replica leads ([`Watches::lead`]): at
//! that moment every stored session is handed over once (urgent ones
//! first, see [`lanes`](crate::session::lanes)), since the previous leader
//! may have left any of them half done, and every later change as it comes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::session::bulk::StatusBulk;
use crate::session::cache;
use crate::session::cache::Caches;
use crate::session::lanes::{self, Lane};
use crate::session::lifecycle;
use crate::session::own_writes::OwnWrites;

/// A watched session: decoded, or the error of one that cannot be.
type Watched = kube::core::DeserializeGuard<crds::AgentSession>;

/// What the watches keep besides their own stores: the session context's
/// caches and records (passed as parts, so that this module does not
/// depend on the controller that depends on it).
#[derive(Clone, Copy)]
pub struct Feeds<'a> {
    pub client: &'a kube::Client,
    pub caches: &'a Caches,
    pub bulk: &'a Arc<StatusBulk>,
    pub own_writes: &'a Arc<OwnWrites>,
    /// Set to the session store once it exists.
    pub sessions: &'a std::sync::OnceLock<Store<Watched>>,
}

impl std::fmt::Debug for Feeds<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feeds").finish_non_exhaustive()
    }
}

/// The label every object the operator makes carries.
const MANAGED: &str = "app.kubernetes.io/managed-by=agentplane";

/// Changes waiting for the controller. The controller's scheduler takes
/// them as fast as they come (it keeps one entry per session); the bound
/// only matters if it stalls, and then it holds the watches back rather
/// than memory growing.
const BACKLOG: usize = 4096;

/// The running watches: the session store, and the changes the controller
/// takes once this replica leads.
pub struct Watches {
    pub sessions: Store<Watched>,
    leading: Arc<AtomicBool>,
    changed: mpsc::Receiver<Watched>,
    owners: mpsc::Receiver<ObjectRef<Watched>>,
    /// The watch tasks; dropping this stops them.
    tasks: JoinSet<()>,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("sessions", &self.sessions.len())
            .field("leading", &self.leading.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// What [`Watches::lead`] hands the controller.
pub struct Triggers {
    /// Sessions whose spec changed (or that were asked to wake).
    pub changed: mpsc::Receiver<Watched>,
    /// Every stored session once, urgent ones first, then the sessions whose
    /// objects changed.
    pub owners: Box<dyn Stream<Item = ObjectRef<Watched>> + Send + Unpin>,
}

impl std::fmt::Debug for Triggers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Triggers").finish_non_exhaustive()
    }
}

impl Watches {
    /// Starts every watch; must run inside the runtime. The caches'
    /// writers are taken here (see [`cache::Caches::take_writers`]); when
    /// someone took them already, the object watches still wake sessions
    /// but fill no cache.
    pub fn start(ctx: Feeds<'_>) -> Self {
        let leading = Arc::new(AtomicBool::new(false));
        let (changed_tx, changed) = mpsc::channel(BACKLOG);
        let (owners_tx, owners) = mpsc::channel(BACKLOG);
        let (sessions, writer) = reflector::store();
        let _ = ctx.sessions.set(sessions.clone());
        let mut tasks = JoinSet::new();
        tasks.spawn(forward(
            session_changes(ctx, writer).filter_map(|r| async move { r.ok() }),
            Arc::clone(&leading),
            changed_tx,
        ));
        let listed = sessions.clone();
        tasks.spawn(async move {
            if listed.wait_until_ready().await.is_ok() {
                tracing::info!(sessions = listed.len(), "the session watch has listed");
            }
        });
        let client = ctx.client.clone();
        let (l, tx) = (&leading, &owners_tx);
        let pods = watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().labels(MANAGED),
        )
        .default_backoff();
        let nps = owned_metadata::<NetworkPolicy>(&client);
        let cms = owned_metadata::<ConfigMap>(&client);
        let pvcs = owned_metadata::<PersistentVolumeClaim>(&client);
        match ctx.caches.take_writers() {
            Some(w) => {
                let caches = ctx.caches.clone();
                let pods = pods
                    .modify(cache::slim)
                    .reflect(w.pods)
                    .inspect_ok(move |event| caches.index_pod_event(event));
                spawn_owned(&mut tasks, owners_of(pods.touched_objects()), l, tx);
                let nps = nps.reflect(w.network_policies).touched_objects();
                spawn_owned(&mut tasks, owners_of(nps), l, tx);
                let cms = cms.reflect(w.configmaps).touched_objects();
                spawn_owned(&mut tasks, owners_of(cms), l, tx);
                let pvcs = pvcs.reflect(w.claims).touched_objects();
                spawn_owned(&mut tasks, owners_of(pvcs), l, tx);
            }
            None => {
                spawn_owned(&mut tasks, owners_of(pods.touched_objects()), l, tx);
                spawn_owned(&mut tasks, owners_of(nps.touched_objects()), l, tx);
                spawn_owned(&mut tasks, owners_of(cms.touched_objects()), l, tx);
                spawn_owned(&mut tasks, owners_of(pvcs.touched_objects()), l, tx);
            }
        }
        Self {
            sessions,
            leading,
            changed,
            owners,
            tasks,
        }
    }

    /// This replica leads from now on: changes flow to the controller, and
    /// every session stored so far is handed over once, urgent ones first.
    /// Sessions the store has not listed yet arrive as changes. Returns
    /// the triggers and the watch tasks, which must live as long as the
    /// controller runs.
    pub fn lead(self) -> (Store<Watched>, Triggers, JoinSet<()>) {
        // First open the gate, then read the store: a change applied to the
        // store before the gate opened is in what is read.
        self.leading.store(true, Ordering::SeqCst);
        let stored = urgent_first(&self.sessions.state());
        tracing::info!(
            sessions = stored.len(),
            "leading: every stored session is looked at once, urgent ones first"
        );
        let owners = tokio_stream::wrappers::ReceiverStream::new(self.owners);
        let triggers = Triggers {
            changed: self.changed,
            owners: Box::new(futures::stream::iter(stored).chain(owners)),
        };
        (self.sessions, triggers, self.tasks)
    }
}

/// The references of `sessions`, urgent ones (not in the background lane,
/// see [`lanes::lane`]) first; an undecodable session counts as urgent
/// (its status says why).
pub fn urgent_first(sessions: &[Arc<Watched>]) -> Vec<ObjectRef<Watched>> {
    let (mut urgent, background): (Vec<_>, Vec<_>) = sessions.iter().partition(|w| {
        w.0.as_ref()
            .map_or(true, |s| lanes::lane(s) != Lane::Background)
    });
    urgent.extend(background);
    urgent
        .into_iter()
        .map(|w| ObjectRef::from_obj(w.as_ref()))
        .collect()
}

/// The sessions that own `meta` (owner references of kind AgentSession in
/// our group), as the controller's triggers: a changed or removed object
/// wakes its session, whose reconcile makes it right again.
pub fn owner_sessions(meta: &ObjectMeta) -> Vec<ObjectRef<Watched>> {
    let Some(ns) = meta.namespace.as_deref() else {
        return Vec::new();
    };
    let group = format!("{}/", crds::GROUP);
    meta.owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == "AgentSession" && o.api_version.starts_with(&group))
        .map(|o| ObjectRef::new(&o.name).within(ns))
        .collect()
}

/// Maps a stream of touched objects to the sessions that own them; watch
/// errors are dropped (the watcher's backoff retries them).
fn owners_of<K, S>(touched: S) -> impl Stream<Item = ObjectRef<Watched>> + Send + 'static
where
    K: Resource + Send + 'static,
    S: Stream<Item = Result<K, watcher::Error>> + Send + 'static,
{
    touched
        .filter_map(|r| async move { r.ok() })
        .flat_map(|obj| futures::stream::iter(owner_sessions(obj.meta())))
}

/// Spawns [`forward`] of one owned kind's triggers.
fn spawn_owned<S>(
    tasks: &mut JoinSet<()>,
    stream: S,
    leading: &Arc<AtomicBool>,
    to: &mpsc::Sender<ObjectRef<Watched>>,
) where
    S: Stream<Item = ObjectRef<Watched>> + Send + 'static,
{
    tasks.spawn(forward(stream, Arc::clone(leading), to.clone()));
}

/// Drives `stream` for as long as the process runs, keeping its store;
/// what it yields goes to the controller only while this replica leads.
async fn forward<T: Send + 'static>(
    stream: impl Stream<Item = T> + Send,
    leading: Arc<AtomicBool>,
    to: mpsc::Sender<T>,
) {
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        if leading.load(Ordering::SeqCst) && to.send(item).await.is_err() {
            // The controller is gone (shutdown): keep nothing waiting.
            return;
        }
    }
}

/// A session is looked at again when its spec changes (generation) or
/// someone asks a suspended one to wake (the wake annotation), not when
/// only its status or other metadata changed.
fn generation_or_wake(session: &Watched) -> Option<u64> {
    use std::hash::{Hash, Hasher};
    let meta = session.meta();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut h);
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(lifecycle::WAKE_ANNOTATION))
        .hash(&mut h);
    Some(h.finish())
}

/// Drops a cached session's managedFields: nothing reads them, and at
/// ten thousand sessions they were a large share of what the session
/// store holds (every writer's field set, as JSON trees).
fn slim_session(session: &mut Watched) {
    match &mut session.0 {
        Ok(s) => s.metadata.managed_fields = None,
        Err(invalid) => invalid.metadata.managed_fields = None,
    }
}

/// A metadata-only watch of the operator's objects of kind `K`: enough to
/// know a session's object changed or went, without caching a toolset's
/// bytes per session.
fn owned_metadata<K>(
    client: &kube::Client,
) -> impl Stream<Item = Result<watcher::Event<PartialObjectMeta<K>>, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<PartialObjectMeta<K>> = Api::all(client.clone());
    watcher(api, watcher::Config::default().labels(MANAGED))
        .default_backoff()
        .modify(|m| m.metadata.managed_fields = None)
}

/// The sessions that need a reconcile, from a watch that also fills the
/// session store (slimmed: see [`slim_session`] and
/// [`crate::session::bulk`]) and keeps the shared status parts and our own
/// writes' records in step with it.
fn session_changes(
    ctx: Feeds<'_>,
    writer: reflector::store::Writer<Watched>,
) -> impl Stream<Item = Result<Watched, watcher::Error>> + Send + 'static {
    // Through the guard, one object that cannot be decoded is reported on
    // its own status instead of failing the list and stalling every session.
    let sessions: Api<Watched> = Api::all(ctx.client.clone());
    let (bulk, bulk_events) = (Arc::clone(ctx.bulk), Arc::clone(ctx.bulk));
    let own_writes = Arc::clone(ctx.own_writes);
    watcher(sessions, watcher::Config::default())
        .default_backoff()
        .modify(move |session| {
            slim_session(session);
            bulk.slim(session);
        })
        .reflect(writer)
        .inspect_ok(move |event| {
            bulk_events.apply(event);
            own_writes.apply(event);
        })
        .applied_objects()
        .predicate_filter(generation_or_wake, Default::default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn an_object_wakes_only_the_sessions_that_own_it() {
        let owner = |api_version: &str, kind: &str, name: &str| OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            ..OwnerReference::default()
        };
        let meta = ObjectMeta {
            namespace: Some("team".into()),
            owner_references: Some(vec![
                owner("agentplane.dev/v1alpha1", "AgentSession", "a"),
                owner("agentplane.dev/v1alpha1", "AgentWarmPool", "pool"),
                owner("other.example/v1", "AgentSession", "elsewhere"),
                owner("agentplane.dev/v1beta1", "AgentSession", "b"),
            ]),
            ..ObjectMeta::default()
        };
        let woken: Vec<String> = owner_sessions(&meta)
            .into_iter()
            .map(|r| format!("{}/{}", r.namespace.unwrap_or_default(), r.name))
            .collect();
        assert_eq!(woken, ["team/a", "team/b"]);
        let cluster_scoped = ObjectMeta {
            namespace: None,
            ..meta
        };
        assert!(owner_sessions(&cluster_scoped).is_empty());
    }

    #[test]
    fn urgent_sessions_are_handed_over_first() {
        let session = |name: &str, ready: bool| {
            let mut v = serde_json::json!({
                "apiVersion": "agentplane.dev/v1alpha1",
                "kind": "AgentSession",
                "metadata": {"name": name, "namespace": "n", "generation": 1},
                "spec": {"image": "img", "tools": [{"type": "agent_toolset_20260401"}]},
            });
            if ready {
                v["status"] = serde_json::json!({"phase": "Ready", "observedGeneration": 1});
            }
            Arc::new(serde_json::from_value::<Watched>(v).expect("a session"))
        };
        let order: Vec<String> = urgent_first(&[
            session("ready-1", true),
            session("new-1", false),
            session("ready-2", true),
            session("new-2", false),
        ])
        .into_iter()
        .map(|r| r.name)
        .collect();
        assert_eq!(order, ["new-1", "new-2", "ready-1", "ready-2"]);
    }
}
