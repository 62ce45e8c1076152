//! Starts the real `agent-sidecar` binary on a temp dir and socket.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use runner_api::{Client, Error, Target, ToolResult};

pub const BIN: &str = env!("CARGO_BIN_EXE_agent-sidecar");

#[derive(Debug)]
pub struct Sidecar {
    pub child: Option<Child>,
    pub root: PathBuf,
    pub socket: PathBuf,
    pub workdir: PathBuf,
    pub state: PathBuf,
    pub spill: PathBuf,
    pub extra: Vec<String>,
    /// Address-space limit the binary runs under (`prlimit --as`), so that a
    /// regression that reads without bound fails the test instead of taking
    /// the machine down.
    pub limit_as: Option<u64>,
    /// Where the binary is started (its working directory, and the `PWD`
    /// it inherits); the test process's own when `None`.
    pub cwd: Option<PathBuf>,
    /// What `--workdir` says, when not `workdir` itself (a relative path,
    /// or one through a symbolic link).
    pub workdir_arg: Option<PathBuf>,
    /// Variables added to the binary's environment.
    pub env: Vec<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

/// The address-space limit hostile tests run the runner under: generous
/// for its threads' reserved stacks and arenas, far below the machine.
pub const HOSTILE_AS_LIMIT: u64 = 1 << 30;

impl Sidecar {
    /// A runner on a fresh temp dir, with the default toolset.
    pub async fn start() -> Sidecar {
        Self::start_with(&[]).await
    }

    pub async fn start_with(extra: &[&str]) -> Sidecar {
        Self::start_limited(extra, None).await
    }

    /// A runner under an address-space limit.
    pub async fn start_limited(extra: &[&str], limit_as: Option<u64>) -> Sidecar {
        Self::start_in(extra, limit_as, None).await
    }

    /// A runner started from `cwd`, as a user would start it by hand from
    /// wherever their shell happens to be.
    pub async fn start_from(cwd: &Path, extra: &[&str]) -> Sidecar {
        Self::start_in(extra, None, Some(cwd.to_path_buf())).await
    }

    async fn start_in(extra: &[&str], limit_as: Option<u64>, cwd: Option<PathBuf>) -> Sidecar {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().to_path_buf();
        let workdir = root.join("work");
        std::fs::create_dir_all(&workdir).expect("workdir");
        let mut s = Sidecar {
            child: None,
            socket: root.join("run/runner.sock"),
            workdir,
            state: root.join("state"),
            spill: root.join("spill"),
            root,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            limit_as,
            cwd,
            workdir_arg: None,
            env: Vec::new(),
            _dir: Some(dir),
        };
        s.spawn().await;
        s
    }

    /// (Re)starts the binary on the same directories.
    pub async fn spawn(&mut self) {
        let mut cmd = match self.limit_as {
            Some(bytes) => {
                // prlimit execs the runner: the pid is the runner's.
                let mut c = Command::new("prlimit");
                c.arg(format!("--as={bytes}")).arg("--").arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        if let Some(cwd) = &self.cwd {
            cmd.current_dir(cwd).env("PWD", cwd);
        }
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let child = cmd
            .arg("serve")
            .arg("--socket")
            .arg(&self.socket)
            .arg("--workdir")
            .arg(self.workdir_arg.as_ref().unwrap_or(&self.workdir))
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--spill-dir")
            .arg(&self.spill)
            .args(&self.extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn agent-sidecar");
        self.child = Some(child);
        for _ in 0..200 {
            if let Ok(mut c) = Client::connect(&Target::Unix(self.socket.clone())).await
                && c.health().await.unwrap_or(false)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("agent-sidecar did not become healthy");
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map(|c| c.id() as i32).expect("running")
    }

    /// SIGTERM, then wait for the process to exit.
    pub fn stop(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .expect("SIGTERM");
        child.wait().expect("wait")
    }

    pub async fn client(&self) -> Client {
        Client::connect(&Target::Unix(self.socket.clone()))
            .await
            .expect("connect")
    }

    pub async fn try_call(
        &self,
        id: &str,
        tool: &str,
        input: serde_json::Value,
    ) -> Result<ToolResult, Error> {
        self.client()
            .await
            .run(id, tool, &input.to_string(), false)
            .await
    }

    pub async fn call(&self, tool: &str, input: serde_json::Value) -> ToolResult {
        self.try_call(&next_id(), tool, input)
            .await
            .expect("call was run")
    }

    pub async fn ok(&self, tool: &str, input: serde_json::Value) -> String {
        let r = self.call(tool, input.clone()).await;
        assert!(!r.is_error, "{tool} {input} failed: {}", r.content);
        r.content
    }

    pub async fn err(&self, tool: &str, input: serde_json::Value) -> String {
        let r = self.call(tool, input.clone()).await;
        assert!(r.is_error, "{tool} {input} should fail, got: {}", r.content);
        r.content
    }

    pub fn status_kib(&self, field: &str) -> u64 {
        status_kib(self.pid(), field)
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.workdir.join(rel)
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn next_id() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "toolu_test_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A `Vm*` field of /proc/PID/status, in KiB.
pub fn status_kib(pid: i32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find_map(|l| l.strip_prefix(field).and_then(|r| r.strip_prefix(':')))
        .and_then(|r| r.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("field")
}

/// Whether a process exists and is not a zombie.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => {
            let state = s
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().next());
            state != Some("Z")
        }
        Err(_) => false,
    }
}

/// Polls `cond` up to a generous bound; never asserts on elapsed time.
pub async fn eventually(mut cond: impl FnMut() -> bool) -> bool {
    for _ in 0..400 {
        if cond() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

pub fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).expect("metadata").permissions().mode() & 0o7777
}
