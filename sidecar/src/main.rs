//! `agent-sidecar`: serve the tools, or call a running runner.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use sidecar::cli::{CallArgs, Cli, Command, ServeArgs, TargetArgs};
use sidecar::client::Client;
use sidecar::service::{Listen, serve};
use sidecar::{Error, Runner, RunnerConfig};

/// Exit status when the runner answered a call with a status (refused it, or
/// failed): distinct from 1 (could not reach the runner) and 2 (usage).
const EXIT_REFUSED: u8 = 3;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let res = match cli.command {
        Command::Serve(args) => run_serve(args),
        Command::Call(args) => client_runtime(call(args)),
        Command::Health(args) => client_runtime(health(args)),
        Command::Tools(args) => client_runtime(tools(args)),
        Command::Install { dest } => install(&dest),
    };
    match res {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agent-sidecar: {e}");
            match e {
                Error::Status { .. } => ExitCode::from(EXIT_REFUSED),
                Error::Usage(_) => ExitCode::from(2),
                _ => ExitCode::FAILURE,
            }
        }
    }
}

fn client_runtime<F: std::future::Future<Output = Result<ExitCode, Error>>>(
    f: F,
) -> Result<ExitCode, Error> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?
        .block_on(f)
}

fn run_serve(args: ServeArgs) -> Result<ExitCode, Error> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // As PID 1, or beside it, every orphaned background job must become ours
    // to reap; the supervisor reaps whatever is reparented here.
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(error = %e, "cannot become a child subreaper; orphans will be reaped only if this is PID 1");
    }
    let toolset = sidecar::cli::load_toolset(args.toolset.as_ref())?;
    let state_dir = args
        .state_dir
        .clone()
        .unwrap_or_else(|| RunnerConfig::default_state_dir(&args.session));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(64)
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?;
    rt.block_on(async move {
        let meter = sidecar::telemetry::init()?;
        let mut config =
            RunnerConfig::new(args.workdir.clone(), state_dir, args.spill_dir.clone(), toolset);
        config.limits = args.limits();
        config.protected = std::iter::once(args.socket.clone())
            .chain(args.toolset.clone())
            .collect();
        let runner = Runner::new(config)?;
        tracing::info!(workdir = %runner.workdir().display(), session = %args.session, "runner ready");
        if let Some(path) = args.toolset.clone() {
            watch_toolset(runner.clone(), path, std::time::Duration::from_secs(args.toolset_poll_seconds.max(1)));
        }
        let idle = args.idle_timeout_seconds.map(std::time::Duration::from_secs);
        let watched = runner.clone();
        let res = serve(
            runner,
            Listen {
                socket: args.socket.clone(),
                tcp: args.listen,
            },
            async move {
                tokio::select! {
                    () = shutdown_signal() => {}
                    () = idle_timeout(watched, idle) => {}
                }
            },
        )
        .await;
        sidecar::telemetry::shutdown(meter);
        res.map(|()| ExitCode::SUCCESS)
    })
}

/// Resolves once the runner has been idle for `limit` (never without one).
async fn idle_timeout(runner: Runner, limit: Option<std::time::Duration>) {
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
        tokio::time::sleep(limit - idle + std::time::Duration::from_millis(50)).await;
    }
}

/// Re-reads the toolset file when its bytes change. A broken file keeps
/// the toolset in force (and says so) rather than opening every tool.
fn watch_toolset(runner: Runner, path: std::path::PathBuf, every: std::time::Duration) {
    tokio::spawn(async move {
        let mut last = std::fs::read(&path).ok();
        loop {
            tokio::time::sleep(every).await;
            let now = std::fs::read(&path).ok();
            if now.is_none() || now == last {
                continue;
            }
            match sidecar::cli::load_toolset(Some(&path)) {
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
    });
}

/// Copies this executable to `dest` atomically, mode 0755.
fn install(dest: &std::path::Path) -> Result<ExitCode, Error> {
    use std::os::unix::fs::PermissionsExt;
    let me = std::env::current_exe().map_err(|e| Error::io("cannot find this executable", e))?;
    let dir = dest.parent().unwrap_or(std::path::Path::new("/"));
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    let tmp = dir.join(format!(".agent-sidecar.{}", std::process::id()));
    std::fs::copy(&me, &tmp)
        .map_err(|e| Error::io(format!("cannot copy to {}", tmp.display()), e))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io(format!("cannot chmod {}", tmp.display()), e))?;
    std::fs::rename(&tmp, dest)
        .map_err(|e| Error::io(format!("cannot install {}", dest.display()), e))?;
    print_line(&format!("installed {}", dest.display()))?;
    Ok(ExitCode::SUCCESS)
}

async fn shutdown_signal() {
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

async fn call(args: CallArgs) -> Result<ExitCode, Error> {
    let id = args.id.clone().unwrap_or_else(sidecar::cli::generate_id);
    let mut client = Client::connect(&args.target.target()).await?;
    let res = client
        .run(&id, &args.tool, &args.input, args.confirmed)
        .await?;
    let line = serde_json::to_string(&res)
        .map_err(|e| Error::io("cannot encode the result", std::io::Error::other(e)))?;
    print_line(&line)?;
    Ok(ExitCode::SUCCESS)
}

async fn health(args: TargetArgs) -> Result<ExitCode, Error> {
    let mut client = Client::connect(&args.target()).await?;
    if client.health().await? {
        print_line("SERVING")?;
        Ok(ExitCode::SUCCESS)
    } else {
        print_line("NOT_SERVING")?;
        Ok(ExitCode::FAILURE)
    }
}

async fn tools(args: TargetArgs) -> Result<ExitCode, Error> {
    let mut client = Client::connect(&args.target()).await?;
    let defs = client.list_tools().await?;
    let json: Vec<serde_json::Value> = defs
        .into_iter()
        .map(|d| {
            serde_json::json!({
                "name": d.name,
                "description": d.description,
                "input_schema": serde_json::from_str::<serde_json::Value>(&d.input_schema_json)
                    .unwrap_or(serde_json::Value::Null),
                "permission_policy": d.permission_policy,
            })
        })
        .collect();
    print_line(&serde_json::Value::Array(json).to_string())?;
    Ok(ExitCode::SUCCESS)
}

fn print_line(s: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{s}")
        .and_then(|()| out.flush())
        .map_err(|e| Error::io("cannot write to stdout", e))
}
