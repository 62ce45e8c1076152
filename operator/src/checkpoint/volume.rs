//! A checkpoint taken as a VolumeSnapshot of the session's workspace
//! claim, decided and built without I/O: whether the session's storage
//! allows it, the snapshot and the Secret with bash's state that make the
//! checkpoint, what a snapshot's status says, and the one step a
//! reconcile takes.
//!
//! Why both halves: the snapshot copies the claim whole, at the storage
//! layer, in the time the driver takes (a copy-on-write driver: moments,
//! whatever the size); bash's state comes from the runner (`Hold`), which
//! holds the workspace still until the snapshot is cut, so the files and
//! the state are of one moment between two calls. The source runner's own
//! state directory comes with the volume; forks never use it (the
//! runner's `--restore-from` discards it and takes the held state).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use crds::{AgentCheckpoint, AgentSession, CheckpointMethod};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::ResourceExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use runner_api::proto::ShellState;

use crate::checkpoint::build::owned;
use crate::checkpoint::plan::claim_name;
use crate::names::controlled_by;

/// The VolumeSnapshot API's group.
pub const GROUP: &str = "snapshot.storage.k8s.io";
/// Marks the StorageClass-wide default VolumeSnapshotClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "snapshot.storage.kubernetes.io/is-default-class";
/// Set on a VolumeSnapshot once it was seen cut while the runner held the
/// workspace still; one without it is from an attempt that was cut short
/// and is not trusted.
pub const CUT_WHILE_HELD: &str = "agentplane.dev/cut-while-held";
/// On a checkpoint's VolumeSnapshot: the Secret made for it, with bash's
/// state held at its cut.
pub const STATE_SECRET: &str = "agentplane.dev/state-secret";
/// Most bytes of bash's state a checkpoint's Secret carries (a Secret
/// holds at most 1 MiB in all).
pub const MAX_STATE_BYTES: usize = 900 << 10;
/// Seconds the runner holds the workspace for one snapshot at most.
pub const HOLD_SECONDS: u32 = 120;

/// `VolumeSnapshot` in `snapshot.storage.k8s.io/v1`.
pub fn snapshot_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, "v1", "VolumeSnapshot"),
        "volumesnapshots",
    )
}

/// `VolumeSnapshotClass` in `snapshot.storage.k8s.io/v1`.
pub fn class_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, "v1", "VolumeSnapshotClass"),
        "volumesnapshotclasses",
    )
}

/// The prefix of the Secrets holding a volume checkpoint's manifest and
/// state: each attempt gets a new one (the API server adds a suffix), so
/// the operator needs no right to read or change Secrets, only to create
/// them; the snapshot names its own.
pub fn state_secret_prefix(checkpoint: &str) -> String {
    format!("{}-", crate::names::object_name(checkpoint, "ckpt-state"))
}

/// The name of a checkpoint's VolumeSnapshot (the name its claim would have).
pub fn snapshot_name(checkpoint: &str) -> String {
    claim_name(checkpoint)
}

/// A VolumeSnapshotClass as the choice needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotClass {
    pub name: String,
    pub driver: String,
    pub default: bool,
}

impl SnapshotClass {
    /// Reads one listed class; `None` for an object without a driver.
    pub fn of(obj: &DynamicObject) -> Option<SnapshotClass> {
        Some(SnapshotClass {
            name: obj.metadata.name.clone()?,
            driver: obj.data.get("driver")?.as_str()?.to_owned(),
            default: obj
                .annotations()
                .get(DEFAULT_CLASS_ANNOTATION)
                .is_some_and(|v| v == "true"),
        })
    }
}

/// What the session's storage offers, as read.
#[derive(Debug, Clone, Copy, Default)]
pub struct Storage<'a> {
    /// The session's workspace claim.
    pub claim: Option<&'a PersistentVolumeClaim>,
    /// The provisioner of the claim's StorageClass (`None`: no such class).
    pub provisioner: Option<&'a str>,
    /// Every VolumeSnapshotClass (none where the API is not installed).
    pub classes: &'a [SnapshotClass],
    /// The largest checkpoint the platform allows (operator
    /// `--checkpoint-max-size`).
    pub max_bytes: u64,
}

/// How a checkpoint is taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// An archive; `why` says why not a snapshot (for the condition).
    Archive { why: String },
    /// A VolumeSnapshot of `claim` in `class`; forks' claims are made in
    /// `storage_class`.
    Snapshot {
        claim: String,
        class: String,
        storage_class: String,
    },
    /// `spec.method: VolumeSnapshot` asked for what cannot be: Failed.
    Refused { message: String },
}

/// Why `session`'s workspace cannot be snapshotted, or the snapshot to take.
fn snapshot_of(
    checkpoint: &AgentCheckpoint,
    session: &AgentSession,
    storage: &Storage<'_>,
) -> Result<(String, String, String), String> {
    if !checkpoint.spec.source.path.is_empty() {
        return Err(
            "source.path asks for part of the workdir and a VolumeSnapshot copies the whole volume"
                .into(),
        );
    }
    let has_claim = session
        .spec
        .workspace
        .as_ref()
        .is_some_and(|w| w.volume_claim_template.is_some());
    if !has_claim {
        return Err("the session's workspace is an emptyDir, not a claim".into());
    }
    if let Some(i) = session.spec.env.iter().position(|e| {
        e.value_from
            .as_ref()
            .is_some_and(|v| v.secret_key_ref.is_some())
    }) {
        return Err(format!(
            "spec.env[{i}] takes its value from a Secret, and the session's runner keeps bash's state (its environment with it) on the volume a snapshot copies"
        ));
    }
    let Some(claim) = storage.claim else {
        return Err("the session's workspace claim is not there".into());
    };
    let spec = claim.spec.as_ref();
    let Some(class) = spec.and_then(|s| s.storage_class_name.clone()) else {
        return Err(format!(
            "PersistentVolumeClaim {} names no StorageClass",
            claim.name_any()
        ));
    };
    // A snapshot holds the whole volume: its size is what is bounded.
    let size = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(crate::quantity::of);
    if let Some(size) = size.filter(|size| *size > u128::from(storage.max_bytes)) {
        return Err(format!(
            "the claim asks for {size} bytes, more than the platform's largest checkpoint of {} bytes (operator --checkpoint-max-size)",
            storage.max_bytes
        ));
    }
    if let (Some(size), Some(max)) = (size, checkpoint.spec.max_bytes)
        && size > u128::from(max)
    {
        return Err(format!(
            "the claim asks for {size} bytes, more than the checkpoint's maxBytes of {max}"
        ));
    }
    let Some(driver) = storage.provisioner else {
        return Err(format!("StorageClass {class} is not there"));
    };
    let mut classes: Vec<&SnapshotClass> = storage
        .classes
        .iter()
        .filter(|c| c.driver == driver)
        .collect();
    classes.sort_by(|a, b| b.default.cmp(&a.default).then(a.name.cmp(&b.name)));
    let Some(snapshot_class) = classes.first() else {
        return Err(format!(
            "no VolumeSnapshotClass has the driver {driver} of StorageClass {class}"
        ));
    };
    Ok((claim.name_any(), snapshot_class.name.clone(), class))
}

/// How `checkpoint` of `session` is taken, given the session's storage.
pub fn choose(
    checkpoint: &AgentCheckpoint,
    session: &AgentSession,
    storage: &Storage<'_>,
) -> Choice {
    if checkpoint.spec.method == Some(CheckpointMethod::Archive) {
        return Choice::Archive {
            why: "spec.method asks for an archive".into(),
        };
    }
    match snapshot_of(checkpoint, session, storage) {
        Ok((claim, class, storage_class)) => Choice::Snapshot {
            claim,
            class,
            storage_class,
        },
        Err(why) if checkpoint.spec.method == Some(CheckpointMethod::VolumeSnapshot) => {
            Choice::Refused {
                message: format!("spec.method is VolumeSnapshot, but {why}"),
            }
        }
        Err(why) => Choice::Archive { why },
    }
}

/// The checkpoint's VolumeSnapshot of `claim`, owned by the checkpoint,
/// naming the Secret made for it.
pub fn volume_snapshot(
    checkpoint: &AgentCheckpoint,
    claim: &str,
    class: &str,
    state_secret: &str,
) -> DynamicObject {
    let name = snapshot_name(&checkpoint.name_any());
    let mut obj = DynamicObject::new(&name, &snapshot_resource());
    obj.metadata = owned(checkpoint, name, "snapshot");
    obj.metadata.annotations = Some(BTreeMap::from([(
        STATE_SECRET.to_owned(),
        state_secret.to_owned(),
    )]));
    obj.data = serde_json::json!({
        "spec": {
            "volumeSnapshotClassName": class,
            "source": {"persistentVolumeClaimName": claim},
        }
    });
    obj
}

/// The manifest a fork's runner reads (`agent-sidecar`'s checkpoint
/// manifest, files on the volume).
pub fn manifest(checkpoint: &AgentCheckpoint, shell_state: bool) -> String {
    serde_json::json!({
        "archiveBytes": 0,
        "shellState": shell_state,
        "files": "volume",
        "checkpoint": checkpoint.metadata.uid.clone().unwrap_or_default(),
    })
    .to_string()
}

/// The Secret with the manifest and bash's state, owned by the checkpoint
/// (a Secret: the state holds the variables the session exported). Too
/// large a state is an error naming its size.
pub fn state_secret(
    checkpoint: &AgentCheckpoint,
    state: Option<&ShellState>,
) -> Result<Secret, String> {
    use prost::Message;
    let mut data = BTreeMap::from([(
        runner_api::CHECKPOINT_MANIFEST.to_owned(),
        ByteString(manifest(checkpoint, state.is_some()).into_bytes()),
    )]);
    if let Some(state) = state {
        let bytes = state.encode_to_vec();
        if bytes.len() > MAX_STATE_BYTES {
            return Err(format!(
                "bash's state is {} bytes, more than the {MAX_STATE_BYTES} a VolumeSnapshot checkpoint's Secret holds; take it with spec.method: Archive",
                bytes.len()
            ));
        }
        data.insert(runner_api::CHECKPOINT_STATE.to_owned(), ByteString(bytes));
    }
    let mut metadata = owned(checkpoint, String::new(), "state");
    metadata.name = None;
    metadata.generate_name = Some(state_secret_prefix(&checkpoint.name_any()));
    Ok(Secret {
        metadata,
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Secret::default()
    })
}

/// What a VolumeSnapshot's status says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Snapshot {
    /// The storage has cut it (`creationTime` set): later writes are not in it.
    pub cut: bool,
    pub ready: bool,
    /// Bytes a volume made from it needs.
    pub restore_size: Option<u64>,
    pub error: Option<String>,
    /// Seen cut while the runner held the workspace.
    pub trusted: bool,
    /// The Secret with bash's state made for it.
    pub state_secret: Option<String>,
}

impl Snapshot {
    pub fn of(obj: &DynamicObject) -> Snapshot {
        let status = obj.data.get("status");
        let get = |k: &str| status.and_then(|s| s.get(k));
        Snapshot {
            cut: get("creationTime").is_some_and(|t| !t.is_null()),
            ready: get("readyToUse").and_then(serde_json::Value::as_bool) == Some(true),
            restore_size: get("restoreSize")
                .and_then(|q| match q {
                    serde_json::Value::String(s) => crate::quantity::bytes(s),
                    serde_json::Value::Number(n) => n.as_u64().map(u128::from),
                    _ => None,
                })
                .and_then(|b| u64::try_from(b).ok()),
            error: get("error")
                .and_then(|e| e.get("message"))
                .and_then(serde_json::Value::as_str)
                .map(str::to_owned),
            trusted: obj
                .annotations()
                .get(CUT_WHILE_HELD)
                .is_some_and(|v| v == "true"),
            state_secret: obj.annotations().get(STATE_SECRET).cloned(),
        }
    }
}

/// The one step of a volume checkpoint's reconcile.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Taking needs the source runner, which is not ready: wait for it.
    NeedsSource,
    /// No snapshot yet: hold the source's workspace, make the Secret and the
    /// snapshot, wait for the cut, release.
    Take { source: SocketAddr },
    /// Cut and trusted, not yet ready to use: look again soon.
    Wait { message: String },
    /// Ready: the checkpoint is too.
    Ready {
        size: Option<u64>,
        state_secret: String,
    },
    /// A snapshot from an attempt cut short, or one the storage failed:
    /// delete it (by UID) and count a failed attempt.
    Discard { uid: Option<String>, why: String },
    /// Something else stands under a name the checkpoint needs.
    NameTaken { message: String },
}

/// The step given the checkpoint's snapshot as read and the source
/// runner's address (needed only to take).
pub fn decide(
    checkpoint: &AgentCheckpoint,
    snapshot: Option<&DynamicObject>,
    source: Option<SocketAddr>,
) -> Step {
    let uid = checkpoint.metadata.uid.as_deref();
    if let Some(s) = snapshot.filter(|s| !controlled_by(&s.metadata, uid)) {
        return Step::NameTaken {
            message: format!(
                "VolumeSnapshot {} already exists and belongs to something else; rename the checkpoint or remove that snapshot",
                s.name_any()
            ),
        };
    }
    let Some(obj) = snapshot else {
        return source.map_or(Step::NeedsSource, |source| Step::Take { source });
    };
    let seen = Snapshot::of(obj);
    match seen {
        Snapshot {
            error: Some(e), ..
        } => Step::Discard {
            uid: obj.metadata.uid.clone(),
            why: format!("the storage failed the VolumeSnapshot: {e}"),
        },
        Snapshot { trusted: false, .. } => Step::Discard {
            uid: obj.metadata.uid.clone(),
            why: "a VolumeSnapshot from an attempt that was cut short (not seen cut while the workspace was held)".into(),
        },
        Snapshot {
            state_secret: None,
            ..
        } => Step::Discard {
            uid: obj.metadata.uid.clone(),
            why: "a VolumeSnapshot that names no Secret with bash's state".into(),
        },
        Snapshot {
            ready: true,
            restore_size,
            state_secret: Some(state_secret),
            ..
        } => Step::Ready {
            size: restore_size,
            state_secret,
        },
        _ => Step::Wait {
            message: format!("VolumeSnapshot {} is cut; waiting for the storage to make it ready to use", obj.name_any()),
        },
    }
}
