//! A fork from a session's name (`spec.from.session`), decided without
//! I/O: the name of the checkpoint the fork has taken of its source, that
//! checkpoint as the fork makes it, and -- given what stands under that
//! name -- whether to make it, start from it, or wait and say why.
//!
//! The checkpoint is the fork's own: controlled by the fork (deleting the
//! fork deletes it, and its claim with it), made with a plain create, never
//! adopted. It is made once: if it goes, the fork does not take another
//! (that would be the source at a later moment than the fork started from).

use std::collections::BTreeMap;

use crds::{AgentCheckpoint, AgentCheckpointSpec, AgentSession, CheckpointSource};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;

use crate::names::{Names, SESSION_LABEL, controlled_by, object_name};
use crate::resolution::CondSpec;

/// The condition type a fork's wait is reported under.
const CONDITION: &str = "Checkpoint";

/// The name of the checkpoint the fork called `fork` takes of its source:
/// `<fork>-from`, or for a long name its head, a digest of the whole name
/// and `-from` (at most 63 characters, as the operator's other names).
pub fn taken_name(fork: &str) -> String {
    object_name(fork, "from")
}

/// The AgentCheckpoint `session` starts from: the one it names, or the one
/// it takes of the session it names. `None` for a session that is no fork
/// (or whose `from` names neither, which validation refuses).
pub fn checkpoint_of(session: &AgentSession) -> Option<String> {
    let from = session.spec.from.as_ref()?;
    if let Some(checkpoint) = &from.checkpoint {
        return Some(checkpoint.clone());
    }
    from.session.as_ref()?;
    Some(taken_name(session.metadata.name.as_deref()?))
}

/// Whether `session` starts from the checkpoint `ns/checkpoint` (named
/// in its `from`, or the one it takes of a session): a change of that
/// checkpoint wakes it, instead of the fork looking again on a timer.
pub fn waits_on(session: &AgentSession, ns: &str, checkpoint: &str) -> bool {
    session.metadata.namespace.as_deref() == Some(ns)
        && checkpoint_of(session).as_deref() == Some(checkpoint)
}

/// The checkpoint `fork` takes of the session `source`: named after the
/// fork, in its namespace, labelled as the platform's, controlled by the
/// fork, all of the source's workdir with bash's state. `None` for a fork
/// without a name or UID (an object not read from the API server), which
/// could not own it.
pub fn taken_checkpoint(fork: &AgentSession, source: &str) -> Option<AgentCheckpoint> {
    let owner = fork.controller_owner_ref(&())?;
    let name = fork.metadata.name.as_deref()?;
    let labels = BTreeMap::from([
        (
            "app.kubernetes.io/managed-by".to_owned(),
            "agentplane".to_owned(),
        ),
        (SESSION_LABEL.to_owned(), Names::of(fork).label),
    ]);
    Some(AgentCheckpoint {
        metadata: ObjectMeta {
            name: Some(taken_name(name)),
            namespace: fork.metadata.namespace.clone(),
            labels: Some(labels),
            owner_references: Some(vec![owner]),
            ..ObjectMeta::default()
        },
        spec: AgentCheckpointSpec {
            source: CheckpointSource {
                session: source.to_owned(),
                path: String::new(),
            },
            shell_state: true,
            max_bytes: None,
            method: None,
        },
        status: None,
    })
}

/// What the session controller does about a fork's checkpoint.
#[derive(Debug, Clone)]
pub enum Source {
    /// Start from this checkpoint (or its absence), as a fork of a named
    /// checkpoint does: `fork_condition` judges it.
    Use(Option<Box<AgentCheckpoint>>),
    /// Make this checkpoint (plain create), then start from it.
    Create(Box<AgentCheckpoint>),
    /// Do not start; the fork's `Checkpoint` condition says why.
    Hold(CondSpec),
}

fn hold(reason: &str, message: String) -> Source {
    Source::Hold(CondSpec {
        type_: CONDITION,
        status: false,
        reason: reason.into(),
        message,
    })
}

/// Reasons of a `Checkpoint` condition that a fork writes only once its
/// checkpoint existed (see `plan::fork_condition`).
const SEEN: [&str; 5] = [
    "CheckpointNotReady",
    "CheckpointReady",
    "CheckpointFailed",
    "CheckpointDataMissing",
    "CheckpointNotFound",
];

/// Whether the fork's last status says its checkpoint was made.
fn made_before(fork: &AgentSession) -> bool {
    fork.status
        .as_ref()
        .into_iter()
        .flat_map(|s| &s.conditions)
        .any(|c| c.type_ == CONDITION && SEEN.contains(&c.reason.as_str()))
}

/// What to do about `fork`'s checkpoint, given `existing`, what stands
/// under its name in the fork's namespace.
pub fn decide(fork: &AgentSession, existing: Option<AgentCheckpoint>) -> Source {
    let Some(from) = fork.spec.from.as_ref() else {
        return Source::Use(existing.map(Box::new));
    };
    let Some(source) = from
        .session
        .as_deref()
        .filter(|_| from.checkpoint.is_none())
    else {
        return Source::Use(existing.map(Box::new));
    };
    let own = fork.metadata.name.as_deref().unwrap_or_default();
    let name = taken_name(own);
    if source == own {
        return hold(
            "ForkOfItself",
            format!(
                "spec.from.session names this session ({own}); a session cannot start from a checkpoint of itself, which it would have to be running to take"
            ),
        );
    }
    match existing {
        Some(c) if !controlled_by(&c.metadata, fork.metadata.uid.as_deref()) => hold(
            "NameTaken",
            format!(
                "AgentCheckpoint {name} already exists and is not this session's; the fork takes its own checkpoint of session {source} under that name: remove that checkpoint, or fork under another name"
            ),
        ),
        Some(c) => Source::Use(Some(Box::new(c))),
        None if made_before(fork) => hold(
            "CheckpointNotFound",
            format!(
                "AgentCheckpoint {name}, which this session took of session {source}, is gone; it is taken once (another would hold {source} as it is now, not as the fork started): make a new fork to start from {source} as it is now"
            ),
        ),
        None => match taken_checkpoint(fork, source) {
            Some(c) => Source::Create(Box::new(c)),
            None => hold(
                "NoUid",
                "the session has no name or UID yet to own its checkpoint by".into(),
            ),
        },
    }
}

/// A fork whose workspace claim is made from its checkpoint's
/// VolumeSnapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkSnapshot {
    /// The VolumeSnapshot, in the fork's namespace.
    pub snapshot: String,
    /// The StorageClass the claim is made in (the source claim's).
    pub storage_class: String,
    /// The Secret with bash's state the fork's runner imports.
    pub state_secret: String,
}

/// For a fork of a Ready checkpoint taken as a VolumeSnapshot: the
/// snapshot its claim is made from, or why it cannot start (it needs a
/// claim workspace, in the snapshot's StorageClass). `Ok(None)` for a
/// checkpoint taken as an archive.
pub fn volume_fork(
    fork: &AgentSession,
    checkpoint: &AgentCheckpoint,
) -> Result<Option<ForkSnapshot>, CondSpec> {
    let status = checkpoint.status.as_ref();
    if status.and_then(|s| s.method) != Some(crds::CheckpointMethod::VolumeSnapshot) {
        return Ok(None);
    }
    let name = checkpoint.metadata.name.as_deref().unwrap_or_default();
    let snapshot = status
        .and_then(|s| s.volume_snapshot.clone())
        .unwrap_or_default();
    let storage_class = status
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    let state_secret = status
        .and_then(|s| s.state_secret.clone())
        .unwrap_or_default();
    let template = fork
        .spec
        .workspace
        .as_ref()
        .and_then(|w| w.volume_claim_template.as_ref());
    let Some(template) = template else {
        return Err(CondSpec {
            type_: CONDITION,
            status: false,
            reason: "CheckpointNeedsClaim".into(),
            message: format!(
                "AgentCheckpoint {name} is a VolumeSnapshot, which only a claim can be made from: give this session spec.workspace.volumeClaimTemplate (StorageClass {storage_class}), or fork a checkpoint taken with spec.method: Archive"
            ),
        });
    };
    match template.spec.storage_class_name.as_deref() {
        Some(theirs) if theirs != storage_class => Err(CondSpec {
            type_: CONDITION,
            status: false,
            reason: "StorageClassMismatch".into(),
            message: format!(
                "AgentCheckpoint {name} is a VolumeSnapshot in StorageClass {storage_class}, and this session's claim asks for StorageClass {theirs}: leave storageClassName out, or set it to {storage_class}"
            ),
        }),
        _ => Ok(Some(ForkSnapshot {
            snapshot,
            storage_class,
            state_secret,
        })),
    }
}
