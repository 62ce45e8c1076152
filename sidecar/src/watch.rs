//! The sandbox's own bounds, watched by the runner: how many processes run
//! in it, and whether the kernel killed one of them for memory.
//!
//! The node's fences are the kernel's (the pod's PID limit, its memory
//! cgroup); what they do to a sandbox is ugly. At the PID limit every fork
//! fails, the runner's own included, and a fork bomb holds the sandbox
//! there for good; after an out-of-memory kill on a node that kills one
//! process (cgroup v1) the rest run on in a state nobody chose. So the
//! runner acts first and clearly: when the sandbox's processes reach
//! `--max-processes` (set below the pod's PID limit), or the memory
//! cgroup's OOM-kill count rises (`--end-on-oom`), it ends every process in
//! the sandbox, adds a notice to the results of the calls that were
//! running, writes why to the termination log, and exits with a code of
//! its own ([`runner_api::ended`]). The kubelet restarts it clean (the
//! workspace and bash's saved state are volumes, and survive); the
//! operator reads the exit and says in the session's status what happened.
//!
//! The watch is a thread of its own, started before anything else, so it
//! needs no thread, task or process when the limit has been reached.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use runner_api::ended::Ended;

use crate::procs;

/// How often the sandbox is looked at. A fork bomb doubles its processes
/// every few milliseconds, so this is not what stops it (the pod's PID
/// limit is); it decides how soon the sandbox is cleaned after.
pub const PERIOD: Duration = Duration::from_millis(100);

/// Most rounds of ending processes: each round kills what the last one's
/// walk saw, and what was forked in between is caught by the next.
const MAX_ROUNDS: usize = 64;

/// What the runner watches for.
#[derive(Debug, Clone, Default)]
pub struct WatchConfig {
    /// End the sandbox when it runs this many tasks (processes and their
    /// threads) besides the runner's own.
    pub max_processes: Option<usize>,
    /// The file the memory cgroup counts OOM kills in (`memory.events` or
    /// `memory.oom_control`, line `oom_kill N`); `None`: not watched.
    pub oom_events: Option<PathBuf>,
}

impl WatchConfig {
    /// Whether anything is watched.
    pub fn any(&self) -> bool {
        self.max_processes.is_some() || self.oom_events.is_some()
    }
}

/// The memory cgroup's OOM-kill counter of the runner's own cgroup, as the
/// container sees it: cgroup v2's `memory.events`, else v1's
/// `memory.oom_control`.
pub fn default_oom_events() -> Option<PathBuf> {
    [
        "/sys/fs/cgroup/memory.events",
        "/sys/fs/cgroup/memory/memory.oom_control",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| oom_kills(p).is_some())
}

/// The `oom_kill N` count in `path`.
pub fn oom_kills(path: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|n| n.trim().parse().ok())
}

/// The memory limit of the cgroup `oom_events` belongs to, as a person
/// reads it (`512Mi`), when there is one.
fn memory_limit(oom_events: &Path) -> Option<String> {
    let dir = oom_events.parent()?;
    let raw = ["memory.max", "memory.limit_in_bytes"]
        .iter()
        .find_map(|f| std::fs::read_to_string(dir.join(f)).ok())?;
    let bytes: u64 = raw.trim().parse().ok()?;
    // v1 reports "no limit" as a huge page-rounded number.
    (bytes < 1 << 60).then(|| match bytes {
        b if b % (1 << 30) == 0 => format!("{}Gi", b >> 30),
        b if b % (1 << 20) == 0 => format!("{}Mi", b >> 20),
        b => format!("{b} bytes"),
    })
}

/// What the watch saw, once: why the sandbox ended, in words for the
/// model, the termination log and the operator.
#[derive(Debug, Default)]
pub struct Alarm {
    breach: OnceLock<(Ended, String)>,
    /// The OOM-kill counter watched and its count at start, so that a call
    /// that ends by SIGKILL can tell at once whether memory killed it
    /// (the watch thread looks only every [`PERIOD`]).
    oom: OnceLock<(PathBuf, u64)>,
    /// Bumped when the breach is set, so a call can tell whether it
    /// happened while it ran.
    generation: AtomicU64,
    notify: tokio::sync::Notify,
}

impl Alarm {
    /// The generation a call starts in.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The notice for a call that started in `generation`, if the sandbox
    /// was ended since.
    pub fn since(&self, generation: u64) -> Option<&str> {
        (self.generation() != generation)
            .then(|| self.breach.get().map(|(_, m)| m.as_str()))
            .flatten()
    }

    /// Why the sandbox was ended, if it was.
    pub fn breach(&self) -> Option<&(Ended, String)> {
        self.breach.get()
    }

    /// Resolves once the sandbox has been ended.
    pub async fn ended(&self) {
        loop {
            let notified = self.notify.notified();
            if self.breach.get().is_some() {
                return;
            }
            notified.await;
        }
    }

    /// Whether the kernel has killed a process for memory since the start,
    /// looked at now; raises the alarm when it has. Called when a call
    /// ends, so its own result can say so.
    pub fn check_oom_now(&self) -> bool {
        let Some((path, baseline)) = self.oom.get() else {
            return false;
        };
        match oom_kills(path) {
            Some(now) if now > *baseline => {
                self.raise(Ended::OutOfMemory, oom_message(path));
                true
            }
            _ => false,
        }
    }

    fn raise(&self, why: Ended, message: String) {
        if self.breach.set((why, message)).is_ok() {
            self.generation.fetch_add(1, Ordering::AcqRel);
            self.notify.notify_waiters();
        }
    }
}

/// Starts the watch thread. Nothing is started when nothing is watched.
pub fn start(config: WatchConfig, alarm: Arc<Alarm>) -> std::io::Result<()> {
    if !config.any() {
        return Ok(());
    }
    let baseline = config.oom_events.as_deref().and_then(oom_kills);
    if let (Some(path), Some(count)) = (&config.oom_events, baseline) {
        let _ = alarm.oom.set((path.clone(), count));
    }
    std::thread::Builder::new()
        .name("sandbox-watch".into())
        .stack_size(256 << 10)
        .spawn(move || watch(&config, baseline, &alarm))
        .map(drop)
}

fn watch(config: &WatchConfig, baseline: Option<u64>, alarm: &Alarm) {
    let me = std::process::id() as i32;
    loop {
        std::thread::sleep(PERIOD);
        // Raised by a call that found the OOM kill first: end the rest.
        if alarm.breach().is_some() {
            end_everything(me);
            return;
        }
        if let (Some(path), Some(before)) = (&config.oom_events, baseline)
            && let Some(now) = oom_kills(path)
            && now > before
        {
            alarm.raise(Ended::OutOfMemory, oom_message(path));
            end_everything(me);
            return;
        }
        if let Some(max) = config.max_processes {
            let seen = tasks_besides(me);
            if seen >= max {
                alarm.raise(
                    Ended::ProcessLimit,
                    format!(
                        "the sandbox reached its limit of {max} processes ({seen} running); every process in it was ended and the sandbox restarts (its workspace and bash's saved state are kept)"
                    ),
                );
                end_everything(me);
                return;
            }
        }
    }
}

fn oom_message(path: &Path) -> String {
    let limit = memory_limit(path).map_or_else(
        || "its memory limit".to_owned(),
        |l| format!("its memory limit of {l}"),
    );
    format!(
        "a process in the sandbox was killed by the kernel for exceeding {limit}; every process in it was ended and the sandbox restarts (its workspace and bash's saved state are kept)"
    )
}

/// The tasks (threads, each process's main one included) the runner sees
/// besides its own: as PID 1 of its namespace, every one in it; otherwise
/// those of its descendants.
pub fn tasks_besides(me: i32) -> usize {
    let all = procs::scan();
    let ours: Vec<&procs::Proc> = if me == 1 {
        all.iter().filter(|p| p.pid != me).collect()
    } else {
        let mine = procs::descendants(&all, &HashSet::from([me]));
        all.iter()
            .filter(|p| p.pid != me && mine.contains(&p.pid))
            .collect()
    };
    ours.iter().map(|p| p.threads.max(1) as usize).sum()
}

/// Ends every process in the sandbox but the runner: stopped first, then
/// killed, round after round until none is left (or the rounds run out).
/// As PID 1, `kill(-1)` reaches every process of the namespace at once.
pub fn end_everything(me: i32) -> usize {
    let mut killed = 0;
    for _ in 0..MAX_ROUNDS {
        if me == 1 {
            let _ = kill(Pid::from_raw(-1), Signal::SIGSTOP);
            let _ = kill(Pid::from_raw(-1), Signal::SIGKILL);
        }
        let all = procs::scan();
        let left: Vec<i32> = if me == 1 {
            all.iter()
                .filter(|p| p.pid != me && !p.zombie)
                .map(|p| p.pid)
                .collect()
        } else {
            procs::descendants(&all, &HashSet::from([me]))
                .into_iter()
                .filter(|pid| *pid != me)
                .filter(|pid| all.iter().any(|p| p.pid == *pid && !p.zombie))
                .collect()
        };
        if left.is_empty() {
            break;
        }
        for pid in &left {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGSTOP);
        }
        for pid in &left {
            if kill(Pid::from_raw(*pid), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
    }
    killed
}

/// Writes why the sandbox ended to the termination log, within the
/// kubelet's bound.
pub fn write_termination_log(path: &Path, message: &str) -> std::io::Result<()> {
    let cut = toolset::truncate_runes(message, runner_api::ended::MAX_MESSAGE_BYTES);
    std::fs::write(path, cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_kill_counts_read_from_either_cgroup_version() {
        let dir = tempfile::tempdir().expect("tempdir");
        let v2 = dir.path().join("memory.events");
        std::fs::write(
            &v2,
            "low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\noom_group_kill 0\n",
        )
        .expect("write");
        assert_eq!(oom_kills(&v2), Some(2));
        let v1 = dir.path().join("memory.oom_control");
        std::fs::write(&v1, "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n").expect("write");
        assert_eq!(oom_kills(&v1), Some(7));
        std::fs::write(dir.path().join("memory.max"), "536870912\n").expect("write");
        assert_eq!(memory_limit(&v2).as_deref(), Some("512Mi"));
        std::fs::write(dir.path().join("memory.max"), "max\n").expect("write");
        assert_eq!(memory_limit(&v2), None);
    }

    #[test]
    fn a_call_sees_the_alarm_raised_while_it_ran_and_only_then() {
        let alarm = Alarm::default();
        let before = alarm.generation();
        assert_eq!(alarm.since(before), None);
        alarm.raise(Ended::ProcessLimit, "limit".into());
        assert_eq!(alarm.since(before), Some("limit"));
        let after = alarm.generation();
        assert_eq!(alarm.since(after), None, "a call started after it");
        alarm.raise(Ended::OutOfMemory, "second".into());
        assert_eq!(
            alarm.breach().map(|b| b.0),
            Some(Ended::ProcessLimit),
            "first wins"
        );
    }
}
