//! Following a streamed call: its output files tailed from given offsets,
//! then its result.
//!
//! A follower opens the call's stdout and stderr files while the call runs
//! and keeps the descriptors, so it can read to the end after the call
//! finished and its files were removed or spilled. One whose first look
//! comes after the call ended reads the descriptors the call's record
//! opened when it started (see [`crate::calls::Output`]). Memory is bounded by one
//! chunk per read and a small channel: a slow client slows its follower,
//! never the call, and never grows the runner.

use std::io::SeekFrom;
use std::sync::Arc;
use std::time::Duration;

use tokio::fs::File;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::calls::{Output, Phase, Record};
use runner_api::proto::{Chunk, RunEvent, RunResponse, run_event};

/// Most bytes in one chunk event.
pub const CHUNK_BYTES: usize = 32 << 10;
/// Events buffered per follower before it waits for its client.
const CHANNEL_EVENTS: usize = 8;
/// How often a running call's files are checked for new output.
const POLL: Duration = Duration::from_millis(50);

/// The events of `record` from the given offsets, as a gRPC stream.
pub fn follow(
    record: Arc<Record>,
    stdout: u64,
    stderr: u64,
) -> ReceiverStream<Result<RunEvent, Status>> {
    let (tx, rx) = mpsc::channel(CHANNEL_EVENTS);
    // Subscribed now, not when the task first runs: a call that ends before
    // then keeps its output for this follower (see `Record::finish`).
    let phase = record.watch();
    tokio::spawn(async move {
        // An Err here only means the client went away.
        let _ = pump(record, phase, [stdout, stderr], tx).await;
    });
    ReceiverStream::new(rx)
}

/// The client is gone; stop following.
struct Gone;

type Tx = mpsc::Sender<Result<RunEvent, Status>>;

async fn pump(
    record: Arc<Record>,
    mut phase: tokio::sync::watch::Receiver<Phase>,
    mut offsets: [u64; 2],
    tx: Tx,
) -> Result<(), Gone> {
    let mut files: Option<[File; 2]> = None;
    // Where the call's own output ends, once the runner knows.
    let mut known_ends: Option<[u64; 2]> = None;
    loop {
        let now = phase.borrow_and_update().clone();
        match now {
            Phase::Pending => {
                if phase.changed().await.is_err() {
                    return Ok(());
                }
            }
            Phase::Running {
                stdout,
                stderr,
                ends,
            } => {
                if files.is_none() {
                    files = open_at(&stdout, &stderr, offsets).await;
                }
                known_ends = known_ends.or(ends);
                let moved = match files.as_mut() {
                    Some(f) => send_available(f, &mut offsets, &tx, known_ends).await?,
                    None => false,
                };
                if !moved {
                    tokio::select! {
                        r = phase.changed() => if r.is_err() { return Ok(()) },
                        () = tokio::time::sleep(POLL) => {}
                    }
                }
            }
            Phase::Done(result, output) => {
                if files.is_none()
                    && let Some(output) = output
                {
                    // Never saw it running: its output from the
                    // descriptors the record kept.
                    let sent = send_kept(&output, &mut offsets, &tx).await;
                    if sent.is_err() {
                        record.release_output();
                    }
                    sent?;
                }
                if let Some(f) = files.as_mut() {
                    // Up to the end of the call's own output: a background
                    // job it left can write on forever, and what it writes
                    // belongs to a later bash result, not this stream. A
                    // call that never said (it was ended) is read up to what
                    // the files hold now.
                    let ends = match known_ends {
                        Some(e) => e,
                        None => {
                            let mut ends = [0u64; 2];
                            for (end, file) in ends.iter_mut().zip(f.iter()) {
                                *end = file.metadata().await.map(|m| m.len()).unwrap_or(0);
                            }
                            ends
                        }
                    };
                    while send_available(f, &mut offsets, &tx, Some(ends)).await? {}
                }
                // The last follower lets the kept output go.
                record.release_output();
                let last = result.map(|r| RunEvent {
                    event: Some(run_event::Event::Result(RunResponse {
                        content: r.content,
                        is_error: r.is_error,
                    })),
                });
                return tx.send(last).await.map_err(|_| Gone);
            }
        }
    }
}

async fn open_at(
    stdout: &std::path::Path,
    stderr: &std::path::Path,
    offsets: [u64; 2],
) -> Option<[File; 2]> {
    let mut out = File::open(stdout).await.ok()?;
    let mut err = File::open(stderr).await.ok()?;
    out.seek(SeekFrom::Start(offsets[0])).await.ok()?;
    err.seek(SeekFrom::Start(offsets[1])).await.ok()?;
    Some([out, err])
}

/// Sends a finished call's output from the descriptors its record kept,
/// from the offsets up to its ends (or what the files hold), with
/// positioned reads: other followers read the same descriptors.
async fn send_kept(output: &Output, offsets: &mut [u64; 2], tx: &Tx) -> Result<(), Gone> {
    use std::os::unix::fs::FileExt;
    for i in 0..2 {
        let file = &output.files[i];
        let end = match output.ends {
            Some(e) => e[i],
            None => file.metadata().map(|m| m.len()).unwrap_or(0),
        };
        while offsets[i] < end {
            let room = usize::try_from(end - offsets[i])
                .unwrap_or(CHUNK_BYTES)
                .min(CHUNK_BYTES);
            let mut buf = vec![0u8; room];
            let n = file.read_at(&mut buf, offsets[i]).unwrap_or_default();
            if n == 0 {
                break;
            }
            buf.truncate(n);
            send_chunk(tx, i, &mut offsets[i], buf).await?;
        }
    }
    Ok(())
}

/// Sends what both files hold past the offsets (up to `ends`, when given),
/// a chunk at a time; whether anything was sent.
async fn send_available(
    files: &mut [File; 2],
    offsets: &mut [u64; 2],
    tx: &Tx,
    ends: Option<[u64; 2]>,
) -> Result<bool, Gone> {
    let mut moved = false;
    let mut buf = vec![0u8; CHUNK_BYTES];
    for (i, f) in files.iter_mut().enumerate() {
        let room = match ends {
            Some(e) => usize::try_from(e[i].saturating_sub(offsets[i]))
                .unwrap_or(CHUNK_BYTES)
                .min(CHUNK_BYTES),
            None => CHUNK_BYTES,
        };
        if room == 0 {
            continue;
        }
        let n = f.read(&mut buf[..room]).await.unwrap_or_default();
        if n == 0 {
            continue;
        }
        send_chunk(tx, i, &mut offsets[i], buf[..n].to_vec()).await?;
        moved = true;
    }
    Ok(moved)
}

/// Sends `data`, read at `*offset` of stream `i` (0 stdout, 1 stderr),
/// and moves the offset past it.
async fn send_chunk(tx: &Tx, i: usize, offset: &mut u64, data: Vec<u8>) -> Result<(), Gone> {
    let n = data.len() as u64;
    let chunk = Chunk {
        offset: *offset,
        data,
    };
    *offset += n;
    let event = if i == 0 {
        run_event::Event::Stdout(chunk)
    } else {
        run_event::Event::Stderr(chunk)
    };
    tx.send(Ok(RunEvent { event: Some(event) }))
        .await
        .map_err(|_| Gone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_api::ToolResult;
    use tokio_stream::StreamExt;

    #[tokio::test]
    async fn a_follower_that_first_looks_after_the_end_still_gets_the_output() {
        let dir = tempfile::tempdir().expect("dir");
        let (out, err) = (dir.path().join("out"), dir.path().join("err"));
        std::fs::write(&out, "step 1\nstep 2\njob's later line\n").expect("out");
        std::fs::write(&err, "warn\n").expect("err");
        let record = Arc::new(Record::for_test("c1"));
        record.running(out.clone(), err.clone());
        // On this current-thread runtime the follower's task has not run
        // yet when the call ends and its files go.
        let stream = follow(Arc::clone(&record), 0, 0);
        record.output_ends([14, 5]);
        record.finish(Ok(ToolResult {
            content: "done".into(),
            is_error: false,
        }));
        std::fs::remove_file(&out).expect("rm");
        std::fs::remove_file(&err).expect("rm");
        let events: Vec<_> = stream.collect().await;
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        let mut result = None;
        for e in events {
            match e.expect("event").event.expect("some") {
                run_event::Event::Stdout(c) => stdout.extend(c.data),
                run_event::Event::Stderr(c) => stderr.extend(c.data),
                run_event::Event::Result(r) => result = Some(r.content),
            }
        }
        assert_eq!(
            stdout, b"step 1\nstep 2\n",
            "the call's own output, not its job's"
        );
        assert_eq!(stderr, b"warn\n");
        assert_eq!(result.as_deref(), Some("done"));
        // The last follower let the descriptors go.
        assert!(matches!(*record.watch().borrow(), Phase::Done(_, None)));
    }

    #[tokio::test]
    async fn a_call_nobody_follows_keeps_no_descriptors_once_done() {
        let dir = tempfile::tempdir().expect("dir");
        let (out, err) = (dir.path().join("out"), dir.path().join("err"));
        std::fs::write(&out, "x").expect("out");
        std::fs::write(&err, "").expect("err");
        let record = Record::for_test("c2");
        record.running(out, err);
        record.finish(Ok(ToolResult {
            content: "x".into(),
            is_error: false,
        }));
        assert!(matches!(*record.watch().borrow(), Phase::Done(_, None)));
    }
}
