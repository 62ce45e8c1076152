//! bash without a persistent shell.
//!
//! Each call is a fresh `/bin/bash` in its own process group that first
//! sources the session snapshot (exported environment, functions, cwd) and,
//! on exit, writes the next one. The snapshot lives on disk, so the session's
//! shell state survives a runner restart, and no long-lived shell can be
//! wedged by a command that left it in a strange state.
//!
//! Output goes to a per-call file, not a pipe: a background job (`server &`)
//! inherits the file, not a pipe the runner would wait to close, so the call
//! ends when the shell does. A timeout SIGKILLs the whole process group.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

use super::{BASH, Ctx, parse};
use crate::Error;
use crate::output::{Body, Output};
use crate::procs::MARKER_VAR;
use crate::reaper::{Ended, Exit, Limits, Waited, group_alive, kill_group};

#[derive(Deserialize)]
struct Input {
    command: Option<String>,
    #[serde(default)]
    restart: bool,
    timeout_ms: Option<i64>,
}

/// The program each call runs. Standard input holds the session's snapshot
/// (verified by the runner, see [`crate::snapshot`]) and the command, each
/// ended by a NUL; the snapshot is evaluated first, then stdin is replaced by
/// /dev/null for the command. The command travels on stdin rather than in
/// argv, where the kernel refuses one argument over 128 KiB. `$1` is where
/// to write the next snapshot. The snapshot is restored
/// with its errors silenced: a readonly variable bash set itself (SHELLOPTS,
/// when exported) cannot be re-declared and that is not the model's business.
/// The save runs as an epilogue, and from the EXIT trap when the command
/// calls `exit` or the shell dies of an error; the call marker is never
/// saved, so a later call's processes never carry an earlier call's marker.
const WRAPPER: &str = r#"__agent_next=$1
set --
IFS= read -r -d '' __agent_snap
IFS= read -r -d '' __agent_cmd
eval "$__agent_snap" 2>/dev/null
unset __agent_snap
exec 0</dev/null
__agent_save() {
  export -n AGENTPLANE_CALL 2>/dev/null
  { export -p; declare -f; printf 'cd -- %q 2>/dev/null\n' "$PWD"; } >"$__agent_next" 2>/dev/null
}
trap '__agent_rc=$?; __agent_save; exit $__agent_rc' EXIT
eval "$__agent_cmd"
__agent_rc=$?
trap - EXIT
__agent_save
exit $__agent_rc
"#;

/// Environment variables a model-driven shell never inherits from the runner
/// (the reference scrubs the same namespace: API credentials).
const SCRUBBED_PREFIXES: [&str; 1] = ["ANTHROPIC_"];

pub async fn run(ctx: &Ctx, id: &str, input: &[u8]) -> Result<Output, Error> {
    let input: Input = match parse("bash", input) {
        Ok(i) => i,
        Err(out) => return Ok(out),
    };
    // Every refusal comes before `restart` acts, so bad input changes nothing.
    let timeout = match timeout(input.timeout_ms) {
        Ok(t) => t,
        Err(out) => return Ok(out),
    };
    let command = input.command.filter(|c| !c.trim().is_empty());
    if command.as_deref().is_some_and(|c| c.contains('\0')) {
        return Ok(Output::error(
            "bash: command contains a NUL byte, which a shell command cannot hold",
        ));
    }
    if input.restart {
        restart(ctx)?;
        if command.is_none() {
            return Ok(Output::ok("bash session restarted"));
        }
    }
    let Some(command) = command else {
        return Ok(Output::error("bash: command is required"));
    };

    exec(ctx, id, &command, timeout).await
}

/// `timeout_ms`: absent or 0 means the default; over the maximum is refused
/// rather than silently shortened, so the model knows what it will get.
fn timeout(ms: Option<i64>) -> Result<Duration, Output> {
    let max_ms = toolset::MAX_TIMEOUT.as_millis();
    match ms {
        None | Some(0) => Ok(toolset::DEFAULT_TIMEOUT),
        Some(ms) if ms < 0 => Err(Output::error(format!(
            "bash: timeout_ms must be a positive number of milliseconds (at most {max_ms}), got {ms}"
        ))),
        Some(ms) if ms as u128 > max_ms => Err(Output::error(format!(
            "bash: timeout_ms {ms} is over the maximum of {max_ms} ({} min); ask for at most {max_ms}",
            toolset::MAX_TIMEOUT.as_secs() / 60
        ))),
        Some(ms) => Ok(Duration::from_millis(ms as u64)),
    }
}

/// Forgets the shell state and ends what earlier calls left running: their
/// process groups, and everything that carries a call marker (a job that
/// left its group with `setsid`), except calls still running.
fn restart(ctx: &Ctx) -> Result<(), Error> {
    let groups: Vec<i32> = {
        let mut g = ctx
            .bash_groups
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        g.drain().collect()
    };
    for pgid in groups {
        kill_group(pgid);
    }
    crate::procs::end_all_calls(
        &format!("{MARKER_VAR}={}.", ctx.instance),
        &ctx.supervisor.live_pids(),
    );
    ctx.snapshot.clear().map_err(|e| {
        Error::io(
            format!(
                "bash: cannot remove the shell snapshot {}",
                ctx.snapshot.path().display()
            ),
            e,
        )
    })
}

async fn exec(ctx: &Ctx, id: &str, command: &str, timeout: Duration) -> Result<Output, Error> {
    let out_path = ctx.call_file(id, "out");
    let next_snapshot = ctx.call_file(id, "snap");
    let out = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&out_path)
        .map_err(|e| Error::io(format!("bash: cannot create {}", out_path.display()), e))?;
    let err = out
        .try_clone()
        .map_err(|e| Error::io("bash: cannot duplicate the output file", e))?;
    let watched = out
        .try_clone()
        .map_err(|e| Error::io("bash: cannot duplicate the output file", e))?;
    let loaded = ctx.snapshot.load();
    let state = loaded.state.as_deref().unwrap_or_default();
    let input = crate::snapshot::private_input(&[state, command.as_bytes()])
        .map_err(|e| Error::io("bash: cannot pass the command to the shell", e))?;
    let marker = format!("{}.{}", ctx.instance, ctx.next_seq());

    let mut cmd = Command::new(BASH);
    cmd.args(["--noprofile", "--norc", "-c", WRAPPER, "agent-bash"])
        .arg(&next_snapshot)
        .current_dir(&ctx.workdir)
        .stdin(Stdio::from(input))
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    match loaded.state {
        Some(_) => {
            // The snapshot *is* the environment: starting empty is what lets
            // an `unset` in an earlier call stick.
            cmd.env_clear();
        }
        None => {
            for (k, _) in std::env::vars_os() {
                if let Some(k) = k.to_str()
                    && SCRUBBED_PREFIXES.iter().any(|p| k.starts_with(p))
                {
                    cmd.env_remove(k);
                }
            }
        }
    }
    cmd.env(MARKER_VAR, &marker);
    let spawned = match ctx.supervisor.spawn(&mut cmd) {
        Ok(s) => s.with_marker(format!("{MARKER_VAR}={marker}")),
        Err(e) => {
            let _ = fs::remove_file(&out_path);
            return Err(Error::io(format!("bash: cannot start {BASH}"), e));
        }
    };
    let pgid = spawned.pid;
    remember_group(ctx, pgid);

    let limits = Limits {
        timeout,
        output: Some((watched, ctx.limits.max_output_bytes)),
    };
    let waited = match spawned.wait(limits).await {
        Ok(w) => w,
        Err(e) => {
            let _ = fs::remove_file(&out_path);
            let _ = fs::remove_file(&next_snapshot);
            return Err(e);
        }
    };
    let mut trailer = String::new();
    if let Some(notice) = loaded.notice {
        trailer.push('\n');
        trailer.push_str(&notice);
    }
    let is_error = match waited {
        Waited::Exited(exit) => {
            if let Some(notice) = ctx.snapshot.install(&next_snapshot) {
                trailer.push('\n');
                trailer.push_str(&notice);
            }
            match exit {
                Exit::Code(0) => false,
                Exit::Code(c) => {
                    trailer.push_str(&format!("\nexit code: {c}"));
                    true
                }
                Exit::Signal(s) => {
                    trailer.push_str(&format!(
                        "\nexit code: {} (bash was killed by signal {s})",
                        exit.code()
                    ));
                    true
                }
            }
        }
        Waited::Ended { reason, report, .. } => {
            let _ = fs::remove_file(&next_snapshot);
            // The group is dead; there is nothing left for restart to end.
            forget_group(ctx, pgid);
            let why = match reason {
                Ended::Timeout => format!("timed out after {}ms", timeout.as_millis()),
                Ended::OutputLimit(cap) => {
                    format!("stopped: the output passed {cap} bytes, the most one call may write")
                }
            };
            trailer.push_str(&format!(
                "\n{why}: {}; the shell state is as it was before this call",
                report.describe()
            ));
            true
        }
    };
    Ok(Output {
        body: Body::File(out_path),
        trailer,
        is_error,
    })
}

fn remember_group(ctx: &Ctx, pgid: i32) {
    let mut g = ctx
        .bash_groups
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    // Keep the set to groups that still have members.
    g.retain(|&p| group_alive(p));
    g.insert(pgid);
}

fn forget_group(ctx: &Ctx, pgid: i32) {
    ctx.bash_groups
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(&pgid);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_rules() {
        assert_eq!(timeout(None).ok(), Some(toolset::DEFAULT_TIMEOUT));
        assert_eq!(timeout(Some(0)).ok(), Some(toolset::DEFAULT_TIMEOUT));
        assert_eq!(timeout(Some(1000)).ok(), Some(Duration::from_secs(1)));
        assert!(timeout(Some(-1)).is_err());
        assert!(timeout(Some(600_000)).is_ok());
        assert!(timeout(Some(600_001)).is_err());
    }
}
