//! The `agent-gateway` command line: where it listens, its certificate
//! (which is also its client identity towards runners, and the key its
//! approvals are signed with), and its bounds.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use kube::Client;

use crate::approval::Approvals;
use crate::auth::Auth;
use crate::directory::Directory;
use crate::error::{Error, Result};
use crate::gate::Gate;
use crate::limits::Limits;
use crate::runners::Runners;
use crate::serve::{self, ConnLimits};

#[derive(Debug, Parser)]
#[command(
    name = "agent-gateway",
    version,
    about = "The front door for programs: a session's tools over gRPC, HTTP/JSON and MCP, authorised by Kubernetes"
)]
pub struct Args {
    /// Address to serve on (gRPC, HTTP and MCP share it).
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Directory with tls.crt, tls.key (served, and shown to runners as the
    /// client) and ca.crt (runners' CA): the Secret the operator writes.
    #[arg(long)]
    pub tls_dir: PathBuf,
    /// Serve plain HTTP (h2c and HTTP/1.1) instead of TLS: for a gateway
    /// behind a TLS-terminating proxy on the same pod only.
    #[arg(long)]
    pub plaintext: bool,
    /// Audiences a token must be for (TokenReview); the API server's own
    /// when none is given.
    #[arg(long = "token-audience")]
    pub audiences: Vec<String>,
    /// Tokens and permission answers remembered (each).
    #[arg(long, default_value_t = 10_000)]
    pub cache_entries: usize,
    /// Calls one caller may run at once through this replica.
    #[arg(long, default_value_t = 64)]
    pub max_calls_per_caller: usize,
    /// Calls this replica runs at once.
    #[arg(long, default_value_t = 2048)]
    pub max_calls: usize,
    /// Callers with calls running at once.
    #[arg(long, default_value_t = 4096)]
    pub max_callers: usize,
    /// Runners this replica keeps connections to.
    #[arg(long, default_value_t = 4096)]
    pub max_runners: usize,
    /// Connections this replica accepts at once.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// Log as JSON lines.
    #[arg(long, env = "AGENTPLANE_JSON_LOGS")]
    pub json_logs: bool,
}

/// Runs the gateway until SIGTERM.
pub async fn main(args: Args) -> ExitCode {
    let _telemetry = match telemetry::init(telemetry::Setup {
        service: "agent-gateway",
        json_logs: args.json_logs,
        default_filter: "info,kube=warn,tower=warn,hyper=warn,h2=warn",
        traces: true,
        metrics: true,
    }) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("agent-gateway: telemetry: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "agent-gateway stopped");
            eprintln!("agent-gateway: {e}");
            ExitCode::FAILURE
        }
    }
}

fn read(dir: &Path, file: &str) -> Result<Vec<u8>> {
    use std::io::Read;
    let path = dir.join(file);
    let mut buf = Vec::new();
    std::fs::File::open(&path)
        .and_then(|f| f.take(256 * 1024).read_to_end(&mut buf))
        .map_err(|source| Error::Read {
            path: path.display().to_string(),
            source,
        })?;
    Ok(buf)
}

/// The gateway's certificate, key and the runners' CA, as read from
/// `--tls-dir` (once, at start).
#[derive(Debug)]
pub struct Certs {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub ca: Vec<u8>,
}

impl Certs {
    pub fn read(dir: &Path) -> Result<Self> {
        Ok(Self {
            cert: read(dir, "tls.crt")?,
            key: read(dir, "tls.key")?,
            ca: read(dir, "ca.crt")?,
        })
    }
}

/// The gate from the certificates and a client.
pub fn gate(args: &Args, certs: &Certs, client: Client, directory: Directory) -> Arc<Gate> {
    Arc::new(Gate {
        auth: Auth::new(client, args.audiences.clone(), args.cache_entries),
        directory,
        runners: Runners::new(&certs.cert, &certs.key, &certs.ca, args.max_runners),
        approvals: Approvals::new(&certs.key),
        limits: Limits::new(args.max_calls_per_caller, args.max_calls, args.max_callers),
    })
}

/// Every front on one router.
pub fn app(gate: Arc<Gate>) -> axum::Router {
    let grpc =
        tonic::service::Routes::new(crate::grpc::server(Arc::clone(&gate))).into_axum_router();
    crate::http::router(Arc::clone(&gate))
        .merge(crate::mcp::router(gate))
        .merge(grpc)
}

async fn run(args: Args) -> Result<()> {
    let client = Client::try_default().await.map_err(|e| {
        Error::Internal(format!("cannot load kubeconfig or in-cluster config: {e}"))
    })?;
    let (directory, watches) = Directory::start(client.clone());
    tokio::spawn(watches);
    let certs = Certs::read(&args.tls_dir)?;
    let gate = gate(&args, &certs, client, directory.clone());
    tracing::info!("waiting for the session and pod caches");
    directory.ready().await;
    let tls = if args.plaintext {
        tracing::warn!("--plaintext: serving without TLS");
        None
    } else {
        Some(serve::tls_config(&certs.cert, &certs.key)?)
    };
    let limits = ConnLimits {
        max_connections: args.max_connections,
        ..ConnLimits::default()
    };
    serve::serve(args.listen, app(gate), tls, limits, shutdown_signal()).await
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
