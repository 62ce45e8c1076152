//! The status the operator writes: phase and conditions from the
//! resolution and the pod, with transition times kept when nothing changed.

use crds::{AgentSessionStatus, RunnerEndpoint, SessionPhase};
use k8s_openapi::api::core::v1::{Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use runner_api::{RUNNER_PORT, RUNNER_SOCKET};

use crate::resolution::{CondSpec, Resolution};

/// The phase and Ready condition a pod (or its absence) means.
pub fn pod_view(resolution: &Resolution, pod: Option<&Pod>) -> (SessionPhase, CondSpec) {
    let ready = |status: bool, reason: &str, message: String| CondSpec {
        type_: "Ready",
        status,
        reason: reason.to_owned(),
        message,
    };
    if resolution.runner.is_none() {
        return (
            SessionPhase::Invalid,
            ready(
                false,
                "SpecInvalid",
                "no sandbox runs until the spec is fixed; see ToolsetValid and PolicyAllowed"
                    .into(),
            ),
        );
    }
    let Some(pod) = pod else {
        return (
            SessionPhase::Pending,
            ready(
                false,
                "PodCreating",
                "the sandbox pod is being created".into(),
            ),
        );
    };
    let status = pod.status.as_ref();
    let phase = status.and_then(|s| s.phase.as_deref()).unwrap_or("Pending");
    let pod_ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    match phase {
        "Running" if pod_ready => (
            SessionPhase::Ready,
            ready(
                true,
                "RunnerReady",
                "the runner answers on its socket".into(),
            ),
        ),
        "Succeeded" => (
            SessionPhase::Succeeded,
            ready(
                false,
                "SessionEnded",
                "the sandbox exited (idle timeout or completed)".into(),
            ),
        ),
        "Failed" => {
            let why = status
                .and_then(|s| s.reason.clone())
                .unwrap_or_else(|| "PodFailed".into());
            let msg = status
                .and_then(|s| s.message.clone())
                .unwrap_or_else(|| "the sandbox pod failed".into());
            (SessionPhase::Failed, ready(false, &why, msg))
        }
        _ => (SessionPhase::Pending, waiting(status, phase)),
    }
}

/// The Ready condition of a pod that is neither running ready nor ended:
/// the most telling wait, an init container's (image pulls fail there
/// first), never the main container's "PodInitializing" placeholder.
fn waiting(status: Option<&PodStatus>, phase: &str) -> CondSpec {
    let wait = status.and_then(|s| {
        s.init_container_statuses
            .iter()
            .flatten()
            .chain(s.container_statuses.iter().flatten())
            .filter_map(|c| c.state.as_ref()?.waiting.clone())
            .find(|w| w.reason.as_deref() != Some("PodInitializing"))
    });
    let (reason, message) = match wait {
        Some(w) => (
            w.reason.unwrap_or_else(|| "ContainerWaiting".into()),
            w.message
                .unwrap_or_else(|| "the sandbox container is waiting".into()),
        ),
        None => (
            "RunnerStarting".into(),
            format!("pod is {phase}; waiting for the runner to answer"),
        ),
    };
    CondSpec {
        type_: "Ready",
        status: false,
        reason,
        message,
    }
}

/// `LimitReached`, when the pod shows that its sandbox hit one of its
/// bounds: the kubelet evicted it (disk), its container was OOM-killed, or
/// the runner ended it at the process limit or after an OOM kill (its exit
/// code and termination message say which). The message names the limit
/// and when, so a second hit is a new message (and a new event).
pub fn limit_reached(pod: &Pod) -> Option<CondSpec> {
    let hit = |reason: &str, message: String| CondSpec {
        type_: "LimitReached",
        status: true,
        reason: reason.to_owned(),
        message,
    };
    let status = pod.status.as_ref()?;
    if status.reason.as_deref() == Some("Evicted") {
        let why = status.message.as_deref().unwrap_or("the node evicted it");
        return Some(hit("Evicted", format!("the sandbox was evicted: {why}")));
    }
    let sandbox = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == crate::session::pod::SANDBOX_CONTAINER)?;
    let ended = sandbox
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .or_else(|| sandbox.last_state.as_ref()?.terminated.as_ref())?;
    let at = ended
        .finished_at
        .as_ref()
        .map_or_else(|| "an unknown time".to_owned(), |t| t.0.to_string());
    let restarted = sandbox
        .state
        .as_ref()
        .is_some_and(|s| s.terminated.is_none());
    let after = if restarted {
        "; it restarted with its workspace and bash state"
    } else {
        ""
    };
    let memory = memory_limit(pod).unwrap_or_else(|| "its memory limit".to_owned());
    if ended.reason.as_deref() == Some("OOMKilled") {
        return Some(hit(
            "OOMKilled",
            format!(
                "the sandbox ran out of memory ({memory}) at {at}; every process in it was ended{after}"
            ),
        ));
    }
    let report = runner_api::ended::Ended::from_exit_code(ended.exit_code)?;
    let said = ended
        .message
        .as_deref()
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| toolset::truncate_runes(m, 512).to_owned());
    let message = match (report, said) {
        (_, Some(m)) => format!("{m} (at {at}){after}"),
        (runner_api::ended::Ended::OutOfMemory, None) => format!(
            "a process in the sandbox ran out of memory ({memory}) at {at}; every process in it was ended{after}"
        ),
        (runner_api::ended::Ended::ProcessLimit, None) => format!(
            "the sandbox reached its process limit at {at}; every process in it was ended{after}"
        ),
    };
    Some(hit(report.reason(), message))
}

/// The sandbox container's memory limit, as its pod spec says.
fn memory_limit(pod: &Pod) -> Option<String> {
    let c = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == crate::session::pod::SANDBOX_CONTAINER)?;
    let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
    Some(format!("limit {}", q.0))
}

/// Whether the kubelet evicted `pod` (it stays Failed until deleted).
pub fn evicted(pod: &Pod) -> bool {
    pod.status.as_ref().is_some_and(|s| {
        s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted")
    })
}

/// Conditions in metav1 shape. A condition whose status did not change
/// keeps its lastTransitionTime from `previous`.
pub fn conditions(
    specs: &[CondSpec],
    previous: &[Condition],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let mut out: Vec<Condition> = specs
        .iter()
        .map(|c| Condition {
            type_: c.type_.to_owned(),
            status: if c.status { "True" } else { "False" }.to_owned(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            observed_generation: generation,
            last_transition_time: Time(now),
        })
        .collect();
    crds::conditions::keep_transition_times(&mut out, previous);
    out
}

/// `Degraded`, for a session whose sandbox runs: True when part of what
/// the spec declared could not be resolved (an MCP server did not list,
/// listed too many tools) and the sandbox runs without it. A resolution
/// failure never stops a running sandbox or its workspace; this condition
/// is how it is seen instead.
pub fn degraded(resolution: &Resolution) -> Option<CondSpec> {
    resolution.runner.as_ref()?;
    let missing = resolution
        .conditions
        .iter()
        .find(|c| !c.status && c.type_ == "McpResolved");
    Some(match missing {
        Some(c) => CondSpec {
            type_: "Degraded",
            status: true,
            reason: c.reason.clone(),
            message: "the sandbox runs without the MCP tools that did not resolve; see McpResolved"
                .into(),
        },
        None => CondSpec {
            type_: "Degraded",
            status: false,
            reason: "Complete".into(),
            message: "every declared tool is available".into(),
        },
    })
}

/// The full status for one reconcile.
pub fn build_status(
    resolution: &Resolution,
    pod: Option<&Pod>,
    pod_name: &str,
    previous: Option<&AgentSessionStatus>,
    generation: Option<i64>,
    now: Timestamp,
) -> AgentSessionStatus {
    let (phase, ready) = pod_view(resolution, pod);
    let mut specs = vec![ready];
    specs.extend(resolution.conditions.iter().cloned());
    if let Some(degraded) = degraded(resolution) {
        specs.push(degraded);
    }
    let prev = previous
        .map(|p| p.conditions.as_slice())
        .unwrap_or_default();
    let running = resolution.runner.is_some();
    AgentSessionStatus {
        phase: Some(phase),
        conditions: conditions(&specs, prev, generation, now),
        observed_generation: generation,
        pod_name: (running && pod.is_some()).then(|| pod_name.to_owned()),
        endpoint: running.then(|| RunnerEndpoint {
            socket: RUNNER_SOCKET.to_owned(),
            port: RUNNER_PORT,
        }),
        toolsets: resolution.toolsets.clone(),
        tools: resolution.tools.clone(),
        tool_count: Some(i64::try_from(resolution.tools.len()).unwrap_or(i64::MAX)),
        policies: resolution.policies.clone(),
        object_names: previous.and_then(|p| p.object_names.clone()),
        from_snapshot: previous.and_then(|p| p.from_snapshot.clone()),
    }
}
