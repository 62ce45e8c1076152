//! `agent-sidecar pids-probe`: whether the pod it runs in has a process
//! limit, found the only way a pod can find it (its cgroup's limit is set
//! on the pod's cgroup, which a container does not see): by starting
//! threads (each a task, counted like a process) until the kernel refuses
//! one. The chart's `helm test` runs it, so a platform learns whether its
//! nodes enforce the per-pod PID limit the sandboxes rely on.

use std::sync::Arc;

/// What the probe met.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probed {
    /// The kernel refused a thread after this many were running.
    Limited { started: u32, error: String },
    /// `max` threads started and none was refused.
    Unlimited { max: u32 },
}

/// Starts up to `max` threads, parked until the probe ends, then ends
/// them all.
pub fn probe(max: u32) -> Probed {
    let gate = Arc::new(std::sync::RwLock::new(()));
    let held = gate
        .write()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut handles = Vec::new();
    let mut outcome = Probed::Unlimited { max };
    for started in 0..max {
        let gate = Arc::clone(&gate);
        let spawned = std::thread::Builder::new()
            .stack_size(16 << 10)
            .spawn(move || drop(gate.read()));
        match spawned {
            Ok(h) => handles.push(h),
            Err(e) => {
                outcome = Probed::Limited {
                    started,
                    error: e.to_string(),
                };
                break;
            }
        }
    }
    drop(held);
    for h in handles {
        let _ = h.join();
    }
    outcome
}

/// Runs the probe and prints what it met; the exit code says whether a
/// limit was met.
pub fn run(max: u32) -> u8 {
    match probe(max) {
        Probed::Limited { started, error } => {
            println!(
                "this pod's process limit was met at about {} tasks (the probe's thread {} was refused: {error}); a fork bomb in one sandbox ends at its own pod's limit",
                started + 1,
                started + 1
            );
            0
        }
        Probed::Unlimited { max } => {
            println!(
                "no process limit met: {max} threads started in this pod; set the kubelet's podPidsLimit on every node that runs sandboxes, or a fork bomb in one can exhaust the node's"
            );
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_probe_meets_no_limit_here_and_ends_its_threads() {
        assert_eq!(probe(16), Probed::Unlimited { max: 16 });
        let me = std::process::id();
        let threads = std::fs::read_to_string(format!("/proc/{me}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Threads:"))
                    .and_then(|n| n.trim().parse::<u32>().ok())
            })
            .unwrap_or(0);
        assert!(
            threads < 16 + 8,
            "the probe's threads were left running: {threads}"
        );
    }
}
