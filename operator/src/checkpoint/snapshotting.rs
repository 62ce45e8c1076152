//! The I/O of a checkpoint taken as a VolumeSnapshot ([`volume`] decides):
//! reading what the choice needs, and the take itself -- the source
//! runner's `Hold` around the snapshot's cut:
//!
//! 1. the runner holds the workspace still (calls in flight finish, new
//!    ones wait, background jobs paused, the filesystem flushed) and sends
//!    bash's state;
//! 2. the Secret with the state and the VolumeSnapshot are created;
//! 3. once the storage has cut the snapshot (`creationTime`), the hold is
//!    released; a release the runner confirms as such (not its deadline)
//!    proves the cut fell inside the hold, and only then is the snapshot
//!    marked [`volume::CUT_WHILE_HELD`].
//!
//! A take cut short anywhere leaves a snapshot without that mark, which
//! the next reconcile discards. Bounded: the hold by
//! [`volume::HOLD_SECONDS`] at the runner, the wait for the cut by
//! [`CUT_WAIT`] here.

use std::net::SocketAddr;
use std::time::Duration;

use crds::{AgentCheckpoint, AgentSession};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use tonic::transport::ClientTlsConfig;

use crate::checkpoint::relay::{self, Failure};
use crate::checkpoint::volume::{self, Choice, SnapshotClass, Storage};
use crate::context::{Context, delete_exactly};
use crate::error::Result;
use crate::names::Names;

/// How long the take waits for the storage to cut the snapshot: well
/// inside the runner's hold, so the release comes before its deadline.
pub const CUT_WAIT: Duration = Duration::from_secs(volume::HOLD_SECONDS as u64 - 20);
/// How often the snapshot is read while waiting for its cut.
const POLL: Duration = Duration::from_millis(250);
/// Most VolumeSnapshotClasses read.
const MAX_CLASSES: u32 = 500;

/// The VolumeSnapshot API in `ns`.
pub fn snapshots(ctx: &Context, ns: &str) -> Api<DynamicObject> {
    Api::namespaced_with(ctx.client.clone(), ns, &volume::snapshot_resource())
}

/// Reads the session's claim, its StorageClass and the snapshot classes,
/// and chooses how `checkpoint` is taken.
pub async fn choose(
    ctx: &Context,
    ns: &str,
    checkpoint: &AgentCheckpoint,
    session: &AgentSession,
    max_bytes: u64,
) -> Result<Choice> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let claim = claims.get_opt(&Names::of(session).claim).await?;
    let class_name = claim
        .as_ref()
        .and_then(|c| c.spec.as_ref())
        .and_then(|s| s.storage_class_name.clone());
    let provisioner = match class_name {
        Some(name) => {
            let classes: Api<StorageClass> = Api::all(ctx.client.clone());
            classes.get_opt(&name).await?.map(|c| c.provisioner)
        }
        None => None,
    };
    let classes = snapshot_classes(ctx).await?;
    let storage = Storage {
        claim: claim.as_ref(),
        provisioner: provisioner.as_deref(),
        classes: &classes,
        max_bytes,
    };
    Ok(volume::choose(checkpoint, session, &storage))
}

/// Every VolumeSnapshotClass; none where the API is not installed.
async fn snapshot_classes(ctx: &Context) -> Result<Vec<SnapshotClass>> {
    let api: Api<DynamicObject> = Api::all_with(ctx.client.clone(), &volume::class_resource());
    match api.list(&ListParams::default().limit(MAX_CLASSES)).await {
        Ok(list) => Ok(list.items.iter().filter_map(SnapshotClass::of).collect()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e.into()),
    }
}

/// Holds the source's workspace, makes the Secret and the snapshot, waits
/// for the cut and releases; marks the snapshot once the release proved
/// the cut fell inside the hold.
pub async fn take(
    ctx: &Context,
    ns: &str,
    checkpoint: &AgentCheckpoint,
    tls: &ClientTlsConfig,
    source: SocketAddr,
    claim: &str,
    class: &str,
) -> std::result::Result<(), Failure> {
    let channel = relay::channel(source, tls, "session's runner").await?;
    let mut runner = runner_api::Client::from_channel(channel);
    let holding = runner
        .hold(checkpoint.spec.shell_state, volume::HOLD_SECONDS)
        .await
        .map_err(|e| Failure {
            permanent: matches!(
                &e,
                runner_api::Error::Refused {
                    refusal: Some(runner_api::Refusal::TransferRefused),
                    ..
                }
            ),
            message: format!("the session's runner did not hold its workspace: {e}"),
        })?;
    let secret =
        volume::state_secret(checkpoint, holding.held.shell_state.as_ref()).map_err(|message| {
            Failure {
                message,
                permanent: true,
            }
        })?;
    let secret = make_secret(ctx, ns, &secret).await?;
    let api = snapshots(ctx, ns);
    let made = api
        .create(
            &PostParams::default(),
            &volume::volume_snapshot(checkpoint, claim, class, &secret),
        )
        .await
        .map_err(|e| Failure::from(format!("cannot create the VolumeSnapshot: {e}")))?;
    let cut = wait_for_cut(&api, &made.name_any()).await;
    let released = holding.release().await;
    let why = match (&cut, &released) {
        (Ok(()), Ok(r)) if r.why == "release" => None,
        (Err(e), _) => Some(e.clone()),
        (_, Ok(r)) => Some(format!(
            "the session's runner ended the hold by itself ({}) before it was released",
            r.why
        )),
        (_, Err(e)) => Some(format!("the hold's release was not confirmed: {e}")),
    };
    if let Some(why) = why {
        let _ = delete_exactly(&api, &made.name_any(), made.metadata.uid.clone(), None).await;
        return Err(why.into());
    }
    let mark = serde_json::json!({"metadata": {"annotations": {volume::CUT_WHILE_HELD: "true"}}});
    api.patch(
        &made.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&mark),
    )
    .await
    .map_err(|e| Failure::from(format!("cannot mark the VolumeSnapshot as cut: {e}")))?;
    Ok(())
}

/// Creates the Secret under a name the API server makes unique; its name.
async fn make_secret(
    ctx: &Context,
    ns: &str,
    secret: &Secret,
) -> std::result::Result<String, Failure> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    api.create(&PostParams::default(), secret)
        .await
        .map(|made| made.name_any())
        .map_err(|e| format!("cannot create the Secret with bash's state: {e}").into())
}

/// Reads the snapshot until the storage has cut it, failed it, or
/// [`CUT_WAIT`] has passed.
async fn wait_for_cut(api: &Api<DynamicObject>, name: &str) -> std::result::Result<(), String> {
    let give_up = tokio::time::Instant::now() + CUT_WAIT;
    loop {
        match api.get_opt(name).await {
            Ok(Some(obj)) => {
                let seen = volume::Snapshot::of(&obj);
                if let Some(e) = seen.error {
                    return Err(format!("the storage failed the VolumeSnapshot: {e}"));
                }
                if seen.cut {
                    return Ok(());
                }
            }
            Ok(None) => {
                return Err(format!(
                    "VolumeSnapshot {name} went away while it was taken"
                ));
            }
            // A failed read is tried again until the deadline.
            Err(e) => tracing::debug!(error = %e, "reading the VolumeSnapshot failed"),
        }
        if tokio::time::Instant::now() >= give_up {
            return Err(format!(
                "the storage did not cut VolumeSnapshot {name} within {} s",
                CUT_WAIT.as_secs()
            ));
        }
        tokio::time::sleep(POLL).await;
    }
}
