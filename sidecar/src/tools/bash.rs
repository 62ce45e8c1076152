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
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

use super::{Ctx, parse};
use crate::Error;
use crate::output::{Body, Output};
use crate::reaper::{Exit, Waited, group_alive, kill_group};

#[derive(Deserialize)]
struct Input {
    command: Option<String>,
    #[serde(default)]
    restart: bool,
    timeout_ms: Option<i64>,
}

/// The program each call runs. `$1` is the snapshot to source, `$2` where to
/// write the next one, `$3` the command. The snapshot is restored with its
/// errors silenced: a readonly variable bash set itself (SHELLOPTS, when
/// exported) cannot be re-declared and that is not the model's business.
/// The save runs both as an epilogue and from the EXIT trap, so a command
/// that calls `exit` or replaces the trap still leaves a snapshot behind.
const WRAPPER: &str = r#"__agent_snap=$1 __agent_next=$2 __agent_cmd=$3
set --
if [[ -f $__agent_snap ]]; then . "$__agent_snap" 2>/dev/null; fi
__agent_save() {
  { export -p; declare -f; printf 'cd -- %q 2>/dev/null\n' "$PWD"; } >"$__agent_next" 2>/dev/null
}
trap '__agent_rc=$?; __agent_save; exit $__agent_rc' EXIT
eval "$__agent_cmd"
__agent_rc=$?
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

/// Forgets the shell state and ends what earlier calls left running.
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
    match fs::remove_file(&ctx.snapshot) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(Error::io(
            format!(
                "bash: cannot remove the shell snapshot {}",
                ctx.snapshot.display()
            ),
            e,
        )),
    }
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

    let mut cmd = Command::new("/bin/bash");
    cmd.args(["--noprofile", "--norc", "-c", WRAPPER, "agent-bash"])
        .arg(&ctx.snapshot)
        .arg(&next_snapshot)
        .arg(command)
        .current_dir(&ctx.workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    if ctx.snapshot.exists() {
        // The snapshot *is* the environment: starting empty is what lets an
        // `unset` in an earlier call stick.
        cmd.env_clear();
    } else {
        for (k, _) in std::env::vars_os() {
            if let Some(k) = k.to_str()
                && SCRUBBED_PREFIXES.iter().any(|p| k.starts_with(p))
            {
                cmd.env_remove(k);
            }
        }
    }
    let spawned = match ctx.supervisor.spawn(&mut cmd) {
        Ok(s) => s,
        Err(e) => {
            let _ = fs::remove_file(&out_path);
            return Err(Error::io("bash: cannot start /bin/bash", e));
        }
    };
    let pgid = spawned.pid;
    remember_group(ctx, pgid);

    let waited = spawned.wait(timeout).await;
    let waited = match waited {
        Ok(w) => w,
        Err(e) => {
            let _ = fs::remove_file(&out_path);
            let _ = fs::remove_file(&next_snapshot);
            return Err(e);
        }
    };
    let (trailer, is_error) = match waited {
        Waited::Exited(exit) => {
            install_snapshot(&next_snapshot, &ctx.snapshot);
            match exit {
                Exit::Code(0) => (String::new(), false),
                Exit::Code(c) => (format!("\nexit code: {c}"), true),
                Exit::Signal(s) => (
                    format!(
                        "\nexit code: {} (bash was killed by signal {s})",
                        exit.code()
                    ),
                    true,
                ),
            }
        }
        Waited::TimedOut(_) => {
            let _ = fs::remove_file(&next_snapshot);
            // The group is dead; there is nothing left for restart to end.
            forget_group(ctx, pgid);
            (
                format!(
                    "\ntimed out after {}ms: the command and every process it started were killed; the shell state is as it was before this call",
                    timeout.as_millis()
                ),
                true,
            )
        }
    };
    Ok(Output {
        body: Body::File(out_path),
        trailer,
        is_error,
    })
}

/// Makes `next` the session's snapshot. Last writer wins between concurrent
/// calls, as it would in one shell. Most calls change no state, and then the
/// old snapshot is kept: renaming over an existing file makes ext4 start
/// writeback (auto_da_alloc), which would cost every `bash` call a flush.
fn install_snapshot(next: &Path, current: &Path) {
    if same_contents(next, current) || fs::rename(next, current).is_err() {
        let _ = fs::remove_file(next);
    }
}

fn same_contents(a: &Path, b: &Path) -> bool {
    const MAX_COMPARED: u64 = 1 << 20;
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(ma), Ok(mb)) if ma.len() == mb.len() && ma.len() <= MAX_COMPARED => {
            matches!((fs::read(a), fs::read(b)), (Ok(x), Ok(y)) if x == y)
        }
        _ => false,
    }
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
