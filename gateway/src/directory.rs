//! Where sessions are: a watch cache of every AgentSession and every
//! sandbox pod, so a tool call costs no API request. A session's runner is
//! its status' pod, when that pod is ready and serves the gateway.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crds::AgentSession;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};

use crate::address::SessionAddr;
use crate::error::{Error, Result};

/// The label every sandbox pod carries.
pub const SANDBOX_SELECTOR: &str = "app.kubernetes.io/name=agentplane-sandbox";

/// The caches, read by every call.
#[derive(Clone)]
pub struct Directory {
    sessions: Store<AgentSession>,
    pods: Store<Pod>,
}

impl std::fmt::Debug for Directory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Directory")
            .field("sessions", &self.sessions.state().len())
            .field("pods", &self.pods.state().len())
            .finish()
    }
}

/// A session's runner, as the gateway reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunnerAt {
    /// The pod's UID: a replaced pod is a new runner.
    pub pod_uid: String,
    pub addr: SocketAddr,
}

impl Directory {
    /// Starts both watches; the future runs them until the process ends.
    pub fn start(client: Client) -> (Self, impl std::future::Future<Output = ()> + Send) {
        let (sessions, s_writer) = reflector::store();
        let (pods, p_writer) = reflector::store();
        let s_api: Api<AgentSession> = Api::all(client.clone());
        let p_api: Api<Pod> = Api::all(client);
        let s_stream = reflector::reflector(
            s_writer,
            watcher(s_api, watcher::Config::default()).modify(|s| {
                s.managed_fields_mut().clear();
            }),
        )
        .default_backoff()
        .for_each(|e| async move {
            if let Err(e) = e {
                tracing::warn!(error = %e, "session watch");
            }
        });
        let p_stream = reflector::reflector(
            p_writer,
            watcher(p_api, watcher::Config::default().labels(SANDBOX_SELECTOR)).modify(
                |p: &mut Pod| {
                    // Only what finding the runner needs is kept.
                    p.managed_fields_mut().clear();
                    p.annotations_mut().clear();
                    if let Some(spec) = p.spec.as_mut() {
                        spec.volumes = None;
                        spec.init_containers = None;
                    }
                },
            ),
        )
        .default_backoff()
        .for_each(|e| async move {
            if let Err(e) = e {
                tracing::warn!(error = %e, "pod watch");
            }
        });
        let run = async move {
            futures::join!(s_stream, p_stream);
        };
        (Self { sessions, pods }, run)
    }

    /// Resolves when both caches hold a first full list.
    pub async fn ready(&self) {
        let _ = futures::join!(
            self.sessions.wait_until_ready(),
            self.pods.wait_until_ready()
        );
    }

    /// The session, if it exists.
    pub fn session(&self, addr: &SessionAddr) -> Option<Arc<AgentSession>> {
        self.sessions
            .get(&ObjectRef::new(&addr.name).within(&addr.namespace))
    }

    /// The session's runner, or why it cannot be reached now.
    pub fn runner(&self, addr: &SessionAddr, session: &AgentSession) -> Result<RunnerAt> {
        let status = session.status.as_ref();
        let Some(pod_name) = status.and_then(|s| s.pod_name.as_deref()) else {
            let phase = status
                .and_then(|s| s.phase.as_ref())
                .map_or_else(|| "Pending".to_owned(), |p| format!("{p:?}"));
            return Err(Error::Unavailable(format!(
                "session {addr} has no running sandbox (phase {phase}); wait for it to be Ready"
            )));
        };
        let pod = self
            .pods
            .get(&ObjectRef::new(pod_name).within(&addr.namespace))
            .ok_or_else(|| {
                Error::Unavailable(format!(
                    "session {addr}'s sandbox pod {pod_name} is not there (yet); retry shortly"
                ))
            })?;
        runner_of(addr, &pod)
    }

    /// The UIDs of the sandbox pods that exist.
    pub fn pod_uids(&self) -> std::collections::HashSet<String> {
        self.pods
            .state()
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect()
    }

    /// Whether a pod with this UID still exists.
    pub fn has_pod(&self, uid: &str) -> bool {
        self.pods
            .state()
            .iter()
            .any(|p| p.metadata.uid.as_deref() == Some(uid))
    }
}

/// The runner of a sandbox pod that is ready and serves the gateway.
pub fn runner_of(addr: &SessionAddr, pod: &Pod) -> Result<RunnerAt> {
    let serves = pod.spec.as_ref().is_some_and(|s| {
        s.containers.iter().any(|c| {
            c.ports
                .iter()
                .flatten()
                .any(|p| p.container_port == i32::from(runner_api::RUNNER_TLS_PORT))
        })
    });
    if !serves {
        return Err(Error::Unavailable(format!(
            "session {addr}'s sandbox was started before the gateway was installed and does not serve it; reach it with kubectl agent, or restart the session"
        )));
    }
    let status = pod.status.as_ref();
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let ip: Option<IpAddr> = status
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok());
    match (ready, ip, pod.metadata.uid.as_deref()) {
        (true, Some(ip), Some(uid)) => Ok(RunnerAt {
            pod_uid: uid.to_owned(),
            addr: SocketAddr::new(ip, runner_api::RUNNER_TLS_PORT),
        }),
        _ => Err(Error::Unavailable(format!(
            "session {addr}'s runner is not ready; retry shortly"
        ))),
    }
}
