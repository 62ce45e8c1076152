//! The AgentCheckpoint reconciler: reads the source session, its pod, the
//! checkpoint's claim and sink pod; carries out the step
//! [`plan::decide`] chose; writes the status.
//!
//! Objects are made with a plain create (never an apply that could adopt
//! an object under a taken name) and owned by the checkpoint as controller,
//! so deleting the checkpoint deletes its data. The sink pod is deleted
//! with its UID as the precondition, and only when the checkpoint controls
//! it.

use std::sync::Arc;
use std::time::Duration;

use crds::{
    AgentCheckpoint, AgentCheckpointStatus, AgentSession, CheckpointMethod, CheckpointPhase,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PostParams};
use kube::runtime::Controller;
use kube::runtime::controller::{self, Action};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use runner_api::proto::ExportRequest;

use crate::checkpoint::build::{self, CHECKPOINT_LABEL};
use crate::checkpoint::plan::{self, Observed, Settings, Sizes, Step};
use crate::checkpoint::relay;
use crate::checkpoint::snapshotting;
use crate::checkpoint::volume::{self, Choice};
use crate::context::{Context, Note, apply_params, delete_exactly, key};
use crate::error::{Error, Result};
use crate::names::controlled_by;

/// Checkpoints taken at once: each holds two streams and a few MiB.
const MAX_CONCURRENT: u16 = 2;

/// What a checkpoint reconcile needs besides the shared [`Context`].
#[derive(Debug)]
pub struct CheckpointContext {
    pub base: Arc<Context>,
    pub settings: Settings,
}

/// Reconciles one checkpoint; a reconcile that went through forgets the
/// checkpoint's earlier API failures.
pub async fn reconcile(ckpt: Arc<AgentCheckpoint>, cx: Arc<CheckpointContext>) -> Result<Action> {
    let done = reconcile_once(&ckpt, &cx).await;
    if done.is_ok() {
        cx.base.backoff.succeeded(&backoff_key(&ckpt));
    }
    done
}

fn backoff_key(ckpt: &AgentCheckpoint) -> String {
    format!("checkpoint/{}", key(ckpt))
}

async fn reconcile_once(ckpt: &Arc<AgentCheckpoint>, cx: &CheckpointContext) -> Result<Action> {
    if ckpt.metadata.deletion_timestamp.is_some() {
        // The claim and the sink pod go with it (owner references).
        return Ok(Action::await_change());
    }
    let ctx = &cx.base;
    let ns = ckpt
        .namespace()
        .ok_or(Error::MissingField("metadata.namespace"))?;
    let name = ckpt.name_any();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let sessions: Api<AgentSession> = Api::namespaced(ctx.client.clone(), &ns);
    let sink = pods.get_opt(&plan::sink_name(&name)).await?;
    let settled = matches!(
        ckpt.status.as_ref().and_then(|s| s.phase),
        Some(CheckpointPhase::Ready | CheckpointPhase::Failed)
    );
    if settled {
        remove_sink(ckpt, &pods, sink.as_ref()).await?;
        return Ok(Action::await_change());
    }
    let claim = claims.get_metadata_opt(&plan::claim_name(&name)).await?;
    let session = sessions.get_opt(&ckpt.spec.source.session).await?;
    let session_pod = match session
        .as_ref()
        .and_then(|s| s.status.as_ref())
        .and_then(|s| s.pod_name.as_deref())
    {
        Some(pod) => pods.get_opt(pod).await?,
        None => None,
    };
    let observed = Observed {
        session: session.as_ref(),
        session_pod: session_pod.as_ref(),
        claim: claim.as_ref().map(|c| &c.metadata),
        sink: sink.as_ref(),
        tls: ctx.pods.gateway && ctx.runner_tls.get().is_some(),
    };
    let updated = match volume_path(cx, &ns, ckpt, &observed).await? {
        Route::Done(action) => return Ok(action),
        Route::Archive(updated) => updated,
    };
    let ckpt = updated.as_deref().unwrap_or(ckpt);
    let step = plan::decide(ckpt, &observed, &cx.settings);
    carry_out(cx, &ns, ckpt, step, sink.as_ref()).await
}

/// Where a reconcile goes after [`volume_path`].
enum Route {
    /// The VolumeSnapshot path took the step.
    Done(Action),
    /// The archive path takes it; with the checkpoint as updated when the
    /// method was just recorded.
    Archive(Option<Box<AgentCheckpoint>>),
}

/// Chooses the method once the source is ready (recorded in the status,
/// never chosen again), and takes the VolumeSnapshot path's step when that
/// is the method.
async fn volume_path(
    cx: &CheckpointContext,
    ns: &str,
    ckpt: &AgentCheckpoint,
    observed: &Observed<'_>,
) -> Result<Route> {
    match ckpt.status.as_ref().and_then(|s| s.method) {
        Some(CheckpointMethod::Archive) => return Ok(Route::Archive(None)),
        Some(CheckpointMethod::VolumeSnapshot) => {
            return volume_step(cx, ns, ckpt, observed, None)
                .await
                .map(Route::Done);
        }
        None => {}
    }
    // Until then the archive path's plan says what is waited for.
    let (Some(session), Ok(_), true) =
        (observed.session, plan::source(ckpt, observed), observed.tls)
    else {
        return Ok(Route::Archive(None));
    };
    let ctx = &cx.base;
    let max = cx.settings.max_volume_bytes;
    let choice = snapshotting::choose(ctx, ns, ckpt, session, max).await?;
    let mut next = ckpt.clone();
    let status = next
        .status
        .get_or_insert_with(AgentCheckpointStatus::default);
    match choice {
        Choice::Refused { message } => {
            let step = Step::Fail {
                reason: "VolumeSnapshotUnavailable".into(),
                message,
            };
            carry_out(cx, ns, ckpt, step, None).await.map(Route::Done)
        }
        Choice::Archive { why } => {
            status.method = Some(CheckpointMethod::Archive);
            write_status(ctx, ns, ckpt, status).await?;
            let message = format!("taken as an archive: {why}");
            ctx.publish(ckpt, &Note::normal("Archiving", message)).await;
            Ok(Route::Archive(Some(Box::new(next))))
        }
        Choice::Snapshot {
            claim,
            class,
            storage_class,
        } => {
            status.method = Some(CheckpointMethod::VolumeSnapshot);
            status.volume_snapshot = Some(volume::snapshot_name(&ckpt.name_any()));
            status.storage_class_name = Some(storage_class);
            write_status(ctx, ns, ckpt, status).await?;
            // Just chosen from what was read: the take need not read it again.
            volume_step(cx, ns, &next, observed, Some((claim, class)))
                .await
                .map(Route::Done)
        }
    }
}

/// One step of a checkpoint taken as a VolumeSnapshot; `chosen` is the
/// claim and snapshot class when this reconcile just chose them.
async fn volume_step(
    cx: &CheckpointContext,
    ns: &str,
    ckpt: &AgentCheckpoint,
    observed: &Observed<'_>,
    chosen: Option<(String, String)>,
) -> Result<Action> {
    let ctx = &cx.base;
    let name = ckpt.name_any();
    let api = snapshotting::snapshots(ctx, ns);
    let snapshot = api.get_opt(&volume::snapshot_name(&name)).await?;
    let source = plan::source(ckpt, observed);
    let addr = source.as_ref().ok().copied().filter(|_| observed.tls);
    let now = Timestamp::now();
    match volume::decide(ckpt, snapshot.as_ref(), addr) {
        volume::Step::NeedsSource => {
            let step = source.err().unwrap_or_else(|| Step::Wait {
                reason: "RunnerTlsOff".into(),
                message: "checkpoints reach the session's runner over the gateway's mutual TLS, and this platform runs no gateway".into(),
                requeue: plan::WAIT_PLATFORM,
            });
            carry_out(cx, ns, ckpt, step, None).await
        }
        volume::Step::NameTaken { message } => {
            let step = Step::Fail {
                reason: "NameTaken".into(),
                message,
            };
            carry_out(cx, ns, ckpt, step, None).await
        }
        volume::Step::Take { source } => {
            take_snapshot(cx, ns, ckpt, observed, source, chosen).await
        }
        volume::Step::Wait { message } => {
            let status = plan::waiting_status(
                ckpt,
                CheckpointPhase::Taking,
                "SnapshotNotReady",
                &message,
                now,
            );
            write_if_changed(ctx, ns, ckpt, &status).await?;
            Ok(Action::requeue(SNAPSHOT_POLL))
        }
        volume::Step::Ready { size, state_secret } => {
            let status = plan::snapshot_ready_status(ckpt, size, &state_secret, now);
            write_status(ctx, ns, ckpt, &status).await?;
            let message = format!(
                "VolumeSnapshot {} is ready to use",
                volume::snapshot_name(&name)
            );
            ctx.publish(ckpt, &Note::normal("Taken", message)).await;
            Ok(Action::await_change())
        }
        volume::Step::Discard { uid, why } => {
            delete_exactly(&api, &volume::snapshot_name(&name), uid, None).await?;
            failed_attempt(ctx, ns, ckpt, &why).await
        }
    }
}

/// How often a checkpoint whose snapshot is cut but not ready looks again.
const SNAPSHOT_POLL: Duration = Duration::from_secs(2);

/// Takes the VolumeSnapshot under the source runner's hold: of the claim
/// and class just `chosen`, else as the storage allows now.
async fn take_snapshot(
    cx: &CheckpointContext,
    ns: &str,
    ckpt: &AgentCheckpoint,
    observed: &Observed<'_>,
    source: std::net::SocketAddr,
    chosen: Option<(String, String)>,
) -> Result<Action> {
    let ctx = &cx.base;
    let (Some(session), Some(runner_tls)) = (observed.session, ctx.runner_tls.get()) else {
        return Ok(Action::requeue(plan::WAIT_SESSION));
    };
    let max = cx.settings.max_volume_bytes;
    let choice = match chosen {
        Some((claim, class)) => Choice::Snapshot {
            claim,
            class,
            storage_class: String::new(),
        },
        None => snapshotting::choose(ctx, ns, ckpt, session, max).await?,
    };
    let (claim, class) = match choice {
        Choice::Snapshot { claim, class, .. } => (claim, class),
        Choice::Archive { why } | Choice::Refused { message: why } => {
            let step = Step::Fail {
                reason: "VolumeSnapshotUnavailable".into(),
                message: format!("the session's storage no longer allows a VolumeSnapshot: {why}"),
            };
            return carry_out(cx, ns, ckpt, step, None).await;
        }
    };
    let (pair, ca) = runner_tls.client_identity()?;
    let tls = relay::tls_config(&pair.cert_pem, &pair.key_pem, &ca);
    let message = format!(
        "the session's runner holds its workspace still (calls that change it wait) while the storage cuts VolumeSnapshot {}",
        volume::snapshot_name(&ckpt.name_any())
    );
    let taking = plan::waiting_status(
        ckpt,
        CheckpointPhase::Taking,
        "Taking",
        &message,
        Timestamp::now(),
    );
    write_if_changed(ctx, ns, ckpt, &taking).await?;
    match snapshotting::take(ctx, ns, ckpt, &tls, source, &claim, &class).await {
        // The next look finds it cut and marked: Ready, or waiting for the storage.
        Ok(()) => Ok(Action::requeue(Duration::from_millis(500))),
        Err(e) => take_failed(ctx, ns, ckpt, &e).await,
    }
}

/// A take (archive or snapshot) that failed: refused as such, Failed at
/// once; else a failed attempt, retried after a back-off.
async fn take_failed(
    ctx: &Context,
    ns: &str,
    ckpt: &AgentCheckpoint,
    e: &relay::Failure,
) -> Result<Action> {
    if !e.permanent {
        tracing::warn!(checkpoint = %key(ckpt), error = %e.message, "checkpoint not taken");
        return failed_attempt(ctx, ns, ckpt, &e.message).await;
    }
    tracing::warn!(checkpoint = %key(ckpt), error = %e.message, "checkpoint refused; not retried");
    let status = plan::refused_status(ckpt, &e.message, Timestamp::now());
    ctx.publish(
        ckpt,
        &Note::warning(plan::TRANSFER_REFUSED, e.message.clone()),
    )
    .await;
    write_status(ctx, ns, ckpt, &status).await?;
    Ok(Action::await_change())
}

/// Carries out one step and writes the status it leads to.
async fn carry_out(
    cx: &CheckpointContext,
    ns: &str,
    ckpt: &AgentCheckpoint,
    step: Step,
    sink: Option<&Pod>,
) -> Result<Action> {
    let ctx = &cx.base;
    let now = Timestamp::now();
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    match step {
        Step::Settled => Ok(Action::await_change()),
        Step::Fail { reason, message } => {
            let status = plan::failed_status(ckpt, &reason, &message, now);
            ctx.publish(ckpt, &Note::warning(&reason, message)).await;
            write_status(ctx, ns, ckpt, &status).await?;
            remove_sink(ckpt, &pods, sink).await?;
            Ok(Action::await_change())
        }
        Step::Wait {
            reason,
            message,
            requeue,
        } => {
            let status =
                plan::waiting_status(ckpt, CheckpointPhase::Pending, &reason, &message, now);
            write_if_changed(ctx, ns, ckpt, &status).await?;
            Ok(Action::requeue(requeue))
        }
        Step::Create { claim, sink } => {
            create(cx, ns, ckpt, claim, sink).await?;
            let status = plan::waiting_status(
                ckpt,
                CheckpointPhase::Pending,
                "SinkStarting",
                "made the checkpoint's volume and sink pod; waiting for the sink",
                now,
            );
            write_if_changed(ctx, ns, ckpt, &status).await?;
            Ok(Action::requeue(plan::WAIT_SINK))
        }
        Step::ReplaceSink { name, uid, why } => {
            delete_exactly(&pods, &name, uid, None).await?;
            failed_attempt(ctx, ns, ckpt, &why).await
        }
        Step::Take {
            source,
            sink: at,
            sizes,
        } => take(cx, ns, ckpt, source, at, sizes, sink).await,
    }
}

/// Makes the claim and the sink pod that are missing. A name taken since
/// it was looked at (409) is left for the next reconcile to judge.
async fn create(
    cx: &CheckpointContext,
    ns: &str,
    ckpt: &AgentCheckpoint,
    claim: bool,
    sink: bool,
) -> Result<()> {
    let ctx = &cx.base;
    let sizes = plan::sizes(ckpt, &cx.settings).map_err(Error::Checkpoint)?;
    if claim {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
        let pvc = build::claim(ckpt, &sizes, &cx.settings);
        ignore_conflict(claims.create(&PostParams::default(), &pvc).await)?;
    }
    if sink {
        fence_sink(ctx, ns, ckpt).await?;
        ctx.ensure_runner_tls(ns).await?;
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        let pod = build::sink_pod(
            ckpt,
            &sizes,
            &cx.settings,
            &ctx.pods.runner_image,
            &ctx.pods.image_pull_policy,
        );
        ignore_conflict(pods.create(&PostParams::default(), &pod).await)?;
    }
    Ok(())
}

/// Makes the sink's NetworkPolicy before the sink exists, so the sink
/// never runs a moment unfenced. A policy under that name that the
/// checkpoint does not control is not ours to trust: no sink is made.
async fn fence_sink(ctx: &Context, ns: &str, ckpt: &AgentCheckpoint) -> Result<()> {
    let Some(np) = build::sink_policy(ckpt, &ctx.pods.egress) else {
        return Ok(());
    };
    let nps: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), ns);
    match nps.create(&PostParams::default(), &np).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let name = np.name_any();
            let theirs = nps
                .get_metadata_opt(&name)
                .await?
                .is_some_and(|m| !controlled_by(&m.metadata, ckpt.metadata.uid.as_deref()));
            if theirs {
                return Err(Error::Checkpoint(format!(
                    "NetworkPolicy {ns}/{name} exists and is not this checkpoint's; \
                     the sink is not started without its own policy (delete or rename that object)"
                )));
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

fn ignore_conflict<T>(r: std::result::Result<T, kube::Error>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Streams the export into the sink; Ready with what was taken, or a
/// failed attempt.
async fn take(
    cx: &CheckpointContext,
    ns: &str,
    ckpt: &AgentCheckpoint,
    source: std::net::SocketAddr,
    at: std::net::SocketAddr,
    sizes: Sizes,
    sink: Option<&Pod>,
) -> Result<Action> {
    let ctx = &cx.base;
    let Some(runner_tls) = ctx.runner_tls.get() else {
        return Ok(Action::requeue(plan::WAIT_PLATFORM));
    };
    let (pair, ca) = runner_tls.client_identity()?;
    let tls = relay::tls_config(&pair.cert_pem, &pair.key_pem, &ca);
    let taking = plan::waiting_status(
        ckpt,
        CheckpointPhase::Taking,
        "Taking",
        "the session's runner is archiving its workspace (calls that change it wait)",
        Timestamp::now(),
    );
    write_if_changed(ctx, ns, ckpt, &taking).await?;
    let export = ExportRequest {
        path: ckpt.spec.source.path.clone(),
        max_bytes: sizes.content_bytes,
        max_entries: 0,
        shell_state: ckpt.spec.shell_state,
    };
    match relay::take(&tls, source, at, export).await {
        Ok(taken) => {
            let status = plan::ready_status(ckpt, taken, Timestamp::now());
            write_status(ctx, ns, ckpt, &status).await?;
            let message = format!(
                "took {} entries, {} bytes of file content",
                taken.entries, taken.file_bytes
            );
            ctx.publish(ckpt, &Note::normal("Taken", message)).await;
            let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
            remove_sink(ckpt, &pods, sink).await?;
            Ok(Action::await_change())
        }
        Err(e) => take_failed(ctx, ns, ckpt, &e).await,
    }
}

/// Counts a failed attempt: retried after a back-off, or Failed.
async fn failed_attempt(
    ctx: &Context,
    ns: &str,
    ckpt: &AgentCheckpoint,
    error: &str,
) -> Result<Action> {
    let (status, retry) = plan::after_failure(ckpt, error, Timestamp::now());
    let reason = if retry.is_some() {
        "Retrying"
    } else {
        "TakeFailed"
    };
    let message = status
        .conditions
        .first()
        .map(|c| c.message.clone())
        .unwrap_or_default();
    ctx.publish(ckpt, &Note::warning(reason, message)).await;
    write_status(ctx, ns, ckpt, &status).await?;
    Ok(retry.map_or_else(Action::await_change, Action::requeue))
}

/// Deletes the sink pod if the checkpoint controls it.
async fn remove_sink(ckpt: &AgentCheckpoint, pods: &Api<Pod>, sink: Option<&Pod>) -> Result<()> {
    if let Some(pod) = sink.filter(|p| controlled_by(&p.metadata, ckpt.metadata.uid.as_deref()))
        && pod.metadata.deletion_timestamp.is_none()
    {
        delete_exactly(pods, &pod.name_any(), pod.metadata.uid.clone(), None).await?;
    }
    Ok(())
}

/// Writes `status` unless the checkpoint shows it already (but for the
/// conditions' times).
async fn write_if_changed(
    ctx: &Context,
    ns: &str,
    ckpt: &AgentCheckpoint,
    status: &AgentCheckpointStatus,
) -> Result<()> {
    let same = ckpt.status.as_ref().is_some_and(|old| {
        old.phase == status.phase
            && old.attempts == status.attempts
            && old.conditions.len() == status.conditions.len()
            && old.conditions.iter().zip(&status.conditions).all(|(a, b)| {
                a.status == b.status && a.reason == b.reason && a.message == b.message
            })
    });
    if same {
        return Ok(());
    }
    write_status(ctx, ns, ckpt, status).await
}

async fn write_status(
    ctx: &Context,
    ns: &str,
    ckpt: &AgentCheckpoint,
    status: &AgentCheckpointStatus,
) -> Result<()> {
    let body = serde_json::json!({
        "apiVersion": format!("{}/{}", crds::GROUP, crds::VERSION),
        "kind": "AgentCheckpoint",
        "status": status,
    });
    let api: Api<AgentCheckpoint> = Api::namespaced(ctx.client.clone(), ns);
    api.patch_status(&ckpt.name_any(), &apply_params(), &Patch::Apply(&body))
        .await?;
    Ok(())
}

/// A failed reconcile (the API server's errors) is retried with the
/// shared back-off; failed takes are counted in the status instead.
pub fn error_policy(
    ckpt: Arc<AgentCheckpoint>,
    error: &Error,
    cx: Arc<CheckpointContext>,
) -> Action {
    let wait = cx
        .base
        .backoff
        .failed(&format!("checkpoint/{}", key(ckpt.as_ref())));
    tracing::warn!(checkpoint = %key(ckpt.as_ref()), %error, "checkpoint reconcile failed");
    Action::requeue(wait.min(Duration::from_secs(60)))
}

/// Runs the checkpoint controller until `shutdown` resolves. Checkpoints
/// are woken by their own changes and their sink pods'; a checkpoint
/// waiting on its session looks again on a short requeue.
pub async fn run(
    cx: Arc<CheckpointContext>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let checkpoints: Api<AgentCheckpoint> = Api::all(cx.base.client.clone());
    let pods: Api<Pod> = Api::all(cx.base.client.clone());
    Controller::new(checkpoints, watcher::Config::default())
        .owns(pods, watcher::Config::default().labels(CHECKPOINT_LABEL))
        .with_config(controller::Config::default().concurrency(MAX_CONCURRENT))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, cx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(checkpoint = %obj.name, "reconciled"),
                Err(e) => tracing::debug!(error = %e, "checkpoint reconcile loop error"),
            }
        })
        .await;
}
