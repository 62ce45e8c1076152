//! grep: GNU grep in the sandbox, PCRE where the image's grep has it, POSIX
//! ERE otherwise. One implementation rather than ripgrep-or-a-walker, so the
//! behaviour depends on nothing the image ships beyond grep itself.

use std::fs::{self, File, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde::Deserialize;

use crate::error::Error;
use crate::fsutil::describe;
use crate::output::{Body, Output};
use crate::reaper::{Ended, Exit, Limits, OutputCap, Waited};
use crate::tools::ctx::Ctx;
use crate::tools::input::{parse, required};
use crate::tools::programs::GrepBinary;

/// Most of grep's stderr quoted back in an error.
const STDERR_LIMIT: usize = 4 << 10;

#[derive(Deserialize)]
struct Input {
    pattern: Option<String>,
    path: Option<String>,
}

/// A grep as its input asks for it, checked before anything runs.
struct Request {
    pattern: String,
    path: Option<String>,
}

fn request(input: &[u8]) -> Result<Request, Output> {
    let input: Input = parse("grep", input)?;
    let pattern = required("grep", "pattern", &input.pattern)?.to_owned();
    Ok(Request {
        pattern,
        path: input.path,
    })
}

/// [`request`]'s refusal, if any (for the fuzz targets).
pub(crate) fn check(input: &[u8]) -> Result<(), Output> {
    request(input).map(drop)
}

pub async fn run(ctx: &Ctx, id: &str, input: &[u8]) -> Result<Output, Error> {
    let input = match request(input) {
        Ok(r) => r,
        Err(out) => return Ok(out),
    };
    let pattern = input.pattern;
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
    let search = Search {
        grep,
        pcre,
        pattern,
        target,
    };
    search.run(ctx, id).await
}

/// One grep run, its input checked.
struct Search {
    grep: PathBuf,
    pcre: bool,
    pattern: String,
    target: PathBuf,
}

impl Search {
    async fn run(&self, ctx: &Ctx, id: &str) -> Result<Output, Error> {
        let files = CallFiles {
            out: ctx.call_file(id, "grep"),
            err: ctx.call_file(id, "grep-err"),
        };
        let (out, watched, err) = files.create()?;
        let mut cmd = self.command(&ctx.workdir, out, err);
        let spawned = match ctx.supervisor.spawn(&mut cmd) {
            Ok(s) => s,
            Err(e) => {
                files.cleanup(false);
                return Ok(Output::error(format!(
                    "grep: cannot run {}: {}",
                    self.grep.display(),
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
                files.cleanup(false);
                return Err(e);
            }
        };
        Ok(self.verdict(waited, &files))
    }

    fn command(&self, workdir: &Path, out: File, err: File) -> Command {
        let mut cmd = Command::new(&self.grep);
        cmd.args([
            "-r",
            "-n",
            "-H",
            "-I",
            "-s",
            "--color=never",
            "--exclude-dir=.git",
        ])
        .arg(if self.pcre { "-P" } else { "-E" })
        .arg("-e")
        .arg(&self.pattern)
        .arg("--")
        .arg(&self.target)
        .current_dir(workdir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
        cmd
    }

    /// What the model reads of a finished grep; the call's files are
    /// removed, except the output when the output is the result.
    fn verdict(&self, waited: Waited, files: &CallFiles) -> Output {
        // grep prefixes its messages with its own path, which says nothing useful.
        let prefix = format!("{}: ", self.grep.display());
        let stderr = crate::output::read_head(&files.err, STDERR_LIMIT)
            .map(|(s, _)| s.trim().replace(&prefix, ""))
            .unwrap_or_default();
        let has_output = fs::metadata(&files.out)
            .map(|m| m.len() > 0)
            .unwrap_or(false);
        let (keep_out, output) = match waited {
            Waited::Ended { reason, .. } => (false, ended(reason)),
            Waited::Exited(Exit::Code(0)) => (true, file_output(files.out.clone())),
            Waited::Exited(Exit::Code(1)) => (false, Output::ok("no matches")),
            // Exit 2 with matches printed: some file below was unreadable,
            // which -s keeps quiet; the matches that were found still stand.
            Waited::Exited(Exit::Code(2)) if has_output => (true, file_output(files.out.clone())),
            // Exit 2 with nothing said: -s silenced every error, so the only
            // trouble was files that vanished or could not be read during
            // the walk (a concurrent write's temporary file, say); the
            // target itself exists (checked before), and nothing readable
            // matched.
            Waited::Exited(Exit::Code(2)) if stderr.is_empty() => (false, Output::ok("no matches")),
            Waited::Exited(exit) => {
                let why = if stderr.is_empty() {
                    format!("grep exited with status {}", exit.code())
                } else {
                    stderr
                };
                (false, Output::error(format!("grep: {why}")))
            }
        };
        files.cleanup(keep_out);
        output
    }
}

/// A grep the runner ended: what the model is told to do about it.
fn ended(reason: Ended) -> Output {
    match reason {
        Ended::Timeout => Output::error(format!(
            "grep: timed out after {}ms; narrow the path or the pattern",
            timeout_ms(toolset::DEFAULT_TIMEOUT)
        )),
        Ended::Cancelled => Output::error("grep: cancelled"),
        Ended::OutputLimit(cap) => Output::error(format!(
            "grep: stopped after {cap} bytes of matches, the most one call may produce; narrow the path or the pattern"
        )),
    }
}

/// grep's output and stderr files for one call: created fresh (never
/// following a planted file), and removed when the call is done.
struct CallFiles {
    out: PathBuf,
    err: PathBuf,
}

impl CallFiles {
    /// The output file, a second handle on it for the output cap to
    /// watch, and the stderr file. Nothing is left behind on failure.
    fn create(&self) -> Result<(File, File, File), Error> {
        let open = |p: &PathBuf| {
            OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(p)
                .map_err(|e| Error::io(format!("grep: cannot create {}", p.display()), e))
        };
        let out = open(&self.out)?;
        let watched = match out.try_clone() {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_file(&self.out);
                return Err(Error::io("grep: cannot duplicate the output file", e));
            }
        };
        let err = match open(&self.err) {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_file(&self.out);
                return Err(e);
            }
        };
        Ok((out, watched, err))
    }

    fn cleanup(&self, keep_out: bool) {
        if !keep_out {
            let _ = fs::remove_file(&self.out);
        }
        let _ = fs::remove_file(&self.err);
    }
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
