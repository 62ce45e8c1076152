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

use crds::AgentSession;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{Controller, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use opentelemetry::KeyValue;
use opentelemetry::trace::{Span, Status, Tracer};

use crate::error::{Error, Result};
use crate::mcp::McpClient;
use crate::pod::{self, PodConfig, SPEC_HASH_ANNOTATION};
use crate::resolution::{self, Listings};
use crate::status;

/// The field manager of everything the operator applies.
pub const MANAGER: &str = "agentplane-operator";

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub reporter: Reporter,
    pub pods: PodConfig,
    pub mcp_timeout: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("reporter", &self.reporter)
            .field("pods", &self.pods)
            .finish_non_exhaustive()
    }
}

impl Context {
    pub fn new(client: Client, pods: PodConfig, mcp_timeout: Duration) -> Self {
        let instance = std::env::var("POD_NAME").ok();
        Self {
            client,
            reporter: Reporter {
                controller: MANAGER.into(),
                instance,
            },
            pods,
            mcp_timeout,
            failures: Mutex::new(HashMap::new()),
        }
    }

    fn failures(&self, key: &str, failed: bool) -> u32 {
        let mut map = match self.failures.lock() {
            Ok(m) => m,
            Err(poisoned) => poisoned.into_inner(),
        };
        if failed {
            let n = map.entry(key.to_owned()).or_insert(0);
            *n += 1;
            *n
        } else {
            map.remove(key);
            0
        }
    }
}

fn key(session: &AgentSession) -> String {
    format!(
        "{}/{}",
        session.namespace().unwrap_or_default(),
        session.name_any()
    )
}

/// Lists every MCP server the session's toolsets use.
async fn list_servers(session: &AgentSession, timeout: Duration) -> Listings {
    let mut out = Listings::new();
    for (server, url) in resolution::servers_to_list(&session.spec) {
        let listed = match McpClient::new(&server, &url, timeout) {
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

async fn publish(
    ctx: &Context,
    session: &AgentSession,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let recorder = Recorder::new(ctx.client.clone(), ctx.reporter.clone());
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &session.object_ref(&())).await {
        tracing::warn!(error = %e, "cannot publish event");
    }
}

/// Reconciles one session.
pub async fn reconcile(session: Arc<AgentSession>, ctx: Arc<Context>) -> Result<Action> {
    let tracer = opentelemetry::global::tracer("agentplane-operator");
    let mut span = tracer.start("reconcile AgentSession");
    span.set_attribute(KeyValue::new(
        "k8s.namespace.name",
        session.namespace().unwrap_or_default(),
    ));
    span.set_attribute(KeyValue::new("agentplane.session", session.name_any()));
    let started = Instant::now();
    let result = reconcile_inner(&session, &ctx).await;
    let meter = opentelemetry::global::meter("agentplane-operator");
    let outcome = if result.is_ok() { "ok" } else { "error" };
    meter
        .f64_histogram("agentplane.reconcile.duration")
        .with_unit("s")
        .with_description("Duration of one AgentSession reconcile")
        .build()
        .record(
            started.elapsed().as_secs_f64(),
            &[KeyValue::new("outcome", outcome)],
        );
    if let Err(e) = &result {
        meter
            .u64_counter("agentplane.reconcile.errors")
            .build()
            .add(1, &[]);
        span.set_status(Status::error(e.to_string()));
    }
    span.end();
    ctx.failures(&key(&session), result.is_err());
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
    let name = session.name_any();
    let client = ctx.client.clone();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let sessions: Api<AgentSession> = Api::namespaced(client.clone(), &ns);
    let apply = PatchParams::apply(MANAGER).force();

    let listings = list_servers(session, ctx.mcp_timeout).await;
    let res = resolution::resolve(&session.spec, &listings);
    let pod_name = pod::pod_name(&name);
    let existing = pods.get_opt(&pod_name).await?;
    let mut current: Option<Pod> = None;
    let mut requeue = if res.retry_mcp {
        Duration::from_secs(30)
    } else {
        Duration::from_secs(300)
    };

    match &res.runner {
        Some(runner) => {
            let cm = pod::toolset_configmap(session, runner);
            let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
            cms.patch(
                &pod::toolset_configmap_name(&name),
                &apply,
                &Patch::Apply(&cm),
            )
            .await?;
            if let Some(claim) = pod::workspace_claim(session) {
                let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
                if claims
                    .get_opt(&pod::workspace_claim_name(&name))
                    .await?
                    .is_none()
                {
                    claims.create(&PostParams::default(), &claim).await?;
                }
            }
            let desired = pod::build_pod(session, &ctx.pods);
            let want_hash = desired.annotations().get(SPEC_HASH_ANNOTATION).cloned();
            match existing {
                Some(p) if p.metadata.deletion_timestamp.is_some() => {
                    requeue = Duration::from_secs(2);
                    current = None;
                }
                Some(p) if p.annotations().get(SPEC_HASH_ANNOTATION) != want_hash.as_ref() => {
                    pods.delete(&pod_name, &DeleteParams::default()).await?;
                    publish(
                        ctx,
                        session,
                        EventType::Normal,
                        "ReplacingPod",
                        format!("the session changed; replacing pod {pod_name}"),
                    )
                    .await;
                    requeue = Duration::from_secs(2);
                }
                Some(p) => current = Some(p),
                None => {
                    let created = pods
                        .patch(&pod_name, &apply, &Patch::Apply(&desired))
                        .await?;
                    publish(
                        ctx,
                        session,
                        EventType::Normal,
                        "CreatedPod",
                        format!("created sandbox pod {pod_name}"),
                    )
                    .await;
                    current = Some(created);
                }
            }
        }
        None => {
            if let Some(p) = existing
                && p.metadata.deletion_timestamp.is_none()
            {
                pods.delete(&pod_name, &DeleteParams::default()).await?;
                publish(
                    ctx,
                    session,
                    EventType::Warning,
                    "StoppedPod",
                    format!("the toolset is invalid; deleted pod {pod_name}"),
                )
                .await;
            }
        }
    }

    let previous = session.status.as_ref();
    let new_status = status::build_status(
        &res,
        current.as_ref(),
        &pod_name,
        previous,
        session.metadata.generation,
        Timestamp::now(),
    );
    if current
        .as_ref()
        .is_some_and(|_| new_status.phase != Some(crds::SessionPhase::Ready))
    {
        requeue = requeue.min(Duration::from_secs(15));
    }

    // Events only for what changed since the last status, so a steady
    // state is quiet: a changed condition is published, and so is every
    // soft finding of the resolution (unknown MCP config names, web tools).
    let old = |t: &str| {
        previous
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == t))
            .map(|c| (c.status.clone(), c.message.clone()))
    };
    let mut any_changed = false;
    for c in &new_status.conditions {
        if old(&c.type_) == Some((c.status.clone(), c.message.clone())) {
            continue;
        }
        any_changed = true;
        match (c.type_.as_str(), c.status.as_str()) {
            ("ToolsetValid" | "McpResolved", "False") => {
                publish(
                    ctx,
                    session,
                    EventType::Warning,
                    &c.reason,
                    c.message.clone(),
                )
                .await;
            }
            ("Ready", "True") => {
                publish(ctx, session, EventType::Normal, "Ready", c.message.clone()).await;
            }
            _ => {}
        }
    }
    if any_changed {
        for w in &res.warnings {
            publish(
                ctx,
                session,
                EventType::Warning,
                "ToolsetWarning",
                w.clone(),
            )
            .await;
        }
    }
    let body = serde_json::json!({
        "apiVersion": format!("{}/{}", crds::GROUP, crds::VERSION),
        "kind": "AgentSession",
        "status": new_status,
    });
    sessions
        .patch_status(&name, &apply, &Patch::Apply(&body))
        .await?;
    Ok(Action::requeue(requeue))
}

/// Backs off exponentially per session: 2s, 4s, ... up to 5 minutes.
pub fn error_policy(session: Arc<AgentSession>, error: &Error, ctx: Arc<Context>) -> Action {
    let n = ctx.failures(&key(&session), true);
    let secs = 2u64.saturating_pow(n.min(9)).min(300);
    tracing::warn!(session = %key(&session), %error, retry_in_s = secs, "reconcile failed");
    Action::requeue(Duration::from_secs(secs))
}

/// Runs the controller until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let sessions: Api<AgentSession> = Api::all(ctx.client.clone());
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    Controller::new(sessions, watcher::Config::default())
        .owns(
            pods,
            watcher::Config::default().labels("app.kubernetes.io/managed-by=agentplane"),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(session = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "reconcile loop error"),
            }
        })
        .await;
}
