//! Which environments are served: a watch of `AgentEnvironment`s (in one
//! namespace or all), one serving loop per environment UID, told when its
//! spec changes and stopped when it is deleted.

use std::collections::HashMap;
use std::sync::Arc;

use crds::AgentEnvironment;
use futures::StreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, ResourceExt};
use tokio::sync::watch;

use crate::context::Context;
use crate::environment;

struct Served {
    spec: watch::Sender<Arc<AgentEnvironment>>,
    stop: watch::Sender<bool>,
}

/// Serves every environment in `namespace` (all when `None`) until
/// `shutdown` turns true.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    mut shutdown: watch::Receiver<bool>,
) {
    let api: Api<AgentEnvironment> = match &namespace {
        Some(ns) => Api::namespaced(ctx.kube.clone(), ns),
        None => Api::all(ctx.kube.clone()),
    };
    let mut served: HashMap<String, Served> = HashMap::new();
    let mut seen_in_relist: Vec<String> = Vec::new();
    let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()).boxed());
    loop {
        let ev = tokio::select! {
            ev = events.next() => ev,
            _ = shutdown.changed() => None,
        };
        let Some(ev) = ev else { break };
        match ev {
            Ok(Event::Init) => seen_in_relist.clear(),
            Ok(Event::InitApply(e)) => {
                seen_in_relist.push(e.uid().unwrap_or_default());
                apply(&ctx, &mut served, e);
            }
            Ok(Event::InitDone) => {
                // Environments gone while the watch was down.
                served.retain(|uid, s| {
                    let keep = seen_in_relist.contains(uid);
                    if !keep {
                        let _ = s.stop.send(true);
                    }
                    keep
                });
            }
            Ok(Event::Apply(e)) => apply(&ctx, &mut served, e),
            Ok(Event::Delete(e)) => {
                if let Some(s) = served.remove(&e.uid().unwrap_or_default()) {
                    tracing::info!(environment = %e.name_any(), "environment deleted; no more polling");
                    let _ = s.stop.send(true);
                }
            }
            Err(e) => tracing::warn!(error = %e, "watching AgentEnvironments; retrying"),
        }
    }
    for s in served.values() {
        let _ = s.stop.send(true);
    }
}

fn apply(ctx: &Arc<Context>, served: &mut HashMap<String, Served>, e: AgentEnvironment) {
    let Some(uid) = e.uid() else { return };
    if e.metadata.deletion_timestamp.is_some() {
        if let Some(s) = served.remove(&uid) {
            let _ = s.stop.send(true);
        }
        return;
    }
    let e = Arc::new(e);
    if let Some(s) = served.get(&uid) {
        let _ = s.spec.send(e);
        return;
    }
    tracing::info!(environment = %e.name_any(), namespace = ?e.namespace(), id = %e.spec.environment_id, "serving an environment");
    let (spec_tx, spec_rx) = watch::channel(e);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(environment::serve(ctx.clone(), spec_rx, stop_rx));
    served.insert(
        uid,
        Served {
            spec: spec_tx,
            stop: stop_tx,
        },
    );
}
