//! grep: GNU grep in the sandbox, PCRE where the image's grep has it, POSIX
//! ERE otherwise. One implementation rather than ripgrep-or-a-walker, so the
//! behaviour depends on nothing the image ships beyond grep itself.
//!
//! The runner walks the tree and hands grep the files, in path order, in
//! batches, rather than letting `grep -r` walk it: grep's own walk follows
//! the directory's on-disk order, so the same tree on two file systems gave
//! two answers, and sorting the output afterwards would mean holding all of
//! it. The runner also decides what is binary: a file with a NUL byte in
//! its first 8 KiB, as `read` decides. GNU grep in a UTF-8 locale also calls
//! a file binary for one byte that is not UTF-8 (a Latin-1 source file), and
//! `-I` then drops it, so the model silently missed matches in legacy code;
//! here grep gets the files as text (`-a`) and a UTF-8 locale, so UTF-8
//! patterns keep their meaning and other bytes are still searched.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::fsutil::{BINARY_SNIFF_BYTES, describe, looks_binary, special_kind};
use crate::output::{Body, Output};
use crate::reaper::{Ended, Exit, Limits, OutputCap, Waited};
use crate::tools::ctx::Ctx;
use crate::tools::input::{parse, required};
use crate::tools::programs::GrepBinary;
use crate::tools::sorted_walk::SortedWalk;

/// Most of grep's stderr quoted back in an error.
const STDERR_LIMIT: usize = 4 << 10;

/// Most files one grep process is given, and most bytes of their paths:
/// well under the kernel's argument limit, few enough processes for a
/// large tree.
const BATCH_FILES: usize = 1024;
const BATCH_PATH_BYTES: usize = 256 << 10;

/// Directories the search never enters (the reference's walker skips
/// `.git` as well).
const SKIPPED_DIRS: &[&str] = &[".git"];

/// The locale grep runs in: the reference's patterns are UTF-8 whatever the
/// sandbox's locale says. Where the image lacks it, glibc falls back to the
/// C locale, in which every byte is still searched.
const LOCALE: &str = "C.UTF-8";

/// A grep as its input asks for it, checked before anything runs.
struct Request {
    pattern: String,
    path: Option<String>,
}

fn request(input: &[u8]) -> Result<Request, Output> {
    let input = parse("grep", input)?;
    let pattern = input.string("pattern")?;
    let path = input.string("path")?;
    let pattern = required("grep", "pattern", &pattern)?.to_owned();
    Ok(Request { pattern, path })
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
    let (shown, target) = match input.path.as_deref().filter(|p| !p.is_empty()) {
        Some(p) => (p.to_owned(), ctx.resolve(p)),
        None => (ctx.workdir.display().to_string(), ctx.workdir.clone()),
    };
    // Unreadable files below the target are passed over quietly; the target
    // itself must exist or the model would read "no matches" for a typo.
    let meta = match fs::metadata(&target) {
        Ok(m) => m,
        Err(e) => return Ok(Output::error(format!("grep {shown}: {}", describe(&e)))),
    };
    if let Some(kind) = special_kind(&meta).filter(|_| !meta.is_dir()) {
        return Ok(Output::error(format!(
            "grep: {shown} is {kind}, not a file or directory to search"
        )));
    }
    let GrepBinary::Found { path: grep, pcre } = ctx.grep.clone() else {
        return Ok(Output::error(
            "grep: no grep program found on the sandbox's PATH; search with bash instead",
        ));
    };
    let search = Search {
        grep,
        pcre,
        pattern: input.pattern,
        target,
        is_dir: meta.is_dir(),
    };
    search.run(ctx, id).await
}

/// One grep run, its input checked.
struct Search {
    grep: PathBuf,
    pcre: bool,
    pattern: String,
    target: PathBuf,
    is_dir: bool,
}

/// Where the files to search come from: the target alone, or a walk.
enum Source {
    One(Option<PathBuf>),
    Walk(Box<SortedWalk>),
}

impl Source {
    /// The next batch of text files, in path order; empty when done.
    fn batch(&mut self, deadline: Instant) -> Vec<PathBuf> {
        match self {
            Source::One(file) => file.take().filter(|f| is_text(f)).into_iter().collect(),
            Source::Walk(walk) => {
                let mut batch = Vec::new();
                let mut bytes = 0;
                while batch.len() < BATCH_FILES && bytes < BATCH_PATH_BYTES {
                    if Instant::now() > deadline {
                        break;
                    }
                    let Some(file) = walk.next_file() else { break };
                    if is_text(&file) {
                        bytes += file.as_os_str().len() + 1;
                        batch.push(file);
                    }
                }
                batch
            }
        }
    }

    fn cut(&self) -> Option<&Path> {
        match self {
            Source::Walk(w) => w.cut(),
            Source::One(_) => None,
        }
    }
}

/// Whether a file is searched: a regular file (a FIFO swapped in after the
/// walk listed it is never read, and so never blocks) that the runner can
/// open, with no NUL byte in its first 8 KiB.
fn is_text(path: &Path) -> bool {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_NOFOLLOW)
        .open(path);
    let Ok(file) = file else { return false };
    match file.metadata() {
        Ok(m) if m.is_file() => {}
        _ => return false,
    }
    let mut head = Vec::with_capacity(BINARY_SNIFF_BYTES);
    match file.take(BINARY_SNIFF_BYTES as u64).read_to_end(&mut head) {
        Ok(_) => !looks_binary(&head),
        Err(_) => false,
    }
}

/// How the batches went, together.
#[derive(Default)]
struct Tally {
    /// grep's first complaint that came with no match before it.
    error: Option<Exit>,
    ended: Option<Ended>,
}

impl Search {
    async fn run(&self, ctx: &Ctx, id: &str) -> Result<Output, Error> {
        let files = CallFiles {
            out: ctx.call_file(id, "grep"),
            err: ctx.call_file(id, "grep-err"),
        };
        let (out, watched, err) = files.create()?;
        let deadline = Instant::now() + toolset::DEFAULT_TIMEOUT;
        let mut source = if self.is_dir {
            // `grep -r --exclude-dir=.git DIR` searched nothing in a target
            // named .git; neither does the reference's walker.
            let skipped = self
                .target
                .file_name()
                .is_some_and(|n| SKIPPED_DIRS.iter().any(|s| n == *s));
            if skipped {
                Source::One(None)
            } else {
                Source::Walk(Box::new(SortedWalk::new(&self.target, SKIPPED_DIRS)))
            }
        } else {
            Source::One(Some(self.target.clone()))
        };
        let mut tally = Tally::default();
        let mut first = true;
        loop {
            // Listing directories and reading file heads is blocking work.
            let (back, batch) = tokio::task::spawn_blocking(move || {
                let batch = source.batch(deadline);
                (source, batch)
            })
            .await
            .map_err(|e| Error::io("grep: the file walk failed", std::io::Error::other(e)))?;
            source = back;
            if Instant::now() > deadline {
                tally.ended = Some(Ended::Timeout);
                break;
            }
            // With nothing to search, grep still judges the pattern, so a
            // bad one is an error whatever the tree holds.
            let args = if batch.is_empty() {
                if !first {
                    break;
                }
                vec![PathBuf::from("/dev/null")]
            } else {
                batch
            };
            first = false;
            let dup = |f: &File| {
                f.try_clone()
                    .map_err(|e| Error::io("grep: cannot duplicate an output file", e))
            };
            let said_before = file_len(&files.err);
            let mut cmd = self.command(&ctx.workdir, &args, dup(&out)?, dup(&err)?);
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
                timeout: deadline.saturating_duration_since(Instant::now()),
                output: Some(OutputCap {
                    files: vec![dup(&watched)?],
                    cap: ctx.limits.max_output_bytes,
                }),
                cancel: None,
            };
            match spawned.wait(limits).await {
                Ok(Waited::Exited(Exit::Code(0 | 1))) => {}
                Ok(Waited::Exited(exit)) => {
                    // A complaint before any match (a bad pattern) is the
                    // answer. One after matches leaves them standing, and a
                    // silent failure is a file that vanished or could not be
                    // read mid-walk (-s): the search goes on.
                    let complained = file_len(&files.err) > said_before;
                    if complained && !has_output(&files.out) {
                        tally.error = Some(exit);
                        break;
                    }
                    if !complained && exit != Exit::Code(2) {
                        tally.error = Some(exit);
                        break;
                    }
                }
                Ok(Waited::Ended { reason, .. }) => {
                    tally.ended = Some(reason);
                    break;
                }
                Err(e) => {
                    files.cleanup(false);
                    return Err(e);
                }
            }
            if args.first().is_some_and(|a| a == Path::new("/dev/null")) {
                break;
            }
        }
        let mut out = self.verdict(&tally, &files);
        if let Some(dir) = source.cut()
            && tally.ended.is_none()
            && tally.error.is_none()
        {
            out.trailer.push_str(&format!(
                "\n[grep searched only {} entries of {}, the most one directory may hold in a search; search its parts separately]",
                crate::tools::sorted_walk::MAX_DIR_ENTRIES,
                dir.display()
            ));
        }
        Ok(out)
    }

    fn command(&self, workdir: &Path, files: &[PathBuf], out: File, err: File) -> Command {
        let mut cmd = Command::new(&self.grep);
        cmd.args(["-n", "-H", "-a", "-s", "--color=never"])
            .arg(if self.pcre { "-P" } else { "-E" })
            .arg("-e")
            .arg(&self.pattern)
            .arg("--")
            .args(files)
            .env("LC_ALL", LOCALE)
            .current_dir(workdir)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        cmd
    }

    /// What the model reads of a finished search; the call's files are
    /// removed, except the output when the output is the result.
    fn verdict(&self, tally: &Tally, files: &CallFiles) -> Output {
        if let Some(reason) = tally.ended {
            files.cleanup(false);
            return ended(reason);
        }
        if let Some(exit) = tally.error {
            // grep prefixes its messages with its own path, which says
            // nothing useful.
            let prefix = format!("{}: ", self.grep.display());
            let stderr = crate::output::read_head(&files.err, STDERR_LIMIT)
                .map(|(s, _)| s.trim().replace(&prefix, ""))
                .unwrap_or_default();
            files.cleanup(false);
            let why = if stderr.is_empty() {
                format!("grep exited with status {}", exit.code())
            } else {
                stderr
            };
            return Output::error(format!("grep: {why}"));
        }
        if has_output(&files.out) {
            files.cleanup(true);
            file_output(files.out.clone())
        } else {
            files.cleanup(false);
            Output::ok("no matches")
        }
    }
}

fn has_output(path: &Path) -> bool {
    file_len(path) > 0
}

fn file_len(path: &Path) -> u64 {
    fs::metadata(path).map(|m| m.len()).unwrap_or(0)
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
