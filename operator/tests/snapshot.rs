//! Checkpoints taken as VolumeSnapshots, without a cluster: when the
//! session's storage allows one, the snapshot and the Secret the
//! checkpoint owns, each step from what its snapshot says, and a fork's
//! claim and pod made from it.

use std::collections::BTreeMap;

use crds::{AgentCheckpoint, AgentSession, CheckpointMethod};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
use operator::checkpoint::fork::{self, ForkSnapshot};
use operator::checkpoint::plan::{self, fork_condition};
use operator::checkpoint::volume::{
    self, CUT_WHILE_HELD, Choice, STATE_SECRET, SnapshotClass, Step, Storage,
};
use operator::resolution::{CondSpec, Listings, resolve};
use operator::session::plan::{self as session_plan, Observed, PodAction};
use operator::validation::entries;
use runner_api::proto::{ShellState, ShellVariable};
use serde_json::json;

mod common;
use common::{cfg, now};

const GIB: u64 = 1 << 30;

fn checkpoint(spec: serde_json::Value) -> AgentCheckpoint {
    let mut c = AgentCheckpoint::new("snap", serde_json::from_value(spec).expect("spec"));
    c.metadata.namespace = Some("team-a".into());
    c.metadata.uid = Some("ckpt-uid".into());
    c
}

fn auto() -> AgentCheckpoint {
    checkpoint(json!({"source": {"session": "src"}}))
}

fn session(spec: serde_json::Value) -> AgentSession {
    serde_json::from_value(json!({
        "apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
        "metadata": {"name": "src", "namespace": "team-a", "uid": "s-uid"},
        "spec": spec,
    }))
    .expect("session")
}

fn on_claim() -> AgentSession {
    session(json!({"image": "busybox", "tools": [],
        "workspace": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "resources": {"requests": {"storage": "1Gi"}}}}}}))
}

fn claim(class: Option<&str>, size: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": "src-workspace"},
        "spec": {"storageClassName": class, "resources": {"requests": {"storage": size}}}
    }))
    .expect("claim")
}

fn class(name: &str, driver: &str, default: bool) -> SnapshotClass {
    SnapshotClass {
        name: name.into(),
        driver: driver.into(),
        default,
    }
}

fn storage<'a>(
    claim: Option<&'a PersistentVolumeClaim>,
    provisioner: Option<&'a str>,
    classes: &'a [SnapshotClass],
) -> Storage<'a> {
    Storage {
        claim,
        provisioner,
        classes,
        max_bytes: 2 * GIB,
    }
}

fn archive_why(choice: Choice) -> String {
    match choice {
        Choice::Archive { why } => why,
        other => panic!("an archive: {other:?}"),
    }
}

#[test]
fn a_snapshot_is_taken_where_the_storage_allows_one_and_an_archive_otherwise() {
    let pvc = claim(Some("fast"), "1Gi");
    let classes = [
        class("other", "other.csi", true),
        class("b-snap", "fast.csi", false),
        class("a-snap", "fast.csi", false),
    ];
    let s = on_claim();
    // The claim's driver has classes: the default among them, else the first by name.
    assert_eq!(
        volume::choose(
            &auto(),
            &s,
            &storage(Some(&pvc), Some("fast.csi"), &classes)
        ),
        Choice::Snapshot {
            claim: "src-workspace".into(),
            class: "a-snap".into(),
            storage_class: "fast".into(),
        }
    );
    let with_default = [
        class("a-snap", "fast.csi", false),
        class("z-snap", "fast.csi", true),
    ];
    let Choice::Snapshot { class: picked, .. } = volume::choose(
        &auto(),
        &s,
        &storage(Some(&pvc), Some("fast.csi"), &with_default),
    ) else {
        panic!("a snapshot");
    };
    assert_eq!(picked, "z-snap");

    // Each reason for an archive, named.
    let ok = storage(Some(&pvc), Some("fast.csi"), &classes);
    let asked = checkpoint(json!({"source": {"session": "src"}, "method": "Archive"}));
    assert!(archive_why(volume::choose(&asked, &s, &ok)).contains("spec.method"));
    let part = checkpoint(json!({"source": {"session": "src", "path": "src"}}));
    assert!(archive_why(volume::choose(&part, &s, &ok)).contains("source.path"));
    let empty = session(json!({"image": "busybox", "tools": []}));
    assert!(archive_why(volume::choose(&auto(), &empty, &ok)).contains("emptyDir"));
    let mut secret_env = on_claim();
    secret_env.spec.env = serde_json::from_value(json!([
        {"name": "A", "value": "1"},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}
    ]))
    .expect("env");
    let why = archive_why(volume::choose(&auto(), &secret_env, &ok));
    assert!(
        why.contains("spec.env[1]") && why.contains("Secret"),
        "{why}"
    );
    let why = archive_why(volume::choose(
        &auto(),
        &s,
        &storage(None, Some("fast.csi"), &classes),
    ));
    assert!(why.contains("not there"), "{why}");
    let classless = claim(None, "1Gi");
    let why = archive_why(volume::choose(
        &auto(),
        &s,
        &storage(Some(&classless), Some("fast.csi"), &classes),
    ));
    assert!(why.contains("no StorageClass"), "{why}");
    let huge = claim(Some("fast"), "3Gi");
    let why = archive_why(volume::choose(
        &auto(),
        &s,
        &storage(Some(&huge), Some("fast.csi"), &classes),
    ));
    assert!(why.contains("--checkpoint-max-size"), "{why}");
    let why = archive_why(volume::choose(
        &auto(),
        &s,
        &storage(Some(&pvc), None, &classes),
    ));
    assert!(why.contains("StorageClass fast is not there"), "{why}");
    let why = archive_why(volume::choose(
        &auto(),
        &s,
        &storage(Some(&pvc), Some("slow.csi"), &classes),
    ));
    assert!(
        why.contains("no VolumeSnapshotClass has the driver slow.csi"),
        "{why}"
    );
    let capped = checkpoint(json!({"source": {"session": "src"}, "maxBytes": 1000}));
    let why = archive_why(volume::choose(&capped, &s, &ok));
    assert!(why.contains("maxBytes of 1000"), "{why}");
    // Asked for by name and not possible: refused, naming why.
    let insist = checkpoint(json!({"source": {"session": "src"}, "method": "VolumeSnapshot"}));
    match volume::choose(&insist, &empty, &ok) {
        Choice::Refused { message } => {
            assert!(
                message.starts_with("spec.method is VolumeSnapshot, but"),
                "{message}"
            );
            assert!(message.contains("emptyDir"), "{message}");
        }
        other => panic!("refused: {other:?}"),
    }
}

fn controller(uid: &str) -> Vec<OwnerReference> {
    vec![OwnerReference {
        uid: uid.into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]
}

fn snapshot(owner: &str, annotations: &[(&str, &str)], status: serde_json::Value) -> DynamicObject {
    let mut obj = DynamicObject::new("snap-ckpt", &volume::snapshot_resource());
    obj.metadata.uid = Some("vs-uid".into());
    obj.metadata.owner_references = Some(controller(owner));
    obj.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>(),
    );
    obj.data = json!({"status": status});
    obj
}

#[test]
fn each_step_follows_from_what_the_snapshot_says() {
    let c = auto();
    let source: std::net::SocketAddr = "10.0.0.7:7443".parse().expect("addr");
    assert_eq!(
        volume::decide(&c, None, Some(source)),
        Step::Take { source }
    );
    assert_eq!(
        volume::decide(&c, None, None),
        Step::NeedsSource,
        "the source is needed to take"
    );
    let trusted = [
        (CUT_WHILE_HELD, "true"),
        (STATE_SECRET, "snap-ckpt-state-x1"),
    ];
    // Someone else's under its name.
    let theirs = snapshot("other", &trusted, json!({}));
    assert!(matches!(
        volume::decide(&c, Some(&theirs), Some(source)),
        Step::NameTaken { message } if message.contains("VolumeSnapshot snap-ckpt")
    ));
    // Cut short (never seen cut while held), failed by the storage, or
    // naming no Secret: discarded by UID, an attempt counted.
    for (obj, says) in [
        (
            snapshot(
                "ckpt-uid",
                &[(STATE_SECRET, "s")],
                json!({"readyToUse": true}),
            ),
            "cut short",
        ),
        (
            snapshot(
                "ckpt-uid",
                &trusted,
                json!({"error": {"message": "disk full"}}),
            ),
            "disk full",
        ),
        (
            snapshot(
                "ckpt-uid",
                &[(CUT_WHILE_HELD, "true")],
                json!({"readyToUse": true}),
            ),
            "names no Secret",
        ),
    ] {
        match volume::decide(&c, Some(&obj), None) {
            Step::Discard { uid, why } => {
                assert_eq!(uid.as_deref(), Some("vs-uid"));
                assert!(why.contains(says), "{why}");
            }
            other => panic!("discarded ({says}): {other:?}"),
        }
    }
    // Cut, not ready: wait; ready: the size a volume from it needs.
    let cut = snapshot(
        "ckpt-uid",
        &trusted,
        json!({"creationTime": "2026-12-07T00:00:00Z", "readyToUse": false}),
    );
    assert!(matches!(
        volume::decide(&c, Some(&cut), None),
        Step::Wait { .. }
    ));
    let ready = snapshot(
        "ckpt-uid",
        &trusted,
        json!({"creationTime": "2026-12-07T00:00:00Z", "readyToUse": true, "restoreSize": "10Mi"}),
    );
    assert_eq!(
        volume::decide(&c, Some(&ready), None),
        Step::Ready {
            size: Some(10 << 20),
            state_secret: "snap-ckpt-state-x1".into()
        }
    );
    // Its Ready status keeps how it was taken, for forks.
    let mut taking = c.clone();
    taking.status = Some(crds::AgentCheckpointStatus {
        method: Some(CheckpointMethod::VolumeSnapshot),
        volume_snapshot: Some("snap-ckpt".into()),
        storage_class_name: Some("fast".into()),
        ..Default::default()
    });
    let st = plan::snapshot_ready_status(&taking, Some(10 << 20), "snap-ckpt-state-x1", now());
    assert_eq!(st.phase, Some(crds::CheckpointPhase::Ready));
    assert_eq!(st.method, Some(CheckpointMethod::VolumeSnapshot));
    assert_eq!(st.state_secret.as_deref(), Some("snap-ckpt-state-x1"));
    assert_eq!(st.storage_class_name.as_deref(), Some("fast"));
    // A retry's status keeps it too.
    taking.status = Some(st);
    let (retry, _) = plan::after_failure(&taking, "x", now());
    assert_eq!(retry.volume_snapshot.as_deref(), Some("snap-ckpt"));
}

#[test]
fn the_snapshot_and_the_state_secret_are_the_checkpoints() {
    use prost::Message;
    let c = auto();
    let vs = volume::volume_snapshot(&c, "src-workspace", "a-snap", "snap-ckpt-state-x1");
    assert_eq!(vs.metadata.name.as_deref(), Some("snap-ckpt"));
    let owner = &vs.metadata.owner_references.as_ref().expect("owned")[0];
    assert_eq!(
        (owner.uid.as_str(), owner.controller),
        ("ckpt-uid", Some(true))
    );
    assert_eq!(
        vs.metadata.labels.as_ref().expect("labels")["app.kubernetes.io/managed-by"],
        "agentplane"
    );
    assert_eq!(
        vs.metadata.annotations.as_ref().expect("annotations")[STATE_SECRET],
        "snap-ckpt-state-x1"
    );
    assert_eq!(
        vs.data["spec"],
        json!({"volumeSnapshotClassName": "a-snap", "source": {"persistentVolumeClaimName": "src-workspace"}})
    );

    let state = ShellState {
        variables: vec![ShellVariable {
            name: "V".into(),
            value: Some(b"x".to_vec()),
            attributes: String::new(),
        }],
        cwd: b"proj".to_vec(),
        ..ShellState::default()
    };
    let secret = volume::state_secret(&c, Some(&state)).expect("secret");
    assert_eq!(secret.metadata.name, None, "named by the API server");
    assert_eq!(
        secret.metadata.generate_name.as_deref(),
        Some("snap-ckpt-state-")
    );
    assert_eq!(
        secret.metadata.owner_references.as_ref().expect("owned")[0].uid,
        "ckpt-uid"
    );
    let data = secret.data.expect("data");
    let manifest: serde_json::Value =
        serde_json::from_slice(&data[runner_api::CHECKPOINT_MANIFEST].0).expect("manifest");
    assert_eq!(
        manifest,
        json!({"archiveBytes": 0, "shellState": true, "files": "volume", "checkpoint": "ckpt-uid"})
    );
    assert_eq!(
        ShellState::decode(data[runner_api::CHECKPOINT_STATE].0.as_slice()).expect("state"),
        state
    );
    // Without shell state: the manifest says so and no state is stored.
    let bare = volume::state_secret(&c, None)
        .expect("secret")
        .data
        .expect("data");
    assert!(!bare.contains_key(runner_api::CHECKPOINT_STATE));
    // A state past what a Secret holds: refused, naming its size.
    let big = ShellState {
        functions: vec![b'x'; volume::MAX_STATE_BYTES + 1],
        ..ShellState::default()
    };
    let err = volume::state_secret(&c, Some(&big)).expect_err("too large");
    assert!(err.contains("spec.method: Archive"), "{err}");
}

fn ready_snapshot_checkpoint() -> AgentCheckpoint {
    let mut c = auto();
    c.status = Some(crds::AgentCheckpointStatus {
        phase: Some(crds::CheckpointPhase::Ready),
        method: Some(CheckpointMethod::VolumeSnapshot),
        volume_snapshot: Some("snap-ckpt".into()),
        storage_class_name: Some("fast".into()),
        state_secret: Some("snap-ckpt-state-x1".into()),
        ..Default::default()
    });
    c
}

fn fork_session(workspace: serde_json::Value) -> AgentSession {
    serde_json::from_value(json!({
        "apiVersion": "agentplane.dev/v1alpha1", "kind": "AgentSession",
        "metadata": {"name": "f1", "namespace": "team-a", "uid": "f1-uid"},
        "spec": {"image": "busybox", "tools": [{"type": "agent_toolset_20260401"}],
                 "from": {"checkpoint": "snap"}, "workspace": workspace}
    }))
    .expect("fork")
}

#[test]
fn a_fork_of_a_snapshot_needs_a_claim_in_its_storage_class() {
    let c = ready_snapshot_checkpoint();
    // Its data is the snapshot (its own), not a claim.
    let mut own = kube::core::ObjectMeta {
        name: Some("snap-ckpt".into()),
        owner_references: Some(controller("ckpt-uid")),
        ..Default::default()
    };
    assert!(fork_condition("snap", Some(&c), Some(&own)).0);
    own.owner_references = Some(controller("someone"));
    let (ok, reason, message) = fork_condition("snap", Some(&c), Some(&own));
    assert!(!ok);
    assert_eq!(reason, "CheckpointDataMissing");
    assert!(message.contains("VolumeSnapshot snap-ckpt"), "{message}");

    let want = ForkSnapshot {
        snapshot: "snap-ckpt".into(),
        storage_class: "fast".into(),
        state_secret: "snap-ckpt-state-x1".into(),
    };
    let unnamed = fork_session(
        json!({"volumeClaimTemplate": {"spec": {"resources": {"requests": {"storage": "1Gi"}}}}}),
    );
    assert_eq!(fork::volume_fork(&unnamed, &c), Ok(Some(want.clone())));
    let same = fork_session(json!({"volumeClaimTemplate": {"spec": {"storageClassName": "fast"}}}));
    assert_eq!(fork::volume_fork(&same, &c), Ok(Some(want)));
    let other =
        fork_session(json!({"volumeClaimTemplate": {"spec": {"storageClassName": "slow"}}}));
    let why: CondSpec = fork::volume_fork(&other, &c).expect_err("mismatch");
    assert_eq!(why.reason, "StorageClassMismatch");
    let empty = fork_session(json!({"emptyDir": {}}));
    let why = fork::volume_fork(&empty, &c).expect_err("needs a claim");
    assert_eq!(why.reason, "CheckpointNeedsClaim");
    assert!(
        why.message.contains("volumeClaimTemplate"),
        "{}",
        why.message
    );
    // An archive checkpoint asks nothing of the fork's workspace.
    let mut archived = c.clone();
    archived.status.as_mut().expect("status").method = Some(CheckpointMethod::Archive);
    assert_eq!(fork::volume_fork(&empty, &archived), Ok(None));
}

#[test]
fn a_fork_of_a_snapshot_makes_its_claim_from_it_and_mounts_the_state_secret() {
    let s = fork_session(json!({"volumeClaimTemplate": {"spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}}));
    let res = resolve(&s.spec, &entries(&s.spec), &Listings::new());
    let from = ForkSnapshot {
        snapshot: "snap-ckpt".into(),
        storage_class: "fast".into(),
        state_secret: "snap-ckpt-state-x1".into(),
    };
    let cond = |status: bool| CondSpec {
        type_: "Checkpoint",
        status,
        reason: "R".into(),
        message: "m".into(),
    };
    // Waiting for the checkpoint: no claim either (it can only be made
    // from the snapshot), no pod.
    let waiting = Observed {
        fork: Some(cond(false)),
        ..Observed::default()
    };
    let p = session_plan::plan(&s, &waiting, &res, &cfg(), now());
    assert!(p.claim.is_none(), "no claim before the snapshot is ready");
    assert_eq!(p.pod, PodAction::Keep);

    let ready = Observed {
        fork: Some(cond(true)),
        fork_snapshot: Some(from),
        ..Observed::default()
    };
    let p = session_plan::plan(&s, &ready, &res, &cfg(), now());
    let claim = p.claim.expect("the workspace claim");
    let spec = claim.spec.expect("spec");
    assert_eq!(
        spec.storage_class_name.as_deref(),
        Some("fast"),
        "the snapshot's class"
    );
    let source = spec.data_source_ref.expect("made from the snapshot");
    assert_eq!(
        (
            source.api_group.as_deref(),
            source.kind.as_str(),
            source.name.as_str()
        ),
        (
            Some("snapshot.storage.k8s.io"),
            "VolumeSnapshot",
            "snap-ckpt"
        )
    );
    let recorded = p.status.from_snapshot.clone().expect("recorded for good");
    assert_eq!(recorded.state_secret, "snap-ckpt-state-x1");
    let PodAction::Create(pod) = p.pod else {
        panic!("a pod: {:?}", p.pod);
    };
    let volume = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .find(|v| v.name == "checkpoint")
        .expect("the checkpoint volume");
    assert_eq!(
        volume
            .secret
            .as_ref()
            .and_then(|s| s.secret_name.as_deref()),
        Some("snap-ckpt-state-x1"),
        "the state Secret, not a checkpoint claim"
    );
    assert!(volume.persistent_volume_claim.is_none());

    // Later, with the checkpoint gone: the recorded status keeps the pod's shape.
    let mut later = s.clone();
    later.status = Some(p.status);
    let gone = Observed {
        fork: Some(cond(false)),
        ..Observed::default()
    };
    let again = session_plan::plan(&later, &gone, &res, &cfg(), now());
    assert_eq!(again.status.from_snapshot, Some(recorded));
}
