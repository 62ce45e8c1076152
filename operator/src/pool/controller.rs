//! The warm-pool reconciler: reads a pool's pods, carries out
//! [`crate::pool::plan::plan`], writes the pool's status.
//!
//! Pods are created with a plain create (never an apply that could adopt
//! an object under a taken name) and deleted with their UID as the
//! precondition, so the pool never removes a pod a session has claimed in
//! the meantime: a claim changes nothing a UID precondition sees, but it
//! removes the pool label, and the plan is made only from pods that still
//! carry it and that the pool still controls. A claimed pod can still be
//! deleted by a stale plan in one narrow case -- the claim landing between
//! this reconcile's list and its delete -- so deletes are also
//! preconditioned on the pod's resourceVersion, which the claim changes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crds::AgentWarmPool;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PostParams};
use kube::runtime::Controller;
use kube::runtime::controller::{self, Action};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use sha2::{Digest, Sha256};

use crate::context::{Context, Note, apply_params, delete_exactly};
use crate::error::{Error, Result};
use crate::names;
use crate::pool::plan as pool;

/// Pools reconciled at once.
const MAX_CONCURRENT_POOL_RECONCILES: u16 = 4;

/// Reconciles one pool.
pub async fn reconcile(pool: Arc<AgentWarmPool>, ctx: Arc<Context>) -> Result<Action> {
    if pool.metadata.deletion_timestamp.is_some() {
        // Owner references hand the unclaimed pods to the garbage
        // collector; claimed pods are their sessions' and stay.
        return Ok(Action::await_change());
    }
    let ns = pool
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let name = pool.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let listed = pods
        .list(&ListParams::default().labels(&names::pool_selector(&name)))
        .await?;
    let mut counter = 0u64;
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    let plan = pool::plan(
        &pool,
        &listed.items,
        &ctx.pods,
        &ctx.policy,
        Timestamp::now(),
        || {
            counter += 1;
            suffix(&uid, counter)
        },
    );
    carry_out(&ctx, &ns, &pool, &listed.items, &plan).await?;
    let body = serde_json::json!({
        "apiVersion": format!("{}/{}", crds::GROUP, crds::VERSION),
        "kind": "AgentWarmPool",
        "status": plan.status,
    });
    let pools: Api<AgentWarmPool> = Api::namespaced(ctx.client.clone(), &ns);
    pools
        .patch_status(&name, &apply_params(), &Patch::Apply(&body))
        .await?;
    Ok(Action::requeue(plan.requeue))
}

/// Applies the pool's NetworkPolicy, then deletes and creates its pods as
/// `plan` says, and warns once when the policy refuses its template.
async fn carry_out(
    ctx: &Context,
    ns: &str,
    pool: &AgentWarmPool,
    listed: &[Pod],
    plan: &pool::PoolPlan,
) -> Result<()> {
    let name = pool.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    if let Some(np) = &plan.network_policy {
        let nps: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
        nps.patch(&np.name_any(), &apply_params(), &Patch::Apply(np))
            .await?;
    }
    for (pod_name, pod_uid, why) in &plan.delete {
        let rv = listed
            .iter()
            .find(|p| p.metadata.uid == *pod_uid)
            .and_then(|p| p.metadata.resource_version.clone());
        // Gone, or changed (claimed) since it was listed: not deleted.
        if delete_exactly(&pods, pod_name, pod_uid.clone(), rv).await? {
            tracing::info!(pool = %name, pod = %pod_name, why, "deleted warm pod");
        }
    }
    let mut created = 0;
    if !plan.create.is_empty() {
        ctx.ensure_runner_tls(ns).await?;
    }
    for pod in &plan.create {
        match pods.create(&PostParams::default(), pod).await {
            Ok(_) => created += 1,
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    if created > 0 {
        tracing::info!(pool = %name, created, "started warm pods");
    }
    if let Some(why) = &plan.denied {
        let denied_before = pool.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "PolicyAllowed" && c.status == "False")
        });
        if !denied_before {
            let note = Note {
                warning: true,
                reason: "PolicyDenied".into(),
                message: format!("no pods are started: {why}"),
            };
            ctx.publish_on(&pool.object_ref(&()), &note).await;
        }
    }
    Ok(())
}

/// A pod-name suffix unique to this pool and moment: 8 hex characters of a
/// digest of the pool's UID, the time and a counter.
fn suffix(pool_uid: &str, counter: u64) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let digest = Sha256::digest(format!("{pool_uid}/{nanos}/{counter}").as_bytes());
    hex::encode(&digest[..4])
}

/// Retries a failed pool reconcile after a short, fixed wait: a pool's
/// work is cheap and idempotent, and its errors are the API server's.
pub fn error_policy(pool: Arc<AgentWarmPool>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(pool = %pool.name_any(), %error, "pool reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

/// Runs the pool controller until `shutdown` resolves. Pools are woken by
/// their own changes, their pods' (still unclaimed) changes, and by the
/// session controller after each claim.
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let pools: Api<AgentWarmPool> = Api::all(ctx.client.clone());
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().labels(names::POOL_LABEL);
    let mut controller = Controller::new(pools, watcher::Config::default());
    // One watch of the pools' pods serves both this controller and the
    // claims' candidate cache.
    controller = match ctx.take_pool_pods_writer() {
        Some(writer) => controller.owns_stream(
            watcher(pods, config)
                .default_backoff()
                // Nothing reads a pooled pod's managedFields.
                .modify(|pod| pod.managed_fields_mut().clear())
                .reflect(writer)
                .touched_objects(),
        ),
        None => controller.owns(pods, config),
    };
    let _ = ctx.pools.set(controller.store());
    let mut controller = controller
        .with_config(controller::Config::default().concurrency(MAX_CONCURRENT_POOL_RECONCILES))
        .graceful_shutdown_on(shutdown);
    if let Some(wakes) = ctx.take_pool_wakes() {
        let wakes = futures::stream::unfold(wakes, |mut rx| async move {
            rx.recv().await.map(|pool| (pool, rx))
        });
        controller = controller.reconcile_on(wakes);
    }
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(pool = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "pool reconcile loop error"),
            }
        })
        .await;
}
