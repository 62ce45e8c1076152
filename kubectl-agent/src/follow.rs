//! `bash --follow`: a streamed call printed as it runs, that survives its
//! connection. A port-forward through the API server breaks when the API
//! server restarts, a load balancer idles it out or a laptop sleeps; the
//! call itself goes on in the sandbox, so the plugin reconnects and
//! re-attaches from the bytes it already printed, and nothing is lost or
//! printed twice.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use runner_api::Client;
use runner_api::proto::{RunRequest, RunResponse, run_event::Event};

use crate::error::Error;

/// Reconnections tried in a row before giving up.
pub const MAX_RECONNECTS: u32 = 8;

/// How a followed call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Followed {
    pub content: String,
    pub is_error: bool,
    /// How many times the plugin connected again after a break.
    pub reconnects: u32,
}

/// What has been printed so far and how the connection has fared.
#[derive(Debug, Default)]
struct Progress {
    /// Bytes of stdout and stderr printed: where a re-attach resumes.
    offsets: [u64; 2],
    reconnects: u32,
    /// Failed connections since the last event received.
    failures: u32,
}

/// How one connection's share of the call ended.
enum Ended {
    Result(RunResponse),
    /// The connection broke (or the stream ended early): the call goes on.
    Broken,
    /// The runner refused or failed the call: retrying will not help.
    Refused(runner_api::Error),
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
    F: Future<Output = Result<Client, Error>>,
{
    let (id, tool) = (req.id.clone(), req.name.clone());
    let mut p = Progress::default();
    let mut first = Some(req);
    loop {
        let ended = match connect().await {
            Ok(mut client) => {
                let opened = match first.take() {
                    Some(r) => start(&mut client, &r, session).await?,
                    None => client.attach(&id, p.offsets[0], p.offsets[1]).await,
                };
                match opened {
                    Ok(mut events) => relay(&mut events, &mut p, out, err).await?,
                    Err(e) if e.is_connection_broken() => Ended::Broken,
                    Err(e) => Ended::Refused(e),
                }
            }
            Err(e) if p.failures >= MAX_RECONNECTS => return Err(e),
            Err(_) => Ended::Broken,
        };
        match ended {
            Ended::Result(r) => {
                return Ok(Followed {
                    content: r.content,
                    is_error: r.is_error,
                    reconnects: p.reconnects,
                });
            }
            Ended::Refused(e) => return Err(crate::error::refusal(e, &tool, session)),
            Ended::Broken => {}
        }
        p.failures += 1;
        p.reconnects += 1;
        if p.failures > MAX_RECONNECTS {
            return Err(Error::Disconnected {
                times: MAX_RECONNECTS,
                id,
            });
        }
        tokio::time::sleep(pause(p.failures)).await;
    }
}

/// Starts the streamed call, trying again on the same connection while the
/// runner refuses it as unbound (a warm sandbox whose binding is on its
/// way; nothing ran). `Err` when it stayed unbound past the plugin's
/// patience; otherwise the runner's answer.
async fn start(
    client: &mut Client,
    r: &RunRequest,
    session: &str,
) -> Result<Result<runner_api::Events, runner_api::Error>, Error> {
    let mut unbound_since = None;
    loop {
        let e = match client
            .run_stream(&r.id, &r.name, &r.input_json, r.confirmed)
            .await
        {
            Ok(events) => return Ok(Ok(events)),
            Err(e) => e,
        };
        let since = *unbound_since.get_or_insert_with(std::time::Instant::now);
        match crate::unbound::next(&e, since.elapsed()) {
            crate::unbound::Next::Retry => tokio::time::sleep(crate::unbound::PAUSE).await,
            crate::unbound::Next::GiveUp => return Err(crate::error::not_bound(session)),
            crate::unbound::Next::Fail => return Ok(Err(e)),
        }
    }
}

/// Prints one connection's events until the result or the end of the
/// stream.
async fn relay<O: Write, E: Write>(
    events: &mut runner_api::Events,
    p: &mut Progress,
    out: &mut O,
    err: &mut E,
) -> Result<Ended, Error> {
    loop {
        match events.next().await {
            Ok(Some(Event::Stdout(c))) => {
                p.failures = 0;
                write_new(out, &mut p.offsets[0], c.offset, &c.data)?;
            }
            Ok(Some(Event::Stderr(c))) => {
                p.failures = 0;
                write_new(err, &mut p.offsets[1], c.offset, &c.data)?;
            }
            Ok(Some(Event::Result(r))) => return Ok(Ended::Result(r)),
            Ok(None) => return Ok(Ended::Broken),
            Err(e) if e.is_connection_broken() => return Ok(Ended::Broken),
            Err(e) => return Ok(Ended::Refused(e)),
        }
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
