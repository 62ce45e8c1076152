//! The gRPC surface: the Runner service, the standard health and reflection
//! services, and serving them on a Unix socket (and optionally loopback TCP)
//! until SIGTERM. Every accepted connection goes through
//! [`AuthorityFix`](crate::authority::AuthorityFix), so stock gRPC clients
//! that send the socket path as `:authority` are served too.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Notify, watch};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream, UnixListenerStream};
use tonic::{Request, Response, Status};

use crate::authority::AuthorityFix;
use crate::error::Error;
use crate::runner::Runner;
use runner_api::proto::runner_server::{Runner as RunnerRpc, RunnerServer};
use runner_api::proto::{
    AttachRequest, CancelRequest, CancelResponse, ExportChunk, ExportRequest, Held, HoldEvent,
    HoldRequest, ImportChunk, ImportResponse, ListToolsRequest, ListToolsResponse, Released,
    RunEvent, RunRequest, RunResponse, ToolDefinition, export_chunk, hold_event, hold_request,
    import_chunk,
};

/// The tonic service over a [`Runner`].
#[derive(Debug, Clone)]
pub struct Service {
    runner: Runner,
    in_flight: Arc<InFlight>,
}

impl Service {
    pub fn new(runner: Runner) -> Self {
        Service {
            runner,
            in_flight: Arc::new(InFlight::default()),
        }
    }
}

/// Calls being run, so shutdown can wait for exactly those. Waiting for the
/// connections to close instead would let one idle client that never
/// answers the HTTP/2 GOAWAY hold the runner up forever.
#[derive(Debug, Default)]
struct InFlight {
    count: AtomicUsize,
    idle: Notify,
}

struct InFlightGuard(Arc<InFlight>);

impl InFlight {
    fn enter(self: &Arc<Self>) -> InFlightGuard {
        self.count.fetch_add(1, Ordering::SeqCst);
        InFlightGuard(self.clone())
    }

    async fn drained(&self) {
        loop {
            let notified = self.idle.notified();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// How long finished calls get to write their responses once every call has
/// drained, before remaining (idle) connections are dropped.
const FLUSH_GRACE: Duration = Duration::from_secs(1);

#[tonic::async_trait]
impl RunnerRpc for Service {
    type RunStreamStream = ReceiverStream<Result<RunEvent, Status>>;
    type AttachStream = ReceiverStream<Result<RunEvent, Status>>;
    type ExportStream = ReceiverStream<Result<ExportChunk, Status>>;
    type HoldStream = ReceiverStream<Result<HoldEvent, Status>>;

    async fn export(
        &self,
        request: Request<ExportRequest>,
    ) -> Result<Response<Self::ExportStream>, Status> {
        // A shutdown waits for an export to be sent, as for a call.
        let guard = self.in_flight.enter();
        let req = request.into_inner();
        let path = req.path.clone();
        let exported = self.runner.export(req).await.map_err(|e| {
            tracing::warn!(path = %path, error = %e, "export not done");
            e.to_status()
        })?;
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            let _guard = guard;
            send_archive(exported, tx).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn hold(
        &self,
        request: Request<tonic::Streaming<HoldRequest>>,
    ) -> Result<Response<Self::HoldStream>, Status> {
        let mut stream = request.into_inner();
        let start = match tokio::time::timeout(IMPORT_IDLE, stream.message()).await {
            Ok(Ok(Some(HoldRequest {
                step: Some(hold_request::Step::Start(start)),
            }))) => start,
            Ok(Err(e)) => return Err(e),
            _ => {
                return Err(runner_api::Refusal::TransferRefused
                    .status("a hold's first message must be its start"));
            }
        };
        let seconds = hold_seconds(start.max_seconds)?;
        // Not counted as in flight: a shutdown ends a hold (the runner
        // exits and no call runs after it) instead of waiting for it.
        let held = self.runner.hold(start.shell_state).await.map_err(|e| {
            tracing::warn!(error = %e, "hold not taken");
            e.to_status()
        })?;
        tracing::info!(seconds, "workspace held for a copy of its volume");
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let first = HoldEvent {
            event: Some(hold_event::Event::Held(Held {
                shell_state: held.shell_state.clone(),
                max_seconds: seconds,
            })),
        };
        if tx.send(Ok(first)).await.is_err() {
            return Err(Status::cancelled("the client went away"));
        }
        tokio::spawn(async move {
            let deadline = tokio::time::sleep(Duration::from_secs(u64::from(seconds)));
            let why = tokio::select! {
                () = deadline => "deadline",
                next = stream.message() => match next {
                    Ok(Some(HoldRequest { step: Some(hold_request::Step::Release(_)) })) => "release",
                    _ => "closed",
                },
            };
            let held_millis = u64::try_from(held.since.elapsed().as_millis()).unwrap_or(u64::MAX);
            drop(held);
            tracing::info!(why, held_millis, "workspace released");
            let last = HoldEvent {
                event: Some(hold_event::Event::Released(Released {
                    why: why.to_owned(),
                    held_millis,
                })),
            };
            let _ = tx.send(Ok(last)).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn import(
        &self,
        request: Request<tonic::Streaming<ImportChunk>>,
    ) -> Result<Response<ImportResponse>, Status> {
        let _guard = self.in_flight.enter();
        let mut stream = request.into_inner();
        let header = match stream.message().await? {
            Some(ImportChunk {
                part: Some(import_chunk::Part::Header(h)),
            }) => h,
            _ => {
                return Err(runner_api::Refusal::TransferRefused
                    .status("an import's first message must be its header"));
            }
        };
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                // A client that stops sending would hold the transfer slot
                // (one import or export at a time) for ever.
                let next = tokio::time::timeout(IMPORT_IDLE, stream.message()).await;
                let Ok(next) = next else {
                    let _ = tx
                        .send(Err(std::io::Error::other(format!(
                            "the import stream sent nothing for {} s",
                            IMPORT_IDLE.as_secs()
                        ))))
                        .await;
                    return;
                };
                let item = match next {
                    Ok(Some(ImportChunk {
                        part: Some(import_chunk::Part::Data(d)),
                    })) => Ok(d),
                    Ok(Some(_)) => Err(std::io::Error::other(
                        "a second header in the import stream",
                    )),
                    Ok(None) => return,
                    Err(e) => Err(std::io::Error::other(format!(
                        "the import stream broke: {}",
                        e.message()
                    ))),
                };
                let last = item.is_err();
                if tx.send(item).await.is_err() || last {
                    return;
                }
            }
        });
        let path = header.path.clone();
        let res = self
            .runner
            .import(header, runner_api::chunks::ChunkReader::new(rx))
            .await
            .map_err(|e| {
                tracing::warn!(path = %path, error = %e, "import not done");
                e.to_status()
            })?;
        Ok(Response::new(res))
    }

    async fn run_stream(
        &self,
        request: Request<RunRequest>,
    ) -> Result<Response<Self::RunStreamStream>, Status> {
        let req = request.into_inner();
        let record = self
            .runner
            .start(
                &req.id,
                &req.name,
                req.input_json.into_bytes(),
                req.confirmed,
            )
            .map_err(|e| {
                not_run(&req.id, &req.name, &e);
                e.to_status()
            })?;
        // A shutdown waits for streamed calls as for any other.
        let guard = self.in_flight.enter();
        let mut phase = record.watch();
        tokio::spawn(async move {
            let _guard = guard;
            let _ = phase
                .wait_for(|p| matches!(p, crate::calls::Phase::Done(..)))
                .await;
        });
        Ok(Response::new(crate::stream::follow(record, 0, 0)))
    }

    async fn attach(
        &self,
        request: Request<AttachRequest>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let req = request.into_inner();
        let record = self.runner.call(&req.id).map_err(|e| e.to_status())?;
        Ok(Response::new(crate::stream::follow(
            record,
            req.stdout_offset,
            req.stderr_offset,
        )))
    }

    async fn cancel(
        &self,
        request: Request<CancelRequest>,
    ) -> Result<Response<CancelResponse>, Status> {
        let req = request.into_inner();
        let record = self.runner.call(&req.id).map_err(|e| e.to_status())?;
        let was_running = !record.is_done();
        if was_running {
            record.cancel.notify_one();
        }
        Ok(Response::new(CancelResponse { was_running }))
    }

    async fn run(&self, request: Request<RunRequest>) -> Result<Response<RunResponse>, Status> {
        let _guard = self.in_flight.enter();
        let req = request.into_inner();
        let res = self
            .runner
            .run(&req.id, &req.name, req.input_json.as_bytes(), req.confirmed)
            .await;
        match res {
            Ok(r) => Ok(Response::new(RunResponse {
                content: r.content,
                is_error: r.is_error,
            })),
            Err(e) => {
                not_run(&req.id, &req.name, &e);
                Err(e.to_status())
            }
        }
    }

    async fn list_tools(
        &self,
        _request: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        // An unbound sandbox's toolset is no session's: an empty list would
        // read as "this session enables nothing".
        self.runner.ensure_bound().map_err(|e| e.to_status())?;
        let ts = self.runner.toolset();
        let tools = ts
            .tools
            .iter()
            .map(|t| ToolDefinition {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema_json: t.input_schema.to_string(),
                permission_policy: ts
                    .policy(&t.name)
                    .map(|p| p.as_str().to_owned())
                    .unwrap_or_default(),
            })
            .collect();
        Ok(Response::new(ListToolsResponse { tools }))
    }
}

/// How long an import waits for its next message before it is refused.
pub const IMPORT_IDLE: Duration = Duration::from_secs(60);

/// Most seconds a hold may keep calls waiting.
pub const MAX_HOLD_SECONDS: u32 = 300;
/// A hold's bound when the client asks for none.
pub const DEFAULT_HOLD_SECONDS: u32 = 60;

/// The seconds a hold asked for `asked` gets (0: the default), or its refusal.
fn hold_seconds(asked: u32) -> Result<u32, Status> {
    match asked {
        0 => Ok(DEFAULT_HOLD_SECONDS),
        s if s > MAX_HOLD_SECONDS => Err(runner_api::Refusal::TransferRefused.status(format!(
            "max_seconds {s} is over the most a hold may keep calls waiting ({MAX_HOLD_SECONDS} s)"
        ))),
        s => Ok(s),
    }
}

/// Most bytes of an archive in one message.
pub const ARCHIVE_CHUNK_BYTES: usize = 1 << 20;

/// Sends an export's header, then its archive in chunks; stops when the
/// receiver is gone.
async fn send_archive(
    exported: crate::transfer::Exported,
    tx: tokio::sync::mpsc::Sender<Result<ExportChunk, Status>>,
) {
    use tokio::io::AsyncReadExt;
    let header = ExportChunk {
        part: Some(export_chunk::Part::Header(exported.header)),
    };
    if tx.send(Ok(header)).await.is_err() {
        return;
    }
    let mut file = tokio::fs::File::from_std(exported.archive);
    loop {
        let mut buf = vec![0; ARCHIVE_CHUNK_BYTES];
        let item = match file.read(&mut buf).await {
            Ok(0) => return,
            Ok(n) => {
                buf.truncate(n);
                Ok(ExportChunk {
                    part: Some(export_chunk::Part::Data(buf)),
                })
            }
            Err(e) => Err(Status::internal(format!(
                "cannot read the export's archive: {e}"
            ))),
        };
        let last = item.is_err();
        if tx.send(item).await.is_err() || last {
            return;
        }
    }
}

/// Logs a call the runner did not run. An unbound warm sandbox refuses
/// every call until its session's files arrive, and clients retry that
/// refusal every few milliseconds: those are routine, not warnings.
fn not_run(id: &str, tool: &str, e: &Error) {
    if matches!(e, Error::Unbound) {
        tracing::debug!(id = %id, tool = %tool, error = %e, "call not run");
    } else {
        tracing::warn!(id = %id, tool = %tool, error = %e, "call not run");
    }
}

/// Where `serve` listens.
#[derive(Debug, Clone)]
pub struct Listen {
    pub socket: PathBuf,
    /// Loopback only: the runner has no authentication of its own, so it is
    /// reached from outside the pod through the API server's port-forward.
    pub tcp: Option<SocketAddr>,
    /// The gateway's listener on the pod network and the directory of its
    /// certificates (mutual TLS, [`crate::mtls`]).
    pub tls: Option<(SocketAddr, PathBuf)>,
}

/// The reflection builder: the runner's own proto, the health service's and
/// both reflection versions', so a client such as grpcurl or grpcui needs no
/// .proto file and either version lists every service served.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(runner_api::proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET)
}

/// Binds the socket with mode 0600 and replaces a stale one left by a runner
/// that died; refuses to steal a socket a live runner still answers on.
pub async fn bind_socket(path: &Path) -> Result<UnixListener, Error> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(Error::Usage(format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            )));
        }
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(Error::Usage(format!(
                "another runner is already serving on {}",
                path.display()
            )));
        }
        std::fs::remove_file(path)
            .map_err(|e| Error::io(format!("cannot remove stale socket {}", path.display()), e))?;
    }
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
    {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("cannot create {}", dir.display()), e))?;
    }
    // The umask makes the socket 0600 from its first instant; chmod after
    // bind would leave a window where anyone could connect. No tool runs yet,
    // so the process-wide umask cannot leak into a tool's files.
    use nix::sys::stat::{Mode, umask};
    let old = umask(Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    umask(old);
    bound.map_err(|e| Error::io(format!("cannot bind {}", path.display()), e))
}

/// Serves until `shutdown` resolves, then drains in-flight calls and removes
/// the socket file.
pub async fn serve(
    runner: Runner,
    listen: Listen,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), Error> {
    let unix = bind_socket(&listen.socket).await?;
    let tcp = match listen.tcp {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|e| Error::io(format!("cannot listen on {addr}"), e))?,
        ),
        None => None,
    };
    let tls = match &listen.tls {
        Some((addr, dir)) => Some((
            crate::mtls::server_config(dir)?,
            TcpListener::bind(addr)
                .await
                .map_err(|e| Error::io(format!("cannot listen on {addr}"), e))?,
        )),
        None => None,
    };

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<RunnerServer<Service>>().await;
    let svc = Service::new(runner);
    let in_flight = svc.in_flight.clone();
    let runner_server = RunnerServer::new(svc);
    let tls_router = match tls {
        Some((config, l)) => {
            let builder = tonic::transport::Server::builder()
                .tls_config(config)
                .map_err(|e| Error::Transport {
                    context: "configuring the gateway's TLS listener".into(),
                    source: e,
                })?;
            Some((
                router(builder, health_service.clone(), runner_server.clone())?,
                l,
            ))
        }
        None => None,
    };
    let router = router(
        tonic::transport::Server::builder(),
        health_service,
        runner_server,
    )?;
    let (stop_tx, stop_rx) = watch::channel(false);

    tracing::info!(socket = %listen.socket.display(), tcp = ?listen.tcp, tls = ?listen.tls.as_ref().map(|t| t.0), "serving");
    let unix_incoming = UnixListenerStream::new(unix).map(|c| c.map(AuthorityFix::new));
    let unix_server = router
        .clone()
        .serve_with_incoming_shutdown(unix_incoming, stopped(stop_rx.clone()));
    let tcp_server = async {
        match tcp {
            Some(l) => {
                router
                    .serve_with_incoming_shutdown(tcp_incoming(l), stopped(stop_rx.clone()))
                    .await
            }
            None => Ok(()),
        }
    };
    let tls_server = async {
        match tls_router {
            Some((r, l)) => {
                r.serve_with_incoming_shutdown(tls_incoming(l), stopped(stop_rx.clone()))
                    .await
            }
            None => Ok(()),
        }
    };
    let servers = async {
        let (u, t, g) = tokio::join!(unix_server, tcp_server, tls_server);
        g.map_err(|e| Error::Transport {
            context: "serving the gateway (TLS)".into(),
            source: e,
        })?;
        u.map_err(|e| Error::Transport {
            context: format!("serving on {}", listen.socket.display()),
            source: e,
        })?;
        t.map_err(|e| Error::Transport {
            context: "serving on TCP".into(),
            source: e,
        })
    };
    tokio::pin!(servers);
    let res = tokio::select! {
        res = &mut servers => res,
        () = shutdown => {
            tracing::info!("shutting down: draining in-flight calls");
            health_reporter
                .set_not_serving::<RunnerServer<Service>>()
                .await;
            health_reporter
                .set_service_status("", tonic_health::ServingStatus::NotServing)
                .await;
            let _ = stop_tx.send(true);
            tokio::select! {
                res = &mut servers => res,
                () = async {
                    in_flight.drained().await;
                    tokio::time::sleep(FLUSH_GRACE).await;
                } => Ok(()),
            }
        }
    };
    let _ = std::fs::remove_file(&listen.socket);
    res?;
    Ok(())
}

/// Every service the runner serves, on both listeners alike.
fn router(
    mut builder: tonic::transport::Server,
    health: tonic_health::pb::health_server::HealthServer<
        impl tonic_health::pb::health_server::Health,
    >,
    runner: RunnerServer<Service>,
) -> Result<tonic::transport::server::Router, Error> {
    // Both protocol versions: grpcurl and grpc-go speak v1, grpcio's
    // reflection client and older tools v1alpha.
    let reflection_error =
        |e: tonic_reflection::server::Error| Error::Usage(format!("reflection service: {e}"));
    let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;
    Ok(builder
        .add_service(health)
        .add_service(runner)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha))
}

/// Accepted TCP connections, with Nagle off: `Server::tcp_nodelay` only
/// applies to listeners tonic binds itself, and without it small responses
/// wait on Nagle.
fn tcp_incoming(
    l: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<AuthorityFix<tokio::net::TcpStream>>> {
    TcpListenerStream::new(l).map(|c| {
        c.map(|s| {
            if let Err(e) = s.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
            AuthorityFix::new(s)
        })
    })
}

/// Accepted TCP connections for the TLS listener, with Nagle off. The
/// header repair of [`AuthorityFix`] is for stock clients on the socket and
/// port-forward; only the gateway speaks here, under TLS.
fn tls_incoming(
    l: TcpListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    TcpListenerStream::new(l).map(|c| {
        c.inspect(|s| {
            if let Err(e) = s.set_nodelay(true) {
                tracing::debug!(error = %e, "cannot set TCP_NODELAY");
            }
        })
    })
}

/// Resolves when the stop flag is raised: the listeners stop accepting.
async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
