//! Hostile calls against the real binary over its socket, each runner under
//! an address-space limit (`prlimit --as`): every call ends with a clear
//! result, the runner's memory stays flat, its own files stay its own, and
//! it is still serving afterwards.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{HOSTILE_AS_LIMIT, Sidecar, eventually};
use serde_json::json;

/// A call that does not answer within this is a hang: the test fails
/// instead of waiting forever. Generous; never a timing assertion.
const HANG: Duration = Duration::from_secs(60);

async fn hostile(extra: &[&str]) -> Sidecar {
    Sidecar::start_limited(extra, Some(HOSTILE_AS_LIMIT)).await
}

async fn call(s: &Sidecar, tool: &str, input: serde_json::Value) -> sidecar::ToolResult {
    tokio::time::timeout(HANG, s.call(tool, input.clone()))
        .await
        .unwrap_or_else(|_| panic!("{tool} {input} did not answer: a hang"))
}

async fn err(s: &Sidecar, tool: &str, input: serde_json::Value) -> String {
    let r = call(s, tool, input.clone()).await;
    assert!(r.is_error, "{tool} {input} should fail, got: {}", r.content);
    r.content
}

/// The runner answers a real call after the hostile ones.
async fn still_serving(s: &Sidecar) {
    let r = call(s, "bash", json!({"command": "echo alive"})).await;
    assert_eq!(r.content, "alive\n");
    assert!(common::alive(s.pid()));
}

#[tokio::test]
async fn proc_and_sys_files_whose_size_lies_are_read_with_a_hard_limit() {
    let s = hostile(&[]).await;
    still_serving(&s).await;
    let before = s.status_kib("VmHWM");
    for path in ["/proc/self/pagemap", "/proc/self/mem", "/proc/kcore"] {
        let e = err(&s, "read", json!({"file_path": path})).await;
        assert!(e.starts_with("read"), "{path}: {e}");
        let e = err(&s, "read", json!({"file_path": path, "view_range": [1, 3]})).await;
        assert!(e.starts_with("read"), "{path}: {e}");
        let e = err(
            &s,
            "edit",
            json!({"file_path": path, "old_string": "a", "new_string": "b"}),
        )
        .await;
        assert!(e.starts_with("edit"), "{path}: {e}");
    }
    // A /proc file that is small reads normally, though it states size 0.
    let r = call(&s, "read", json!({"file_path": "/proc/self/status"})).await;
    assert!(!r.is_error && r.content.contains("VmHWM"), "{}", r.content);
    let after = s.status_kib("VmHWM");
    assert!(
        after <= before + 8 * 1024,
        "peak RSS grew from {before} to {after} KiB"
    );
    still_serving(&s).await;
}

#[tokio::test]
async fn fifos_devices_and_sockets_are_refused_not_opened() {
    let s = hostile(&[]).await;
    let fifo = s.path("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    for tool_input in [
        ("read", json!({"file_path": "pipe"})),
        ("read", json!({"file_path": "pipe", "view_range": [1, 2]})),
        (
            "edit",
            json!({"file_path": "pipe", "old_string": "a", "new_string": "b"}),
        ),
        ("write", json!({"file_path": "pipe", "content": "x"})),
    ] {
        let e = err(&s, tool_input.0, tool_input.1).await;
        assert!(e.contains("FIFO"), "{e}");
    }
    let e = err(&s, "read", json!({"file_path": "/dev/zero"})).await;
    assert!(e.contains("character device"), "{e}");
    let e = err(
        &s,
        "read",
        json!({"file_path": "/dev/urandom", "view_range": [1, 1]}),
    )
    .await;
    assert!(e.contains("character device"), "{e}");
    let sock = s.socket.display().to_string();
    let e = err(&s, "read", json!({"file_path": sock})).await;
    assert!(e.contains("runner"), "{e}");
    // The FIFO is still a FIFO: nothing replaced it.
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    still_serving(&s).await;
}

#[tokio::test]
async fn a_file_swapped_for_a_fifo_mid_call_never_blocks_a_worker() {
    let s = hostile(&[]).await;
    let dir = s.workdir.clone();
    std::fs::write(dir.join("regular"), "text\n").unwrap();
    nix::unistd::mkfifo(
        &dir.join("fifo"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    // A thread swaps the target between a regular file and a FIFO as fast
    // as it can while reads and edits run against it.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let swapper = {
        let (dir, stop) = (dir.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 2_000_000 {
                let from = if n.is_multiple_of(2) {
                    "regular"
                } else {
                    "fifo"
                };
                let _ = std::fs::hard_link(dir.join(from), dir.join("target.tmp"));
                let _ = std::fs::rename(dir.join("target.tmp"), dir.join("target"));
                n += 1;
            }
        })
    };
    for i in 0u32..200 {
        let (tool, input) = if i.is_multiple_of(2) {
            ("read", json!({"file_path": "target"}))
        } else {
            (
                "edit",
                json!({"file_path": "target", "old_string": "zzz", "new_string": "y"}),
            )
        };
        // Either answer is fine; not answering is the failure.
        let _ = call(&s, tool, input).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    swapper.join().unwrap();
    still_serving(&s).await;
}

#[tokio::test]
async fn replace_all_cannot_build_an_unbounded_file() {
    let s = hostile(&[]).await;
    let original = "a".repeat(200 << 10);
    std::fs::write(s.path("big.txt"), &original).unwrap();
    let before = s.status_kib("VmHWM");
    let e = err(
        &s,
        "edit",
        json!({"file_path": "big.txt", "old_string": "a", "new_string": "b".repeat(4096), "replace_all": true}),
    )
    .await;
    assert!(
        e.contains("over the") && e.contains("limit of an edit"),
        "{e}"
    );
    assert_eq!(
        std::fs::read_to_string(s.path("big.txt")).unwrap(),
        original
    );
    let after = s.status_kib("VmHWM");
    assert!(
        after <= before + 16 * 1024,
        "peak RSS grew from {before} to {after} KiB"
    );
    // A large but bounded replace_all still works.
    let r = call(
        &s,
        "edit",
        json!({"file_path": "big.txt", "old_string": "a", "new_string": "bb", "replace_all": true}),
    )
    .await;
    assert!(!r.is_error, "{}", r.content);
    assert_eq!(
        std::fs::metadata(s.path("big.txt")).unwrap().len(),
        400 << 10
    );
    still_serving(&s).await;
}

#[tokio::test]
async fn output_past_the_per_call_cap_ends_the_call() {
    let s = hostile(&["--max-call-output-bytes", "2000000"]).await;
    let r = call(&s, "bash", json!({"command": "yes"})).await;
    assert!(r.is_error);
    assert!(
        r.content
            .contains("stopped: the output passed 2000000 bytes"),
        "{}",
        &r.content[r.content.len().saturating_sub(400)..]
    );
    assert!(r.content.len() <= toolset::MAX_OUTPUT_BYTES);
    std::fs::write(s.path("many.txt"), "match\n".repeat(1_000_000)).unwrap();
    let e = err(&s, "grep", json!({"pattern": "match"})).await;
    assert!(e.contains("grep: stopped after 2000000 bytes"), "{e}");
    still_serving(&s).await;
}

#[tokio::test]
async fn calls_past_the_concurrency_cap_are_refused_clearly() {
    let s = hostile(&["--max-concurrent-calls", "2"]).await;
    let mut slow = Vec::new();
    for _ in 0..2 {
        let c = s.client().await;
        slow.push(tokio::spawn(async move {
            let mut c = c;
            c.run(
                &common::next_id(),
                "bash",
                r#"{"command":"sleep 3"}"#,
                false,
            )
            .await
        }));
    }
    // Wait until both are running.
    let pid = s.pid();
    assert!(
        eventually(|| {
            let procs = sidecar::procs::scan();
            let shells: Vec<i32> = procs
                .iter()
                .filter(|p| p.ppid == pid && p.comm == "bash")
                .map(|p| p.pid)
                .collect();
            procs
                .iter()
                .filter(|p| p.comm == "sleep" && shells.contains(&p.ppid))
                .count()
                >= 2
        })
        .await
    );
    let refused = s
        .try_call(&common::next_id(), "read", json!({"file_path": "x"}))
        .await
        .expect_err("a third call is refused");
    match refused {
        runner_api::Error::Refused {
            code,
            message,
            refusal,
        } => {
            assert_eq!(code, tonic::Code::ResourceExhausted);
            assert_eq!(refusal, Some(runner_api::Refusal::Busy));
            assert!(message.contains("--max-concurrent-calls"), "{message}");
        }
        other => panic!("unexpected {other:?}"),
    }
    for h in slow {
        assert!(!h.await.unwrap().unwrap().is_error);
    }
    still_serving(&s).await;
}

#[tokio::test]
async fn the_runners_own_files_are_out_of_the_file_tools_reach() {
    let s = hostile(&[]).await;
    let snapshot = s.state.join("shell.snapshot");
    call(&s, "bash", json!({"command": "export KEEP=1"})).await;
    assert!(snapshot.exists());
    let snap = snapshot.display().to_string();
    // The issue's exploit: plant a command with write, have bash run it.
    let e = err(
        &s,
        "write",
        json!({"file_path": snap, "content": "id > /tmp/planted\n"}),
    )
    .await;
    assert!(e.contains("runner's state directory"), "{e}");
    let e = err(
        &s,
        "edit",
        json!({"file_path": snap, "old_string": "KEEP", "new_string": "X"}),
    )
    .await;
    assert!(e.contains("runner's state directory"), "{e}");
    let e = err(&s, "read", json!({"file_path": snap})).await;
    assert!(e.contains("runner's state directory"), "{e}");
    // Through a symlink, and through `..`.
    std::os::unix::fs::symlink(&s.state, s.path("innocent")).unwrap();
    let e = err(
        &s,
        "write",
        json!({"file_path": "innocent/shell.snapshot", "content": "x"}),
    )
    .await;
    assert!(e.contains("runner's state directory"), "{e}");
    let rel = pathdiff(&s.workdir, &snapshot);
    let e = err(&s, "write", json!({"file_path": rel, "content": "x"})).await;
    assert!(e.contains("runner's state directory"), "{e}");
    // The socket and the binary.
    let e = err(
        &s,
        "write",
        json!({"file_path": s.socket.display().to_string(), "content": "x"}),
    )
    .await;
    assert!(e.contains("runner's own files"), "{e}");
    let e = err(&s, "read", json!({"file_path": common::BIN})).await;
    assert!(e.contains("runner's binary"), "{e}");
    let r = call(&s, "bash", json!({"command": "echo $KEEP"})).await;
    assert_eq!(r.content, "1\n");
}

/// `../../state/shell.snapshot`, from `from` to `to` (both absolute).
fn pathdiff(from: &Path, to: &Path) -> String {
    let up = from.components().count() - 1;
    let mut s = "../".repeat(up);
    s.push_str(&to.display().to_string()[1..]);
    s
}

#[tokio::test]
async fn a_snapshot_changed_behind_the_runners_back_is_discarded() {
    let s = hostile(&[]).await;
    call(
        &s,
        "bash",
        json!({"command": "export SECRET_STATE=1; cd /tmp"}),
    )
    .await;
    // A background job of an earlier call (or anything else) rewrites it.
    let snapshot = s.state.join("shell.snapshot");
    let planted = s.root.join("planted");
    let mut text = std::fs::read_to_string(&snapshot).unwrap();
    text.push_str(&format!("touch {}\n", planted.display()));
    std::fs::write(&snapshot, text).unwrap();
    let r = call(
        &s,
        "bash",
        json!({"command": "echo \"[$SECRET_STATE]\"; pwd"}),
    )
    .await;
    assert!(!planted.exists(), "the planted command ran");
    assert!(
        r.content.contains("changed outside the runner"),
        "{}",
        r.content
    );
    assert!(r.content.starts_with("[]\n"), "{}", r.content);
    // The next call starts from the state this call left, trusted again.
    call(&s, "bash", json!({"command": "export NEXT=2"})).await;
    let r = call(&s, "bash", json!({"command": "echo $NEXT"})).await;
    assert_eq!(r.content, "2\n");
}

fn read_pid(p: &Path) -> i32 {
    std::fs::read_to_string(p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_timeout_ends_every_process_the_call_started() {
    let s = hostile(&[]).await;
    let dir = s.root.clone();
    // setsid: a new session and group, still a descendant.
    // (setsid ... &): a double fork, reparented to the runner before the
    // timeout, found by the call's marker.
    let cmd = format!(
        "setsid sleep 300 & echo $! > {d}/a; (setsid sh -c 'echo $$ > {d}/b; exec sleep 301' &); sleep 30",
        d = dir.display()
    );
    let r = call(&s, "bash", json!({"command": cmd, "timeout_ms": 1500})).await;
    assert!(r.is_error);
    assert!(
        r.content
            .contains("the command and every process it started were killed"),
        "{}",
        r.content
    );
    let (a, b) = (read_pid(&dir.join("a")), read_pid(&dir.join("b")));
    assert!(eventually(|| !common::alive(a) && !common::alive(b)).await);

    // A job that drops the marker cannot be attributed; the result says so
    // and names it instead of claiming it was killed.
    let cmd = format!(
        "(env -i setsid sh -c 'echo $$ > {d}/c; exec sleep 302' &); sleep 30",
        d = dir.display()
    );
    let r = call(&s, "bash", json!({"command": cmd, "timeout_ms": 1500})).await;
    let c = read_pid(&dir.join("c"));
    assert!(
        r.content.contains("left running") && r.content.contains(&format!("{c} (sleep)")),
        "{}",
        r.content
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(c),
        nix::sys::signal::Signal::SIGKILL,
    );
    still_serving(&s).await;
}

#[tokio::test]
async fn spills_are_retained_within_count_bounds() {
    let s = hostile(&["--spill-max-files", "3"]).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        let id = common::next_id();
        let r = s
            .try_call(
                &id,
                "bash",
                json!({"command": "head -c 300000 /dev/zero | tr '\\0' y"}),
            )
            .await
            .unwrap();
        assert!(r.content.contains("full output"), "{}", r.content);
        ids.push(id);
        // Distinct mtimes, so "oldest" is well defined.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kept: Vec<String> = std::fs::read_dir(&s.spill)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(kept.len(), 3, "{kept:?}");
    for id in &ids[3..] {
        assert!(kept.contains(&format!("{id}.txt")), "{kept:?}");
    }
}

#[tokio::test]
async fn temp_files_of_an_interrupted_write_are_removed_at_start_up() {
    let mut s = hostile(&[]).await;
    s.stop();
    // What a runner killed between create and rename leaves: the journal
    // line and the temporary file, plus a planted line naming a real file.
    let tmp = s.workdir.join(".agent-write-999-1.tmp");
    std::fs::write(&tmp, "half").unwrap();
    let keep = s.workdir.join("keep.txt");
    std::fs::write(&keep, "mine").unwrap();
    std::fs::write(
        s.state.join("writes.journal"),
        format!("{}\n{}\n", tmp.display(), keep.display()),
    )
    .unwrap();
    s.spawn().await;
    assert!(!tmp.exists());
    assert_eq!(std::fs::read_to_string(&keep).unwrap(), "mine");
}

#[tokio::test]
async fn concurrent_edits_of_one_file_are_all_kept() {
    let s = hostile(&[]).await;
    let n = 24;
    let text: String = (0..n).map(|i| format!("line-{i}\n")).collect();
    std::fs::write(s.path("shared.txt"), text).unwrap();
    let mut handles = Vec::new();
    for i in 0..n {
        let c = s.client().await;
        handles.push(tokio::spawn(async move {
            let mut c = c;
            let input = json!({"file_path": "shared.txt", "old_string": format!("line-{i}\n"), "new_string": format!("done-{i}\n")});
            c.run(&common::next_id(), "edit", &input.to_string(), false)
                .await
        }));
    }
    for h in handles {
        let r = h.await.unwrap().unwrap();
        assert!(!r.is_error, "{}", r.content);
    }
    let expected: String = (0..n).map(|i| format!("done-{i}\n")).collect();
    assert_eq!(
        std::fs::read_to_string(s.path("shared.txt")).unwrap(),
        expected
    );
}

#[tokio::test]
async fn commands_over_the_kernels_argument_limit_and_with_nul_bytes() {
    let s = hostile(&[]).await;
    // One argv string may not pass 128 KiB; the command does not travel in argv.
    let long = format!("x='{}'; echo ${{#x}}", "a".repeat(1 << 20));
    let r = call(&s, "bash", json!({ "command": long })).await;
    assert_eq!(r.content, "1048576\n");
    assert!(!r.is_error);
    let e = err(&s, "bash", json!({"command": "echo a\u{0}b"})).await;
    assert!(e.contains("NUL byte"), "{e}");
    still_serving(&s).await;
}

/// A parked shell killed, or woken before the runner handed it a call (by
/// anything that reaches its pipe through /proc), is replaced: the next
/// call runs in a shell of its own, with the session's state.
#[tokio::test]
async fn a_parked_shell_killed_or_woken_early_is_replaced() {
    let s = hostile(&[]).await;
    call(&s, "bash", json!({"command": "export KEPT=1"})).await;
    let runner = s.pid();
    for wake_early in [false, true] {
        let mut parked = Vec::new();
        assert!(
            eventually(|| {
                parked = parked_shells(runner);
                !parked.is_empty()
            })
            .await,
            "a shell is parked for the next call"
        );
        let shell = parked[0].pid;
        if wake_early {
            // The pipe's descriptor is the shell's last argument.
            let args = std::fs::read(format!("/proc/{shell}/cmdline")).unwrap();
            let fd =
                String::from_utf8_lossy(args.split(|&b| b == 0).rfind(|a| !a.is_empty()).unwrap())
                    .into_owned();
            std::fs::write(format!("/proc/{shell}/fd/{fd}"), "go\n").unwrap();
        } else {
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(shell),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap();
        }
        assert!(eventually(|| !common::alive(shell)).await);
        let r = call(&s, "bash", json!({"command": "echo $KEPT"})).await;
        assert_eq!(
            (r.content.as_str(), r.is_error),
            ("1\n", false),
            "woken early: {wake_early}"
        );
    }
}

/// The shells started ahead of calls (parked) whose parent is `runner`.
fn parked_shells(runner: i32) -> Vec<sidecar::procs::Proc> {
    sidecar::procs::scan()
        .into_iter()
        .filter(|p| p.ppid == runner && !p.zombie)
        .filter(|p| {
            std::fs::read(format!("/proc/{}/cmdline", p.pid))
                .map(|c| c.split(|&b| b == 0).any(|arg| arg == b"park"))
                .unwrap_or(false)
        })
        .collect()
}

/// A background job that writes without end after its call returned is
/// held to the call's output cap like the call itself: ended past it, and
/// the result that shows its output says so. Neither the disk nor the
/// runner's memory follows the job.
#[tokio::test]
async fn a_background_job_writing_forever_is_ended_at_the_output_cap() {
    let s = hostile(&["--max-call-output-bytes", "2000000"]).await;
    let r = call(
        &s,
        "bash",
        json!({"command": "(while [ ! -e go ]; do sleep 0.02; done; exec yes) & echo $! > yes.pid; echo started"}),
    )
    .await;
    assert_eq!(r.content, "started\n");
    let before = s.status_kib("VmHWM");
    std::fs::write(s.path("go"), "").unwrap();
    let job: i32 = std::fs::read_to_string(s.path("yes.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        eventually(|| !common::alive(job)).await,
        "the job is still writing"
    );
    let r = call(&s, "bash", json!({"command": "echo own"})).await;
    assert!(!r.is_error, "{}", r.content);
    assert!(r.content.len() <= toolset::MAX_OUTPUT_BYTES);
    assert!(
        r.content.contains(
            "its jobs were ended: together with the call they wrote more than 2000000 bytes"
        ),
        "{}",
        &r.content[r.content.len().saturating_sub(600)..]
    );
    assert!(r.content.ends_with("own\n"));
    assert!(s.status_kib("VmHWM") < before + 16 * 1024);
    still_serving(&s).await;
}
