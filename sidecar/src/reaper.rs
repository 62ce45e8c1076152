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
use std::os::fd::BorrowedFd;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, FdFlag, fcntl};
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
    marker: Option<String>,
    sup: Arc<Supervisor>,
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
    pub fn spawn(self: &Arc<Self>, cmd: &mut Command) -> std::io::Result<Spawned> {
        self.spawn_with(cmd, None)
    }

    /// [`Supervisor::spawn`], handing the child `inherit` at its own number
    /// (std has no safe way to place a descriptor in a child). The runner's
    /// descriptors are all close-on-exec; `inherit` is let through for this
    /// one spawn, under the lock every spawn takes, so no other child of
    /// the runner ever gets it.
    pub fn spawn_with(
        self: &Arc<Self>,
        cmd: &mut Command,
        inherit: Option<BorrowedFd<'_>>,
    ) -> std::io::Result<Spawned> {
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let (tx, rx) = oneshot::channel();
        let mut waiters = self.waiters.lock().unwrap_or_else(PoisonError::into_inner);
        let set_cloexec = |fd: BorrowedFd<'_>, on: bool| {
            let flags = if on {
                FdFlag::FD_CLOEXEC
            } else {
                FdFlag::empty()
            };
            fcntl(fd, FcntlArg::F_SETFD(flags)).map(drop)
        };
        if let Some(fd) = inherit {
            set_cloexec(fd, false)?;
        }
        let child = cmd.spawn();
        if let Some(fd) = inherit {
            // Restored even when the spawn failed. Failing here is not the
            // child's fault; it is running and must be waited for.
            if let Err(e) = set_cloexec(fd, true) {
                tracing::warn!(error = %e, "cannot make a descriptor close-on-exec again");
            }
        }
        let child = child?;
        let pid = child.id() as i32;
        waiters.insert(pid, tx);
        Ok(Spawned {
            pid,
            exit: rx,
            marker: None,
            sup: Arc::clone(self),
            _child: child,
        })
    }

    /// The children being waited for: the live calls.
    pub fn live_pids(&self) -> std::collections::HashSet<i32> {
        self.waiters
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .keys()
            .copied()
            .collect()
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
    /// Whether the child has exited (or can no longer be watched).
    pub fn has_exited(&mut self) -> bool {
        !matches!(
            self.exit.try_recv(),
            Err(oneshot::error::TryRecvError::Empty)
        )
    }

    /// Tags the call so that [`crate::procs::end_call`] can find the
    /// processes that left its group; the caller sets the same
    /// `AGENTPLANE_CALL=<token>` on the command.
    pub fn with_marker(mut self, marker: String) -> Self {
        self.marker = Some(marker);
        self
    }

    /// The `AGENTPLANE_CALL=<token>` the call's processes carry, if any.
    pub fn marker(&self) -> Option<&str> {
        self.marker.as_deref()
    }

    /// Waits for the child to exit, or ends the whole call (see
    /// [`crate::procs`]) when `limits.timeout` passes or the output file
    /// outgrows `limits.output`. Dropping the future before it resolves (the
    /// caller went away) ends the call too, so an abandoned call leaves
    /// nothing running.
    pub async fn wait(self, limits: Limits) -> Result<Waited, crate::error::Error> {
        let Spawned {
            pid,
            mut exit,
            _child,
            marker,
            sup,
        } = self;
        let started = std::time::Instant::now();
        let mut guard = EndOnDrop {
            pid: Some(pid),
            marker: marker.clone(),
            sup: sup.clone(),
            started,
        };
        let over_limit = watch_output(limits.output.as_ref(), limits.cancel.clone());
        let reason = tokio::select! {
            res = &mut exit => {
                guard.pid = None;
                let exit = res.map_err(|_| crate::error::Error::SupervisorGone)?;
                // A call that outran the cap between two checks and exited
                // is still over it: the cap is on what a call writes, not
                // on how fast it writes it.
                if let Some(cap) = over_cap(limits.output.as_ref()) {
                    return Ok(Waited::Ended {
                        reason: Ended::OutputLimit(cap),
                        exit,
                        report: crate::procs::Ended {
                            killed: 0,
                            unattributed: Vec::new(),
                        },
                    });
                }
                return Ok(Waited::Exited(exit));
            }
            () = tokio::time::sleep(limits.timeout) => Ended::Timeout,
            ended = over_limit => ended,
        };
        guard.pid = None;
        let report = end(pid, marker.as_deref(), &sup, started);
        match exit.await {
            Ok(exit) => Ok(Waited::Ended {
                reason,
                exit,
                report,
            }),
            Err(_) => Err(crate::error::Error::SupervisorGone),
        }
    }
}

/// Resolves once the files together grow past their cap, or the call is
/// cancelled; never without either.
async fn watch_output(
    limit: Option<&OutputCap>,
    cancel: Option<Arc<tokio::sync::Notify>>,
) -> Ended {
    let cancelled = async {
        match cancel {
            Some(n) => n.notified().await,
            None => std::future::pending().await,
        }
    };
    let over = async {
        let Some(OutputCap { files, cap }) = limit else {
            return std::future::pending().await;
        };
        let mut tick = tokio::time::interval(OUTPUT_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if output_bytes(files) > *cap {
                return *cap;
            }
        }
    };
    tokio::select! {
        () = cancelled => Ended::Cancelled,
        cap = over => Ended::OutputLimit(cap),
    }
}

/// What the watched files hold together.
fn output_bytes(files: &[std::fs::File]) -> u64 {
    files
        .iter()
        .map(|f| f.metadata().map(|m| m.len()).unwrap_or(0))
        .sum()
}

/// The cap, when the files are over it.
fn over_cap(limit: Option<&OutputCap>) -> Option<u64> {
    let OutputCap { files, cap } = limit?;
    (output_bytes(files) > *cap).then_some(*cap)
}

/// How often a running call's output size is checked against its cap.
const OUTPUT_POLL: Duration = Duration::from_millis(100);

fn end(
    pid: i32,
    marker: Option<&str>,
    sup: &Supervisor,
    started: std::time::Instant,
) -> crate::procs::Ended {
    let mut spared = sup.live_pids();
    spared.remove(&pid);
    let since = crate::procs::now_ticks()
        .saturating_sub(crate::procs::ticks(started.elapsed()))
        .saturating_sub(1);
    match marker {
        Some(m) => crate::procs::end_call(pid, m, since, &spared),
        None => {
            kill_group(pid);
            crate::procs::Ended {
                killed: 1,
                unattributed: Vec::new(),
            }
        }
    }
}

/// What a wait may be cut short by.
#[derive(Debug)]
pub struct Limits {
    pub timeout: Duration,
    /// The call's output files and the most bytes they may hold together.
    pub output: Option<OutputCap>,
    /// Notified to cancel the call (a streamed call's `Cancel`).
    pub cancel: Option<Arc<tokio::sync::Notify>>,
}

/// Output files watched against a cap.
#[derive(Debug)]
pub struct OutputCap {
    pub files: Vec<std::fs::File>,
    pub cap: u64,
}

/// Why a call was ended before it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Timeout,
    /// The output passed this many bytes.
    OutputLimit(u64),
    /// The executor cancelled the call.
    Cancelled,
}

/// The outcome of [`Spawned::wait`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waited {
    Exited(Exit),
    /// The call was ended; `exit` is how its leader died and `report` what
    /// was killed and what could not be.
    Ended {
        reason: Ended,
        exit: Exit,
        report: crate::procs::Ended,
    },
}

struct EndOnDrop {
    pid: Option<i32>,
    marker: Option<String>,
    sup: Arc<Supervisor>,
    started: std::time::Instant,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.pid {
            end(pid, self.marker.as_deref(), &self.sup, self.started);
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
