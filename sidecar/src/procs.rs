//! Finding and ending every process a call started.
//!
//! A call's bash runs in its own process group, but a command can leave it:
//! `setsid` starts a new session and group, a double fork hands the child to
//! the runner (the subreaper) before the call ends. Killing the group alone
//! would leave those running while the result says everything was killed.
//!
//! So ending a call freezes and then kills three sets: the process group,
//! every descendant of the call's bash (walked through `/proc`), and every
//! orphan that carries the call's marker in its environment (a variable the
//! runner sets on the call's bash and that its children inherit). Freezing
//! (SIGSTOP) comes first so that nothing forks between the walk and the kill.
//! What cannot be attributed -- an orphan that started during the call but
//! dropped the marker with `env -i` -- is reported, not killed, because it
//! may belong to a concurrent call.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Read;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// The environment variable that marks a call's processes.
pub const MARKER_VAR: &str = "AGENTPLANE_CALL";

/// Most processes looked at in one walk of `/proc`.
const MAX_PROCS: usize = 1 << 16;
/// Most rounds of freeze-and-walk; each round catches children forked since
/// the last, and frozen processes cannot fork, so two or three suffice.
const MAX_ROUNDS: usize = 16;
/// Most of a process's environment read when looking for the marker.
const MAX_ENVIRON_BYTES: u64 = 1 << 20;

/// One line of `/proc/PID/stat`, the fields used here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    /// In clock ticks since boot.
    pub start: u64,
    pub comm: String,
    pub zombie: bool,
    /// Its tasks (threads), each of which counts against a PID limit.
    pub threads: u64,
}

/// Parses `/proc/PID/stat`. The command name is in parentheses and may
/// itself contain spaces and parentheses, so the fields after it are found
/// from the last `)`.
pub fn parse_stat(s: &str) -> Option<Proc> {
    let open = s.find('(')?;
    let close = s.rfind(')')?;
    let pid = s[..open].trim().parse().ok()?;
    let comm = s.get(open + 1..close)?.to_owned();
    let rest: Vec<&str> = s.get(close + 1..)?.split_whitespace().collect();
    // rest[0] is field 3 (state); field N is rest[N - 3].
    Some(Proc {
        pid,
        zombie: *rest.first()? == "Z",
        ppid: rest.get(1)?.parse().ok()?,
        pgid: rest.get(2)?.parse().ok()?,
        start: rest.get(19)?.parse().ok()?,
        threads: rest.get(17).and_then(|t| t.parse().ok()).unwrap_or(1),
        comm,
    })
}

/// The state letter of process `pid` (`R`, `S`, `T` stopped, `Z`, ...).
pub fn state(pid: i32) -> Option<char> {
    let s = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.get(s.rfind(')')? + 1..)?.trim_start().chars().next()
}

/// Every process visible in `/proc`, bounded.
pub fn scan() -> Vec<Proc> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .take(MAX_PROCS)
        .filter_map(|pid| parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?))
        .collect()
}

/// Whether process `pid`'s environment holds `needle` (a whole `K=V` entry,
/// or with `prefix_only`, an entry starting with it).
pub fn environ_has(pid: i32, needle: &str, prefix_only: bool) -> bool {
    let mut buf = Vec::new();
    let read = fs::File::open(format!("/proc/{pid}/environ"))
        .and_then(|f| f.take(MAX_ENVIRON_BYTES).read_to_end(&mut buf));
    read.is_ok()
        && buf.split(|&b| b == 0).any(|entry| {
            if prefix_only {
                entry.starts_with(needle.as_bytes())
            } else {
                entry == needle.as_bytes()
            }
        })
}

/// The pids in `procs` descended from any of `roots` (roots included when
/// present), following parent links.
pub fn descendants(procs: &[Proc], roots: &HashSet<i32>) -> HashSet<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for p in procs {
        children.entry(p.ppid).or_default().push(p.pid);
    }
    let mut out: HashSet<i32> = HashSet::new();
    let mut stack: Vec<i32> = roots.iter().copied().collect();
    while let Some(pid) = stack.pop() {
        if pid <= 1 || !out.insert(pid) {
            continue;
        }
        if let Some(c) = children.get(&pid) {
            stack.extend(c);
        }
    }
    out.retain(|pid| procs.iter().any(|p| p.pid == *pid));
    out
}

/// What ending a call left behind.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Ended {
    /// Processes killed (the call's bash included).
    pub killed: usize,
    /// Processes that started during the call and may be its, but could not
    /// be attributed to it, and so were left running: `pid (comm)`.
    pub unattributed: Vec<String>,
}

impl Ended {
    /// The sentence a timed-out result ends with.
    pub fn describe(&self) -> String {
        if self.unattributed.is_empty() {
            "the command and every process it started were killed".into()
        } else {
            format!(
                "the command and every process traced to it were killed; {} process(es) that started during the call had left its process tree and dropped its marker, so they may belong to another call and were left running: {}",
                self.unattributed.len(),
                self.unattributed.join(", ")
            )
        }
    }
}

/// Ends a call: the group `leader` leads, its descendants, and every orphan
/// marked with `marker` (`AGENTPLANE_CALL=<token>`). `started` is when the
/// call began, in clock ticks since boot (see [`now_ticks`]); `spared` are
/// pids that belong to other live calls and are never touched.
pub fn end_call(leader: i32, marker: &str, started: u64, spared: &HashSet<i32>) -> Ended {
    let me = std::process::id() as i32;
    let mut frozen: HashSet<i32> = HashSet::new();
    // Stop the group first: its members cannot fork while we look.
    if leader > 1 {
        let _ = killpg(Pid::from_raw(leader), Signal::SIGSTOP);
    }
    for _ in 0..MAX_ROUNDS {
        let procs = scan();
        let mut roots: HashSet<i32> = frozen.clone();
        roots.insert(leader);
        for p in &procs {
            if p.pgid == leader {
                roots.insert(p.pid);
            }
        }
        for p in &procs {
            if p.ppid == me
                && !p.zombie
                && !spared.contains(&p.pid)
                && !frozen.contains(&p.pid)
                && environ_has(p.pid, marker, false)
            {
                roots.insert(p.pid);
            }
        }
        let tree = descendants(&procs, &roots);
        let new: Vec<i32> = tree
            .into_iter()
            .filter(|pid| *pid != me && !spared.contains(pid) && !frozen.contains(pid))
            .collect();
        if new.is_empty() {
            break;
        }
        for pid in new {
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
            frozen.insert(pid);
        }
    }
    if leader > 1 {
        let _ = killpg(Pid::from_raw(leader), Signal::SIGKILL);
    }
    for pid in &frozen {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    let unattributed = scan()
        .into_iter()
        .filter(|p| {
            p.ppid == me
                && !p.zombie
                && p.start >= started
                && !frozen.contains(&p.pid)
                && !spared.contains(&p.pid)
                && !environ_has(p.pid, &format!("{MARKER_VAR}="), true)
        })
        .map(|p| format!("{} ({})", p.pid, p.comm))
        .collect();
    Ended {
        killed: frozen.len().max(1),
        unattributed,
    }
}

/// Kills every process of any call of this runner (`restart`): everything
/// whose marker starts with `prefix` (`AGENTPLANE_CALL=<runner instance>.`),
/// and the trees below them, except `spared`. Another runner's calls on the
/// same machine carry another instance and are never touched.
pub fn end_all_calls(prefix: &str, spared: &HashSet<i32>) -> usize {
    let me = std::process::id() as i32;
    let procs = scan();
    let roots: HashSet<i32> = procs
        .iter()
        .filter(|p| p.pid != me && !p.zombie && !spared.contains(&p.pid))
        .filter(|p| environ_has(p.pid, prefix, true))
        .map(|p| p.pid)
        .collect();
    let tree = descendants(&procs, &roots);
    let mut n = 0;
    for pid in tree {
        if pid != me && !spared.contains(&pid) && kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok()
        {
            n += 1;
        }
    }
    n
}

/// Stops (SIGSTOP) every process of any call of this runner -- the
/// background jobs earlier calls left, found by marker as
/// [`end_all_calls`] finds them -- and the trees below them, except
/// `spared`, and returns them for [`resume`]. Two rounds, so a child
/// forked while the first round ran is stopped too.
pub fn pause_all_calls(prefix: &str, spared: &HashSet<i32>) -> Vec<i32> {
    let me = std::process::id() as i32;
    let mut stopped: HashSet<i32> = HashSet::new();
    for _ in 0..2 {
        let procs = scan();
        let roots: HashSet<i32> = procs
            .iter()
            .filter(|p| p.pid != me && !p.zombie && !spared.contains(&p.pid))
            .filter(|p| environ_has(p.pid, prefix, true))
            .map(|p| p.pid)
            .collect();
        for pid in descendants(&procs, &roots) {
            if pid != me
                && !spared.contains(&pid)
                && !stopped.contains(&pid)
                && kill(Pid::from_raw(pid), Signal::SIGSTOP).is_ok()
            {
                stopped.insert(pid);
            }
        }
    }
    stopped.into_iter().collect()
}

/// Continues (SIGCONT) what [`pause_all_calls`] stopped.
pub fn resume(pids: &[i32]) {
    for &pid in pids {
        let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
    }
}

/// Clock ticks since boot, the unit of [`Proc::start`].
pub fn now_ticks() -> u64 {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok())
        .map(|up| (up * hz) as u64)
        .unwrap_or(0)
}

/// Clock ticks in `d`.
pub fn ticks(d: std::time::Duration) -> u64 {
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    (d.as_secs_f64() * hz) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_hostile_comm() {
        let s = "4242 (a) b (c)) S 7 4242 4242 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let p = parse_stat(s).unwrap();
        assert_eq!(p.pid, 4242);
        assert_eq!(p.comm, "a) b (c)");
        assert_eq!(p.ppid, 7);
        assert_eq!(p.pgid, 4242);
        assert_eq!(p.start, 987654);
        assert!(!p.zombie);
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) S").is_none());
    }

    #[test]
    fn descendants_follow_parents() {
        let p = |pid, ppid| Proc {
            pid,
            ppid,
            pgid: pid,
            start: 0,
            comm: String::new(),
            zombie: false,
            threads: 1,
        };
        let procs = vec![p(10, 1), p(11, 10), p(12, 11), p(13, 1), p(14, 13)];
        let d = descendants(&procs, &HashSet::from([10]));
        assert_eq!(d, HashSet::from([10, 11, 12]));
    }

    #[test]
    fn own_stat_parses() {
        let me = std::process::id() as i32;
        let s = fs::read_to_string(format!("/proc/{me}/stat")).unwrap();
        let p = parse_stat(&s).unwrap();
        assert_eq!(p.pid, me);
        assert!(p.start <= now_ticks() + 1);
        assert!(p.threads >= 1);
    }
}
