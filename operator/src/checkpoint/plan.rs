//! What a checkpoint reconcile does, decided without I/O: the volume's
//! size, the next step, the status to write, and -- for the session wing --
//! whether a fork may start from a checkpoint.

use std::time::Duration;

use crds::{AgentCheckpoint, AgentCheckpointStatus, AgentSession, CheckpointPhase, SessionPhase};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use crate::names::controlled_by;

/// Failed takes (a relay error, a sink that ended) before the checkpoint
/// is Failed for good.
pub const MAX_ATTEMPTS: u32 = 5;
/// How often a checkpoint waiting on its session looks again.
pub const WAIT_SESSION: Duration = Duration::from_secs(5);
/// How often a checkpoint waiting on its sink pod looks again (the pod's
/// own changes wake it sooner).
pub const WAIT_SINK: Duration = Duration::from_secs(3);
/// How often a checkpoint that cannot be taken on this platform looks again.
pub const WAIT_PLATFORM: Duration = Duration::from_secs(300);

/// The platform's checkpoint volumes (operator flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// A checkpoint without `maxBytes` gets a volume this large; no
    /// checkpoint gets a smaller one.
    pub default_volume_bytes: u64,
    /// The largest volume; a `maxBytes` that needs more fails.
    pub max_volume_bytes: u64,
    /// The StorageClass of checkpoint volumes (absent: the cluster's default).
    pub storage_class: Option<String>,
    /// Seconds a sink pod waits for its archive.
    pub sink_deadline_seconds: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            default_volume_bytes: 1 << 30,
            max_volume_bytes: 2 << 30,
            storage_class: None,
            sink_deadline_seconds: 900,
        }
    }
}

/// What one checkpoint is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// The claim's request.
    pub volume_bytes: u64,
    /// Most bytes of file content the export may hold.
    pub content_bytes: u64,
    /// Most bytes of archive the sink stores (the volume less a margin for
    /// the filesystem's own).
    pub archive_bytes: u64,
}

/// The sizes of `checkpoint`'s volume, or why it cannot have one.
pub fn sizes(checkpoint: &AgentCheckpoint, settings: &Settings) -> Result<Sizes, String> {
    let max = settings.max_volume_bytes;
    let default = settings.default_volume_bytes.min(max);
    let archive = |volume: u64| volume - volume / 32;
    match checkpoint.spec.max_bytes {
        None => Ok(Sizes {
            volume_bytes: default,
            // Headers and padding take their share of the archive.
            content_bytes: default - default / 8,
            archive_bytes: archive(default),
        }),
        Some(0) => Err("maxBytes must be at least 1".into()),
        Some(asked) => {
            // Room for tar's headers (512 bytes an entry, padding to 512)
            // and the filesystem's own.
            let margin = asked / 8 + (16 << 20);
            let volume = asked.saturating_add(margin).max(default);
            if volume > max {
                return Err(format!(
                    "maxBytes {asked} needs a volume of {volume} bytes, more than the platform's largest checkpoint volume of {max} bytes (operator --checkpoint-max-size); ask for at most {}",
                    max.saturating_sub(max / 8 + (16 << 20))
                ));
            }
            Ok(Sizes {
                volume_bytes: volume,
                content_bytes: asked,
                archive_bytes: archive(volume),
            })
        }
    }
}

/// What the reconcile observed.
#[derive(Debug, Clone, Copy)]
pub struct Observed<'a> {
    /// The source session, in the checkpoint's namespace.
    pub session: Option<&'a AgentSession>,
    /// The source session's sandbox pod.
    pub session_pod: Option<&'a Pod>,
    /// The checkpoint's claim, under its name.
    pub claim: Option<&'a ObjectMeta>,
    /// The sink pod, under its name.
    pub sink: Option<&'a Pod>,
    /// Whether the operator can speak mutual TLS to runners (a gateway is
    /// installed, so runners listen on the pod network).
    pub tls: bool,
}

/// The one step a reconcile takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Ready or Failed: nothing more, except removing a sink pod left.
    Settled,
    /// The checkpoint cannot be taken, ever: Failed.
    Fail { reason: String, message: String },
    /// Not yet: Pending, with why, and when to look again.
    Wait {
        reason: String,
        message: String,
        requeue: Duration,
    },
    /// Make what is missing (the claim, the sink pod), then wait for it.
    Create { claim: bool, sink: bool },
    /// The sink pod ended without the checkpoint being stored: delete it
    /// (a new one follows) and count a failed attempt.
    ReplaceSink {
        name: String,
        uid: Option<String>,
        why: String,
    },
    /// Stream the session's export into the sink.
    Take {
        source: std::net::SocketAddr,
        sink: std::net::SocketAddr,
        sizes: Sizes,
    },
}

fn wait(reason: &str, message: String, requeue: Duration) -> Step {
    Step::Wait {
        reason: reason.into(),
        message,
        requeue,
    }
}

fn pod_phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The address of a pod's runner TLS port, if it has an IP.
pub fn tls_addr(pod: &Pod) -> Option<std::net::SocketAddr> {
    let ip: std::net::IpAddr = pod.status.as_ref()?.pod_ip.as_deref()?.parse().ok()?;
    Some(std::net::SocketAddr::new(ip, runner_api::RUNNER_TLS_PORT))
}

/// The step for `checkpoint` given what was observed.
pub fn decide(checkpoint: &AgentCheckpoint, observed: &Observed<'_>, settings: &Settings) -> Step {
    let phase = checkpoint.status.as_ref().and_then(|s| s.phase);
    if matches!(
        phase,
        Some(CheckpointPhase::Ready | CheckpointPhase::Failed)
    ) {
        return Step::Settled;
    }
    let sizes = match sizes(checkpoint, settings) {
        Ok(s) => s,
        Err(message) => {
            return Step::Fail {
                reason: "TooLarge".into(),
                message,
            };
        }
    };
    let uid = checkpoint.metadata.uid.as_deref();
    if let Some(meta) = observed.claim.filter(|m| !controlled_by(m, uid)) {
        return Step::Fail {
            reason: "NameTaken".into(),
            message: format!(
                "PersistentVolumeClaim {} already exists and belongs to something else; rename the checkpoint or remove that claim",
                meta.name.as_deref().unwrap_or_default()
            ),
        };
    }
    if let Some(pod) = observed.sink.filter(|p| !controlled_by(&p.metadata, uid)) {
        return Step::Fail {
            reason: "NameTaken".into(),
            message: format!(
                "pod {} already exists and belongs to something else; rename the checkpoint or remove that pod",
                pod.metadata.name.as_deref().unwrap_or_default()
            ),
        };
    }
    if !observed.tls {
        return wait(
            "RunnerTlsOff",
            "checkpoints reach the session's runner over the gateway's mutual TLS, and this platform runs no gateway (chart value gateway.enabled)".into(),
            WAIT_PLATFORM,
        );
    }
    let source = match source(checkpoint, observed) {
        Ok(addr) => addr,
        Err(step) => return step,
    };
    if observed.claim.is_none() || observed.sink.is_none() {
        return Step::Create {
            claim: observed.claim.is_none(),
            sink: observed.sink.is_none(),
        };
    }
    sink_step(observed.sink, source, sizes)
}

/// The source runner's address, or the wait for it.
pub fn source(
    checkpoint: &AgentCheckpoint,
    observed: &Observed<'_>,
) -> Result<std::net::SocketAddr, Step> {
    let name = &checkpoint.spec.source.session;
    let Some(session) = observed.session else {
        return Err(wait(
            "SessionNotFound",
            format!(
                "no AgentSession {name} in this namespace; the checkpoint is taken once it exists and is Ready"
            ),
            WAIT_SESSION,
        ));
    };
    let phase = session.status.as_ref().and_then(|s| s.phase);
    if phase != Some(SessionPhase::Ready) {
        return Err(wait(
            "SessionNotReady",
            format!(
                "AgentSession {name} is {}; the checkpoint is taken once it is Ready",
                phase.map_or_else(|| "not started".to_owned(), |p| format!("{p:?}"))
            ),
            WAIT_SESSION,
        ));
    }
    match observed
        .session_pod
        .filter(|p| pod_ready(p))
        .and_then(tls_addr)
    {
        Some(addr) => Ok(addr),
        None => Err(wait(
            "SessionNotReady",
            format!("the sandbox pod of AgentSession {name} is not ready or has no address yet"),
            WAIT_SESSION,
        )),
    }
}

/// With the claim and the sink pod made: replace an ended sink, wait for a
/// starting one, or take.
fn sink_step(sink: Option<&Pod>, source: std::net::SocketAddr, sizes: Sizes) -> Step {
    let Some(pod) = sink else {
        return wait(
            "SinkStarting",
            "the sink pod is being made".into(),
            WAIT_SINK,
        );
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    if pod.metadata.deletion_timestamp.is_some() {
        return wait(
            "SinkStarting",
            format!("the previous sink pod {name} is going away"),
            WAIT_SINK,
        );
    }
    if let Some(phase @ ("Failed" | "Succeeded")) = pod_phase(pod) {
        return Step::ReplaceSink {
            uid: pod.metadata.uid.clone(),
            why: format!(
                "the sink pod {name} ended ({phase}) without the checkpoint being recorded"
            ),
            name,
        };
    }
    match tls_addr(pod).filter(|_| pod_ready(pod)) {
        Some(addr) => Step::Take {
            source,
            sink: addr,
            sizes,
        },
        None => wait(
            "SinkStarting",
            format!("waiting for the sink pod {name} to be ready"),
            WAIT_SINK,
        ),
    }
}

/// What a finished take reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Taken {
    pub entries: u64,
    pub file_bytes: u64,
    pub skipped: u64,
}

fn condition(
    previous: Option<&AgentCheckpointStatus>,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut out = vec![Condition {
        type_: "Ready".into(),
        status: if status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.into(),
        observed_generation: generation,
        last_transition_time: Time(now),
    }];
    let prev = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    crds::conditions::keep_transition_times(&mut out, prev);
    out
}

/// The status of a checkpoint that is not taken yet (`phase` Pending or
/// Taking), with why; also that of one that cannot be taken (Failed).
pub fn waiting_status(
    checkpoint: &AgentCheckpoint,
    phase: CheckpointPhase,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> AgentCheckpointStatus {
    let previous = checkpoint.status.as_ref();
    AgentCheckpointStatus {
        phase: Some(phase),
        attempts: previous.and_then(|p| p.attempts),
        conditions: condition(
            previous,
            false,
            reason,
            message,
            checkpoint.metadata.generation,
            now,
        ),
        ..carried(previous)
    }
}

/// What every later status keeps of `previous`: how the checkpoint is
/// taken, chosen once.
pub fn carried(previous: Option<&AgentCheckpointStatus>) -> AgentCheckpointStatus {
    AgentCheckpointStatus {
        method: previous.and_then(|p| p.method),
        volume_snapshot: previous.and_then(|p| p.volume_snapshot.clone()),
        storage_class_name: previous.and_then(|p| p.storage_class_name.clone()),
        state_secret: previous.and_then(|p| p.state_secret.clone()),
        ..AgentCheckpointStatus::default()
    }
}

/// The number of the attempt that just ended, counting from the status.
fn this_attempt(previous: Option<&AgentCheckpointStatus>) -> u32 {
    previous
        .and_then(|p| p.attempts)
        .unwrap_or(0)
        .saturating_add(1)
}

/// The status after a failed attempt: retried (Pending, the attempt
/// counted) until [`MAX_ATTEMPTS`], then Failed. The wait before the next
/// attempt, or `None` once Failed.
pub fn after_failure(
    checkpoint: &AgentCheckpoint,
    error: &str,
    now: Timestamp,
) -> (AgentCheckpointStatus, Option<Duration>) {
    let previous = checkpoint.status.as_ref();
    let attempts = this_attempt(previous);
    let generation = checkpoint.metadata.generation;
    if attempts >= MAX_ATTEMPTS {
        let message = format!("gave up after {attempts} attempts; the last: {error}");
        let status = AgentCheckpointStatus {
            phase: Some(CheckpointPhase::Failed),
            attempts: Some(attempts),
            conditions: condition(previous, false, "TakeFailed", &message, generation, now),
            ..carried(previous)
        };
        return (status, None);
    }
    let message = format!("attempt {attempts} of {MAX_ATTEMPTS} failed, retrying: {error}");
    let status = AgentCheckpointStatus {
        phase: Some(CheckpointPhase::Pending),
        attempts: Some(attempts),
        conditions: condition(previous, false, "Retrying", &message, generation, now),
        ..carried(previous)
    };
    (status, Some(crate::context::backoff(attempts)))
}

/// The reason of a checkpoint the runner or the sink refused as such.
pub const TRANSFER_REFUSED: &str = "TransferRefused";

/// The status of a checkpoint whose transfer was refused as such (see
/// [`crate::checkpoint::relay::Failure::permanent`]): Failed at once,
/// the attempt counted, the refusal in its condition.
pub fn refused_status(
    checkpoint: &AgentCheckpoint,
    error: &str,
    now: Timestamp,
) -> AgentCheckpointStatus {
    let previous = checkpoint.status.as_ref();
    let attempts = this_attempt(previous);
    let message =
        format!("refused, not retried (the same checkpoint would be refused again): {error}");
    AgentCheckpointStatus {
        phase: Some(CheckpointPhase::Failed),
        attempts: Some(attempts),
        conditions: condition(
            previous,
            false,
            TRANSFER_REFUSED,
            &message,
            checkpoint.metadata.generation,
            now,
        ),
        ..carried(previous)
    }
}

/// The status of a checkpoint that cannot be taken: a waiting status
/// whose phase is Failed (same attempts, same condition rules).
pub fn failed_status(
    checkpoint: &AgentCheckpoint,
    reason: &str,
    message: &str,
    now: Timestamp,
) -> AgentCheckpointStatus {
    waiting_status(checkpoint, CheckpointPhase::Failed, reason, message, now)
}

/// The status of a taken checkpoint.
pub fn ready_status(
    checkpoint: &AgentCheckpoint,
    taken: Taken,
    now: Timestamp,
) -> AgentCheckpointStatus {
    let previous = checkpoint.status.as_ref();
    let message = format!(
        "{} entries, {} bytes of file content, stored in PersistentVolumeClaim {}",
        taken.entries,
        taken.file_bytes,
        claim_name(&checkpoint.metadata.name.clone().unwrap_or_default())
    );
    taken_status(
        checkpoint,
        &message,
        now,
        AgentCheckpointStatus {
            size_bytes: Some(taken.file_bytes),
            entries: Some(taken.entries),
            skipped: Some(taken.skipped),
            ..carried(previous)
        },
    )
}

/// `base` marked Ready now, its condition `Taken` saying `message`: what
/// both ways of taking a checkpoint end with.
fn taken_status(
    checkpoint: &AgentCheckpoint,
    message: &str,
    now: Timestamp,
    base: AgentCheckpointStatus,
) -> AgentCheckpointStatus {
    let previous = checkpoint.status.as_ref();
    AgentCheckpointStatus {
        phase: Some(CheckpointPhase::Ready),
        taken_at: Some(now.to_string()),
        attempts: previous.and_then(|p| p.attempts),
        conditions: condition(
            previous,
            true,
            "Taken",
            message,
            checkpoint.metadata.generation,
            now,
        ),
        ..base
    }
}

/// The status of a checkpoint taken as a VolumeSnapshot, ready to use;
/// `size` is what a volume made from it needs.
pub fn snapshot_ready_status(
    checkpoint: &AgentCheckpoint,
    size: Option<u64>,
    state_secret: &str,
    now: Timestamp,
) -> AgentCheckpointStatus {
    let previous = checkpoint.status.as_ref();
    let mut carried = carried(previous);
    carried.state_secret = Some(state_secret.to_owned());
    let message = format!(
        "VolumeSnapshot {} of the session's workspace claim, ready to use; forks' claims are made from it in StorageClass {}",
        carried.volume_snapshot.as_deref().unwrap_or_default(),
        carried.storage_class_name.as_deref().unwrap_or_default()
    );
    taken_status(
        checkpoint,
        &message,
        now,
        AgentCheckpointStatus {
            size_bytes: size,
            ..carried
        },
    )
}

/// The name of a checkpoint's claim: `<checkpoint>-ckpt` (shortened with a
/// digest for a long name).
pub fn claim_name(checkpoint: &str) -> String {
    crate::names::object_name(checkpoint, "ckpt")
}

/// The name of a checkpoint's sink pod.
pub fn sink_name(checkpoint: &str) -> String {
    crate::names::object_name(checkpoint, "ckpt-sink")
}

/// The object that holds a checkpoint's data for forks (kind and name):
/// its claim, or its VolumeSnapshot.
pub fn data_object(checkpoint: &AgentCheckpoint) -> String {
    let name = checkpoint.metadata.name.as_deref().unwrap_or_default();
    if checkpoint.status.as_ref().and_then(|s| s.method)
        == Some(crds::CheckpointMethod::VolumeSnapshot)
    {
        // Named as the claim would be (volume::snapshot_name).
        format!("VolumeSnapshot {}", claim_name(name))
    } else {
        format!("PersistentVolumeClaim {}", claim_name(name))
    }
}

/// Whether a fork may start from `checkpoint` (the session's `from`), and
/// the session's `Checkpoint` condition: (ready, reason, message). `claim`
/// is what stands under the checkpoint's claim name: a fork mounts it only
/// when the checkpoint controls it (a claim someone put there after the
/// checkpoint's was deleted is not the checkpoint).
pub fn fork_condition(
    name: &str,
    checkpoint: Option<&AgentCheckpoint>,
    claim: Option<&ObjectMeta>,
) -> (bool, String, String) {
    let Some(c) = checkpoint else {
        return (
            false,
            "CheckpointNotFound".into(),
            format!(
                "no AgentCheckpoint {name} in this namespace; the session starts once it exists and is Ready"
            ),
        );
    };
    let status = c.status.as_ref();
    let why = status
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
        .map(|c| c.message.clone())
        .unwrap_or_default();
    match status.and_then(|s| s.phase) {
        Some(CheckpointPhase::Ready)
            if !claim.is_some_and(|m| controlled_by(m, c.metadata.uid.as_deref())) =>
        {
            (
                false,
                "CheckpointDataMissing".into(),
                format!(
                    "AgentCheckpoint {name} is Ready but its {} is missing or not its own; take a new checkpoint",
                    data_object(c)
                ),
            )
        }
        Some(CheckpointPhase::Ready) => (
            true,
            "CheckpointReady".into(),
            format!("started from AgentCheckpoint {name}"),
        ),
        Some(CheckpointPhase::Failed) => (
            false,
            "CheckpointFailed".into(),
            format!("AgentCheckpoint {name} failed and no fork can start from it: {why}"),
        ),
        _ => (
            false,
            "CheckpointNotReady".into(),
            format!(
                "waiting for AgentCheckpoint {name} to be Ready{}",
                if why.is_empty() {
                    String::new()
                } else {
                    format!(" ({why})")
                }
            ),
        ),
    }
}
