//! One place that waits for child processes.
//!
//! The runner may be PID 1 of the sandbox container, and it is a subreaper in
//! any case, so every orphan of a tool call (a background job whose shell has
//! exited) becomes its child and must be reaped or it stays a zombie forever.
//! Reaping with `waitpid(-1)` would steal the exit status of a child some
//! other code is waiting for, so *all* waiting goes through here: a tool
//! spawns via [`Supervisor::spawn`], which registers the pid under the same
//! lock the reaper holds, and the reaper hands each status to whoever
//! registered that pid and discards the rest (orphans).

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::oneshot;

/// How a child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

impl Exit {
    /// The shell's `$?` convention: the code, or 128 + the signal number.
    pub fn code(self) -> i32 {
        match self {
            Exit::Code(c) => c,
            Exit::Signal(s) => 128 + s,
        }
    }
}

type Waiters = HashMap<i32, oneshot::Sender<Exit>>;

#[derive(Debug)]
pub struct Supervisor {
    waiters: Mutex<Waiters>,
}

/// A spawned child in its own process group (pgid == pid).
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    exit: oneshot::Receiver<Exit>,
    // Held so std never sees the child dropped as "leaked"; std's Child does
    // nothing on drop, and its own wait is never called.
    _child: Child,
}

impl Supervisor {
    /// Starts the reaper task. Must be called inside a tokio runtime, before
    /// any child is spawned.
    pub fn start() -> std::io::Result<Arc<Self>> {
        let sup = Arc::new(Supervisor {
            waiters: Mutex::new(HashMap::new()),
        });
        let mut sigchld = signal(SignalKind::child())?;
        let weak = Arc::downgrade(&sup);
        tokio::spawn(async move {
            // The tick is a backstop only: SIGCHLD is coalesced, not lost, and
            // each wake-up drains every zombie there is.
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tokio::select! {
                    _ = sigchld.recv() => {}
                    _ = tick.tick() => {}
                }
                match weak.upgrade() {
                    Some(sup) => sup.reap(),
                    None => return,
                }
            }
        });
        Ok(sup)
    }

    /// Spawns `cmd` in a new process group and registers it for its exit.
    pub fn spawn(&self, cmd: &mut Command) -> std::io::Result<Spawned> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let (tx, rx) = oneshot::channel();
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let child = cmd.spawn()?;
        let pid = child.id() as i32;
        waiters.insert(pid, tx);
        Ok(Spawned {
            pid,
            exit: rx,
            _child: child,
        })
    }

    fn reap(&self) {
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            let (pid, exit) = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => (pid, Exit::Code(code)),
                Ok(WaitStatus::Signaled(pid, sig, _)) => (pid, Exit::Signal(sig as i32)),
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(_) => continue,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "waitpid failed");
                    return;
                }
            };
            if let Some(tx) = waiters.remove(&pid.as_raw()) {
                let _ = tx.send(exit);
            }
        }
    }
}

impl Spawned {
    /// Waits for the child to exit, or kills its whole process group when
    /// `timeout` passes first. Dropping the future before it resolves (the
    /// caller went away) kills the group too, so an abandoned call leaves
    /// nothing running.
    pub async fn wait(self, timeout: Duration) -> Result<Waited, crate::Error> {
        let Spawned {
            pid,
            mut exit,
            _child,
        } = self;
        let mut guard = KillOnDrop(Some(pid));
        let res = tokio::time::timeout(timeout, &mut exit).await;
        let waited = match res {
            Ok(Ok(exit)) => Waited::Exited(exit),
            Ok(Err(_)) => return Err(crate::Error::SupervisorGone),
            Err(_) => {
                kill_group(pid);
                match exit.await {
                    Ok(exit) => Waited::TimedOut(exit),
                    Err(_) => return Err(crate::Error::SupervisorGone),
                }
            }
        };
        guard.0 = None;
        Ok(waited)
    }
}

/// The outcome of [`Spawned::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waited {
    Exited(Exit),
    /// The deadline passed; the group was killed and this is how the leader ended.
    TimedOut(Exit),
}

struct KillOnDrop(Option<i32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            kill_group(pid);
        }
    }
}

/// SIGKILLs every process in the group `pgid`. A group that is already gone
/// is not an error: that is the outcome wanted.
pub fn kill_group(pgid: i32) {
    if pgid > 1 {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Whether any process is still in the group `pgid`.
pub fn group_alive(pgid: i32) -> bool {
    pgid > 1 && killpg(Pid::from_raw(pgid), None) != Err(Errno::ESRCH)
}
