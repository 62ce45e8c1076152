//! bash without a persistent shell.
//!
//! Each call is a fresh `/bin/bash` in its own process group (started ahead
//! of the call, see [`crate::tools::shell`]) that first evaluates the session
//! snapshot (exported environment, functions, cwd) and, on exit, writes the
//! next one. The snapshot lives on disk, so the session's
//! shell state survives a runner restart, and no long-lived shell can be
//! wedged by a command that left it in a strange state.
//!
//! Output goes to a per-call file, not a pipe: a background job (`server &`)
//! inherits the file, not a pipe the runner would wait to close, so the call
//! ends when the shell does; what the job writes after that reaches a later
//! result (see [`crate::tools::late`]). A timeout SIGKILLs the whole
//! process group.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::calls::Record;
use crate::error::Error;
use crate::output::{Body, Output, Part};
use crate::procs::MARKER_VAR;
use crate::reaper::{Ended, Exit, Limits, OutputCap, Waited, group_alive, kill_group};
use crate::tools::ctx::Ctx;
use crate::tools::input::parse;
use crate::tools::shell::{self, Shell};

/// A bash call as its input asks for it, checked before anything runs.
struct Request {
    /// `None` only with `restart`.
    command: Option<String>,
    restart: bool,
    timeout: Duration,
}

/// Every refusal, before `restart` acts, so bad input changes nothing.
fn request(input: &[u8]) -> Result<Request, Output> {
    let input = parse("bash", input)?;
    let command = input.string("command")?;
    let restart = input.boolean("restart")?.unwrap_or(false);
    let timeout = timeout(input.integer("timeout_ms", "a whole number of milliseconds")?)?;
    // Only an empty command is missing: "   " is a command (it does nothing).
    let command = command.filter(|c| !c.is_empty());
    if command.as_deref().is_some_and(|c| c.contains('\0')) {
        return Err(Output::error(
            "bash: command contains a NUL byte, which a shell command cannot hold",
        ));
    }
    if command.is_none() && !restart {
        return Err(Output::error("bash: command is required"));
    }
    Ok(Request {
        command,
        restart,
        timeout,
    })
}

/// [`request`]'s refusal, if any (for the fuzz targets).
pub(crate) fn check(input: &[u8]) -> Result<(), Output> {
    request(input).map(drop)
}

pub async fn run(
    ctx: &Ctx,
    id: &str,
    input: &[u8],
    live: Option<&Record>,
) -> Result<Output, Error> {
    let req = match request(input) {
        Ok(r) => r,
        Err(out) => return Ok(out),
    };
    if req.restart {
        restart(ctx)?;
    }
    let Some(command) = req.command else {
        return Ok(Output::ok("bash session restarted"));
    };

    exec(ctx, id, &command, req.timeout, live).await
}

/// `timeout_ms`: absent or 0 means the default; over the maximum is refused
/// rather than silently shortened, so the model knows what it will get.
fn timeout(ms: Option<i128>) -> Result<Duration, Output> {
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
    ctx.late.clear();
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

async fn exec(
    ctx: &Ctx,
    id: &str,
    command: &str,
    timeout: Duration,
    live: Option<&Record>,
) -> Result<Output, Error> {
    let loaded = ctx.snapshot.load();
    let initial = ctx.initial_state();
    let state = loaded.state.as_deref().unwrap_or(&initial);
    let sh = start_shell(ctx, &shell::payload(state, command)).await?;
    // The next call's shell starts while this command runs.
    park_next(ctx);
    let Shell {
        spawned,
        out_path,
        err_path,
        watched,
        next_snapshot,
        ..
    } = sh;
    let pgid = spawned.pid;
    let marker = spawned.marker().map(str::to_owned);
    remember_group(ctx, pgid);
    if let Some(r) = live {
        r.running(out_path.clone(), err_path.clone());
    }

    let limits = Limits {
        timeout,
        output: Some(OutputCap {
            files: watched,
            cap: ctx.limits.max_output_bytes,
        }),
        cancel: live.map(|r| Arc::clone(&r.cancel)),
    };
    let waited = match spawned.wait(limits).await {
        Ok(w) => w,
        Err(e) => {
            let _ = fs::remove_file(&out_path);
            let _ = fs::remove_file(&err_path);
            let _ = fs::remove_file(&next_snapshot);
            return Err(e);
        }
    };

    let mut trailer = String::new();
    if let Some(notice) = loaded.notice {
        trailer.push('\n');
        trailer.push_str(&notice);
    }
    let (is_error, ended) = match waited {
        Waited::Exited(exit) => {
            if let Some(notice) = ctx.snapshot.install(&next_snapshot) {
                trailer.push('\n');
                trailer.push_str(&notice);
            }
            (exit_trailer(exit, &mut trailer), false)
        }
        Waited::Ended { reason, report, .. } => {
            let _ = fs::remove_file(&next_snapshot);
            // The group is dead; there is nothing left for restart to end.
            forget_group(ctx, pgid);
            trailer.push_str(&ended_trailer(reason, &report, timeout));
            (true, true)
        }
    };
    // What earlier calls' jobs wrote since comes first: most of it was
    // written before this call's own output.
    let mut parts = ctx.late.collect();
    match Written::open(&out_path, &err_path) {
        Ok(own) => {
            if let Some(r) = live {
                r.output_ends([own.out_len, own.err_len]);
            }
            parts.extend(own.parts(is_error));
            // Jobs this call left running keep writing to its files: they
            // are followed, and what they write reaches a later result.
            if !ended && group_alive(pgid) {
                ctx.late.follow(
                    id,
                    pgid,
                    marker,
                    (out_path, own.out_len),
                    (err_path, own.err_len),
                );
            } else {
                let _ = fs::remove_file(&out_path);
                let _ = fs::remove_file(&err_path);
            }
        }
        Err(e) => {
            let _ = fs::remove_file(&out_path);
            let _ = fs::remove_file(&err_path);
            parts.push(Part::Text(format!(
                "[the output could not be read back: {}]",
                crate::fsutil::describe(&e)
            )));
        }
    }
    Ok(Output {
        body: Body::Parts(parts),
        trailer,
        is_error,
    })
}

/// A finished call's stdout and stderr, open, and how much each held when
/// the call was done: what this call's result shows. Whatever comes later
/// is its background jobs' (see [`crate::tools::late`]).
struct Written {
    out: Arc<fs::File>,
    err: Arc<fs::File>,
    out_len: u64,
    err_len: u64,
}

impl Written {
    fn open(out: &Path, err: &Path) -> std::io::Result<Written> {
        let out = fs::File::open(out)?;
        let err = fs::File::open(err)?;
        let (out_len, err_len) = (out.metadata()?.len(), err.metadata()?.len());
        Ok(Written {
            out: Arc::new(out),
            err: Arc::new(err),
            out_len,
            err_len,
        })
    }

    /// stdout, then stderr -- stderr first when the call failed, where the
    /// reason usually is -- as the reference joins them, with a newline
    /// between when stderr is not empty; "(no output)" for a failed call
    /// that printed nothing.
    fn parts(&self, failed: bool) -> Vec<Part> {
        if failed && self.out_len == 0 && self.err_len == 0 {
            return vec![Part::Text("(no output)".into())];
        }
        let out = Part::Range {
            file: Arc::clone(&self.out),
            start: 0,
            len: self.out_len,
        };
        let err = Part::Range {
            file: Arc::clone(&self.err),
            start: 0,
            len: self.err_len,
        };
        let (first, second) = if failed { (err, out) } else { (out, err) };
        let mut parts = vec![first];
        if self.err_len > 0 {
            parts.push(Part::Text("\n".into()));
        }
        parts.push(second);
        parts
    }
}

/// The parked shell, handed this call's payload, or a new shell when none
/// is parked or the parked one cannot take it.
async fn start_shell(ctx: &Ctx, payload: &[u8]) -> Result<Shell, Error> {
    let parked = ctx
        .parked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    let started = match parked {
        Some(mut p) => {
            if p.start(payload) {
                Some(p)
            } else {
                p.discard();
                None
            }
        }
        None => None,
    };
    match started {
        Some(sh) => Ok(sh),
        None => shell::spawn(ctx.spawner(), Some(payload)),
    }
}

/// Appends how bash exited to `trailer`, as the reference words it;
/// whether that is an error.
fn exit_trailer(exit: Exit, trailer: &mut String) -> bool {
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

/// Why the runner ended the call and what it killed, so the model knows
/// the shell state was not kept.
fn ended_trailer(reason: Ended, report: &crate::procs::Ended, timeout: Duration) -> String {
    let why = match reason {
        Ended::Timeout => format!("timed out after {}ms", timeout.as_millis()),
        Ended::OutputLimit(cap) => {
            format!("stopped: the output passed {cap} bytes, the most one call may write")
        }
        Ended::Cancelled => "cancelled".to_owned(),
    };
    format!(
        "\n{why}: {}; the shell state is as it was before this call",
        report.describe()
    )
}

/// Starts the shell the next call will use, unless one is already parked.
/// A shell that cannot be started now is not an error: the next call then
/// starts its own.
fn park_next(ctx: &Ctx) {
    if !ctx.limits.park_shells {
        return;
    }
    let mut slot = ctx
        .parked
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if slot.is_none() {
        match shell::spawn(ctx.spawner(), None) {
            Ok(sh) => *slot = Some(sh),
            Err(e) => tracing::warn!(error = %e, "cannot start a shell ahead of the next call"),
        }
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
