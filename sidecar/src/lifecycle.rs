//! `agent-sidecar serve` as a process: logging, the subreaper, the async
//! runtime, and the three things that change the runner while it serves --
//! a new toolset file, an idle timeout, a shutdown signal.

use std::path::PathBuf;
use std::time::Duration;

use toolset::ResolvedToolset;

use crate::binding::{AwaitBinding, Bound};
use crate::cli::ServeArgs;
use crate::error::Error;
use crate::runner::{Runner, RunnerConfig};
use crate::service::{Listen, serve as serve_grpc};
use crate::toolset_file::{load_toolset, parse_toolset, read_toolset};

/// `agent-sidecar checkpoint-sink`: stores one checkpoint, then exits.
pub fn checkpoint_sink(args: crate::cli::SinkArgs) -> Result<(), Error> {
    if let Err(e) = telemetry::init_logging(TELEMETRY) {
        eprintln!("agent-sidecar: {e}");
    }
    let config = crate::checkpoint::SinkConfig {
        dir: args.dir,
        max_archive_bytes: args.max_archive_bytes,
        socket: args.socket,
        tls: args.listen_tls.zip(args.tls_dir),
        deadline: Duration::from_secs(args.deadline_seconds),
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?;
    rt.block_on(crate::checkpoint::sink(config))
}

/// Serves until SIGTERM/SIGINT or the idle timeout, then drains in-flight
/// calls and returns. A runner that cannot start returns the reason.
pub fn serve(args: ServeArgs) -> Result<(), Error> {
    if let Err(e) = telemetry::init_logging(TELEMETRY) {
        eprintln!("agent-sidecar: {e}");
    }
    // As PID 1, or beside it, every orphaned background job must become ours
    // to reap; the supervisor reaps whatever is reparented here.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(error = %e, "cannot become a child subreaper; orphans will be reaped only if this is PID 1");
    }
    let config = config(&args)?;
    let watch = args.watch();
    if args.end_on_oom && watch.oom_events.is_none() {
        tracing::warn!(
            "--end-on-oom: no memory cgroup OOM-kill counter found; out-of-memory kills are not watched"
        );
    }
    // Started first, as a thread of its own: at the limit, nothing new can
    // be started (see crate::watch).
    crate::watch::start(watch, std::sync::Arc::clone(&config.alarm))
        .map_err(|e| Error::io("cannot start the sandbox watch", e))?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?;
    rt.block_on(async move {
        // Flushed when dropped, after the last call has been recorded.
        let _exporters =
            telemetry::init_export(TELEMETRY).map_err(|e| Error::Telemetry(e.to_string()))?;
        run(args, config).await
    })
}

/// The runner exports only its tool-duration metric; spans would be one
/// per call with nothing a metric does not say.
const TELEMETRY: telemetry::Setup = telemetry::Setup {
    service: "agent-sidecar",
    json_logs: false,
    default_filter: "info",
    traces: false,
    metrics: true,
};

/// The runner's configuration from the flags. The socket, the toolset file
/// and the binding file are protected: the file tools must not let the
/// model replace the runner's own way in, its policy or its session.
fn config(args: &ServeArgs) -> Result<RunnerConfig, Error> {
    let await_binding = match (&args.await_binding, &args.toolset) {
        (Some(binding), Some(toolset)) => Some(AwaitBinding {
            binding: binding.clone(),
            toolset: toolset.clone(),
        }),
        (Some(_), None) => {
            return Err(Error::Usage(
                "--await-binding needs --toolset: a warm sandbox binds once both files are there"
                    .into(),
            ));
        }
        (None, _) => None,
    };
    // A warm sandbox's toolset file does not exist before it is claimed;
    // until then nothing is enabled (and every call is refused unbound).
    let toolset = match await_binding {
        Some(_) => ResolvedToolset {
            tools: Vec::new(),
            policies: Default::default(),
        },
        None => load_toolset(args.toolset.as_ref())?,
    };
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| RunnerConfig::default_state_dir(&args.session));
    let mut config = RunnerConfig::new(
        args.workdir.clone(),
        state_dir,
        args.spill_dir.clone(),
        toolset,
    );
    config.limits = args.limits();
    config.protected = std::iter::once(args.socket.clone())
        .chain(args.toolset.clone())
        .chain(args.await_binding.clone())
        .collect();
    config.private = args.tls_dir.iter().cloned().collect();
    config.await_binding = await_binding;
    Ok(config)
}

/// How often an unbound runner looks for its binding. Calls look too, so
/// this only matters for a sandbox nobody calls yet (its idle clock starts
/// at binding).
pub const BIND_POLL: Duration = Duration::from_millis(200);

async fn run(args: ServeArgs, config: RunnerConfig) -> Result<(), Error> {
    let state_dir = config.state_dir.clone();
    let runner = Runner::new(config)?;
    if let Some(from) = &args.restore_from {
        // Before the first call: a fork serves only once it is the copy.
        match crate::checkpoint::restore(&runner, from, &state_dir).await {
            Ok(crate::checkpoint::Restored::Imported {
                entries,
                file_bytes,
            }) => tracing::info!(
                from = %from.display(),
                entries,
                file_bytes,
                "imported the checkpoint into the workdir"
            ),
            Ok(crate::checkpoint::Restored::Already) => tracing::info!(
                from = %from.display(),
                "the checkpoint was imported by an earlier start; not again"
            ),
            Err(e) => {
                return Err(Error::io(
                    format!("cannot import the checkpoint in {}", from.display()),
                    std::io::Error::other(e.to_string()),
                ));
            }
        }
    }
    tracing::info!(
        workdir = %runner.workdir().display(),
        session = %args.session,
        awaiting_binding = !runner.is_bound(),
        "runner ready"
    );
    let every = Duration::from_secs(args.toolset_poll_seconds.max(1));
    if let Some(awaited) = runner.awaited().cloned() {
        let runner = runner.clone();
        tokio::spawn(async move {
            let bound = await_binding(&runner, BIND_POLL).await;
            // Watched from the bytes bound, so a change made between the
            // binding and this task's start is not missed.
            let (toolset, binding) = (bound.toolset_bytes.clone(), bound.binding_bytes.clone());
            tokio::spawn(note_rebinding(awaited.binding, binding, every));
            watch_toolset(runner, awaited.toolset, every, Some(toolset)).await;
        });
    } else if let Some(path) = args.toolset.clone() {
        let last = read_toolset(&path).ok();
        tokio::spawn(watch_toolset(runner.clone(), path, every, last));
    }
    let idle = args.idle_timeout_seconds.map(Duration::from_secs);
    let watched = runner.clone();
    let alarm = runner.alarm();
    let listen = Listen {
        socket: args.socket,
        tcp: args.listen,
        tls: args.listen_tls.zip(args.tls_dir),
    };
    let ended = std::sync::Arc::clone(&alarm);
    serve_grpc(runner, listen, async move {
        tokio::select! {
            () = shutdown_signal() => {}
            () = idle_timeout(watched, idle) => {}
            () = ended.ended() => {}
        }
    })
    .await?;
    // The sandbox was ended at a bound: the calls that ran have their
    // notice; say why where the operator reads it, and exit with its code.
    match alarm.breach() {
        Some((why, message)) => {
            tracing::warn!(%message, "the sandbox was ended");
            if let Some(path) = &args.termination_log
                && let Err(e) = crate::watch::write_termination_log(path, message)
            {
                tracing::warn!(error = %e, path = %path.display(), "cannot write the termination log");
            }
            Err(Error::SandboxEnded {
                why: *why,
                message: message.clone(),
            })
        }
        None => Ok(()),
    }
}

/// Polls until the runner is bound (a call may bind it first) and returns
/// the binding. The files are small and bounded, and the poll stops at
/// binding.
pub async fn await_binding(runner: &Runner, every: Duration) -> &Bound {
    loop {
        // A call that arrived with the files binds too; either way the
        // binding is made once (see `binding::Gate`).
        let _ = runner.ensure_bound();
        if let Some(bound) = runner.binding() {
            return bound;
        }
        tokio::time::sleep(every).await;
    }
}

/// A bound runner stays bound to its session for its life: a binding file
/// that changes later is not applied (the session's environment is in its
/// shells' state already), and this says so in the log, once.
async fn note_rebinding(path: PathBuf, bound: Vec<u8>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        match crate::fsutil::read_config_file(&path, runner_api::binding::MAX_BINDING_BYTES) {
            Ok(now) if now == bound => {}
            _ => {
                tracing::warn!(
                    file = %path.display(),
                    "the binding file changed after this runner was bound; a sandbox stays bound to its first session, so the change is ignored"
                );
                return;
            }
        }
    }
}

/// Resolves once the runner has been idle for `limit` (never without one).
/// The pod's restart policy treats the clean exit that follows as the
/// session's end, so an abandoned session stops costing a node.
pub async fn idle_timeout(runner: Runner, limit: Option<Duration>) {
    let Some(limit) = limit else {
        return std::future::pending().await;
    };
    loop {
        let idle = runner.idle_for();
        if idle >= limit {
            tracing::info!(
                idle_s = idle.as_secs(),
                "idle timeout reached; ending the session"
            );
            return;
        }
        tokio::time::sleep(limit - idle + Duration::from_millis(50)).await;
    }
}

/// Re-reads the toolset file when its bytes change, because the kubelet
/// updates a mounted ConfigMap in place and a policy change must not need
/// a new pod. A broken file keeps the toolset in force (and says so)
/// rather than opening every tool. `last` is the bytes of the toolset in
/// force. Reads are bounded ([`crate::toolset_file::MAX_TOOLSET_BYTES`]).
pub async fn watch_toolset(runner: Runner, path: PathBuf, every: Duration, last: Option<Vec<u8>>) {
    let mut last = last;
    loop {
        tokio::time::sleep(every).await;
        let now = read_toolset(&path).ok();
        let Some(bytes) = now.as_ref().filter(|_| now != last) else {
            continue;
        };
        match parse_toolset(&path, bytes) {
            Ok(ts) => {
                tracing::info!(path = %path.display(), tools = ts.tools.len(), "toolset changed; now enforcing it");
                runner.set_toolset(ts);
                last = now;
            }
            Err(e) => {
                tracing::warn!(error = %e, "toolset file changed but is unusable; keeping the current toolset")
            }
        }
    }
}

/// Resolves on SIGTERM (the kubelet stopping the pod) or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers the runner serves until killed.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
