//! What every reconciler shares: the client, the platform's settings, one
//! event recorder, the failure back-off, the field manager that applies
//! everything, and the one delete that never removes an object it did not
//! observe. Also the hand-off between the session and pool reconcilers (a
//! claim takes pods from the pool controller's cache and wakes it to
//! replenish), kept here so that neither wing imports the other.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use crds::AgentWarmPool;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::api::{DeleteParams, PatchParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::{Api, Client, Resource};

use crate::error::Result;
use crate::policy::SessionPolicy;
use crate::sandbox::PodConfig;

/// The field manager of everything the operator applies.
pub const MANAGER: &str = crate::names::FIELD_MANAGER;

/// The longest a failing object waits before the next attempt.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Pool wake-ups queued at most.
const POOL_WAKES: usize = 1024;

/// Objects whose failure counts are remembered at most; past it the map is
/// cleared (objects deleted while failing never report a success).
const MAX_TRACKED_FAILURES: usize = 10_000;

/// One event to publish: Normal or Warning, a reason, a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub warning: bool,
    pub reason: String,
    pub message: String,
}

impl Note {
    pub fn normal(reason: &str, message: String) -> Self {
        Self {
            warning: false,
            reason: reason.into(),
            message,
        }
    }

    pub fn warning(reason: &str, message: String) -> Self {
        Self {
            warning: true,
            reason: reason.into(),
            message,
        }
    }
}

/// The wait before the next try after `failures` consecutive failures:
/// 2 s, 4 s, 8 s ... at most [`MAX_BACKOFF`].
pub fn backoff(failures: u32) -> Duration {
    let secs = 2u64.saturating_pow(failures.clamp(1, 16));
    Duration::from_secs(secs).min(MAX_BACKOFF)
}

/// Counts consecutive failed reconciles per object, once per failure.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        locked(&self.failures)
    }

    /// Records one failure of `key`; how long to wait before the next try.
    pub fn failed(&self, key: &str) -> Duration {
        let mut map = self.map();
        if map.len() >= MAX_TRACKED_FAILURES && !map.contains_key(key) {
            map.clear();
        }
        let n = map.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        backoff(*n)
    }

    /// Forgets `key`'s failures after a reconcile that succeeded.
    pub fn succeeded(&self, key: &str) {
        self.map().remove(key);
    }
}

/// `namespace/name` of an object, for logs and the back-off's keys.
pub fn key(object: &impl Resource) -> String {
    format!(
        "{}/{}",
        object.meta().namespace.as_deref().unwrap_or_default(),
        object.meta().name.as_deref().unwrap_or_default()
    )
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub pods: PodConfig,
    /// What the platform lets sessions ask for.
    pub policy: SessionPolicy,
    /// One recorder for every event, so repeated events are aggregated into
    /// series instead of each creating an object.
    recorder: Recorder,
    pub backoff: Backoff,
    /// Pools a claim just took a pod from, for the pool controller to
    /// replenish at once (a claimed pod leaves the pool's watch as the
    /// session's, so no pool event says so).
    pool_wake: tokio::sync::mpsc::Sender<ObjectRef<AgentWarmPool>>,
    pool_wakes: Mutex<Option<tokio::sync::mpsc::Receiver<ObjectRef<AgentWarmPool>>>>,
    /// Every pool's unclaimed pods, as the pool controller's watch sees
    /// them: a claim picks its candidates here instead of listing the pool
    /// (a burst of claims on a large pool would list it once per claim).
    /// It may lag; a stale pod only costs a 409 and the next candidate.
    pub pool_pods: reflector::Store<Pod>,
    /// The pool controller's cache of pools, once it runs.
    pub pools: std::sync::OnceLock<reflector::Store<AgentWarmPool>>,
    /// Runner certificates, when a gateway is installed: every namespace a
    /// sandbox pod is made in gets its Secret first.
    pub runner_tls: std::sync::OnceLock<std::sync::Arc<crate::tls_secrets::RunnerTls>>,
    pool_pods_writer: Mutex<Option<reflector::store::Writer<Pod>>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("pods", &self.pods)
            .field("backoff", &self.backoff)
            .finish_non_exhaustive()
    }
}

pub(crate) fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    locked(slot).take()
}

/// The guard of `m`, poisoned or not: what the operator keeps under its
/// mutexes (records, counters) stays usable after a panic elsewhere.
pub(crate) fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(poisoned) => poisoned.into_inner(),
    }
}

impl Context {
    pub fn new(client: Client, pods: PodConfig, policy: SessionPolicy) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let (pool_wake, wakes) = tokio::sync::mpsc::channel(POOL_WAKES);
        let (pool_pods, writer) = reflector::store();
        Self {
            pool_pods,
            pools: std::sync::OnceLock::new(),
            runner_tls: std::sync::OnceLock::new(),
            pool_pods_writer: Mutex::new(Some(writer)),
            pool_wake,
            pool_wakes: Mutex::new(Some(wakes)),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            pods,
            policy,
            backoff: Backoff::default(),
        }
    }

    /// Makes sure `ns` holds the runner certificate a sandbox pod made now
    /// would mount (a pod whose Secret is missing does not start).
    pub async fn ensure_runner_tls(&self, ns: &str) -> Result<()> {
        match self.runner_tls.get() {
            Some(tls) if self.pods.gateway => tls.ensure(&self.client, ns).await,
            _ => Ok(()),
        }
    }

    /// Asks the pool controller to look at `pool` now. A full queue drops
    /// the request: the pool's own requeue comes soon anyway.
    pub fn wake_pool(&self, pool: &AgentWarmPool) {
        let _ = self.pool_wake.try_send(ObjectRef::from_obj(pool));
    }

    /// The stream of pool wake-ups; the first caller gets it.
    pub fn take_pool_wakes(&self) -> Option<tokio::sync::mpsc::Receiver<ObjectRef<AgentWarmPool>>> {
        take(&self.pool_wakes)
    }

    /// The writer of [`Context::pool_pods`]; the first caller (the pool
    /// controller's watch) gets it.
    pub fn take_pool_pods_writer(&self) -> Option<reflector::store::Writer<Pod>> {
        take(&self.pool_pods_writer)
    }

    /// Publishes an event about any object (a session, a pool, a session
    /// that cannot be decoded).
    pub async fn publish_on(&self, reference: &ObjectReference, note: &Note) {
        let event = Event {
            type_: if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: note.reason.clone(),
            note: Some(note.message.clone()),
            action: "Reconcile".into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, reference).await {
            tracing::warn!(error = %e, "cannot publish event");
        }
    }

    /// Publishes an event about `object`.
    pub async fn publish<K: Resource<DynamicType = ()>>(&self, object: &K, note: &Note) {
        self.publish_on(&object.object_ref(&()), note).await;
    }
}

/// Server-side apply as the operator's one field manager, taking over
/// fields another manager set (the operator's objects are its own).
pub fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// Deletes `name` only if it is still the object that was observed: its UID
/// (and, when given, its resourceVersion) are the delete's preconditions.
/// Already gone or replaced since (404, 409) is not an error -- the next
/// reconcile sees what is there now. Whether this call deleted it.
pub async fn delete_exactly<K>(
    api: &Api<K>,
    name: &str,
    uid: Option<String>,
    resource_version: Option<String>,
) -> Result<bool>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid,
            resource_version,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}
