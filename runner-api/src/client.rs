//! A client for the runner: over its Unix socket, a loopback TCP address,
//! or a channel the caller opened itself (`kubectl agent` dials through the
//! API server's port-forward).
//!
//! Addresses are numeric only: the runner binary is static glibc, whose
//! resolver would need NSS modules the sandbox image may not have, so
//! nothing here ever does a DNS lookup.

use std::net::SocketAddr;
use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::error::Error;
use crate::proto::run_event::Event;
use crate::proto::runner_client::RunnerClient;
use crate::proto::{
    AttachRequest, CancelRequest, ExportChunk, ExportHeader, ExportRequest, Held, HoldEvent,
    HoldRelease, HoldRequest, HoldStart, ImportChunk, ImportHeader, ImportResponse,
    ListToolsRequest, Released, RunEvent, RunRequest, ToolDefinition, export_chunk, hold_event,
    hold_request, import_chunk,
};

/// One tool call as the model sees it. `is_error` marks a tool-level
/// failure the model reads and can recover from; a call that was not run is
/// an [`Error`] instead, never a `ToolResult`. Serialised, it is the one
/// JSON line `agent-sidecar call` and `kubectl agent call --json` print.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    pub content: String,
    pub is_error: bool,
}

/// Where the runner listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "unix:{}", p.display()),
            Target::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// A connected client. Cloning shares the connection.
#[derive(Debug, Clone)]
pub struct Client {
    runner: RunnerClient<Channel>,
    health: HealthClient<Channel>,
}

impl Client {
    /// Connects to a runner's socket or loopback port. The connection is
    /// opened now, so an absent runner is reported here, not at the first call.
    pub async fn connect(target: &Target) -> Result<Client, Error> {
        // The URI is a placeholder the connector ignores; it is never resolved.
        let endpoint = Endpoint::from_static("http://127.0.0.1:1");
        let res = match target.clone() {
            Target::Unix(path) => {
                endpoint
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            let s = tokio::net::UnixStream::connect(path).await?;
                            Ok::<_, std::io::Error>(TokioIo::new(s))
                        }
                    }))
                    .await
            }
            Target::Tcp(addr) => {
                endpoint
                    .connect_with_connector(tower::service_fn(move |_: Uri| async move {
                        let s = tokio::net::TcpStream::connect(addr).await?;
                        s.set_nodelay(true)?;
                        Ok::<_, std::io::Error>(TokioIo::new(s))
                    }))
                    .await
            }
        };
        let channel = res.map_err(|e| Error::Connect {
            target: target.to_string(),
            detail: error_chain(&e),
        })?;
        Ok(Client::from_channel(channel))
    }

    /// A client on a channel the caller opened (a port-forward, a proxy).
    /// Connection failures then surface at the first call, as
    /// [`Error::Broken`].
    pub fn from_channel(channel: Channel) -> Client {
        Client {
            runner: RunnerClient::new(channel.clone()),
            health: HealthClient::new(channel),
        }
    }

    /// Runs one call and waits for its result.
    pub async fn run(
        &mut self,
        id: &str,
        name: &str,
        input_json: &str,
        confirmed: bool,
    ) -> Result<ToolResult, Error> {
        let resp = self
            .runner
            .run(request(id, name, input_json, confirmed))
            .await?
            .into_inner();
        Ok(ToolResult {
            content: resp.content,
            is_error: resp.is_error,
        })
    }

    /// Starts a streamed call: its output as it is written, then its result.
    /// The call runs on in the sandbox if the stream is dropped.
    pub async fn run_stream(
        &mut self,
        id: &str,
        name: &str,
        input_json: &str,
        confirmed: bool,
    ) -> Result<Events, Error> {
        let stream = self
            .runner
            .run_stream(request(id, name, input_json, confirmed))
            .await?
            .into_inner();
        Ok(Events(stream))
    }

    /// Follows a streamed call again, from the output already received.
    pub async fn attach(
        &mut self,
        id: &str,
        stdout_offset: u64,
        stderr_offset: u64,
    ) -> Result<Events, Error> {
        let stream = self
            .runner
            .attach(AttachRequest {
                id: id.to_owned(),
                stdout_offset,
                stderr_offset,
            })
            .await?
            .into_inner();
        Ok(Events(stream))
    }

    /// Ends a streamed call; whether it was still running.
    pub async fn cancel(&mut self, id: &str) -> Result<bool, Error> {
        Ok(self
            .runner
            .cancel(CancelRequest { id: id.to_owned() })
            .await?
            .into_inner()
            .was_running)
    }

    /// The tool definitions the session enables, in wire order.
    pub async fn list_tools(&mut self) -> Result<Vec<ToolDefinition>, Error> {
        Ok(self
            .runner
            .list_tools(ListToolsRequest {})
            .await?
            .into_inner()
            .tools)
    }

    /// Starts an export: the header (what the archive holds, bash's state
    /// when asked), then the archive's bytes from [`Archive::next`].
    pub async fn export(&mut self, req: ExportRequest) -> Result<(ExportHeader, Archive), Error> {
        let mut stream = self.runner.export(req).await?.into_inner();
        match stream.message().await? {
            Some(ExportChunk {
                part: Some(export_chunk::Part::Header(h)),
            }) => Ok((h, Archive(stream))),
            _ => Err(Error::Broken {
                code: tonic::Code::Internal,
                message: "the runner's export did not start with its header".into(),
            }),
        }
    }

    /// Imports an archive: `header`, then the chunks `data` yields, in
    /// order. A chunk that could not be read on this side ends `data`
    /// early; the runner then refuses the truncated archive and keeps
    /// nothing of it.
    pub async fn import(
        &mut self,
        header: ImportHeader,
        data: impl tokio_stream::Stream<Item = Vec<u8>> + Send + 'static,
    ) -> Result<ImportResponse, Error> {
        use tokio_stream::StreamExt;
        let first = tokio_stream::once(ImportChunk {
            part: Some(import_chunk::Part::Header(header)),
        });
        let rest = data.map(|d| ImportChunk {
            part: Some(import_chunk::Part::Data(d)),
        });
        Ok(self.runner.import(first.chain(rest)).await?.into_inner())
    }

    /// Holds the runner's workspace still (see the `Hold` RPC): returns once
    /// it is held, with bash's state when asked; calls run again when the
    /// hold is released, dropped, or its `max_seconds` (0: the runner's
    /// default) have passed.
    pub async fn hold(&mut self, shell_state: bool, max_seconds: u32) -> Result<Holding, Error> {
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        let start = HoldRequest {
            step: Some(hold_request::Step::Start(HoldStart {
                shell_state,
                max_seconds,
            })),
        };
        tx.send(start).await.map_err(|_| Error::Broken {
            code: tonic::Code::Internal,
            message: "the hold's request stream closed".into(),
        })?;
        let mut events = self
            .runner
            .hold(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await?
            .into_inner();
        match events.message().await? {
            Some(HoldEvent {
                event: Some(hold_event::Event::Held(held)),
            }) => Ok(Holding { held, tx, events }),
            _ => Err(Error::Broken {
                code: tonic::Code::Internal,
                message: "the runner's hold did not start with `held`".into(),
            }),
        }
    }

    /// Whether the runner reports SERVING on the standard health service
    /// (it stops doing so when it starts draining for shutdown).
    pub async fn health(&mut self) -> Result<bool, Error> {
        let resp = self
            .health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await?
            .into_inner();
        Ok(resp.status == ServingStatus::Serving as i32)
    }
}

/// The events of a streamed call: stdout and stderr chunks, each with its
/// offset in its stream, then the result.
#[derive(Debug)]
pub struct Events(tonic::Streaming<RunEvent>);

impl Events {
    /// The next event; `None` when the stream ended. A stream that ends
    /// without a result, or with [`Error::Broken`], lost its connection:
    /// the call goes on, and [`Client::attach`] picks it up again.
    pub async fn next(&mut self) -> Result<Option<Event>, Error> {
        loop {
            match self.0.message().await? {
                Some(RunEvent { event: Some(ev) }) => return Ok(Some(ev)),
                // An empty event carries nothing (a newer runner's kind).
                Some(RunEvent { event: None }) => {}
                None => return Ok(None),
            }
        }
    }
}

/// A workspace held still by [`Client::hold`]. Dropping it ends the hold
/// too (the runner sees the stream close).
#[derive(Debug)]
pub struct Holding {
    /// What the runner sent once the workspace was still.
    pub held: Held,
    tx: tokio::sync::mpsc::Sender<HoldRequest>,
    events: tonic::Streaming<HoldEvent>,
}

impl Holding {
    /// Ends the hold; the runner's account of it. A hold that had already
    /// ended (its deadline) says so in `why`.
    pub async fn release(mut self) -> Result<Released, Error> {
        let release = HoldRequest {
            step: Some(hold_request::Step::Release(HoldRelease {})),
        };
        // Already ended by the runner: its `released` is still to be read.
        let _ = self.tx.send(release).await;
        loop {
            match self.events.message().await? {
                Some(HoldEvent {
                    event: Some(hold_event::Event::Released(r)),
                }) => return Ok(r),
                Some(_) => {}
                None => {
                    return Err(Error::Broken {
                        code: tonic::Code::Unavailable,
                        message: "the hold's stream ended without `released`".into(),
                    });
                }
            }
        }
    }
}

/// The bytes of an export's archive.
#[derive(Debug)]
pub struct Archive(tonic::Streaming<ExportChunk>);

impl Archive {
    /// The next chunk of the archive; `None` when it is complete.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, Error> {
        loop {
            match self.0.message().await? {
                Some(ExportChunk {
                    part: Some(export_chunk::Part::Data(d)),
                }) => return Ok(Some(d)),
                Some(_) => {}
                None => return Ok(None),
            }
        }
    }
}

fn request(id: &str, name: &str, input_json: &str, confirmed: bool) -> RunRequest {
    RunRequest {
        id: id.to_owned(),
        name: name.to_owned(),
        input_json: input_json.to_owned(),
        confirmed,
    }
}

/// An error with its causes, since tonic's transport error alone says only
/// "transport error" and the cause (no such file, refused) is what a
/// user acts on.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}
