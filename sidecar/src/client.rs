//! A client for the runner, over its Unix socket or a loopback TCP address
//! (the kubectl plugin's port-forward). Addresses are parsed numerically:
//! the binary is static glibc, whose resolver would need NSS modules the
//! sandbox image may not have, so it never does a DNS lookup.

use std::net::SocketAddr;
use std::path::PathBuf;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::proto::runner_client::RunnerClient;
use crate::proto::{
    AttachRequest, CancelRequest, ListToolsRequest, RunEvent, RunRequest, ToolDefinition,
};
use crate::{Error, ToolResult};

/// Where the runner listens.
#[derive(Debug, Clone)]
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

/// A connected client.
#[derive(Debug, Clone)]
pub struct Client {
    runner: RunnerClient<Channel>,
    health: HealthClient<Channel>,
}

impl Client {
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
        let channel = res.map_err(|e| Error::Transport {
            context: format!("cannot connect to the runner at {target}"),
            source: e,
        })?;
        Ok(Client {
            runner: RunnerClient::new(channel.clone()),
            health: HealthClient::new(channel),
        })
    }

    /// Runs one call. A refusal or runner fault is [`Error::Status`].
    pub async fn run(
        &mut self,
        id: &str,
        name: &str,
        input_json: &str,
        confirmed: bool,
    ) -> Result<ToolResult, Error> {
        let resp = self
            .runner
            .run(RunRequest {
                id: id.to_owned(),
                name: name.to_owned(),
                input_json: input_json.to_owned(),
                confirmed,
            })
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner();
        Ok(ToolResult {
            content: resp.content,
            is_error: resp.is_error,
        })
    }

    /// Starts a streamed call; the events end with its result.
    pub async fn run_stream(
        &mut self,
        id: &str,
        name: &str,
        input_json: &str,
        confirmed: bool,
    ) -> Result<tonic::Streaming<RunEvent>, Error> {
        Ok(self
            .runner
            .run_stream(RunRequest {
                id: id.to_owned(),
                name: name.to_owned(),
                input_json: input_json.to_owned(),
                confirmed,
            })
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner())
    }

    /// Re-attaches to a streamed call, from the output already received.
    pub async fn attach(
        &mut self,
        id: &str,
        stdout_offset: u64,
        stderr_offset: u64,
    ) -> Result<tonic::Streaming<RunEvent>, Error> {
        Ok(self
            .runner
            .attach(AttachRequest {
                id: id.to_owned(),
                stdout_offset,
                stderr_offset,
            })
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner())
    }

    /// Cancels a streamed call; whether it was still running.
    pub async fn cancel(&mut self, id: &str) -> Result<bool, Error> {
        Ok(self
            .runner
            .cancel(CancelRequest { id: id.to_owned() })
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner()
            .was_running)
    }

    /// The tool definitions the session enables.
    pub async fn list_tools(&mut self) -> Result<Vec<ToolDefinition>, Error> {
        Ok(self
            .runner
            .list_tools(ListToolsRequest {})
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner()
            .tools)
    }

    /// Whether the runner reports SERVING on the standard health service.
    pub async fn health(&mut self) -> Result<bool, Error> {
        let resp = self
            .health
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner();
        Ok(resp.status == ServingStatus::Serving as i32)
    }
}
