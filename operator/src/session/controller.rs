//! The reconciler: one AgentSession in, its ConfigMap, claim and sandbox
//! pod applied, its status written, events published.
//!
//! Everything is applied with server-side apply under one field manager, so
//! a reconcile interrupted anywhere converges on the next one: names are
//! deterministic, and applying what already exists changes nothing. There
//! is no finalizer: owner references let the garbage collector remove the
//! pod, ConfigMap and claim with the session, and there is nothing else to
//! clean.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crds::{AgentSession, AgentSessionSpec, AgentWarmPool};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::DeserializeGuard;
use kube::runtime::Controller;
use kube::runtime::controller::{self, Action};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};
use opentelemetry::trace::{Span, Status, Tracer};

use crate::error::{Error, Result};
use crate::mcp::client::McpClient;
use crate::mcp::destinations::Destinations;
use crate::names::{Names, Scheme};
use crate::policy::{self, SessionPolicy};
use crate::resolution::CondSpec;
use crate::resolution::{self, Listings, Resolution};
use crate::session::claim as warm;
use crate::session::egress;
use crate::session::lifecycle;
use crate::session::plan::{self, Note, Observed, Plan, PodAction};
use crate::session::pod::{self, PodConfig};
use crate::session::unreadable;
use crate::validation;
use toolset::Entries;

/// The field manager of everything the operator applies.
pub const MANAGER: &str = "agentplane-operator";

/// Counts consecutive failed reconciles per session, once per failure.
#[derive(Debug, Default)]
pub struct Backoff {
    failures: Mutex<HashMap<String, u32>>,
}

/// Sessions whose failure counts are remembered at most; past it the map is
/// cleared (sessions deleted while failing never report a success).
const MAX_TRACKED_FAILURES: usize = 10_000;

impl Backoff {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        match self.failures.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Records one failure of `key`; how long to wait before the next try.
    pub fn failed(&self, key: &str) -> Duration {
        let mut map = self.map();
        if map.len() >= MAX_TRACKED_FAILURES && !map.contains_key(key) {
            map.clear();
        }
        let n = map.entry(key.to_owned()).or_insert(0);
        *n = n.saturating_add(1);
        plan::backoff(*n)
    }

    /// Forgets `key`'s failures after a reconcile that succeeded.
    pub fn succeeded(&self, key: &str) {
        self.map().remove(key);
    }
}

/// The reconcile metrics, built once rather than per reconcile.
#[derive(Debug)]
struct Metrics {
    duration: Histogram<f64>,
    errors: Counter<u64>,
}

impl Metrics {
    fn new() -> Self {
        let meter = opentelemetry::global::meter("agentplane-operator");
        Self {
            duration: meter
                .f64_histogram("agentplane.reconcile.duration")
                .with_unit("s")
                .with_description("Duration of one AgentSession reconcile")
                .build(),
            errors: meter.u64_counter("agentplane.reconcile.errors").build(),
        }
    }
}

/// What every reconcile shares. Built after telemetry is installed, so the
/// instruments are bound to the real meter provider.
pub struct Context {
    pub client: Client,
    pub pods: PodConfig,
    pub mcp_timeout: Duration,
    /// What the platform lets sessions ask for.
    pub policy: SessionPolicy,
    /// Where MCP listings may connect.
    pub mcp_destinations: Arc<Destinations>,
    /// One recorder for every event, so repeated events are aggregated into
    /// series instead of each creating an object.
    recorder: Recorder,
    metrics: Metrics,
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

impl Context {
    pub fn new(
        client: Client,
        pods: PodConfig,
        mcp_timeout: Duration,
        policy: SessionPolicy,
        mcp_destinations: Destinations,
    ) -> Self {
        let reporter = Reporter {
            controller: MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        };
        let (pool_wake, wakes) = tokio::sync::mpsc::channel(POOL_WAKES);
        let (pool_pods, writer) = reflector::store();
        Self {
            pool_pods,
            pools: std::sync::OnceLock::new(),
            pool_pods_writer: Mutex::new(Some(writer)),
            pool_wake,
            pool_wakes: Mutex::new(Some(wakes)),
            recorder: Recorder::new(client.clone(), reporter),
            client,
            pods,
            mcp_timeout,
            policy,
            mcp_destinations: Arc::new(mcp_destinations),
            metrics: Metrics::new(),
            backoff: Backoff::default(),
        }
    }

    /// Asks the pool controller to look at `pool` now. A full queue drops
    /// the request: the pool's own requeue comes soon anyway.
    fn wake_pool(&self, pool: &AgentWarmPool) {
        let _ = self.pool_wake.try_send(ObjectRef::from_obj(pool));
    }

    /// The stream of pool wake-ups; the first caller gets it.
    pub fn take_pool_wakes(&self) -> Option<tokio::sync::mpsc::Receiver<ObjectRef<AgentWarmPool>>> {
        match self.pool_wakes.lock() {
            Ok(mut w) => w.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        }
    }

    /// The writer of [`Context::pool_pods`]; the first caller (the pool
    /// controller's watch) gets it.
    pub fn take_pool_pods_writer(&self) -> Option<reflector::store::Writer<Pod>> {
        match self.pool_pods_writer.lock() {
            Ok(mut w) => w.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        }
    }

    /// Publishes an event about any object (a session, a pool, a session
    /// that cannot be decoded).
    pub async fn publish_on(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        note: &Note,
    ) {
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

    async fn publish(&self, session: &AgentSession, note: &Note) {
        self.publish_on(&session.object_ref(&()), note).await;
    }
}

/// A watched session: decoded, or the error of one that cannot be (see
/// [`unreadable`]).
pub type Watched = DeserializeGuard<AgentSession>;

fn key(session: &impl Resource) -> String {
    format!(
        "{}/{}",
        session.meta().namespace.as_deref().unwrap_or_default(),
        session.meta().name.as_deref().unwrap_or_default()
    )
}

/// Lists every MCP server the session's toolsets use.
async fn list_servers(ctx: &Context, spec: &AgentSessionSpec, entries: &Entries) -> Listings {
    let mut out = Listings::new();
    for (server, url) in resolution::servers_to_list(spec, entries) {
        let listed = match McpClient::new(&server, &url, ctx.mcp_timeout, &ctx.mcp_destinations) {
            Ok(client) => client.list_tools().await,
            Err(e) => Err(e),
        };
        let listed = listed.map_err(|e| match e {
            Error::Mcp { message, .. } => format!("{url}: {message}"),
            other => other.to_string(),
        });
        out.insert(server, listed);
    }
    out
}

/// Reconciles one session.
pub async fn reconcile(watched: Arc<Watched>, ctx: Arc<Context>) -> Result<Action> {
    let session = match &watched.0 {
        Ok(session) => session,
        Err(invalid) => return unreadable_session(&ctx, &invalid.metadata, &invalid.error).await,
    };
    let tracer = opentelemetry::global::tracer("agentplane-operator");
    let mut span = tracer.start("reconcile AgentSession");
    span.set_attribute(KeyValue::new(
        "k8s.namespace.name",
        session.namespace().unwrap_or_default(),
    ));
    span.set_attribute(KeyValue::new("agentplane.session", session.name_any()));
    let started = Instant::now();
    let result = reconcile_inner(session, &ctx).await;
    let outcome = if result.is_ok() { "ok" } else { "error" };
    ctx.metrics.duration.record(
        started.elapsed().as_secs_f64(),
        &[KeyValue::new("outcome", outcome)],
    );
    match &result {
        Ok(_) => ctx.backoff.succeeded(&key(session)),
        Err(e) => {
            ctx.metrics.errors.add(1, &[]);
            span.set_status(Status::error(e.to_string()));
        }
    }
    span.end();
    result
}

async fn reconcile_inner(session: &AgentSession, ctx: &Context) -> Result<Action> {
    if session.metadata.deletion_timestamp.is_some() {
        // Owner references hand the pod, ConfigMap and claim to the garbage
        // collector; nothing is left to do.
        return Ok(Action::await_change());
    }
    let ns = session
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let entries = validation::entries(&session.spec);
    // The webhook may not have run: the policy is checked again here, and
    // an invalid or denied spec reaches no server (its URLs were never
    // admitted) and runs no pod.
    let denied = policy::check(&session.spec, &ctx.policy);
    let findings = validation::check(&session.spec, &entries);
    let listings = if denied.is_empty() && findings.is_valid() {
        list_servers(ctx, &session.spec, &entries).await
    } else {
        Listings::new()
    };
    let mut res = resolution::resolve_checked(&session.spec, &entries, findings, &listings);
    resolution::apply_policy(&mut res, &denied);
    let named;
    let session = match earlier_scheme(ctx, &ns, session).await? {
        Some(scheme) => {
            let mut s = session.clone();
            s.status.get_or_insert_with(Default::default).object_names = scheme.recorded();
            named = s;
            &named
        }
        None => session,
    };
    let mut observed = observe(ctx, &ns, session, &res).await?;
    let now = Timestamp::now();
    let wants_pod = res.runner.is_some()
        && matches!(
            lifecycle::stage(session, None, now),
            lifecycle::Stage::Running
        );
    if observed.pod.is_none()
        && wants_pod
        && let Some(pool) = session.spec.warm_pool.as_deref()
    {
        match claim(ctx, &ns, session, pool).await? {
            Ok(pod) => observed.pod = Some(pod),
            Err(cold) => observed.warm = Some(cold),
        }
    }
    let mut plan = plan::plan(session, &observed, &res, &ctx.pods, now);
    let applied = carry_out(ctx, &ns, &plan).await;
    let previous = session.status.as_ref();
    if let Err(e) = &applied {
        tracing::warn!(session = %key(session), error = %e, "applying the session's objects failed");
        plan.apply_failed(previous, &e.to_string(), Timestamp::now());
    }
    let body = serde_json::json!({
        "apiVersion": format!("{}/{}", crds::GROUP, crds::VERSION),
        "kind": "AgentSession",
        "status": plan.status,
    });
    let sessions: Api<AgentSession> = Api::namespaced(ctx.client.clone(), &ns);
    let status = async {
        sessions
            .patch_status(&session.name_any(), &apply_params(), &Patch::Apply(&body))
            .await?;
        Ok::<_, Error>(())
    };
    // The nudge that has the kubelet write a claimed pod's binding runs
    // with the status write: a client that sees Ready first is told
    // `unbound` and retries for the moment it takes.
    let touched = async {
        match &plan.pod {
            PodAction::Touch { name, uid, bound } if applied.is_ok() => {
                touch(ctx, &ns, name, uid.as_deref(), bound).await
            }
            _ => Ok(()),
        }
    };
    let (status, touched) = futures::join!(status, touched);
    status?;
    touched?;
    // Events after the status: a client waiting for Ready does not wait
    // for them, and a status that failed to land is reconciled again, its
    // events with it.
    for note in plan.pod_events.iter().chain(&plan.events) {
        ctx.publish(session, note).await;
    }
    applied?;
    Ok(Action::requeue(plan.requeue))
}

/// A session the typed decode refused: its status names the JSON path
/// (read again as raw JSON to find it), a Warning event is published once
/// per distinct problem, and nothing else is touched. It is looked at again
/// when it changes.
async fn unreadable_session(
    ctx: &Context,
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    decode_error: &str,
) -> Result<Action> {
    let (Some(ns), Some(name)) = (meta.namespace.as_deref(), meta.name.as_deref()) else {
        return Ok(Action::await_change());
    };
    let resource = ApiResource::erase::<AgentSession>(&());
    let raw: Api<DynamicObject> = Api::namespaced_with(ctx.client.clone(), ns, &resource);
    // One read: the raw object names the bad field and carries the status
    // already written for it.
    let Some(obj) = raw.get_opt(name).await? else {
        return Ok(Action::await_change());
    };
    let raw_json = serde_json::to_value(&obj).unwrap_or_default();
    let problem = unreadable::locate(&raw_json).unwrap_or_else(|| decode_error.to_owned());
    tracing::warn!(session = %format!("{ns}/{name}"), %problem, "session cannot be decoded");
    let body = unreadable::status_body(&problem, meta.generation, Timestamp::now());
    let already = raw_json["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            c["type"] == "Ready"
                && c["reason"] == unreadable::REASON
                && c["message"] == body["status"]["conditions"][0]["message"]
        });
    if already {
        return Ok(Action::await_change());
    }
    let sessions: Api<AgentSession> = Api::namespaced(ctx.client.clone(), ns);
    sessions
        .patch_status(name, &apply_params(), &Patch::Apply(&body))
        .await?;
    let reference = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(format!("{}/{}", crds::GROUP, crds::VERSION)),
        kind: Some("AgentSession".into()),
        name: Some(name.to_owned()),
        namespace: Some(ns.to_owned()),
        uid: meta.uid.clone(),
        ..Default::default()
    };
    let note = Note {
        warning: true,
        reason: unreadable::REASON.into(),
        message: format!("the stored session cannot be read: {problem}"),
    };
    ctx.publish_on(&reference, &note).await;
    Ok(Action::await_change())
}

/// Server-side apply as the operator's one field manager, taking over
/// fields another manager set (the operator's objects are its own).
pub(crate) fn apply_params() -> PatchParams {
    PatchParams::apply(MANAGER).force()
}

/// For a session with no naming scheme recorded whose name is long enough
/// for the schemes to differ: the earlier scheme, when its pod or workspace
/// claim exists under the earlier names and belongs to the session (see
/// [`crate::names`]). Probed once; the status records the answer.
async fn earlier_scheme(ctx: &Context, ns: &str, session: &AgentSession) -> Result<Option<Scheme>> {
    if session
        .status
        .as_ref()
        .is_some_and(|s| s.object_names.is_some())
    {
        return Ok(None);
    }
    let name = session.name_any();
    let (now, old) = (
        Names::with(&name, Scheme::Current),
        Names::with(&name, Scheme::Digest32),
    );
    if now == old {
        return Ok(None);
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let found = [
        pods.get_metadata_opt(&old.pod).await?.map(|m| m.metadata),
        claims
            .get_metadata_opt(&old.claim)
            .await?
            .map(|m| m.metadata),
    ];
    let ours = found.iter().flatten().any(|m| plan::owned_by(m, session));
    Ok(ours.then_some(Scheme::Digest32))
}

/// Reads what the plan depends on: the objects under the session's names
/// (the ConfigMap and claim as metadata only).
async fn observe(
    ctx: &Context,
    ns: &str,
    session: &AgentSession,
    res: &Resolution,
) -> Result<Observed> {
    let names = Names::of(session);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let warm_pool = session.spec.warm_pool.is_some();
    // Independent reads, issued together: each is a round trip, and a warm
    // claim is judged by how few of those it waits on.
    let listed = async {
        if warm_pool {
            session_pods(&pods, session).await
        } else {
            Ok(Vec::new())
        }
    };
    let wants_claim = res.runner.is_some() && pod::workspace_claim(session).is_some();
    let claim = async {
        if !wants_claim {
            return Ok(None);
        }
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        Ok::<_, Error>(
            claims
                .get_metadata_opt(&names.claim)
                .await?
                .map(|m| m.metadata),
        )
    };
    let network_policy = async {
        let nps: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        Ok::<_, Error>(
            nps.get_metadata_opt(&names.network_policy)
                .await?
                .map(|m| m.metadata),
        )
    };
    let by_name = async { Ok::<_, Error>(pods.get_opt(&names.pod).await?) };
    let (by_name, listed, claim, network_policy) =
        futures::try_join!(by_name, listed, claim, network_policy)?;
    let (pod, surplus) = match by_name {
        // Someone else's pod under the session's name: the plan reports it.
        Some(p) if !plan::owned_by(&p.metadata, session) => (Some(p), Vec::new()),
        by_name if warm_pool => {
            let mut all = listed;
            if let Some(p) = by_name
                && !all.iter().any(|q| q.metadata.uid == p.metadata.uid)
            {
                all.push(p);
            }
            warm::pick(all)
        }
        by_name => (by_name, Vec::new()),
    };
    // A claimed warm pod mounts the ConfigMap named after itself; it is the
    // session's to write only if it is the session's (or not there yet).
    let cm_name = pod
        .as_ref()
        .filter(|p| warm::is_warm(p))
        .and_then(warm::toolset_configmap_name)
        .unwrap_or(names.configmap.clone());
    let cms: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let configmap = cms.get_metadata_opt(&cm_name).await?.map(|m| m.metadata);
    Ok(Observed {
        pod,
        configmap,
        claim,
        network_policy,
        warm: None,
        surplus,
    })
}

/// Every pod `session` controls, found by its session label and then
/// checked by owner UID (a label alone anyone can set): a claimed warm pod
/// has the pool's name, not the session's, and the label list is how a
/// claim interrupted right after its patch is found again.
async fn session_pods(pods: &Api<Pod>, session: &AgentSession) -> Result<Vec<Pod>> {
    let selector = format!("{}={}", pod::SESSION_LABEL, Names::of(session).label);
    let listed = pods
        .list(&kube::api::ListParams::default().labels(&selector))
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|p| plan::owned_by(&p.metadata, session))
        .collect())
}

/// Most pods one claim tries before the session starts cold: each failed
/// try is another session's claim of the same pod.
const CLAIM_TRIES: usize = 8;

/// Tries to take a ready pod from the session's pool `pool_name`. On
/// success the pod is the session's (see [`warm`] for why this is a single
/// preconditioned patch; its `WarmPool` condition is derived from it);
/// otherwise the condition that says why the session starts cold.
async fn claim(
    ctx: &Context,
    ns: &str,
    session: &AgentSession,
    pool_name: &str,
) -> Result<std::result::Result<Pod, CondSpec>> {
    // The session's NetworkPolicy exists before the pod carries its label;
    // applied while the pool is looked up (it is the session's anyway).
    let network_policy = async {
        if let Some(np) = egress::network_policy(session, &ctx.pods.egress) {
            let nps: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
            nps.patch(&np.name_any(), &apply_params(), &Patch::Apply(&np))
                .await?;
        }
        Ok::<_, Error>(())
    };
    let pool = async {
        let cached = ctx
            .pools
            .get()
            .and_then(|store| store.get(&ObjectRef::<AgentWarmPool>::new(pool_name).within(ns)));
        if let Some(pool) = cached {
            return Ok(Some(AgentWarmPool::clone(&pool)));
        }
        let pools: Api<AgentWarmPool> = Api::namespaced(ctx.client.clone(), ns);
        Ok::<_, Error>(pools.get_opt(pool_name).await?)
    };
    let ((), pool) = futures::try_join!(network_policy, pool)?;
    let Some(pool) = pool else {
        return Ok(Err(cold(
            "PoolNotFound",
            format!(
                "spec.warmPool: no AgentWarmPool {pool_name:?} in namespace {ns}; started cold"
            ),
        )));
    };
    if let Some(why) = warm::mismatch(&session.spec, &pool.spec.template) {
        return Ok(Err(cold(
            "TemplateMismatch",
            format!("{why}; started cold"),
        )));
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let mut candidates: Vec<Pod> = ctx
        .pool_pods
        .state()
        .iter()
        .filter(|p| p.metadata.namespace.as_deref() == Some(ns) && warm::claimable(p, &pool))
        .map(|p| Pod::clone(p))
        .collect();
    if candidates.is_empty() {
        // The watch may not have listed yet (a restarted operator): ask.
        let listed = pods
            .list(&kube::api::ListParams::default().labels(&warm::pool_selector(pool_name)))
            .await?;
        candidates = listed
            .items
            .into_iter()
            .filter(|p| warm::claimable(p, &pool))
            .collect();
    }
    if candidates.is_empty() {
        return Ok(Err(cold(
            "PoolExhausted",
            format!("AgentWarmPool {pool_name} has no ready pod; started cold"),
        )));
    }
    // Concurrent claims spread over the pool instead of all racing for its
    // first pod: each starts at a different place.
    let start = session_spread(session, candidates.len());
    candidates.rotate_left(start);
    for candidate in candidates.iter().take(CLAIM_TRIES) {
        let Some(patch) = warm::claim_patch(candidate, session, &ctx.pods) else {
            continue;
        };
        let name = candidate.name_any();
        match pods
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(pod) => {
                ctx.wake_pool(&pool);
                tracing::info!(session = %key(session), pod = %name, pool = pool_name, "claimed a warm pod");
                return Ok(Ok(pod));
            }
            // Claimed by another session first, or gone: try the next.
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Err(cold(
        "PoolExhausted",
        format!(
            "every ready pod of AgentWarmPool {pool_name} was claimed by other sessions first; started cold"
        ),
    )))
}

fn cold(reason: &str, message: String) -> CondSpec {
    CondSpec {
        type_: "WarmPool",
        status: false,
        reason: reason.into(),
        message,
    }
}

/// Where in a list of `n` candidates this session starts, from its UID.
fn session_spread(session: &AgentSession, n: usize) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    session.metadata.uid.hash(&mut h);
    usize::try_from(h.finish() % (n.max(1) as u64)).unwrap_or(0)
}

/// Issues the plan's API calls, in dependency order: the ConfigMap and
/// claim the pod mounts, then the pod.
async fn carry_out(ctx: &Context, ns: &str, plan: &Plan) -> Result<()> {
    let client = &ctx.client;
    // The ConfigMap and the NetworkPolicy before the pod (the sandbox never
    // runs a moment with open egress), and independent of each other.
    let configmap = async {
        if let Some(cm) = &plan.configmap {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            cms.patch(&cm.name_any(), &apply_params(), &Patch::Apply(cm))
                .await?;
        }
        Ok::<_, Error>(())
    };
    let network_policy = async {
        if let Some(np) = &plan.network_policy {
            let nps: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
            nps.patch(&np.name_any(), &apply_params(), &Patch::Apply(np))
                .await?;
        }
        Ok::<_, Error>(())
    };
    futures::try_join!(configmap, network_policy)?;
    if let Some((name, uid)) = &plan.delete_claim {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        delete_exactly(&claims, name, uid.clone(), None).await?;
    }
    if let Some(claim) = &plan.claim {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
        match claims.create(&PostParams::default(), claim).await {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            other => {
                other?;
            }
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for (name, uid) in &plan.delete_pods {
        delete_exactly(&pods, name, uid.clone(), None).await?;
    }
    match &plan.pod {
        PodAction::Keep | PodAction::WaitForDeletion => {}
        PodAction::Create(pod) => {
            pods.patch(
                &pod.name_any(),
                &apply_params(),
                &Patch::Apply(pod.as_ref()),
            )
            .await?;
        }
        // Done beside the status write (see `reconcile_inner`).
        PodAction::Touch { .. } => {}
        PodAction::Delete { name, uid } => {
            delete_exactly(&pods, name, uid.clone(), None).await?;
        }
    }
    Ok(())
}

/// Deletes `name` only if it is still the object that was observed: its UID
/// (and, when given, its resourceVersion) are the delete's preconditions.
/// Already gone or replaced since (404, 409) is not an error -- the next
/// reconcile sees what is there now. Whether this call deleted it.
pub(crate) async fn delete_exactly<K>(
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

/// Records the hash of the ConfigMap just written on a claimed warm pod.
/// The UID makes the patch fail on any other pod of that name.
async fn touch(ctx: &Context, ns: &str, name: &str, uid: Option<&str>, bound: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({
        "metadata": {
            "uid": uid,
            "annotations": { warm::BOUND_ANNOTATION: bound },
        }
    });
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Backs off exponentially per session: 2 s, 4 s, ... up to 5 minutes.
/// Each failure is counted here and only here.
pub fn error_policy(session: Arc<Watched>, error: &Error, ctx: Arc<Context>) -> Action {
    let wait = ctx.backoff.failed(&key(session.as_ref()));
    tracing::warn!(session = %key(session.as_ref()), %error, retry_in_s = wait.as_secs(), "reconcile failed");
    Action::requeue(wait)
}

/// Pool wake-ups queued at most.
const POOL_WAKES: usize = 1024;

/// Most sessions reconciled at once. A reconcile may wait on MCP servers
/// (bounded by their timeout); the bound keeps a burst of sessions from
/// opening unbounded connections and starving the lease renewal.
pub const MAX_CONCURRENT_RECONCILES: u16 = 16;

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
        .and_then(|a| a.get(crate::session::lifecycle::WAKE_ANNOTATION))
        .hash(&mut h);
    Some(h.finish())
}

/// Runs the controller until `shutdown` resolves.
///
/// Sessions trigger a reconcile only when their generation changes (a spec
/// change), not on every status write, so the operator's own status patch
/// never wakes it again; pods it owns trigger on any change, and every
/// session is looked at again on its plan's requeue.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    // Through the guard, one object that cannot be decoded is reported on
    // its own status instead of failing the list and stalling every session.
    let sessions: Api<Watched> = Api::all(ctx.client.clone());
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let (reader, writer) = reflector::store();
    let changed = watcher(sessions, watcher::Config::default())
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(generation_or_wake, Default::default());
    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let sessions = Controller::for_stream(changed, reader)
        .owns(
            pods,
            watcher::Config::default().labels("app.kubernetes.io/managed-by=agentplane"),
        )
        .with_config(controller::Config::default().concurrency(MAX_CONCURRENT_RECONCILES))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(session = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile loop error"),
            }
        });
    let pools = crate::pool::controller::run(ctx, shutdown);
    futures::join!(sessions, pools);
}
