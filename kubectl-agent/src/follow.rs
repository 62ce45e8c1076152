//! `bash --follow`: a streamed call printed as it runs, that survives its
//! connection. A port-forward through the API server breaks when the API
//! server restarts, a load balancer idles it out or a laptop sleeps; the
//! call itself goes on in the sandbox, so the plugin reconnects and
//! re-attaches from the bytes it already printed, and nothing is lost or
//! printed twice.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use sidecar::proto::runner_client::RunnerClient;
use sidecar::proto::{AttachRequest, RunEvent, RunRequest, run_event::Event};
use tonic::transport::Channel;

use crate::error::Error;

/// Reconnections tried in a row before giving up.
pub const MAX_RECONNECTS: u32 = 8;

/// How a followed call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Followed {
    pub content: String,
    pub is_error: bool,
    /// How many times the connection was re-established.
    pub reconnects: u32,
}

/// Runs `req` as a streamed call, writing its stdout and stderr as they
/// come, and returns its result. `connect` opens a new connection to the
/// runner (a new port-forward); it is called again after a connection
/// breaks, with a growing pause, up to [`MAX_RECONNECTS`] times in a row.
/// A refusal is not retried.
pub async fn follow<C, F, O, E>(
    mut connect: C,
    session: &str,
    req: RunRequest,
    out: &mut O,
    err: &mut E,
) -> Result<Followed, Error>
where
    O: Write,
    E: Write,
    C: FnMut() -> F,
    F: Future<Output = Result<RunnerClient<Channel>, Error>>,
{
    let id = req.id.clone();
    let tool = req.name.clone();
    let mut offsets = [0u64; 2];
    let mut reconnects = 0;
    let mut failures = 0;
    let mut first = Some(req);
    loop {
        let opened = match connect().await {
            Ok(mut client) => match first.take() {
                Some(req) => client.run_stream(req).await,
                None => {
                    client
                        .attach(AttachRequest {
                            id: id.clone(),
                            stdout_offset: offsets[0],
                            stderr_offset: offsets[1],
                        })
                        .await
                }
            },
            Err(e) => {
                failures += 1;
                if failures > MAX_RECONNECTS {
                    return Err(e);
                }
                tokio::time::sleep(pause(failures)).await;
                continue;
            }
        };
        let mut stream = match opened {
            Ok(s) => s.into_inner(),
            Err(status) if broken(&status) && failures < MAX_RECONNECTS => {
                failures += 1;
                reconnects += 1;
                tokio::time::sleep(pause(failures)).await;
                continue;
            }
            Err(status) => return Err(crate::cli::refusal(&status, &tool, session)),
        };
        loop {
            match stream.message().await {
                Ok(Some(RunEvent { event: Some(ev) })) => {
                    failures = 0;
                    match ev {
                        Event::Stdout(c) => write_new(out, &mut offsets[0], c.offset, &c.data)?,
                        Event::Stderr(c) => write_new(err, &mut offsets[1], c.offset, &c.data)?,
                        Event::Result(r) => {
                            return Ok(Followed {
                                content: r.content,
                                is_error: r.is_error,
                                reconnects,
                            });
                        }
                    }
                }
                Ok(Some(RunEvent { event: None })) => {}
                Ok(None) => break,
                Err(status) if broken(&status) => break,
                Err(status) => return Err(crate::cli::refusal(&status, &tool, session)),
            }
        }
        failures += 1;
        reconnects += 1;
        if failures > MAX_RECONNECTS {
            return Err(Error::Refused {
                code: "Unavailable".into(),
                message: format!(
                    "the connection to the runner broke {MAX_RECONNECTS} times in a row; the call {id} may still be running"
                ),
            });
        }
        tokio::time::sleep(pause(failures)).await;
    }
}

/// Writes the part of a chunk not written yet: a chunk re-sent after a
/// reconnect overlaps what was printed, and only the rest is new.
fn write_new(w: &mut impl Write, printed: &mut u64, offset: u64, data: &[u8]) -> Result<(), Error> {
    let end = offset + data.len() as u64;
    if end <= *printed || offset > *printed {
        // Nothing new, or a gap (never sent by the runner): skip it.
        return Ok(());
    }
    let skip = (*printed - offset) as usize;
    w.write_all(&data[skip..])
        .and_then(|()| w.flush())
        .map_err(|e| Error::Output(e.to_string()))?;
    *printed = end;
    Ok(())
}

/// A status that means the connection broke, not that the runner refused:
/// the runner's own statuses carry a code it chose and never these.
fn broken(status: &tonic::Status) -> bool {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled => true,
        tonic::Code::Internal => status.message().contains("h2 protocol error"),
        _ => false,
    }
}

fn pause(failures: u32) -> Duration {
    Duration::from_millis(250 * 2u64.pow(failures.min(4)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_chunks_print_once() {
        let mut out = Vec::new();
        let mut printed = 0;
        write_new(&mut out, &mut printed, 0, b"abc").unwrap();
        write_new(&mut out, &mut printed, 1, b"bcde").unwrap();
        write_new(&mut out, &mut printed, 0, b"ab").unwrap();
        write_new(&mut out, &mut printed, 9, b"zz").unwrap();
        assert_eq!(out, b"abcde");
        assert_eq!(printed, 5);
    }
}
