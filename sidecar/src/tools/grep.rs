//! grep: GNU grep in the sandbox, PCRE where the image's grep has it, POSIX
//! ERE otherwise. One implementation rather than ripgrep-or-a-walker, so the
//! behaviour depends on nothing the image ships beyond grep itself.

use std::fs::{self, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

use super::{Ctx, look_path, parse, required};
use crate::Error;
use crate::fsutil::describe;
use crate::output::{Body, Output};
use crate::reaper::{Ended, Exit, Limits, OutputCap, Waited};

/// Most of grep's stderr quoted back in an error.
const STDERR_LIMIT: usize = 4 << 10;

/// The grep the sandbox has, probed once per runner.
#[derive(Debug, Clone)]
pub enum GrepBinary {
    Found { path: PathBuf, pcre: bool },
    Missing,
}

#[derive(Deserialize)]
struct Input {
    pattern: Option<String>,
    path: Option<String>,
}

pub async fn run(ctx: &Ctx, id: &str, input: &[u8]) -> Result<Output, Error> {
    let input: Input = match parse("grep", input) {
        Ok(i) => i,
        Err(out) => return Ok(out),
    };
    let pattern = match required("grep", "pattern", &input.pattern) {
        Ok(p) => p.to_owned(),
        Err(out) => return Ok(out),
    };
    let (shown, target) = match input.path.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => (p.to_owned(), ctx.resolve(p)),
        None => (ctx.workdir.display().to_string(), ctx.workdir.clone()),
    };
    // grep -s hides unreadable files below the target; the target itself must
    // exist or the model would read "no matches" for a typo.
    if let Err(e) = fs::metadata(&target) {
        return Ok(Output::error(format!("grep {shown}: {}", describe(&e))));
    }
    let GrepBinary::Found { path: grep, pcre } = ctx.grep.clone() else {
        return Ok(Output::error(
            "grep: no grep program found on the sandbox's PATH; search with bash instead",
        ));
    };

    let out_path = ctx.call_file(id, "grep");
    let err_path = ctx.call_file(id, "grep-err");
    let open = |p: &PathBuf| {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(p)
            .map_err(|e| Error::io(format!("grep: cannot create {}", p.display()), e))
    };
    let out = open(&out_path)?;
    let watched = match out.try_clone() {
        Ok(f) => f,
        Err(e) => {
            let _ = fs::remove_file(&out_path);
            return Err(Error::io("grep: cannot duplicate the output file", e));
        }
    };
    let err = match open(&err_path) {
        Ok(f) => f,
        Err(e) => {
            let _ = fs::remove_file(&out_path);
            return Err(e);
        }
    };
    let mut cmd = Command::new(&grep);
    cmd.args([
        "-r",
        "-n",
        "-H",
        "-I",
        "-s",
        "--color=never",
        "--exclude-dir=.git",
    ])
    .arg(if pcre { "-P" } else { "-E" })
    .arg("-e")
    .arg(&pattern)
    .arg("--")
    .arg(&target)
    .current_dir(&ctx.workdir)
    .stdin(Stdio::null())
    .stdout(Stdio::from(out))
    .stderr(Stdio::from(err));
    let cleanup = |keep_out: bool| {
        if !keep_out {
            let _ = fs::remove_file(&out_path);
        }
        let _ = fs::remove_file(&err_path);
    };
    let spawned = match ctx.supervisor.spawn(&mut cmd) {
        Ok(s) => s,
        Err(e) => {
            cleanup(false);
            return Ok(Output::error(format!(
                "grep: cannot run {}: {}",
                grep.display(),
                describe(&e)
            )));
        }
    };
    let limits = Limits {
        timeout: toolset::DEFAULT_TIMEOUT,
        output: Some(OutputCap {
            files: vec![watched],
            cap: ctx.limits.max_output_bytes,
        }),
        cancel: None,
    };
    let waited = match spawned.wait(limits).await {
        Ok(w) => w,
        Err(e) => {
            cleanup(false);
            return Err(e);
        }
    };
    // grep prefixes its messages with its own path, which says nothing useful.
    let prefix = format!("{}: ", grep.display());
    let stderr = crate::output::read_head(&err_path, STDERR_LIMIT)
        .map(|(s, _)| s.trim().replace(&prefix, ""))
        .unwrap_or_default();
    let has_output = fs::metadata(&out_path)
        .map(|m| m.len() > 0)
        .unwrap_or(false);
    let result = match waited {
        Waited::Ended {
            reason: Ended::Timeout,
            ..
        } => {
            cleanup(false);
            Output::error(format!(
                "grep: timed out after {}ms; narrow the path or the pattern",
                timeout_ms(toolset::DEFAULT_TIMEOUT)
            ))
        }
        Waited::Ended {
            reason: Ended::Cancelled,
            ..
        } => {
            cleanup(false);
            Output::error("grep: cancelled")
        }
        Waited::Ended {
            reason: Ended::OutputLimit(cap),
            ..
        } => {
            cleanup(false);
            Output::error(format!(
                "grep: stopped after {cap} bytes of matches, the most one call may produce; narrow the path or the pattern"
            ))
        }
        Waited::Exited(Exit::Code(0)) => {
            cleanup(true);
            file_output(out_path.clone())
        }
        Waited::Exited(Exit::Code(1)) => {
            cleanup(false);
            Output::ok("no matches")
        }
        // Exit 2 with matches printed: some file below was unreadable, which
        // -s keeps quiet; the matches that were found still stand.
        Waited::Exited(Exit::Code(2)) if has_output => {
            cleanup(true);
            file_output(out_path.clone())
        }
        // Exit 2 with nothing said: -s silenced every error, so the only
        // trouble was files that vanished or could not be read during the
        // walk (a concurrent write's temporary file, say); the target itself
        // exists (checked above), and nothing readable matched.
        Waited::Exited(Exit::Code(2)) if stderr.is_empty() => {
            cleanup(false);
            Output::ok("no matches")
        }
        Waited::Exited(exit) => {
            cleanup(false);
            let why = if stderr.is_empty() {
                format!("grep exited with status {}", exit.code())
            } else {
                stderr
            };
            Output::error(format!("grep: {why}"))
        }
    };
    Ok(result)
}

fn file_output(path: PathBuf) -> Output {
    Output {
        body: Body::File(path),
        trailer: String::new(),
        is_error: false,
    }
}

fn timeout_ms(d: Duration) -> u128 {
    d.as_millis()
}

/// Finds grep on PATH and asks it once whether it has PCRE (`grep -P ''
/// /dev/null` exits 1, "no match", when it does and 2 when it was built
/// without). Runs at start-up, before the supervisor reaps children, so it
/// waits for its own child; a grep that does not answer within the probe's
/// bound is taken as having no PCRE.
pub fn probe() -> GrepBinary {
    let Some(path) = look_path("grep") else {
        return GrepBinary::Missing;
    };
    let pcre = Command::new(&path)
        .args(["-P", "", "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map(|mut child| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                match child.try_wait() {
                    Ok(Some(status)) => return matches!(status.code(), Some(0 | 1)),
                    Ok(None) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    _ => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return false;
                    }
                }
            }
        })
        .unwrap_or(false);
    tracing::info!(grep = %path.display(), pcre, "grep probed");
    GrepBinary::Found { path, pcre }
}
