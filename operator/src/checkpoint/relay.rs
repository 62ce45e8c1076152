//! The checkpoint's transfer: the session runner's `Export` streamed into
//! the sink's `Import`, both over mutual TLS with a client certificate the
//! operator mints in memory from the runner CA (a runner accepts nothing
//! else on the pod network).
//!
//! Bounded: at most [`IN_FLIGHT`] archive messages (each at most
//! [`MAX_MESSAGE`]) wait between the two streams, so a slow sink slows the
//! export rather than filling the operator's memory; an archive longer
//! than its header said, a message over the bound, a stream silent for
//! [`IDLE`] or a transfer longer than [`DEADLINE`] ends it with an error.

use std::net::SocketAddr;
use std::time::Duration;

use runner_api::proto::runner_client::RunnerClient;
use runner_api::proto::{ExportRequest, ImportChunk, ImportHeader, export_chunk, import_chunk};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::checkpoint::plan::Taken;

/// Why a take failed, and whether another attempt could go differently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// For the checkpoint's condition.
    pub message: String,
    /// The runner or the sink judged the transfer itself (too large, a
    /// path that leaves the workdir, an archive it will not store): the
    /// same checkpoint would be refused again, so it is not retried.
    pub permanent: bool,
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self {
            message,
            permanent: false,
        }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// Whether a runner's or sink's answer refuses the transfer as such
/// ([`runner_api::Refusal::TransferRefused`]) rather than failing at it
/// (busy, a broken connection, its own fault).
pub fn is_permanent(status: &tonic::Status) -> bool {
    runner_api::Refusal::from_status(status) == Some(runner_api::Refusal::TransferRefused)
}

/// `context: message`, permanent when the status refuses the transfer.
fn refused(context: &str, status: &tonic::Status) -> Failure {
    Failure {
        message: format!("{context}: {}", status.message()),
        permanent: is_permanent(status),
    }
}

/// Archive messages between the export and the import at most.
pub const IN_FLIGHT: usize = 4;
/// The largest message taken from the runner (it sends at most 1 MiB of
/// archive a message; the header carries at most 3 MiB of shell state).
pub const MAX_MESSAGE: usize = 4 << 20;
/// A stream that sends nothing for this long is given up.
pub const IDLE: Duration = Duration::from_secs(60);
/// The longest one transfer may take.
pub const DEADLINE: Duration = Duration::from_secs(30 * 60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The client side of mutual TLS towards runners and sinks.
pub fn tls_config(cert_pem: &str, key_pem: &str, ca_pem: &str) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .identity(Identity::from_pem(cert_pem, key_pem))
        .domain_name(runner_api::RUNNER_TLS_NAME)
}

/// A mutual-TLS channel to the runner (or sink) `what` at `addr`.
pub async fn channel(
    addr: SocketAddr,
    tls: &ClientTlsConfig,
    what: &str,
) -> Result<Channel, String> {
    Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| format!("{what} address {addr}: {e}"))?
        .tls_config(tls.clone())
        .map_err(|e| format!("TLS towards the {what}: {e}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("cannot connect to the {what} at {addr}: {}", describe(&e)))
}

async fn connect(
    addr: SocketAddr,
    tls: &ClientTlsConfig,
    what: &str,
) -> Result<RunnerClient<Channel>, String> {
    let channel = channel(addr, tls, what).await?;
    Ok(RunnerClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// Streams the export of `source` into the import of `sink`; what the
/// export's header counted, or what went wrong (for the checkpoint's
/// condition).
pub async fn take(
    tls: &ClientTlsConfig,
    source: SocketAddr,
    sink: SocketAddr,
    export: ExportRequest,
) -> Result<Taken, Failure> {
    match tokio::time::timeout(DEADLINE, relay(tls, source, sink, export)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "the transfer took longer than {} minutes",
            DEADLINE.as_secs() / 60
        )
        .into()),
    }
}

async fn relay(
    tls: &ClientTlsConfig,
    source: SocketAddr,
    sink: SocketAddr,
    export: ExportRequest,
) -> Result<Taken, Failure> {
    let mut runner = connect(source, tls, "session's runner").await?;
    let mut sinker = connect(sink, tls, "checkpoint sink").await?;
    let mut stream = runner
        .export(export)
        .await
        .map_err(|s| refused("the session's runner refused the export", &s))?
        .into_inner();
    let header = match next(&mut stream).await? {
        Some(export_chunk::Part::Header(h)) => h,
        _ => return Err("the session's runner sent no export header first".into()),
    };
    let taken = Taken {
        entries: header.entries,
        file_bytes: header.file_bytes,
        skipped: header.skipped_count,
    };
    let expected = header.archive_bytes;
    let (tx, rx) = tokio::sync::mpsc::channel::<ImportChunk>(IN_FLIGHT);
    let first = ImportChunk {
        part: Some(import_chunk::Part::Header(ImportHeader {
            shell_state: header.shell_state,
            ..ImportHeader::default()
        })),
    };
    tx.send(first)
        .await
        .map_err(|_| Failure::from("the import stream closed before it began"))?;
    let pump = async move {
        let mut sent: u64 = 0;
        while let Some(part) = next(&mut stream).await? {
            let export_chunk::Part::Data(data) = part else {
                return Err(Failure::from(
                    "the session's runner sent a second export header",
                ));
            };
            sent = sent.saturating_add(data.len() as u64);
            if sent > expected {
                return Err(Failure::from(format!(
                    "the session's runner sent more than the {expected} archive bytes its header announced"
                )));
            }
            let chunk = ImportChunk {
                part: Some(import_chunk::Part::Data(data)),
            };
            if tx.send(chunk).await.is_err() {
                // The import ended first; its answer says why.
                return Ok(sent);
            }
        }
        if sent != expected {
            return Err(Failure::from(format!(
                "the export ended after {sent} of the {expected} archive bytes its header announced"
            )));
        }
        Ok(sent)
    };
    let import = sinker.import(tokio_stream::wrappers::ReceiverStream::new(rx));
    let (pumped, imported) = tokio::join!(pump, import);
    // The export's own failure is the cause when both failed.
    pumped?;
    imported.map_err(|s| refused("the checkpoint sink refused the archive", &s))?;
    Ok(taken)
}

/// The next part of the export, or an error when it broke or fell silent.
async fn next(
    stream: &mut tonic::Streaming<runner_api::proto::ExportChunk>,
) -> Result<Option<export_chunk::Part>, Failure> {
    match tokio::time::timeout(IDLE, stream.message()).await {
        Ok(Ok(Some(m))) => m
            .part
            .map(Some)
            .ok_or_else(|| Failure::from("the session's runner sent an empty export message")),
        Ok(Ok(None)) => Ok(None),
        Ok(Err(s)) => Err(refused("the export broke", &s)),
        Err(_) => Err(Failure::from(format!(
            "the session's runner sent nothing for {} s",
            IDLE.as_secs()
        ))),
    }
}
