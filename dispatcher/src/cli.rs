//! The `agent-dispatcher` command line.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use crate::api::ManagedApi;
use crate::context::Context;
use crate::metrics::Metrics;
use crate::tools::Gateway;

#[derive(Debug, Parser)]
#[command(
    name = "agent-dispatcher",
    version,
    about = "Serves Claude Managed Agents self-hosted environments (AgentEnvironment) from the cluster"
)]
pub struct Args {
    /// The Managed Agents API. Set by the platform (the chart), never by a
    /// tenant: the dispatcher sends environment keys there.
    #[arg(
        long,
        env = "AGENTPLANE_MANAGED_API_URL",
        default_value = "https://api.anthropic.com"
    )]
    pub api_url: String,
    /// Serve the environments of this namespace only (all when unset).
    #[arg(long)]
    pub namespace: Option<String>,
    /// The ServiceAccount token shown to the gateway.
    #[arg(
        long,
        default_value = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    )]
    pub token_file: PathBuf,
    /// The worker id sent on every poll; the pod's name by default.
    #[arg(long, env = "POD_NAME")]
    pub worker_id: Option<String>,
    /// Log as JSON lines.
    #[arg(long, env = "AGENTPLANE_JSON_LOGS")]
    pub json_logs: bool,
}

/// Runs the dispatcher until SIGTERM.
pub async fn main(args: Args) -> ExitCode {
    let _telemetry = match telemetry::init(telemetry::Setup {
        service: "agent-dispatcher",
        json_logs: args.json_logs,
        default_filter: "info,kube=warn,tower=warn,hyper=warn,h2=warn,reqwest=warn",
        traces: true,
        metrics: true,
    }) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("agent-dispatcher: telemetry: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "agent-dispatcher stopped");
            ExitCode::FAILURE
        }
    }
}

/// How long the dispatcher waits at start for a gateway to be published.
const GATEWAY_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

async fn run(args: Args) -> crate::Result<()> {
    let api = ManagedApi::new(&args.api_url)?;
    let kube = kube::Client::try_default().await?;
    // The operator publishes the gateway once both run and rewrites the
    // entry when it moves; the dispatcher follows it for as long as it runs.
    let gateway = Arc::new(Gateway::new(args.token_file.clone()));
    tokio::spawn(gateway.clone().follow(kube.clone()));
    if !gateway.is_published() {
        tracing::info!("waiting for the gateway to be published");
    }
    gateway.wait_published(GATEWAY_WAIT).await?;
    let host = args.worker_id.unwrap_or_else(|| "agent-dispatcher".into());
    let worker_id = format!("{host}-{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff);
    let ctx = Arc::new(Context {
        kube,
        api,
        gateway,
        worker_id,
        metrics: Metrics::new(),
    });
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = tx.send(true);
    });
    tracing::info!(api = %args.api_url, namespace = ?args.namespace, "dispatcher started");
    crate::controller::run(ctx, args.namespace, rx).await;
    Ok(())
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
