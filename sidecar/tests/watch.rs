//! The sandbox watch, with the real binary: a call that starts more
//! processes than `--max-processes` ends with a notice, every process is
//! ended, the runner exits with the process-limit code and says why in its
//! termination log; in a real memory cgroup, a process the kernel kills
//! for memory ends the sandbox the same way.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{HOSTILE_AS_LIMIT, Sidecar, alive, eventually, next_id};
use serde_json::json;

/// The runner's descendants, by walking /proc.
fn descendants(root: i32) -> Vec<i32> {
    let all: Vec<(i32, i32)> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let rest = stat.get(stat.rfind(')')? + 1..)?;
            let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
            Some((pid, ppid))
        })
        .collect();
    let mut out = Vec::new();
    let mut stack = vec![root];
    while let Some(p) = stack.pop() {
        for (pid, ppid) in &all {
            if *ppid == p && alive(*pid) {
                out.push(*pid);
                stack.push(*pid);
            }
        }
    }
    out
}

async fn exit_code(s: &mut Sidecar) -> Option<i32> {
    let mut child = s.child.take().expect("running");
    for _ in 0..400 {
        if let Ok(Some(status)) = child.try_wait() {
            return status.code();
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let _ = child.kill();
    panic!("the runner did not exit after ending the sandbox");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_past_the_process_limit_ends_the_sandbox_and_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("termination-log");
    let log_arg = log.to_str().expect("utf-8").to_owned();
    let mut s = Sidecar::start_limited(
        &["--max-processes", "40", "--termination-log", &log_arg],
        Some(HOSTILE_AS_LIMIT),
    )
    .await;
    let runner = s.pid();
    // A background job the model started earlier is ended too: the whole
    // sandbox restarts.
    s.ok("bash", json!({"command": "sleep 300 & echo started"}))
        .await;
    let r = s
        .call(
            "bash",
            json!({"command": "for i in $(seq 200); do sleep 300 & done; wait", "timeout_ms": 60000}),
        )
        .await;
    assert!(r.is_error, "{}", r.content);
    assert!(
        r.content
            .contains("the sandbox reached its limit of 40 processes")
            && r.content.contains("every process in it was ended"),
        "{}",
        r.content
    );
    assert_eq!(
        exit_code(&mut s).await,
        Some(runner_api::ended::PROCESS_LIMIT)
    );
    let said = std::fs::read_to_string(&log).expect("termination log");
    assert!(said.contains("limit of 40 processes"), "{said}");
    assert!(
        eventually(|| descendants(runner).is_empty()).await,
        "processes were left: {:?}",
        descendants(runner)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn processes_under_the_limit_run_and_the_runner_stays() {
    let mut s = Sidecar::start_with(&["--max-processes", "64"]).await;
    let out = s
        .ok(
            "bash",
            json!({"command": "for i in $(seq 20); do sleep 1 & done; wait; echo done"}),
        )
        .await;
    assert!(out.contains("done"), "{out}");
    assert!(alive(s.pid()));
    assert!(s.stop().success());
}

/// A memory cgroup of the test's own (v2 under the unified hierarchy, or
/// v1's memory controller), removed on drop.
struct MemoryCgroup {
    dir: PathBuf,
    events: PathBuf,
}

impl MemoryCgroup {
    fn create(limit: u64) -> MemoryCgroup {
        let name = format!("agentplane-watch-test-{}", std::process::id());
        let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers");
        let v2_root = if v2.exists() {
            Some(PathBuf::from("/sys/fs/cgroup"))
        } else {
            None
        };
        let (dir, limit_file, events) = match v2_root {
            Some(root) => {
                let dir = root.join(&name);
                (
                    dir.clone(),
                    dir.join("memory.max"),
                    dir.join("memory.events"),
                )
            }
            None => {
                let dir = PathBuf::from("/sys/fs/cgroup/memory").join(&name);
                (
                    dir.clone(),
                    dir.join("memory.limit_in_bytes"),
                    dir.join("memory.oom_control"),
                )
            }
        };
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| {
            panic!(
                "this test makes a memory cgroup to run a real out-of-memory kill in, and needs root and a writable cgroup file system: {}: {e}",
                dir.display()
            )
        });
        std::fs::write(&limit_file, limit.to_string()).expect("memory limit");
        // No swap to escape into (v1 accounts it separately).
        let _ = std::fs::write(dir.join("memory.swap.max"), "0");
        let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), limit.to_string());
        MemoryCgroup { dir, events }
    }

    fn add(&self, pid: i32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).expect("join the cgroup");
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..100 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_killed_for_memory_ends_the_sandbox_and_says_why() {
    let cg = MemoryCgroup::create(96 << 20);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = dir.path().join("termination-log");
    let events = cg.events.to_str().expect("utf-8").to_owned();
    let log_arg = log.to_str().expect("utf-8").to_owned();
    let mut s = Sidecar::start_with(&[
        "--end-on-oom",
        "--oom-events-file",
        &events,
        "--termination-log",
        &log_arg,
    ])
    .await;
    let runner = s.pid();
    cg.add(runner);
    // A fresh shell (in the cgroup now) for the call, then 200 MB held in
    // one bash variable: the kernel kills it.
    s.ok("bash", json!({"command": "true", "restart": true}))
        .await;
    let id = next_id();
    let r = s
        .try_call(
            &id,
            "bash",
            json!({"command": "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}", "timeout_ms": 60000}),
        )
        .await
        .expect("the call is answered");
    assert!(r.is_error, "{}", r.content);
    assert!(
        r.content
            .contains("killed by the kernel for exceeding its memory limit of 96Mi"),
        "{}",
        r.content
    );
    assert_eq!(
        exit_code(&mut s).await,
        Some(runner_api::ended::OUT_OF_MEMORY)
    );
    let said = std::fs::read_to_string(&log).expect("termination log");
    assert!(said.contains("memory limit of 96Mi"), "{said}");
}
