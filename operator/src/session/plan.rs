//! What one reconcile decides, as a pure function of the session, what was
//! observed in the cluster and the resolution: the objects to apply, what to
//! do with the pod, the status to write, the events to publish and when to
//! look again. The controller only carries the plan out, so every rule here
//! is tested without an API server (`tests/plan.rs`).

use std::time::Duration;

use crds::{AgentSession, AgentSessionStatus};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use crate::checkpoint::fork::ForkSnapshot;
use crate::context::Note;
use crate::names::{BOUND_ANNOTATION, Names, SPEC_HASH_ANNOTATION, owned_by};
use crate::resolution::{CondSpec, Resolution};
use crate::sandbox::PodConfig;
use crate::session::bulk::Bulk;
use crate::session::claim;
use crate::session::egress;
use crate::session::lifecycle::{self, Stage};
use crate::session::pod;
use crate::session::status;

/// How soon a session is looked at again when nothing is wrong.
pub const RESYNC: Duration = Duration::from_secs(300);
/// How soon an MCP server that did not list its tools is asked again.
pub const MCP_RETRY: Duration = Duration::from_secs(30);
/// How soon a pod that is not ready yet is looked at again (pod events
/// also wake the controller; this is the floor if one is missed).
pub const POD_NOT_READY: Duration = Duration::from_secs(15);
/// How soon a pod being deleted is looked at again, to create its successor.
pub const POD_GOING: Duration = Duration::from_secs(2);
/// How soon a session whose status write was refused as stale is looked at
/// again: long enough for the watch to bring the newer version, short
/// enough that nobody waits on it.
pub const STATUS_REFUSED: Duration = Duration::from_secs(1);

/// What the controller read from the cluster for one session.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    /// The session's pod, if one exists under its name.
    pub pod: Option<Pod>,
    /// The toolset ConfigMap's metadata, if one exists under its name.
    pub configmap: Option<ObjectMeta>,
    /// The workspace claim's metadata, if one exists under its name.
    pub claim: Option<ObjectMeta>,
    /// The NetworkPolicy's metadata, if one exists under its name.
    pub network_policy: Option<ObjectMeta>,
    /// Why this reconcile's try at a warm pool failed and the session
    /// starts cold; `None` when nothing was tried or the claim succeeded
    /// (its condition is derived from the claimed pod).
    pub warm: Option<CondSpec>,
    /// Live pods the session controls besides `pod` (name, UID): left by
    /// two operators that raced, one claiming a warm pod while the other
    /// started a cold one. They are deleted (see [`claim::pick`]).
    pub surplus: Vec<(String, Option<String>)>,
    /// A fork's `Checkpoint` condition (`spec.from`): True once its
    /// checkpoint is Ready. Until then no pod is made.
    pub fork: Option<CondSpec>,
    /// For a fork of a Ready checkpoint taken as a VolumeSnapshot: the
    /// snapshot its workspace claim is made from.
    pub fork_snapshot: Option<ForkSnapshot>,
}

/// The first object under one of the session's names that the session does
/// not own, described for a condition (the plan's NameConflict; a warm
/// claim is not tried while there is one).
pub fn foreign(session: &AgentSession, observed: &Observed) -> Option<String> {
    let found = [
        ("pod", observed.pod.as_ref().map(|p| &p.metadata)),
        ("ConfigMap", observed.configmap.as_ref()),
        ("PersistentVolumeClaim", observed.claim.as_ref()),
        ("NetworkPolicy", observed.network_policy.as_ref()),
    ];
    found.into_iter().find_map(|(kind, meta)| {
        let meta = meta?;
        (!owned_by(meta, session)).then(|| {
            format!(
                "{kind} {} already exists and belongs to something else; rename the session or remove that object",
                meta.name.as_deref().unwrap_or_default()
            )
        })
    })
}

/// What to do with the sandbox pod.
#[derive(Debug, Clone, PartialEq)]
pub enum PodAction {
    /// The pod is as it should be (or there is none and none may run).
    Keep,
    /// Apply this pod: none exists.
    Create(Box<Pod>),
    /// Delete the existing pod: its spec is outdated (a successor follows
    /// once it is gone) or no pod may run. The UID makes the delete a
    /// precondition on the pod that was observed, never a successor.
    Delete { name: String, uid: Option<String> },
    /// The pod is already being deleted; wait for it to go.
    WaitForDeletion,
    /// Record `bound` (the hash of the ConfigMap just written) on a claimed
    /// warm pod: the pod update has the kubelet refresh the mounted
    /// ConfigMap now, so the runner sees its binding within moments.
    Touch {
        name: String,
        uid: Option<String>,
        bound: String,
    },
}

/// Everything one reconcile does.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The runner's toolset ConfigMap to apply (none when nothing may run).
    pub configmap: Option<ConfigMap>,
    /// The workspace claim to create (only when it does not exist yet).
    pub claim: Option<PersistentVolumeClaim>,
    /// The workspace claim to delete (name, UID precondition): only for a
    /// finished session whose spec says `workspaceOnFinish: Delete`, and
    /// only a claim the session controls.
    pub delete_claim: Option<(String, Option<String>)>,
    /// The sandbox's NetworkPolicy, applied before the pod exists.
    pub network_policy: Option<NetworkPolicy>,
    pub pod: PodAction,
    /// Surplus pods of the session to delete (name, UID precondition).
    pub delete_pods: Vec<(String, Option<String>)>,
    /// Events to publish once the pod action has been carried out.
    pub pod_events: Vec<Note>,
    pub status: AgentSessionStatus,
    /// Events for what changed since the previous status.
    pub events: Vec<Note>,
    pub requeue: Duration,
    /// Warnings of the resolution, repeated with any status change.
    warnings: Vec<String>,
}

impl Plan {
    /// Whether the status this plan writes differs from `previous`, the
    /// status the reconcile read. When it does not, writing it again would
    /// change nothing but cost an API call (and, at scale, most reconciles
    /// are resyncs that find everything as it was).
    ///
    /// `bulk` is the previous status's tool definitions and toolsets when
    /// the session cache holds them apart ([`crate::session::bulk`]): the
    /// previous status then has none of its own, and is compared with
    /// this one less those.
    pub fn changes_status(
        &self,
        previous: Option<&AgentSessionStatus>,
        bulk: Option<&Bulk>,
    ) -> bool {
        let Some(previous) = previous else {
            return true;
        };
        let Some(bulk) = bulk else {
            return *previous != self.status;
        };
        if bulk.tools != self.status.tools || bulk.toolsets != self.status.toolsets {
            return true;
        }
        let rest = AgentSessionStatus {
            tools: Vec::new(),
            toolsets: Vec::new(),
            ..self.status.clone()
        };
        *previous != rest
    }

    /// The server-side apply body of this plan's status for `session`. It
    /// carries the resourceVersion the plan was made from, so the API
    /// server refuses it (409) when the session changed since: a plan made
    /// from a lagging watch cache must not overwrite a newer status with an
    /// older view (an evicted pod's `LimitReached`, say, once that pod is
    /// gone and only the newer status remembers it).
    pub fn status_apply(&self, session: &AgentSession) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": format!("{}/{}", crds::GROUP, crds::VERSION),
            "kind": "AgentSession",
            "metadata": { "resourceVersion": session.resource_version() },
            "status": self.status,
        })
    }
}

/// Decides one reconcile.
pub fn plan(
    session: &AgentSession,
    observed: &Observed,
    resolution: &Resolution,
    cfg: &PodConfig,
    now: Timestamp,
) -> Plan {
    if let Some(conflict) = foreign(session, observed) {
        return conflicted(session, resolution, conflict, now);
    }
    let mut plan = match lifecycle::stage(session, observed.pod.as_ref(), now) {
        Stage::Running => running(session, observed, resolution, cfg, now),
        Stage::Suspended { reason, .. } => stopped_plan(
            session,
            observed,
            resolution,
            Stopped::Suspended(reason),
            now,
        ),
        Stage::Finished {
            at,
            delete_workspace,
        } => stopped_plan(
            session,
            observed,
            resolution,
            Stopped::Finished {
                at,
                delete_workspace,
            },
            now,
        ),
    };
    if let Some(left) = lifecycle::until_deadline(session, now) {
        plan.requeue = plan.requeue.min(left.max(Duration::from_secs(1)));
    }
    for (name, _) in &observed.surplus {
        plan.pod_events.push(Note::normal(
            "DeletedSurplusPod",
            format!("deleted pod {name}: the session runs in one pod only"),
        ));
    }
    plan.delete_pods = observed.surplus.clone();
    plan
}

/// The session as its status will say from this reconcile on: a fork of a
/// VolumeSnapshot checkpoint records what it was made from, for good, and
/// its pod is built from that record.
fn with_fork_record<'a>(
    session: &'a AgentSession,
    observed: &Observed,
) -> std::borrow::Cow<'a, AgentSession> {
    let recorded = session
        .status
        .as_ref()
        .is_some_and(|s| s.from_snapshot.is_some());
    match &observed.fork_snapshot {
        Some(f) if !recorded => {
            let mut s = session.clone();
            s.status.get_or_insert_with(Default::default).from_snapshot =
                Some(crds::FromSnapshot {
                    volume_snapshot: f.snapshot.clone(),
                    state_secret: f.state_secret.clone(),
                });
            std::borrow::Cow::Owned(s)
        }
        _ => std::borrow::Cow::Borrowed(session),
    }
}

/// The plan of a session whose pod should run.
fn running(
    session: &AgentSession,
    observed: &Observed,
    resolution: &Resolution,
    cfg: &PodConfig,
    now: Timestamp,
) -> Plan {
    let session = &*with_fork_record(session, observed);
    let warm_pod = observed.pod.as_ref().filter(|p| claim::is_warm(p));
    let pod_name = warm_pod.map_or_else(|| Names::of(session).pod, |p| p.name_any());
    let (mut action, mut pod_events, mut current) = decide_pod(session, observed, resolution, cfg);
    // A fork waits for its checkpoint before its pod is made (a pod that
    // runs already keeps running: it imported when it started).
    let fork_waits = observed.fork.as_ref().is_some_and(|f| !f.status);
    if fork_waits && matches!(action, PodAction::Create(_)) {
        action = PodAction::Keep;
        pod_events.clear();
        current = None;
    }
    // Woken after an idle exit while the ended pod is still there: replace it.
    if let Some(p) = observed.pod.as_ref().filter(|p| ended_idle(session, p)) {
        action = delete(p);
        pod_events = vec![Note::normal(
            "Resuming",
            format!("the session was woken; replacing ended pod {pod_name}"),
        )];
        current = None;
    }
    let previous = session.status.as_ref();
    let status = running_status(
        session,
        observed,
        resolution,
        current.as_ref(),
        &pod_name,
        now,
    );
    let starting = current.is_some() && status.phase != Some(crds::SessionPhase::Ready);
    let requeue = running_requeue(resolution, &action, starting, observed);
    let runs = resolution.runner.as_ref();
    let configmap = runs.and_then(|r| match warm_pod {
        Some(p) => claim::bound_configmap(session, r, p),
        None => Some(pod::toolset_configmap(session, r)),
    });
    if let (Some(p), Some(cm), PodAction::Keep) = (warm_pod, &configmap, &action) {
        action = touch_if_unbound(p, cm).unwrap_or(action);
    }
    let mut plan = Plan {
        delete_claim: None,
        configmap,
        network_policy: runs.and_then(|_| egress::network_policy(session, &cfg.egress)),
        // A fork's claim waits for its checkpoint too: one made from a
        // VolumeSnapshot can only be made with it.
        claim: runs
            .filter(|_| observed.claim.is_none() && !fork_waits)
            .and_then(|_| pod::workspace_claim(session, observed.fork_snapshot.as_ref())),
        pod: action,
        delete_pods: Vec::new(),
        pod_events,
        events: Vec::new(),
        status,
        requeue,
        warnings: resolution.warnings.clone(),
    };
    plan.events = status_events(previous, &plan.status, &plan.warnings);
    plan
}

/// When a session whose pod should run is looked at again unless an
/// event wakes it first: soon while its pod goes or starts, else on the
/// resync (or the MCP retry).
fn running_requeue(
    resolution: &Resolution,
    action: &PodAction,
    starting: bool,
    observed: &Observed,
) -> Duration {
    let mut requeue = if resolution.retry_mcp {
        MCP_RETRY
    } else {
        RESYNC
    };
    if matches!(
        action,
        PodAction::Delete { .. } | PodAction::WaitForDeletion
    ) && resolution.runner.is_some()
    {
        requeue = POD_GOING;
    }
    // A waiting fork is woken by its checkpoint's changes (the session
    // controller watches checkpoints), not by this requeue; one whose
    // checkpoint the API server refused to create has none to watch and
    // tries again on it.
    let fork_refused = observed
        .fork
        .as_ref()
        .is_some_and(|f| !f.status && f.reason == "CheckpointRefused");
    if starting || fork_refused {
        requeue = requeue.min(POD_NOT_READY);
    }
    requeue
}

/// The status of a session whose pod should run: the resolution, the
/// pod's view, and the `Suspended` and `WarmPool` conditions when the
/// session uses them.
fn running_status(
    session: &AgentSession,
    observed: &Observed,
    resolution: &Resolution,
    current: Option<&Pod>,
    pod_name: &str,
    now: Timestamp,
) -> AgentSessionStatus {
    let previous = session.status.as_ref();
    let generation = session.metadata.generation;
    let mut status = status::build_status(resolution, current, pod_name, previous, generation, now);
    if uses_suspension(session) {
        running_condition(&mut status, previous, generation, now);
    }
    if let Some(spec) = warm_condition(session, observed, previous) {
        push_condition(&mut status, spec, previous, generation, now);
    }
    if let Some(spec) = observed.fork.clone() {
        push_condition(&mut status, spec, previous, generation, now);
    }
    // The last bound the sandbox hit: from the pod that shows it, else as
    // the last status said (a replaced pod no longer shows it).
    let limit = observed
        .pod
        .as_ref()
        .and_then(status::limit_reached)
        .or_else(|| carried(previous, "LimitReached"));
    if let Some(spec) = limit {
        push_condition(&mut status, spec, previous, generation, now);
    }
    status
}

/// The condition of type `type_` as `previous` has it.
fn carried(previous: Option<&AgentSessionStatus>, type_: &'static str) -> Option<CondSpec> {
    let old = previous?.conditions.iter().find(|c| c.type_ == type_)?;
    Some(CondSpec {
        type_,
        status: old.status == "True",
        reason: old.reason.clone(),
        message: old.message.clone(),
    })
}

/// A claimed warm pod whose recorded binding is not the ConfigMap's data
/// gets a nudge (see [`PodAction::Touch`]); `None` when it is current.
fn touch_if_unbound(pod: &Pod, cm: &ConfigMap) -> Option<PodAction> {
    let bound = claim::data_hash(cm);
    (pod.annotations().get(BOUND_ANNOTATION) != Some(&bound)).then(|| PodAction::Touch {
        name: pod.name_any(),
        uid: pod.metadata.uid.clone(),
        bound,
    })
}

/// A plan that touches nothing: one of the session's names is taken by an
/// object it does not own. The status and a Warning event say which.
fn conflicted(
    session: &AgentSession,
    resolution: &Resolution,
    message: String,
    now: Timestamp,
) -> Plan {
    let previous = session.status.as_ref();
    let mut status = status::build_status(
        resolution,
        None,
        "",
        previous,
        session.metadata.generation,
        now,
    );
    status.pod_name = None;
    let mut plan = Plan {
        configmap: None,
        claim: None,
        delete_claim: None,
        network_policy: None,
        pod: PodAction::Keep,
        delete_pods: Vec::new(),
        pod_events: Vec::new(),
        events: Vec::new(),
        status,
        requeue: RESYNC,
        warnings: resolution.warnings.clone(),
    };
    if resolution.runner.is_some() {
        plan.set_ready_false(previous, "NameConflict", &message, now);
        plan.events = status_events(previous, &plan.status, &plan.warnings);
    }
    plan
}

/// The `WarmPool` condition of a session that names a pool: why this
/// reconcile's claim failed; else, for a pod from a pool, that it was
/// claimed; else what the last status said (a claim is tried only when the
/// session needs a new pod, so why it runs cold is remembered there).
fn warm_condition(
    session: &AgentSession,
    observed: &Observed,
    previous: Option<&AgentSessionStatus>,
) -> Option<CondSpec> {
    session.spec.warm_pool.as_ref()?;
    if let Some(spec) = &observed.warm {
        return Some(spec.clone());
    }
    if let Some(claimed) = observed.pod.as_ref().and_then(claim::claimed_condition) {
        return Some(claimed);
    }
    carried(previous, "WarmPool")
}

/// Whether the session uses suspension at all (its status then carries a
/// `Suspended` condition even while it runs).
fn uses_suspension(session: &AgentSession) -> bool {
    session.spec.suspended.is_some()
        || session
            .spec
            .lifetime
            .as_ref()
            .is_some_and(|l| l.idle_suspend_seconds.is_some())
}

/// A pod whose runner exited after idling, for a session that suspends
/// then (a woken session replaces it).
fn ended_idle(session: &AgentSession, pod: &Pod) -> bool {
    session
        .spec
        .lifetime
        .as_ref()
        .is_some_and(|l| l.idle_suspend_seconds.is_some())
        && pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded")
}

fn running_condition(
    status: &mut AgentSessionStatus,
    previous: Option<&AgentSessionStatus>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let spec = CondSpec {
        type_: "Suspended",
        status: false,
        reason: "Running".into(),
        message: "the sandbox runs".into(),
    };
    push_condition(status, spec, previous, generation, now);
}

/// Adds one condition, its transition time kept from `previous` when its
/// status did not change.
fn push_condition(
    status: &mut AgentSessionStatus,
    spec: CondSpec,
    previous: Option<&AgentSessionStatus>,
    generation: Option<i64>,
    now: Timestamp,
) {
    let prev = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    status
        .conditions
        .extend(status::conditions(&[spec], prev, generation, now));
}

/// The plan of a suspended or finished session: no pod (the running one is
/// deleted by UID), nothing applied, the claim kept -- or deleted, for a
/// finished session that asked for it.
fn stopped_plan(
    session: &AgentSession,
    observed: &Observed,
    resolution: &Resolution,
    stage: Stopped,
    now: Timestamp,
) -> Plan {
    let previous = session.status.as_ref();
    let pod_name = Names::of(session).pod;
    let (pod_action, deleting) = match observed.pod.as_ref() {
        Some(p) if p.metadata.deletion_timestamp.is_some() => (PodAction::WaitForDeletion, false),
        Some(p) => (delete(p), true),
        None => (PodAction::Keep, false),
    };
    let mut status = status::build_status(
        resolution,
        None,
        &pod_name,
        previous,
        session.metadata.generation,
        now,
    );
    status.pod_name = None;
    status.endpoint = None;
    let StopView {
        phase,
        reason,
        message,
        suspended,
        delete_claim,
    } = stop_view(session, observed, stage);
    status.phase = Some(phase);
    if let Some(why) = suspended {
        let spec = CondSpec {
            type_: "Suspended",
            status: true,
            reason: why.into(),
            message: message.clone(),
        };
        push_condition(
            &mut status,
            spec,
            previous,
            session.metadata.generation,
            now,
        );
    }
    let pod_events = if deleting {
        vec![Note::normal(
            "DeletedPod",
            format!("{message}; deleted pod {pod_name}"),
        )]
    } else {
        Vec::new()
    };
    let mut plan = Plan {
        configmap: None,
        claim: None,
        delete_claim,
        network_policy: None,
        pod: pod_action,
        delete_pods: Vec::new(),
        pod_events,
        events: Vec::new(),
        status,
        requeue: if observed.pod.is_some() {
            POD_GOING
        } else {
            RESYNC
        },
        warnings: Vec::new(),
    };
    plan.set_ready_false(previous, reason, &message, now);
    plan.events = status_events(previous, &plan.status, &plan.warnings);
    plan
}

/// What a stopped session's status says, and the claim a finished one
/// that asked for it deletes.
struct StopView {
    phase: crds::SessionPhase,
    reason: &'static str,
    message: String,
    /// The `Suspended` condition's reason, for a suspended session.
    suspended: Option<&'static str>,
    delete_claim: Option<(String, Option<String>)>,
}

fn stop_view(session: &AgentSession, observed: &Observed, stage: Stopped) -> StopView {
    match stage {
        Stopped::Suspended(reason) => StopView {
            phase: crds::SessionPhase::Suspended,
            reason: "Suspended",
            message: if reason == lifecycle::IDLE {
                "suspended after idling; the workspace and bash's state are kept (kubectl agent wakes it with wakeOnCall)".to_owned()
            } else {
                "suspended (spec.suspended); the workspace and bash's state are kept".to_owned()
            },
            suspended: Some(reason),
            delete_claim: None,
        },
        Stopped::Finished {
            at,
            delete_workspace,
        } => {
            let kept = if delete_workspace { "deleted" } else { "kept" };
            StopView {
                phase: crds::SessionPhase::Finished,
                reason: "Finished",
                message: format!("the session's lifetime ended at {at}; its workspace is {kept}"),
                suspended: None,
                delete_claim: observed
                    .claim
                    .as_ref()
                    .filter(|c| delete_workspace && owned_by(c, session))
                    .map(|c| (c.name.clone().unwrap_or_default(), c.uid.clone())),
            }
        }
    }
}

/// Why no pod runs.
enum Stopped {
    Suspended(&'static str),
    Finished {
        at: Timestamp,
        delete_workspace: bool,
    },
}

/// The pod action, the events it earns, and the pod the status describes.
fn decide_pod(
    session: &AgentSession,
    observed: &Observed,
    resolution: &Resolution,
    cfg: &PodConfig,
) -> (PodAction, Vec<Note>, Option<Pod>) {
    let pod_name = Names::of(session).pod;
    let existing = observed.pod.as_ref();
    let going = existing.is_some_and(|p| p.metadata.deletion_timestamp.is_some());
    if resolution.runner.is_none() {
        return match existing {
            Some(p) if !going => (
                delete(p),
                vec![Note::warning(
                    "StoppedPod",
                    format!("the session's spec is invalid or not allowed; deleted pod {pod_name}"),
                )],
                None,
            ),
            Some(_) => (PodAction::WaitForDeletion, Vec::new(), None),
            None => (PodAction::Keep, Vec::new(), None),
        };
    }
    let desired = pod::build_pod(session, cfg);
    match existing {
        Some(_) if going => (PodAction::WaitForDeletion, Vec::new(), None),
        // Evicted (past a disk bound, or by node pressure): the pod stays
        // Failed until deleted; the session gets a new one, and its
        // LimitReached condition says why.
        Some(p) if status::evicted(p) => (
            delete(p),
            vec![Note::warning(
                "ReplacingEvictedPod",
                format!("pod {pod_name} was evicted; starting a new sandbox"),
            )],
            None,
        ),
        Some(p) if !current(session, cfg, p) => (
            delete(p),
            vec![Note::normal(
                "ReplacingPod",
                format!("the session changed; replacing pod {pod_name}"),
            )],
            None,
        ),
        Some(p) => (PodAction::Keep, Vec::new(), Some(p.clone())),
        None => (
            PodAction::Create(Box::new(desired.clone())),
            vec![Note::normal(
                "CreatedPod",
                format!("created sandbox pod {pod_name}"),
            )],
            Some(desired),
        ),
    }
}

/// Whether `pod` is what the session asks for, whatever runner image and
/// defaults it was built with: the session is rebuilt with the pod's own
/// operator-level settings ([`pod::config_of`]) and the spec hashes compared. A new runner image (a `helm upgrade`) so reaches a
/// session when its pod is next made (a spec change, a deleted pod, a
/// restart), not by replacing every sandbox pod, and every workspace on
/// emptyDir, at once.
fn current(session: &AgentSession, cfg: &PodConfig, pod: &Pod) -> bool {
    let want = pod::build_pod(session, &pod::config_of(pod, cfg));
    pod.annotations().get(SPEC_HASH_ANNOTATION) == want.annotations().get(SPEC_HASH_ANNOTATION)
}

fn delete(p: &Pod) -> PodAction {
    PodAction::Delete {
        name: p.name_any(),
        uid: p.metadata.uid.clone(),
    }
}

impl Plan {
    /// Whether the pod this plan deletes is the only evidence of a bound
    /// the sandbox hit (an evicted pod's `LimitReached`): then it is
    /// deleted only after the status recording that has landed. A plan
    /// made from a stale copy of the session has its status refused
    /// ([`Plan::status_apply`]); had it deleted the pod first, the next
    /// plan would see neither the pod nor a status that remembers why.
    pub fn deletion_waits_for_status(&self, observed: &Observed) -> bool {
        let PodAction::Delete { uid, .. } = &self.pod else {
            return false;
        };
        observed
            .pod
            .as_ref()
            .filter(|p| p.metadata.uid == *uid)
            .is_some_and(|p| status::limit_reached(p).is_some())
    }

    /// When the session is looked at again, given whether the plan's
    /// status landed. A status refused as stale is retried soon whatever
    /// the plan's requeue: the newer version's arrival does not wake the
    /// session (the controller wakes on spec changes, not status ones), so
    /// with the plan's own requeue a session whose pod had just turned
    /// Ready stayed Pending until the 5-minute resync (the scale bench's
    /// stragglers, docs/benchmarks.md).
    pub fn requeue_after(&self, status_landed: bool) -> Duration {
        if status_landed {
            self.requeue
        } else {
            self.requeue.min(STATUS_REFUSED)
        }
    }

    /// Rewrites the plan for an apply that failed: the status says so in
    /// its Ready condition (so the session does not sit in Pending with no
    /// explanation), a Warning event is due, and the pod's own events are
    /// dropped because the action did not happen. `message` is short and
    /// safe to show to the session's author.
    pub fn apply_failed(
        &mut self,
        previous: Option<&AgentSessionStatus>,
        message: &str,
        now: Timestamp,
    ) {
        self.set_ready_false(previous, "ApplyFailed", message, now);
        if self.status.phase == Some(crds::SessionPhase::Ready) {
            self.status.phase = Some(crds::SessionPhase::Pending);
        }
        self.status.pod_name = None;
        self.pod_events.clear();
        self.events = status_events(previous, &self.status, &self.warnings);
    }
}

impl Plan {
    /// Ready=False with `reason`, its transition time kept when it was
    /// already False.
    fn set_ready_false(
        &mut self,
        previous: Option<&AgentSessionStatus>,
        reason: &str,
        message: &str,
        now: Timestamp,
    ) {
        let was_false = previous
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .filter(|c| c.status == "False")
            .map(|c| c.last_transition_time.clone());
        if let Some(ready) = self
            .status
            .conditions
            .iter_mut()
            .find(|c| c.type_ == "Ready")
        {
            ready.status = "False".into();
            ready.reason = reason.into();
            ready.message = message.to_owned();
            ready.last_transition_time = was_false.unwrap_or(Time(now));
        }
    }
}

/// Events only for what changed since the last status, so a steady state is
/// quiet: a changed condition is published, and so is every soft finding of
/// the resolution (unknown MCP config names, web tools).
pub fn status_events(
    previous: Option<&AgentSessionStatus>,
    now: &AgentSessionStatus,
    warnings: &[String],
) -> Vec<Note> {
    let old = |t: &str| {
        previous
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == t))
            .map(|c| (c.status.as_str(), c.reason.as_str(), c.message.as_str()))
    };
    let mut out = Vec::new();
    let mut any_changed = false;
    for c in &now.conditions {
        if old(&c.type_) == Some((c.status.as_str(), c.reason.as_str(), c.message.as_str())) {
            continue;
        }
        any_changed = true;
        match (c.type_.as_str(), c.status.as_str(), c.reason.as_str()) {
            ("ToolsetValid" | "McpResolved" | "PolicyAllowed", "False", _)
            | ("Ready", "False", "ApplyFailed" | "NameConflict") => {
                out.push(Note::warning(&c.reason, c.message.clone()));
            }
            ("Ready", "True", _) => out.push(Note::normal("Ready", c.message.clone())),
            ("Ready", "False", "Finished") => {
                out.push(Note::normal("Finished", c.message.clone()));
            }
            ("Suspended", "True", _) => out.push(Note::normal("Suspended", c.message.clone())),
            ("LimitReached", "True", _) => out.push(Note::warning(&c.reason, c.message.clone())),
            ("WarmPool", "True", _) => out.push(Note::normal("ClaimedWarmPod", c.message.clone())),
            ("WarmPool", "False", _) => out.push(Note::warning(&c.reason, c.message.clone())),
            ("Suspended", "False", _) if old("Suspended").is_some() => {
                out.push(Note::normal("Resumed", "the sandbox runs again".into()));
            }
            _ => {}
        }
    }
    if any_changed {
        out.extend(
            warnings
                .iter()
                .map(|w| Note::warning("ToolsetWarning", w.clone())),
        );
    }
    out
}
