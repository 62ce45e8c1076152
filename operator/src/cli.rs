//! The `agent-operator` command line.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};

use crate::admission::check;
use crate::admission::route::router as admission_router;
use crate::admission::tls::{self, ReloadingCert, TlsFiles};
use crate::checkpoint::controller::CheckpointContext;
use crate::cidr::Cidr;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::health::{self, Readiness};
use crate::leader::{self, LeaseConfig};
use crate::mcp::destinations::Destinations;
use crate::policy::SessionPolicy;
use crate::sandbox::{DiskBounds, EgressPolicy, GatewaySource, PodConfig, RunnerWatch};
use crate::session::controller::{MAX_CONCURRENT_RECONCILES, SessionContext};
use crate::session::watches::Watches;
use crate::{checkpoint, pool, session};
use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// Reconciles AgentSessions into hardened sandbox pods and validates them at admission.
#[derive(Debug, Parser)]
#[command(name = "agent-operator", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller and the admission webhook.
    Run(Box<RunArgs>),
    /// Validate a manifest offline like the webhook, and print the status
    /// the operator would write, as JSON. Exits 1 when a session is invalid.
    /// The session policy is the default (every guarded field denied)
    /// unless `--values` or the policy flags say otherwise, as for the
    /// operator itself.
    Check {
        /// The manifest (YAML or JSON, several documents allowed); - for stdin.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The chart values file the platform installed with: its
        /// `sessionPolicy` is the policy checked against.
        #[arg(long = "values", value_name = "FILE", conflicts_with_all = ["secret_refs", "configmap_refs", "runtime_classes", "node_selectors", "tolerations", "storage_classes", "max_ephemeral_storage"])]
        values: Option<PathBuf>,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Print the AgentSession CRD as YAML.
    Crd,
    /// GET a URL and exit 0 on a 2xx answer (the chart's `helm test`).
    Probe {
        /// e.g. http://agentplane-webhook.agentplane-system.svc:8081/readyz
        url: String,
    },
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Image that carries the static runner at /agent-sidecar.
    #[arg(
        long,
        env = "AGENTPLANE_RUNNER_IMAGE",
        default_value = "localhost/agentplane/runner:dev"
    )]
    pub runner_image: String,
    /// Pull policy for sandbox and runner images.
    #[arg(
        long,
        env = "AGENTPLANE_IMAGE_PULL_POLICY",
        default_value = "IfNotPresent"
    )]
    pub image_pull_policy: String,
    /// Where the webhook serves HTTPS.
    #[arg(long, env = "AGENTPLANE_WEBHOOK_ADDR", default_value = "0.0.0.0:9443")]
    pub webhook_addr: SocketAddr,
    /// PEM certificate of the webhook; the webhook is off without it.
    #[arg(long, env = "AGENTPLANE_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of the webhook.
    #[arg(long, env = "AGENTPLANE_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Where /healthz and /readyz answer (plain HTTP).
    #[arg(long, env = "AGENTPLANE_HEALTH_ADDR", default_value = "0.0.0.0:8081")]
    pub health_addr: SocketAddr,
    /// Elect a leader by Lease before reconciling (for several replicas).
    #[arg(long, env = "AGENTPLANE_LEADER_ELECT")]
    pub leader_elect: bool,
    /// Namespace of the leader Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Name of the leader Lease.
    #[arg(long, default_value = "agentplane-operator")]
    pub lease_name: String,
    /// Seconds a leader lease lasts unrenewed: with the retry period, how
    /// long a fail-over takes after the leader dies. Shorter than
    /// client-go's 15 s so that a fail-over (lease + retry) stays under
    /// 15 s (docs/benchmarks.md, issue 24).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(2..=600))]
    pub lease_duration_seconds: u64,
    /// Seconds after which a leader that could not renew stops acting
    /// (shorter than the lease).
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub lease_renew_deadline_seconds: u64,
    /// Seconds between renewals, and between a standby's tries.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub lease_retry_period_seconds: u64,
    /// Serve only the webhook; do not reconcile.
    #[arg(long)]
    pub webhook_only: bool,
    /// A non-public range MCP servers may be reached in (e.g. an in-cluster
    /// MCP Service's range); public addresses always may; repeatable.
    #[arg(long = "mcp-allow-cidr", value_name = "CIDR")]
    pub mcp_allow_cidrs: Vec<Cidr>,
    /// Seconds one MCP request may take.
    #[arg(long, default_value_t = 10)]
    pub mcp_timeout_seconds: u64,
    /// Most sessions reconciled at once. A reconcile is a few API round
    /// trips one after another, so on a large cluster this, not CPU, bounds
    /// sessions made Ready per second; each slot may also hold an MCP
    /// listing open for up to its timeout. A quarter of the slots is kept
    /// for sessions under way (pending, changed), and neither new sessions
    /// nor resyncs of settled ones may hold more than the rest.
    #[arg(long, default_value_t = MAX_CONCURRENT_RECONCILES,
          value_parser = clap::value_parser!(u16).range(1..=512))]
    pub max_concurrent_reconciles: u16,
    /// Log as JSON lines.
    #[arg(long, env = "AGENTPLANE_JSON_LOGS")]
    pub json_logs: bool,
    #[command(flatten)]
    pub policy: PolicyArgs,
    #[command(flatten)]
    pub defaults: DefaultsArgs,
    #[command(flatten)]
    pub egress: EgressArgs,
    #[command(flatten)]
    pub gateway: GatewayArgs,
    #[command(flatten)]
    pub checkpoints: CheckpointArgs,
}

/// Checkpoints (AgentCheckpoint): their volumes, and how the operator
/// reaches runners to take them.
#[derive(Debug, Clone, Default, Args)]
pub struct CheckpointArgs {
    /// A label of the operator's own pods (KEY=VALUE), which sandboxes
    /// admit to the runner's mutual-TLS port beside the gateway, so that
    /// the operator can take checkpoints; repeatable. Without it a
    /// NetworkPolicy-enforcing cluster keeps checkpoints from being taken.
    #[arg(long = "operator-pod-label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub operator_pod_labels: Vec<(String, String)>,
    /// The volume of a checkpoint that sets no maxBytes; no checkpoint
    /// gets a smaller one.
    #[arg(long = "checkpoint-default-size", value_name = "QUANTITY", default_value = "1Gi", value_parser = parse_bytes)]
    pub default_size: String,
    /// The largest checkpoint volume; a maxBytes that needs more fails.
    #[arg(long = "checkpoint-max-size", value_name = "QUANTITY", default_value = "2Gi", value_parser = parse_bytes)]
    pub max_size: String,
    /// The StorageClass of checkpoint volumes [default: the cluster's].
    #[arg(long = "checkpoint-storage-class", value_name = "NAME")]
    pub storage_class: Option<String>,
}

impl CheckpointArgs {
    /// The checkpoint settings these flags describe.
    pub fn settings(&self) -> crate::checkpoint::plan::Settings {
        let bytes = |q: &str, fallback: u64| {
            crate::quantity::bytes(q)
                .and_then(|b| u64::try_from(b).ok())
                .unwrap_or(fallback)
        };
        let defaults = crate::checkpoint::plan::Settings::default();
        crate::checkpoint::plan::Settings {
            default_volume_bytes: bytes(&self.default_size, defaults.default_volume_bytes),
            max_volume_bytes: bytes(&self.max_size, defaults.max_volume_bytes),
            storage_class: self.storage_class.clone(),
            ..defaults
        }
    }
}

/// The gateway (`agent-gateway`), when the platform runs one: sandboxes
/// then serve it on the pod network with mutual TLS, from certificates the
/// operator issues, and admit it alone.
#[derive(Debug, Clone, Default, Args)]
pub struct GatewayArgs {
    /// The namespace the gateway runs in; turns the gateway's access on.
    #[arg(long = "gateway-namespace", value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// A label of the gateway's pods (KEY=VALUE), which sandboxes admit;
    /// repeatable.
    #[arg(long = "gateway-pod-label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub pod_labels: Vec<(String, String)>,
    /// The Secret (in the gateway's namespace) the operator writes the
    /// gateway's certificate to.
    #[arg(long = "gateway-secret", default_value = "agentplane-gateway-tls")]
    pub secret: String,
    /// A DNS name the gateway serves under (its Service's names);
    /// repeatable.
    #[arg(long = "gateway-dns-name", value_name = "NAME")]
    pub dns_names: Vec<String>,
    /// The Secret (in the operator's namespace) holding the CA that signs
    /// runner and gateway certificates; made on first start.
    #[arg(long = "ca-secret", default_value = "agentplane-ca")]
    pub ca_secret: String,
}

impl GatewayArgs {
    /// Who sandboxes admit, when a gateway runs.
    pub fn source(&self) -> Option<GatewaySource> {
        self.namespace.as_ref().map(|ns| GatewaySource {
            namespace: ns.clone(),
            pod_labels: self.pod_labels.iter().cloned().collect(),
        })
    }
}

fn parse_label(s: &str) -> std::result::Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not KEY=VALUE"))?;
    if k.is_empty() {
        return Err(format!("{s:?} has an empty key"));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// What sandboxes may reach: by default cluster DNS only.
#[derive(Debug, Clone, Default, Args)]
pub struct EgressArgs {
    /// Do not manage a NetworkPolicy per session (for clusters that
    /// restrict sandbox egress some other way).
    #[arg(long = "no-sandbox-network-policy")]
    pub disabled: bool,
    /// A CIDR sandboxes may reach, e.g. 0.0.0.0/0 for the internet;
    /// link-local and --cluster-cidr ranges are carved out of it; repeatable.
    #[arg(long = "egress-allow-cidr", value_name = "CIDR")]
    pub allowed: Vec<Cidr>,
    /// The cluster's pod or service range, never reachable through an
    /// allowed CIDR that contains it; repeatable.
    #[arg(long = "cluster-cidr", value_name = "CIDR")]
    pub cluster: Vec<Cidr>,
}

impl EgressArgs {
    /// The egress policy these flags describe.
    pub fn policy(&self) -> EgressPolicy {
        EgressPolicy {
            enabled: !self.disabled,
            allowed: self.allowed.clone(),
            cluster: self.cluster.clone(),
            gateway: None,
            operator: None,
        }
    }
}

/// What a sandbox gets when its session does not say: bounds, so that no
/// sandbox runs unbounded on the node. Changing them affects pods made
/// afterwards, not running ones.
#[derive(Debug, Clone, Default, Args)]
pub struct DefaultsArgs {
    /// CPU request of a sandbox whose session sets no resources.
    #[arg(long = "default-cpu-request", value_name = "QUANTITY", value_parser = parse_quantity)]
    pub cpu_request: Option<String>,
    /// CPU limit of a sandbox whose session sets no resources.
    #[arg(long = "default-cpu-limit", value_name = "QUANTITY", value_parser = parse_quantity)]
    pub cpu_limit: Option<String>,
    /// Memory request of a sandbox whose session sets no resources.
    #[arg(long = "default-memory-request", value_name = "QUANTITY", value_parser = parse_quantity)]
    pub memory_request: Option<String>,
    /// Memory limit of a sandbox whose session sets no resources.
    #[arg(long = "default-memory-limit", value_name = "QUANTITY", value_parser = parse_quantity)]
    pub memory_limit: Option<String>,
    /// Size limit of an emptyDir workspace whose session sets none.
    #[arg(long = "default-workspace-size", value_name = "QUANTITY", value_parser = parse_quantity)]
    pub workspace_size: Option<String>,
    /// Mount every sandbox's root filesystem read-only; the workspace,
    /// /tmp and the runner's directories stay writable. Affects pods made
    /// afterwards, not running ones.
    #[arg(long = "sandbox-read-only-root")]
    pub read_only_root: bool,
    /// Size limit of every sandbox's /tmp emptyDir.
    #[arg(long = "default-tmp-size", value_name = "QUANTITY", value_parser = parse_bytes)]
    pub tmp_size: Option<String>,
    /// Size limit of the runner's own emptyDir (socket, bash state, spilled
    /// outputs) in every sandbox.
    #[arg(long = "runner-scratch-size", value_name = "QUANTITY", value_parser = parse_bytes)]
    pub runner_scratch_size: Option<String>,
    /// What a sandbox container's writable layer may hold; its
    /// ephemeral-storage limit is this plus its volumes' limits, unless the
    /// session sets one.
    #[arg(long = "default-writable-layer-size", value_name = "QUANTITY", value_parser = parse_bytes)]
    pub writable_layer_size: Option<String>,
    /// The ephemeral-storage request of a sandbox whose session sets none.
    #[arg(long = "default-ephemeral-storage-request", value_name = "QUANTITY", value_parser = parse_bytes)]
    pub ephemeral_storage_request: Option<String>,
    /// The runner ends every process of a sandbox that runs this many
    /// processes and threads, and restarts clean; set it below the nodes'
    /// kubelet podPidsLimit.
    #[arg(long = "sandbox-max-processes", value_name = "N", value_parser = clap::value_parser!(u32).range(8..))]
    pub max_processes: Option<u32>,
    /// The runner ends every process of a sandbox in which the kernel
    /// killed one for memory, and restarts clean (as nodes on cgroup v2
    /// kill a container whole).
    #[arg(long = "sandbox-end-on-oom")]
    pub end_on_oom: bool,
    /// Run sandboxes in a user namespace (`hostUsers: false`); needs a
    /// runtime that supports them (containerd >= 2.0, runc >= 1.2, Linux >=
    /// 6.3), or their pods fail to start.
    #[arg(long = "sandbox-user-namespaces")]
    pub user_namespaces: bool,
}

/// A Kubernetes quantity as flags take it (`500m`, `2`, `1Gi`, `1.5G`),
/// checked at start-up rather than at the first pod the API server refuses.
fn parse_quantity(s: &str) -> Result<String, String> {
    const SUFFIXES: [&str; 14] = [
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "k", "M", "G", "T", "P", "E", "",
    ];
    let number = SUFFIXES
        .iter()
        .find_map(|suffix| s.strip_suffix(suffix).filter(|n| !n.is_empty()));
    match number {
        Some(n) if n.parse::<f64>().is_ok_and(|v| v.is_finite() && v > 0.0) => Ok(s.to_owned()),
        _ => Err(format!(
            "{s:?} is not a positive Kubernetes quantity (e.g. 500m, 2, 512Mi, 1Gi)"
        )),
    }
}

/// A byte quantity (`512Mi`, `1Gi`, `2G`), checked at start-up.
fn parse_bytes(s: &str) -> Result<String, String> {
    match crate::quantity::bytes(s) {
        Some(n) if n > 0 => Ok(s.to_owned()),
        _ => Err(format!(
            "{s:?} is not a positive byte quantity (e.g. 512Mi, 1Gi, 2G)"
        )),
    }
}

impl DefaultsArgs {
    /// The disk bounds these flags set.
    pub fn disk(&self) -> DiskBounds {
        let q = |v: &Option<String>| v.clone().map(Quantity);
        DiskBounds {
            tmp: q(&self.tmp_size),
            runner: q(&self.runner_scratch_size),
            layer: q(&self.writable_layer_size),
            request: q(&self.ephemeral_storage_request),
        }
    }

    /// The default resources, if any flag sets one.
    pub fn resources(&self) -> Option<ResourceRequirements> {
        let pick = |cpu: &Option<String>, memory: &Option<String>| {
            let map: BTreeMap<String, Quantity> = [("cpu", cpu), ("memory", memory)]
                .into_iter()
                .filter_map(|(k, v)| Some((k.to_owned(), Quantity(v.clone()?))))
                .collect();
            (!map.is_empty()).then_some(map)
        };
        let requests = pick(&self.cpu_request, &self.memory_request);
        let limits = pick(&self.cpu_limit, &self.memory_limit);
        (requests.is_some() || limits.is_some()).then(|| ResourceRequirements {
            requests,
            limits,
            ..ResourceRequirements::default()
        })
    }
}

/// The session policy: what sessions may ask for beyond literal env values.
/// Everything here is denied unless listed.
#[derive(Debug, Clone, Default, Args)]
pub struct PolicyArgs {
    /// A Secret (in the session's namespace) env valueFrom may reference; repeatable.
    #[arg(long = "allow-secret-ref", value_name = "NAME")]
    pub secret_refs: Vec<String>,
    /// A ConfigMap (in the session's namespace) env valueFrom may reference; repeatable.
    #[arg(long = "allow-configmap-ref", value_name = "NAME")]
    pub configmap_refs: Vec<String>,
    /// A RuntimeClass sessions may select; repeatable.
    #[arg(long = "allow-runtime-class", value_name = "NAME")]
    pub runtime_classes: Vec<String>,
    /// A node-selector term sessions may use; repeatable.
    #[arg(long = "allow-node-selector", value_name = "KEY=VALUE")]
    pub node_selectors: Vec<String>,
    /// Let sessions set tolerations.
    #[arg(long = "allow-tolerations")]
    pub tolerations: bool,
    /// A StorageClass workspace claims may name; repeatable.
    #[arg(long = "allow-storage-class", value_name = "NAME")]
    pub storage_classes: Vec<String>,
    /// The most local disk (ephemeral-storage, emptyDir workspace size) a
    /// session may ask for.
    #[arg(long = "max-ephemeral-storage", value_name = "QUANTITY", value_parser = parse_bytes)]
    pub max_ephemeral_storage: Option<String>,
}

impl PolicyArgs {
    /// The policy these flags describe.
    pub fn policy(&self) -> SessionPolicy {
        SessionPolicy {
            secret_refs: self.secret_refs.iter().cloned().collect(),
            configmap_refs: self.configmap_refs.iter().cloned().collect(),
            runtime_classes: self.runtime_classes.iter().cloned().collect(),
            node_selectors: self.node_selectors.iter().cloned().collect(),
            tolerations: self.tolerations,
            storage_classes: self.storage_classes.iter().cloned().collect(),
            max_ephemeral_storage: self.max_ephemeral_storage.clone(),
        }
    }
}

/// Runs the command line; the exit code says how it went.
pub async fn main(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Crd => match crds::crd_yaml() {
            Ok(y) => {
                print!("{y}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("agent-operator: cannot render the CRD: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Check {
            file,
            values,
            policy,
        } => run_check(&file, values.as_deref(), &policy),
        Command::Probe { url } => probe(&url).await,
        Command::Run(args) => match run(*args).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                tracing::error!(error = %e, "agent-operator stopped");
                eprintln!("agent-operator: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

async fn probe(url: &str) -> ExitCode {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent-operator probe: {e}");
            return ExitCode::FAILURE;
        }
    };
    match client.get(url).send().await {
        Ok(r) if r.status().is_success() => {
            println!("{url}: {}", r.status());
            ExitCode::SUCCESS
        }
        Ok(r) => {
            eprintln!("agent-operator probe: {url} answered {}", r.status());
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("agent-operator probe: {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The most a manifest or values file `check` reads: far more than any
/// manifest, and bounded so that `-f /dev/zero` ends with an error.
const MAX_CHECK_INPUT: u64 = 16 << 20;

/// Reads `path` (`-`: standard input), at most [`MAX_CHECK_INPUT`] bytes.
fn read_bounded(path: &std::path::Path) -> std::result::Result<String, String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let read = if path.as_os_str() == "-" {
        std::io::stdin()
            .take(MAX_CHECK_INPUT + 1)
            .read_to_end(&mut bytes)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_CHECK_INPUT + 1).read_to_end(&mut bytes))
    };
    let shown = if path.as_os_str() == "-" {
        "standard input".to_owned()
    } else {
        path.display().to_string()
    };
    read.map_err(|e| format!("cannot read {shown}: {e}"))?;
    if bytes.len() as u64 > MAX_CHECK_INPUT {
        return Err(format!(
            "{shown} is larger than {} MiB",
            MAX_CHECK_INPUT >> 20
        ));
    }
    String::from_utf8(bytes).map_err(|_| format!("{shown} is not UTF-8 text"))
}

fn run_check(
    file: &std::path::Path,
    values: Option<&std::path::Path>,
    flags: &PolicyArgs,
) -> ExitCode {
    let policy = match values {
        Some(v) => match read_bounded(v).and_then(|t| {
            SessionPolicy::from_chart_values(&t).map_err(|e| format!("{}: {e}", v.display()))
        }) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("agent-operator check: {e}");
                return ExitCode::from(2);
            }
        },
        None => flags.policy(),
    };
    let text = match read_bounded(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("agent-operator check: {e}");
            return ExitCode::from(2);
        }
    };
    let verdicts = match check::check_manifest(&text, &policy) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("agent-operator check: {}: {e}", file.display());
            return ExitCode::from(2);
        }
    };
    if verdicts.is_empty() {
        eprintln!(
            "agent-operator check: {}: no AgentSession in the file",
            file.display()
        );
        return ExitCode::from(2);
    }
    let mut invalid = false;
    for v in &verdicts {
        println!(
            "{}",
            serde_json::to_string_pretty(&v.report).unwrap_or_default()
        );
        for e in &v.errors {
            invalid = true;
            eprintln!("{}: {e}", v.name);
        }
    }
    if invalid {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// A future that resolves once the process is stopping.
type Stopped = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + Sync>>;

/// Hands out futures that resolve when the stop flag is set.
#[derive(Clone)]
struct StopSignal(tokio::sync::watch::Receiver<bool>);

impl StopSignal {
    fn wait(&self) -> Stopped {
        let mut rx = self.0.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|s| *s).await;
        })
    }
}

type Tasks = tokio::task::JoinSet<Result<()>>;

async fn run(args: RunArgs) -> Result<()> {
    let _telemetry = telemetry::init(telemetry::Setup {
        service: "agent-operator",
        json_logs: args.json_logs,
        default_filter: "info,kube=warn,tower=warn,hyper=warn",
        traces: true,
        metrics: true,
    })
    .map_err(|e| Error::Telemetry(e.to_string()))?;
    let client = Client::try_default()
        .await
        .map_err(|e| Error::KubeConfig(e.to_string()))?;
    let ready = Arc::new(Readiness::default());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop = StopSignal(stop_rx);

    let mut tasks = Tasks::new();
    tasks.spawn(health::serve_plain(
        args.health_addr,
        health::router(Arc::clone(&ready)),
        stop.wait(),
    ));
    spawn_webhook(&args, &mut tasks, &stop)?;

    // The API server must answer before we call ourselves ready.
    client.apiserver_version().await?;
    ready.set(true);

    if !args.webhook_only {
        let ctx = Arc::new(Context::new(
            client.clone(),
            pod_config(&args),
            args.policy.policy(),
        ));
        bootstrap_gateway(&args, &ctx).await?;
        let mcp = Destinations {
            allowed: args.mcp_allow_cidrs.clone(),
        };
        let mut sessions = SessionContext::new(
            Arc::clone(&ctx),
            Duration::from_secs(args.mcp_timeout_seconds),
            mcp,
        );
        sessions.lanes = session::lanes::Lanes::new(args.max_concurrent_reconciles);
        let sessions = Arc::new(sessions);
        let lease = lease_config(&args)?;
        let checkpoints = Arc::new(CheckpointContext {
            base: Arc::clone(&ctx),
            settings: args.checkpoints.settings(),
        });
        tasks.spawn(reconcile(ctx, sessions, checkpoints, lease, stop.clone()));
    }

    tokio::select! {
        () = shutdown_signal() => tracing::info!("shutting down"),
        Some(done) = tasks.join_next() => {
            let _ = stop_tx.send(true);
            match done {
                Ok(Err(e)) => return Err(e),
                Ok(Ok(())) => {}
                Err(e) => return Err(Error::Telemetry(format!("task panicked: {e}"))),
            }
        }
    }
    let _ = stop_tx.send(true);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// With a gateway: the CA and the gateway's certificate before anything
/// reconciles, so that every sandbox pod made finds its runner certificate.
/// The leader lease this replica competes for, when `--leader-elect`.
fn lease_config(args: &RunArgs) -> Result<Option<LeaseConfig>> {
    if !args.leader_elect {
        return Ok(None);
    }
    let identity = std::env::var("POD_NAME")
        .unwrap_or_else(|_| format!("agent-operator-{}", std::process::id()));
    LeaseConfig::new(
        args.lease_namespace.clone(),
        args.lease_name.clone(),
        identity,
    )
    .with_timing(
        Duration::from_secs(args.lease_duration_seconds),
        Duration::from_secs(args.lease_renew_deadline_seconds),
        Duration::from_secs(args.lease_retry_period_seconds),
    )
    .map(Some)
}

async fn bootstrap_gateway(args: &RunArgs, ctx: &Context) -> Result<()> {
    if let Some(ns) = &args.gateway.namespace {
        let tls = crate::tls_secrets::bootstrap(
            &ctx.client,
            &args.lease_namespace,
            &args.gateway.ca_secret,
            ns,
            &args.gateway.secret,
            &args.gateway.dns_names,
        )
        .await?;
        let _ = ctx.runner_tls.set(tls);
    }
    Ok(())
}

/// What the platform decides about every sandbox pod, from the flags.
fn pod_config(args: &RunArgs) -> PodConfig {
    PodConfig {
        runner_image: args.runner_image.clone(),
        image_pull_policy: args.image_pull_policy.clone(),
        default_resources: args.defaults.resources(),
        default_workspace_limit: args.defaults.workspace_size.clone().map(Quantity),
        egress: EgressPolicy {
            gateway: args.gateway.source(),
            operator: (!args.checkpoints.operator_pod_labels.is_empty()).then(|| GatewaySource {
                namespace: args.lease_namespace.clone(),
                pod_labels: args
                    .checkpoints
                    .operator_pod_labels
                    .iter()
                    .cloned()
                    .collect(),
            }),
            ..args.egress.policy()
        },
        read_only_root: args.defaults.read_only_root,
        disk: args.defaults.disk(),
        host_users: args.defaults.user_namespaces.then_some(false),
        watch: RunnerWatch {
            max_processes: args.defaults.max_processes,
            end_on_oom: args.defaults.end_on_oom,
        },
        gateway: args.gateway.namespace.is_some(),
    }
}

/// Starts the admission webhook when a certificate and key are given.
fn spawn_webhook(args: &RunArgs, tasks: &mut Tasks, stop: &StopSignal) -> Result<()> {
    match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let cert = ReloadingCert::load(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
            })?;
            cert.watch(Duration::from_secs(10));
            tasks.spawn(tls::serve(
                args.webhook_addr,
                admission_router(Arc::new(args.policy.policy())),
                cert,
                stop.wait(),
            ));
            Ok(())
        }
        (None, None) => {
            tracing::warn!("no --tls-cert/--tls-key: the admission webhook is off");
            Ok(())
        }
        _ => Err(Error::Tls(
            "give both --tls-cert and --tls-key, or neither".into(),
        )),
    }
}

/// The reconcilers, sessions, warm pools and checkpoints, until `stop`.
async fn reconcilers(
    ctx: Arc<Context>,
    sessions: Arc<SessionContext>,
    watches: Watches,
    checkpoints: Arc<CheckpointContext>,
    stop: StopSignal,
) {
    futures::join!(
        session::controller::run(sessions, watches, stop.wait()),
        pool::controller::run(ctx, stop.wait()),
        checkpoint::controller::run(checkpoints, stop.wait()),
    );
}

/// Runs the reconcilers, behind the leader lease when one is configured:
/// they reconcile only while this replica holds the lease, and the error
/// that ends leadership is returned so that the process exits at once.
/// The session watches run from the start, leading or not (see
/// [`session::watches`]).
async fn reconcile(
    ctx: Arc<Context>,
    sessions: Arc<SessionContext>,
    checkpoints: Arc<CheckpointContext>,
    lease: Option<LeaseConfig>,
    stop: StopSignal,
) -> Result<()> {
    let watches = sessions.watch();
    let Some(cfg) = lease else {
        reconcilers(ctx, sessions, watches, checkpoints, stop).await;
        return Ok(());
    };
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), &cfg.namespace);
    tokio::select! {
        () = stop.wait() => return Ok(()),
        acquired = leader::acquire(&api, &cfg) => acquired?,
    }
    let outcome = tokio::select! {
        err = leader::hold(&api, &cfg) => Err(err),
        () = reconcilers(ctx, sessions, watches, checkpoints, stop.clone()) => Ok(()),
    };
    leader::release(&api, &cfg).await;
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_checked_at_start_up() {
        for ok in ["500m", "2", "1.5", "512Mi", "1Gi", "4G"] {
            assert_eq!(parse_quantity(ok).as_deref(), Ok(ok));
        }
        for bad in ["", "lots", "Gi", "-1Gi", "0", "1 Gi", "NaN"] {
            assert!(parse_quantity(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn default_resources_only_when_a_flag_sets_one() {
        assert!(DefaultsArgs::default().resources().is_none());
        let d = DefaultsArgs {
            cpu_request: Some("100m".into()),
            memory_limit: Some("1Gi".into()),
            ..DefaultsArgs::default()
        };
        let r = d.resources().expect("set");
        assert_eq!(
            r.requests.expect("requests")["cpu"],
            Quantity("100m".into())
        );
        let limits = r.limits.expect("limits");
        assert_eq!(limits["memory"], Quantity("1Gi".into()));
        assert!(!limits.contains_key("cpu"));
    }
}
