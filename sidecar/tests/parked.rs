//! A shell parked for the next bash call ends with its runner, however the
//! runner ends (issue 21, item 6).
//!
//! The case that matters is a runner that is not PID 1 killed with SIGKILL
//! while something in its own session adopts its orphans: a supervisor, an
//! init that is a subreaper (tini -s, a container runtime's shim). Then
//! the parked shell's process group is not orphaned, so the kernel sends it
//! no SIGHUP, and a shell that had stopped itself to park stayed stopped
//! forever. This binary makes itself that adopter (a child subreaper), which
//! is why the test has a file, and so a process, of its own.

mod common;

use common::{HOSTILE_AS_LIMIT, Sidecar, eventually};
use serde_json::json;

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

#[tokio::test]
async fn a_parked_shell_ends_with_its_runner_killed_by_sigkill() {
    nix::sys::prctl::set_child_subreaper(true).expect("become a child subreaper");
    let mut s = Sidecar::start_limited(&[], Some(HOSTILE_AS_LIMIT)).await;
    let runner = s.pid();
    assert_ne!(runner, 1);
    let r = s.call("bash", json!({"command": "echo ready"})).await;
    assert_eq!(r.content, "ready\n");
    let mut parked = Vec::new();
    assert!(
        eventually(|| {
            parked = parked_shells(runner);
            !parked.is_empty()
        })
        .await,
        "no parked shell after a call: nothing to test"
    );
    let child = s.child.as_mut().expect("running");
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
    s.child = None;
    for shell in &parked {
        // The same process (pid and start time), neither running nor
        // stopped: gone, or a zombie of this process, its adopter.
        let lives = || {
            sidecar::procs::scan()
                .iter()
                .any(|p| p.pid == shell.pid && p.start == shell.start && !p.zombie)
        };
        let ended = eventually(|| !lives()).await;
        let state = sidecar::procs::state(shell.pid);
        // Reaped either way, so nothing is left behind by the test.
        if !ended {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(shell.pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(shell.pid), None);
        assert!(
            ended,
            "parked shell {} outlived its runner (state {state:?})",
            shell.pid
        );
    }
}
