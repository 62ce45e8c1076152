//! The session reconciler: one AgentSession in, its ConfigMap, claim,
//! NetworkPolicy and sandbox pod applied, its status written, events
//! published. It reads through [`observe`](crate::session::observe),
//! decides through [`plan`](crate::session::plan) (pure), and takes warm
//! pods through [`claiming`](crate::session::claiming).
//!
//! Everything is applied with server-side apply under one field manager, so
//! a reconcile interrupted anywhere converges on the next one: names are
//! deterministic, and applying what already exists changes nothing. There
//! is no finalizer: owner references let the garbage collector remove the
//! pod, ConfigMap and claim with the session, and there is nothing else to
//! clean.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crds::{AgentCheckpoint, AgentSession, AgentSessionSpec};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::DeserializeGuard;
use kube::runtime::Controller;
use kube::runtime::controller::{self, Action};
use kube::runtime::{reflector, watcher};
use kube::{Api, Resource, ResourceExt};
use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};
use opentelemetry::trace::{Span, Status, Tracer};
use toolset::Entries;

use crate::checkpoint::fork;
use crate::context::{Context, Note, apply_params, delete_exactly, key};
use crate::error::{Error, Result};
use crate::mcp::client::McpClient;
use crate::mcp::destinations::Destinations;
use crate::names::BOUND_ANNOTATION;
use crate::policy;
use crate::resolution::{self, CondSpec, Listings, Resolution};
use crate::session::bulk::StatusBulk;
use crate::session::cache::Caches;
use crate::session::claiming;
use crate::session::lanes::{self, Lane, Lanes};
use crate::session::lifecycle;
use crate::session::observe::{earlier_scheme, observe};
use crate::session::own_writes::OwnWrites;
use crate::session::plan::{self, Observed, Plan, PodAction};
use crate::session::unreadable;
use crate::session::watches::{Feeds, Watches};
use crate::session::written::{self, Written};
use crate::validation;

/// The reconcile metrics, built once rather than per reconcile.
#[derive(Debug)]
struct Metrics {
    duration: Histogram<f64>,
    errors: Counter<u64>,
    waited: Histogram<f64>,
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
            waited: meter
                .f64_histogram("agentplane.reconcile.waited")
                .with_unit("s")
                .with_description(
                    "Time a due AgentSession reconcile waited for a slot, by lane (finishing, new, background)",
                )
                .build(),
        }
    }
}

/// What a session reconcile needs besides the shared [`Context`]: where
/// and how long MCP listings may go, and the reconcile metrics. Built after
/// telemetry is installed, so the instruments are bound to the real meter
/// provider.
pub struct SessionContext {
    pub base: Arc<Context>,
    pub mcp_timeout: Duration,
    /// Where MCP listings may connect.
    pub mcp_destinations: Arc<Destinations>,
    /// The ConfigMaps and NetworkPolicies last applied, to skip unchanged
    /// re-applies (see [`crate::session::written`]).
    pub written: Written,
    /// The controller's caches of the sessions' objects, read before the
    /// API server (see [`crate::session::cache`]).
    pub caches: Caches,
    /// The reconcile slots (`--max-concurrent-reconciles`), in three lanes.
    pub lanes: Lanes,
    /// The cached sessions' tool definitions, shared (see
    /// [`crate::session::bulk`]).
    pub bulk: Arc<StatusBulk>,
    /// The sessions as our last status writes left them (see
    /// [`crate::session::own_writes`]).
    pub own_writes: Arc<OwnWrites>,
    /// The session store, once the watches run: a reconcile that waited
    /// for its slot reads the session again from here (see [`reconcile`]).
    pub sessions: std::sync::OnceLock<reflector::Store<Watched>>,
    metrics: Metrics,
}

impl std::fmt::Debug for SessionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionContext")
            .field("base", &self.base)
            .field("mcp_timeout", &self.mcp_timeout)
            .finish_non_exhaustive()
    }
}

impl SessionContext {
    pub fn new(base: Arc<Context>, mcp_timeout: Duration, mcp_destinations: Destinations) -> Self {
        Self {
            base,
            mcp_timeout,
            mcp_destinations: Arc::new(mcp_destinations),
            written: Written::default(),
            caches: Caches::default(),
            lanes: Lanes::new(MAX_CONCURRENT_RECONCILES),
            bulk: Arc::default(),
            own_writes: Arc::default(),
            sessions: std::sync::OnceLock::new(),
            metrics: Metrics::new(),
        }
    }
}

impl SessionContext {
    /// Starts the session watches over this context's caches (see
    /// [`crate::session::watches`]).
    pub fn watch(&self) -> Watches {
        Watches::start(Feeds {
            client: &self.client,
            caches: &self.caches,
            bulk: &self.bulk,
            own_writes: &self.own_writes,
            sessions: &self.sessions,
        })
    }
}

/// The shared context's fields read through a session context, as the
/// session reconciler is one user of it.
impl std::ops::Deref for SessionContext {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.base
    }
}

/// A watched session: decoded, or the error of one that cannot be (see
/// [`unreadable`]).
pub type Watched = DeserializeGuard<AgentSession>;

/// Lists every MCP server the session's toolsets use.
async fn list_servers(
    ctx: &SessionContext,
    spec: &AgentSessionSpec,
    entries: &Entries,
) -> Listings {
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

/// Reconciles one session, once a slot in its lane is free (see
/// [`lanes`](crate::session::lanes)). The work is boxed only once the slot
/// is held, so that thousands of waiting reconciles stay small.
pub async fn reconcile(watched: Arc<Watched>, ctx: Arc<SessionContext>) -> Result<Action> {
    let lane = match &watched.0 {
        Ok(session) => {
            let newer = ctx.own_writes.newer_than(session);
            lanes::lane(newer.as_deref().unwrap_or(session))
        }
        // Its status says why it cannot be read: one cheap write.
        Err(_) => Lane::Finishing,
    };
    let waited = Instant::now();
    let _slot = ctx.lanes.enter(lane).await;
    ctx.metrics.waited.record(
        waited.elapsed().as_secs_f64(),
        &[KeyValue::new("lane", lane.as_str())],
    );
    // The session as the store holds it now: the one handed over when the
    // reconcile became due may be minutes old after the wait, older than
    // the watch's copy of our own last status write (whose record in
    // `own_writes` is gone once the watch brought it), and a status
    // conditional on it would be refused as stale (the scale bench: 1 392
    // refusals at 10 000 sessions, each retried a second later).
    let current = ctx
        .sessions
        .get()
        .and_then(|store| store.get(&reflector::ObjectRef::from_obj(watched.as_ref())));
    Box::pin(reconcile_traced(current.unwrap_or(watched), ctx)).await
}

async fn reconcile_traced(watched: Arc<Watched>, ctx: Arc<SessionContext>) -> Result<Action> {
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

async fn reconcile_inner(cached: &AgentSession, ctx: &SessionContext) -> Result<Action> {
    // Our last status write, when the watch has not brought it yet: the
    // newest version we know (see `own_writes`).
    let newer = ctx.own_writes.newer_than(cached);
    let session = newer.as_deref().unwrap_or(cached);
    if session.metadata.deletion_timestamp.is_some() {
        // Owner references hand the pod, ConfigMap and claim to the garbage
        // collector; nothing is left to do.
        return Ok(Action::await_change());
    }
    let ns = session
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let res = resolve(ctx, session).await;
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
    let mut observed = observe(ctx, &ctx.caches, &ns, session, &res).await?;
    let now = Timestamp::now();
    (observed.fork, observed.fork_snapshot) = fork_source(ctx, &ns, session).await?;
    claim_if_warm(ctx, &ns, session, &res, &mut observed, now).await?;
    let mut plan = plan::plan(session, &observed, &res, &ctx.pods, now);
    let applied = carry_out(ctx, &ns, &plan, &observed).await;
    if let Err(e) = &applied {
        tracing::warn!(session = %key(session), error = %e, "applying the session's objects failed");
        plan.apply_failed(session.status.as_ref(), &e.to_string(), Timestamp::now());
    }
    if !write_status(ctx, &ns, cached, session, &plan, applied.is_ok()).await? {
        // The session read was stale (a newer version, most often our own
        // last status, is on its way through the watch); its arrival does
        // not wake the session (`generation_or_wake`), so the plan says how
        // soon to look again (`Plan::requeue_after`).
        applied?;
        return Ok(Action::requeue(plan.requeue_after(false)));
    }
    if applied.is_ok() {
        delete_after_status(ctx, &ns, &plan, &observed).await?;
    }
    // Events after the status: a client waiting for Ready does not wait
    // for them, and a status that failed to land is reconciled again, its
    // events with it.
    for note in plan.pod_events.iter().chain(&plan.events) {
        ctx.publish(session, note).await;
    }
    applied?;
    Ok(Action::requeue(plan.requeue_after(true)))
}

/// The session's resolution: its toolsets resolved against the MCP
/// servers it lists, and the session policy applied. The webhook may not
/// have run: the policy is checked again here, and an invalid or denied
/// spec reaches no server (its URLs were never admitted) and runs no pod.
async fn resolve(ctx: &SessionContext, session: &AgentSession) -> Resolution {
    let entries = validation::entries(&session.spec);
    let denied = policy::check(&session.spec, &ctx.policy);
    let findings = validation::check(&session.spec, &entries);
    let listings = if denied.is_empty() && findings.is_valid() {
        list_servers(ctx, &session.spec, &entries).await
    } else {
        Listings::new()
    };
    let mut res = resolution::resolve_checked(&session.spec, &entries, findings, &listings);
    resolution::apply_policy(&mut res, &denied);
    res
}

/// For a session that names a warm pool, needs a pod and has none: tries
/// a claim, and records the claimed pod or why the session starts cold.
async fn claim_if_warm(
    ctx: &SessionContext,
    ns: &str,
    session: &AgentSession,
    res: &Resolution,
    observed: &mut Observed,
    now: Timestamp,
) -> Result<()> {
    let wants_pod = res.runner.is_some()
        && matches!(
            lifecycle::stage(session, None, now),
            lifecycle::Stage::Running
        );
    if session.spec.from.is_some() && session.spec.warm_pool.is_some() {
        observed.warm = Some(CondSpec {
            type_: "WarmPool",
            status: false,
            reason: "ForkStartsCold".into(),
            message:
                "the session starts from a checkpoint, which a warm pod cannot: it starts cold"
                    .into(),
        });
        return Ok(());
    }
    // An object of someone else's under one of the session's names stops
    // the session (NameConflict, in the plan): no claim, and no apply of
    // the policy over theirs.
    let foreign = plan::foreign(session, observed).is_some();
    if observed.pod.is_none()
        && wants_pod
        && !foreign
        && let Some(pool) = session.spec.warm_pool.as_deref()
    {
        let np = &mut observed.network_policy;
        match claiming::claim(ctx, &ctx.written, ns, session, pool, np).await? {
            Ok(pod) => observed.pod = Some(pod),
            Err(cold) => observed.warm = Some(cold),
        }
    }
    Ok(())
}

/// For a fork (`spec.from`): its `Checkpoint` condition, True once the
/// checkpoint in the session's namespace is Ready. A fork from a session's
/// name first makes its own checkpoint of that session (see
/// [`fork::decide`]).
async fn fork_source(
    ctx: &Context,
    ns: &str,
    session: &AgentSession,
) -> Result<(Option<CondSpec>, Option<fork::ForkSnapshot>)> {
    let Some(name) = fork::checkpoint_of(session) else {
        return Ok((None, None));
    };
    let api: Api<AgentCheckpoint> = Api::namespaced(ctx.client.clone(), ns);
    let checkpoint = match fork::decide(session, api.get_opt(&name).await?) {
        fork::Source::Use(c) => c.map(|c| *c),
        fork::Source::Hold(why) => return Ok((Some(why), None)),
        fork::Source::Create(new) => match take_for_fork(ctx, &api, session, &new).await? {
            Ok(made) => made,
            Err(why) => return Ok((Some(why), None)),
        },
    };
    let data = match &checkpoint {
        Some(c) => checkpoint_data(ctx, ns, c).await?,
        None => None,
    };
    let (ready, reason, message) =
        crate::checkpoint::plan::fork_condition(&name, checkpoint.as_ref(), data.as_ref());
    let condition = CondSpec {
        type_: "Checkpoint",
        status: ready,
        reason,
        message,
    };
    match checkpoint
        .as_ref()
        .filter(|_| ready)
        .map(|c| fork::volume_fork(session, c))
    {
        Some(Err(why)) => Ok((Some(why), None)),
        Some(Ok(snapshot)) => Ok((Some(condition), snapshot)),
        None => Ok((Some(condition), None)),
    }
}

/// What stands under the name of `checkpoint`'s data for forks: its
/// claim, or its VolumeSnapshot.
async fn checkpoint_data(
    ctx: &Context,
    ns: &str,
    checkpoint: &AgentCheckpoint,
) -> Result<Option<ObjectMeta>> {
    let name = checkpoint.name_any();
    let snapshot = checkpoint.status.as_ref().and_then(|s| s.method)
        == Some(crds::CheckpointMethod::VolumeSnapshot);
    Ok(if snapshot {
        let snapshots = crate::checkpoint::snapshotting::snapshots(ctx, ns);
        let snapshot = crate::checkpoint::volume::snapshot_name(&name);
        snapshots.get_opt(&snapshot).await?.map(|s| s.metadata)
    } else {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        let claim = crate::checkpoint::plan::claim_name(&name);
        claims.get_metadata_opt(&claim).await?.map(|m| m.metadata)
    })
}

/// Creates the checkpoint a fork takes of the session it names (a plain
/// create: nothing under its name is adopted). When the name was taken
/// since it was read, what stands there now is judged again.
async fn take_for_fork(
    ctx: &Context,
    api: &Api<AgentCheckpoint>,
    session: &AgentSession,
    new: &AgentCheckpoint,
) -> Result<std::result::Result<Option<AgentCheckpoint>, CondSpec>> {
    match api.create(&PostParams::default(), new).await {
        Ok(made) => {
            let message = format!(
                "taking AgentCheckpoint {} of session {} to start from",
                made.name_any(),
                made.spec.source.session
            );
            ctx.publish(session, &Note::normal("TakingCheckpoint", message))
                .await;
            Ok(Ok(Some(made)))
        }
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let now = api.get_opt(&new.name_any()).await?;
            Ok(match fork::decide(session, now) {
                fork::Source::Use(c) => Ok(c.map(|c| *c)),
                fork::Source::Hold(why) => Err(why),
                // Gone again already: the reconcile is retried.
                fork::Source::Create(_) => {
                    return Err(Error::Checkpoint(format!(
                        "AgentCheckpoint {} was there when it was created and gone when it was read",
                        new.name_any()
                    )));
                }
            })
        }
        // Refused for good until someone acts (the operator's RBAC, an
        // admission policy): said on the fork, tried again on its requeue.
        Err(kube::Error::Api(e)) if e.code == 403 || e.code == 422 => Ok(Err(CondSpec {
            type_: "Checkpoint",
            status: false,
            reason: "CheckpointRefused".into(),
            message: format!(
                "the API server refused to create AgentCheckpoint {}: {}",
                new.name_any(),
                e.message
            ),
        })),
        Err(e) => Err(e.into()),
    }
}

/// Writes the plan's status by server-side apply, beside the nudge that
/// has the kubelet write a claimed pod's binding: a client that sees Ready
/// first is told `unbound` and retries for the moment it takes.
///
/// The apply is conditional on the session's resourceVersion (see
/// [`Plan::status_apply`]): the session comes from the watch cache, which
/// can lag behind our own last write, or from that write's answer (see
/// [`crate::session::own_writes`]), which a change by someone else the
/// watch has not shown yet makes stale. `Ok(false)`: refused as stale.
/// A write that lands is recorded against `cached`, the version the cache
/// held.
async fn write_status(
    ctx: &SessionContext,
    ns: &str,
    cached: &AgentSession,
    session: &AgentSession,
    plan: &Plan,
    applied: bool,
) -> Result<bool> {
    let body = plan.status_apply(session);
    let sessions: Api<AgentSession> = Api::namespaced(ctx.client.clone(), ns);
    // A resync that finds everything as the status already says writes
    // nothing: at scale most reconciles are such resyncs.
    let bulk = ctx.bulk.of(session);
    let unchanged = applied && !plan.changes_status(session.status.as_ref(), bulk.as_deref());
    let status = async {
        if unchanged {
            return Ok(true);
        }
        match sessions
            .patch_status(&session.name_any(), &apply_params(), &Patch::Apply(&body))
            .await
        {
            Ok(written) => {
                ctx.own_writes.record(cached, written);
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::info!(
                    session = %key(session),
                    read = session.resource_version().unwrap_or_default(),
                    "status refused: the session changed since it was read; reconciling its newer version"
                );
                Ok(false)
            }
            Err(e) => Err(Error::from(e)),
        }
    };
    let touched = async {
        match &plan.pod {
            PodAction::Touch { name, uid, bound } if applied => {
                touch(ctx, ns, name, uid.as_deref(), bound).await
            }
            _ => Ok(()),
        }
    };
    let (status, touched) = futures::join!(status, touched);
    let landed = status?;
    touched?;
    Ok(landed)
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

/// Issues the plan's API calls, in dependency order: the ConfigMap and
/// claim the pod mounts, then the pod.
async fn carry_out(ctx: &SessionContext, ns: &str, plan: &Plan, observed: &Observed) -> Result<()> {
    let client = &ctx.client;
    // The ConfigMap and the NetworkPolicy before the pod (the sandbox never
    // runs a moment with open egress), and independent of each other; each
    // skipped when the server holds exactly what our last apply of the
    // same content left there.
    let configmap = async {
        if let Some(cm) = &plan.configmap {
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            apply_unless_written(&ctx.written, &cms, ns, cm, observed.configmap.as_ref()).await?;
        }
        Ok::<_, Error>(())
    };
    let network_policy = async {
        if let Some(np) = &plan.network_policy {
            let nps: Api<NetworkPolicy> = Api::namespaced(client.clone(), ns);
            apply_unless_written(&ctx.written, &nps, ns, np, observed.network_policy.as_ref())
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
            ctx.ensure_runner_tls(ns).await?;
            pods.patch(
                &pod.name_any(),
                &apply_params(),
                &Patch::Apply(pod.as_ref()),
            )
            .await?;
        }
        // Done beside the status write (see `reconcile_inner`).
        PodAction::Touch { .. } => {}
        // After the status that records why (see `reconcile_inner`).
        PodAction::Delete { .. } if plan.deletion_waits_for_status(observed) => {}
        PodAction::Delete { name, uid } => {
            delete_exactly(&pods, name, uid.clone(), None).await?;
        }
    }
    Ok(())
}

/// Deletes the plan's pod when its deletion waited for the status (see
/// [`Plan::deletion_waits_for_status`]).
async fn delete_after_status(
    ctx: &Context,
    ns: &str,
    plan: &Plan,
    observed: &Observed,
) -> Result<()> {
    if let PodAction::Delete { name, uid } = &plan.pod
        && plan.deletion_waits_for_status(observed)
    {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        delete_exactly(&pods, name, uid.clone(), None).await?;
    }
    Ok(())
}

/// Server-side applies `obj` unless `observed` (its metadata read in this
/// reconcile) is what our last apply of the same content left; records the
/// apply otherwise.
async fn apply_unless_written<K>(
    written: &Written,
    api: &Api<K>,
    ns: &str,
    obj: &K,
    observed: Option<&ObjectMeta>,
) -> Result<()>
where
    K: Resource<DynamicType = ()>
        + k8s_openapi::Resource
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let kind = <K as k8s_openapi::Resource>::KIND;
    let name = obj.name_any();
    let digest = written::digest(obj);
    let seen = observed
        .filter(|m| m.name.as_deref() == Some(name.as_str()))
        .and_then(|m| m.resource_version.as_deref());
    if written.unchanged(kind, ns, &name, seen, digest) {
        return Ok(());
    }
    let applied = api
        .patch(&name, &apply_params(), &Patch::Apply(obj))
        .await?;
    written.record(
        kind,
        ns,
        &name,
        applied.meta().resource_version.clone(),
        digest,
    );
    Ok(())
}

/// Records the hash of the ConfigMap just written on a claimed warm pod.
/// The UID makes the patch fail on any other pod of that name.
async fn touch(ctx: &Context, ns: &str, name: &str, uid: Option<&str>, bound: &str) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let patch = serde_json::json!({
        "metadata": {
            "uid": uid,
            "annotations": { BOUND_ANNOTATION: bound },
        }
    });
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Backs off exponentially per session: 2 s, 4 s, ... up to 5 minutes.
/// Each failure is counted here and only here.
pub fn error_policy(session: Arc<Watched>, error: &Error, ctx: Arc<SessionContext>) -> Action {
    let wait = ctx.backoff.failed(&key(session.as_ref()));
    tracing::warn!(session = %key(session.as_ref()), %error, retry_in_s = wait.as_secs(), "reconcile failed");
    Action::requeue(wait)
}

/// Most sessions reconciled at once, unless `--max-concurrent-reconciles`
/// says otherwise. A reconcile may wait on MCP servers
/// (bounded by their timeout); the bound keeps a burst of sessions from
/// opening unbounded connections and starving the lease renewal. A quarter
/// of them is kept for sessions under way (see [`Lanes`]).
pub const MAX_CONCURRENT_RECONCILES: u16 = 16;

/// A fork waits for its checkpoint to be Ready: a checkpoint's change
/// wakes the forks that start from it, found in the session store (a scan
/// per checkpoint change; checkpoints change a handful of times each).
fn forks_of(
    sessions: reflector::Store<Watched>,
) -> impl Fn(AgentCheckpoint) -> Vec<reflector::ObjectRef<Watched>> + Send + Sync + 'static {
    move |ckpt: AgentCheckpoint| {
        let (Some(ns), Some(name)) = (ckpt.metadata.namespace, ckpt.metadata.name) else {
            return Vec::new();
        };
        sessions
            .state()
            .iter()
            .filter(|w| w.0.as_ref().is_ok_and(|s| fork::waits_on(s, &ns, &name)))
            .map(|w| reflector::ObjectRef::from_obj(w.as_ref()))
            .collect()
    }
}

/// Runs the controller from the moment this replica leads until
/// `shutdown` resolves, on the watches started before (see
/// [`watches`](crate::session::watches)).
///
/// Sessions trigger a reconcile only when their generation changes (a spec
/// change), not on every status write, so the operator's own status patch
/// never wakes it again; the objects it owns trigger on any change, and
/// every session is looked at again on its plan's requeue. The controller
/// starts every due reconcile at once; [`Lanes`] decide which runs first.
pub async fn run(
    ctx: Arc<SessionContext>,
    watches: Watches,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let (reader, triggers, _watching) = watches.lead();
    let shutdown = futures::future::FutureExt::shared(Box::pin(shutdown));
    let forks = forks_of(reader.clone());
    let checkpoints: Api<AgentCheckpoint> = Api::all(ctx.client.clone());
    let changed = tokio_stream::wrappers::ReceiverStream::new(triggers.changed).map(Ok);
    let sessions = Controller::for_stream(changed, reader)
        .reconcile_on(triggers.owners)
        .watches(checkpoints, watcher::Config::default(), forks)
        .with_config(controller::Config::default().concurrency(0))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(session = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile loop error"),
            }
        });
    sessions.await;
}
