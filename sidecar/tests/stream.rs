//! Streamed calls over the real socket: output as it is written, the same
//! result as Run, re-attach after a dropped connection, cancel, bounded
//! memory for any output size.

mod common;

use std::time::Duration;

use common::{HOSTILE_AS_LIMIT, Sidecar};
use runner_api::Events;
use runner_api::proto::run_event::Event;
use serde_json::json;

const HANG: Duration = Duration::from_secs(60);

/// What a stream delivered: stdout, stderr, the events before the result,
/// and the result (or the status it ended with).
#[derive(Debug, Default)]
struct Seen {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    chunks_before_result: usize,
    result: Option<(String, bool)>,
}

async fn next(s: &mut Events) -> Option<Event> {
    tokio::time::timeout(HANG, s.next())
        .await
        .expect("the stream went silent")
        .expect("the stream failed")
}

/// Reads events, checking each chunk's offset continues its stream, until
/// the result, or until `stop_after` chunks.
async fn read(s: &mut Events, seen: &mut Seen, stop_after: Option<usize>) {
    let mut n = 0;
    while let Some(ev) = next(s).await {
        match ev {
            Event::Stdout(c) => {
                assert_eq!(c.offset, seen.stdout.len() as u64);
                seen.stdout.extend(c.data);
            }
            Event::Stderr(c) => {
                assert_eq!(c.offset, seen.stderr.len() as u64);
                seen.stderr.extend(c.data);
            }
            Event::Result(r) => {
                seen.result = Some((r.content, r.is_error));
                return;
            }
        }
        seen.chunks_before_result += 1;
        n += 1;
        if stop_after == Some(n) {
            return;
        }
    }
}

#[tokio::test]
async fn output_streams_and_the_result_is_the_one_run_gives() {
    let s = Sidecar::start().await;
    let cmd = "for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.2; done";
    for (command, failing) in [(cmd.to_owned(), false), (format!("{cmd}; exit 4"), true)] {
        let input = json!({ "command": command }).to_string();
        let mut c = s.client().await;
        let mut st = c
            .run_stream(&common::next_id(), "bash", &input, false)
            .await
            .unwrap();
        let mut seen = Seen::default();
        read(&mut st, &mut seen, None).await;
        assert_eq!(seen.stdout, b"out1\nout2\nout3\n");
        assert_eq!(seen.stderr, b"err1\nerr2\nerr3\n");
        assert!(seen.chunks_before_result >= 2);
        let run = c
            .run(&common::next_id(), "bash", &input, false)
            .await
            .unwrap();
        assert_eq!(seen.result, Some((run.content.clone(), run.is_error)));
        assert_eq!(run.is_error, failing);
        // The reference's order: stdout then stderr, stderr first on failure.
        let want = if failing {
            "err1\nerr2\nerr3\n\nout1\nout2\nout3\nexit code: 4"
        } else {
            "out1\nout2\nout3\n\nerr1\nerr2\nerr3\n"
        };
        assert_eq!(run.content, want);
    }
    // A file tool streams no output, only its result.
    let mut c = s.client().await;
    std::fs::write(s.path("f.txt"), "text\n").unwrap();
    let mut st = c
        .run_stream(
            &common::next_id(),
            "read",
            r#"{"file_path":"f.txt"}"#,
            false,
        )
        .await
        .unwrap();
    let mut seen = Seen::default();
    read(&mut st, &mut seen, None).await;
    assert_eq!(seen.chunks_before_result, 0);
    assert_eq!(seen.result, Some(("text\n".into(), false)));
}

#[tokio::test]
async fn a_dropped_connection_reattaches_and_loses_nothing() {
    let s = Sidecar::start().await;
    let id = common::next_id();
    let input = json!({"command": "echo first; sleep 1; echo second; echo late >&2"}).to_string();
    let mut seen = Seen::default();
    {
        let mut c = s.client().await;
        let mut st = c.run_stream(&id, "bash", &input, false).await.unwrap();
        read(&mut st, &mut seen, Some(1)).await;
        assert_eq!(seen.stdout, b"first\n");
        // The connection goes away with the client; the call runs on.
    }
    let mut c = s.client().await;
    let mut st = c
        .attach(&id, seen.stdout.len() as u64, seen.stderr.len() as u64)
        .await
        .unwrap();
    read(&mut st, &mut seen, None).await;
    assert_eq!(seen.stdout, b"first\nsecond\n");
    assert_eq!(seen.stderr, b"late\n");
    assert_eq!(seen.result, Some(("first\nsecond\n\nlate\n".into(), false)));
    // Finished calls stay attachable: the result again.
    let mut st = c.attach(&id, 0, 0).await.unwrap();
    let mut again = Seen::default();
    read(&mut st, &mut again, None).await;
    assert_eq!(again.result, seen.result);
    // An id never started, and an id still running.
    match c.attach("toolu_never", 0, 0).await {
        Err(e) => assert_eq!(e.refusal(), Some(runner_api::Refusal::UnknownCall), "{e}"),
        other => panic!("{other:?}"),
    }
    let busy = common::next_id();
    let _st = c
        .run_stream(&busy, "bash", r#"{"command":"sleep 2"}"#, false)
        .await
        .unwrap();
    match c
        .run_stream(&busy, "bash", r#"{"command":"true"}"#, false)
        .await
    {
        Err(e) => assert_eq!(e.refusal(), Some(runner_api::Refusal::CallRunning), "{e}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn cancel_ends_a_running_call_and_everything_it_started() {
    let s = Sidecar::start().await;
    let id = common::next_id();
    let pidfile = s.root.join("bg");
    let cmd = format!(
        "setsid sleep 300 & echo $! > {}; sleep 300",
        pidfile.display()
    );
    let mut c = s.client().await;
    let mut st = c
        .run_stream(&id, "bash", &json!({ "command": cmd }).to_string(), false)
        .await
        .unwrap();
    assert!(common::eventually(|| pidfile.exists()).await);
    assert!(c.cancel(&id).await.unwrap());
    let mut seen = Seen::default();
    read(&mut st, &mut seen, None).await;
    let (content, is_error) = seen.result.unwrap();
    assert!(is_error);
    assert!(
        content.contains("cancelled: the command and every process it started were killed"),
        "{content}"
    );
    let bg: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(common::eventually(|| !common::alive(bg)).await);
    assert!(!c.cancel(&id).await.unwrap(), "already finished");
}

#[tokio::test]
async fn streaming_any_output_size_keeps_memory_flat() {
    let s = Sidecar::start_limited(&[], Some(HOSTILE_AS_LIMIT)).await;
    let mut c = s.client().await;
    // Warm up every path once.
    let mut st = c
        .run_stream(
            &common::next_id(),
            "bash",
            r#"{"command":"echo hi"}"#,
            false,
        )
        .await
        .unwrap();
    read(&mut st, &mut Seen::default(), None).await;
    let before = s.status_kib("VmHWM");
    let input = json!({"command": "head -c 200000000 /dev/zero | tr '\\0' x"}).to_string();
    let mut st = c
        .run_stream(&common::next_id(), "bash", &input, false)
        .await
        .unwrap();
    let mut total = 0u64;
    let mut result = None;
    while let Some(ev) = next(&mut st).await {
        match ev {
            Event::Stdout(ch) => {
                assert_eq!(ch.offset, total);
                total += ch.data.len() as u64;
                // A slow reader: the runner must wait, not buffer.
                if total % (16 << 20) < ch.data.len() as u64 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            Event::Stderr(_) => panic!("no stderr expected"),
            Event::Result(r) => {
                result = Some(r);
                break;
            }
        }
    }
    assert_eq!(total, 200_000_000);
    let r = result.unwrap();
    assert!(!r.is_error && r.content.len() <= toolset::MAX_OUTPUT_BYTES);
    let after = s.status_kib("VmHWM");
    assert!(
        after <= before + 8 * 1024,
        "peak RSS grew from {before} to {after} KiB"
    );
}

/// A streamed call that leaves a job writing without end ends with its
/// result: the stream sends what the files held when the call was done,
/// not what the job goes on writing (that belongs to a later bash result).
/// The job starts writing the moment the call's shell is gone, while the
/// follower drains the files; a drain to the end of the files never ended.
#[tokio::test]
async fn a_stream_ends_though_a_job_it_left_writes_on() {
    let s = Sidecar::start().await;
    let input = json!({
        "command": "(while kill -0 $$ 2>/dev/null; do sleep 0.005; done; exec yes) & echo started",
    })
    .to_string();
    let mut c = s.client().await;
    let mut st = c
        .run_stream(&common::next_id(), "bash", &input, false)
        .await
        .unwrap();
    let mut seen = Seen::default();
    // At most 64 MiB of chunks: an unbounded stream fails here instead of
    // filling the test's memory.
    read(&mut st, &mut seen, Some(2048)).await;
    // What the job wrote before the result was made (between the shell's
    // exit and the result) is the call's own: only the start is known.
    let Some((content, is_error)) = &seen.result else {
        panic!("{} bytes streamed and no result", seen.stdout.len());
    };
    assert!(!is_error && content.starts_with("started\n"));
    assert!(seen.stdout.starts_with(b"started\n"));
    s.ok("bash", json!({"restart": true})).await;
}
