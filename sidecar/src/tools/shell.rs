//! The shells bash calls run in, started ahead of their calls.
//!
//! Every call still gets a fresh `/bin/bash` (no state lives in a process),
//! but starting one costs about as much as the rest of a small call put
//! together. So the runner keeps one shell started and *parked*: it has
//! done its start-up and waits, before reading anything, for one line on a
//! pipe whose only writer is the runner. A call hands it the session's
//! verified snapshot and the command in its private in-memory stdin and
//! writes that line; the next shell is started while the command runs. A
//! parked shell that was killed is discarded and the call starts a shell of
//! its own, which is what every call did before this existed.
//!
//! The pipe is also what ends a parked shell that outlives its runner: when
//! the runner dies, however (SIGKILL included, and when it is not PID 1, so
//! that nothing else would end its children), the kernel closes its end, the
//! shell reads end-of-file instead of a line, and exits without running
//! anything. A shell that stopped itself to park (as it once did) stayed
//! stopped forever after such a death.
//!
//! Every shell starts from an empty environment: the state it evaluates is
//! the environment (the snapshot, or for a fresh session the runner's own
//! environment written as `declare -x` lines), so a parked shell needs
//! nothing from the call it will serve but what its stdin brings.

use std::fs::{File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use crate::error::Error;
use crate::procs::MARKER_VAR;
use crate::reaper::{Spawned, Supervisor};
use crate::tools::callfiles::CallFiles;
use crate::tools::programs::BASH;

/// The program each call runs, with `$0` = /bin/bash so that the shell's
/// own messages read as bash's, and the command evaluated on the script's
/// third line, followed by two newlines (a final backslash continues onto
/// them instead of being printed), so that its error messages say the line
/// numbers the reference's do. `$1` is where to write the next snapshot;
/// `$2` is `park` for a shell started ahead of its call, which waits for a
/// line on the pipe at descriptor `$3` (end-of-file: the runner is gone,
/// exit) and closes it before anything else runs. Standard input holds the state to evaluate
/// and the command, each ended by a NUL (a seekable in-memory file, which
/// bash reads in blocks; the command travels here rather than in argv, where
/// the kernel refuses one argument over 128 KiB). A shell whose input is not
/// both parts whole exits 125 without running anything. The state is
/// evaluated with its errors silenced: a readonly variable bash set itself
/// (SHELLOPTS, when exported) cannot be re-declared and that is not the
/// model's business. stdin is /dev/null for the command. The save runs as an
/// epilogue, and from the EXIT trap when the command calls `exit`; the call
/// marker is never saved, so a later call's processes never carry it.
///
/// The working directory is the state's last line (`cd`), taken from where
/// the shell really is: `$PWD` when it names that directory (so a path
/// through a symbolic link keeps its name), the physical path when a
/// command assigned `PWD` without moving. The shell starts in the workdir
/// with `PWD` naming it, so a state without a `cd` (a session's first call,
/// after `restart`) runs there, whatever the runner's own directory. When
/// the saved directory cannot be entered any more (removed, or its mode
/// changed), the command does not run somewhere the model did not choose:
/// the call fails saying so and the shell is back in the workdir, where the
/// next call runs. `builtin` keeps a model's function named `cd`, `printf`
/// or `export` out of the state handling.
pub const WRAPPER: &str = r#"__agent_next=$1 __agent_home=$PWD; [[ $2 == park ]] && { IFS= read -r -u "$3" __agent_go || exit 125; __agent_go=$3; exec {__agent_go}<&-; unset __agent_go; }; set --; { IFS= read -r -d '' __agent_snap && IFS= read -r -d '' __agent_cmd; } || exit 125; eval "$__agent_snap" 2>/dev/null; builtin unset __agent_snap __agent_gone; [[ $PWD -ef . ]] || { __agent_gone=$PWD; builtin cd -- "$__agent_home"; }; builtin unset __agent_home; builtin exec 0</dev/null
__agent_save() { builtin export -n AGENTPLANE_CALL 2>/dev/null; builtin local d=$PWD; [[ $d -ef . ]] || d=$(builtin pwd -P 2>/dev/null) || d=$PWD; { builtin export -p; builtin declare -f; builtin printf 'builtin cd -- %q 2>/dev/null\n' "$d"; [[ ${OLDPWD+x} ]] && builtin printf 'OLDPWD=%q\n' "$OLDPWD"; } >"$__agent_next" 2>/dev/null; }; builtin trap '__agent_rc=$?; __agent_save; builtin exit $__agent_rc' EXIT; [[ ${__agent_gone+x} ]] && { builtin printf '%s: the working directory %s cannot be entered any more (it was removed, or its permissions changed), so the command did not run; the shell is now in %s, where the next command runs\n' "$0" "$__agent_gone" "$PWD" >&2; builtin exit 1; }
builtin eval "$__agent_cmd"$'\n\n'
__agent_rc=$?; builtin trap - EXIT; __agent_save; builtin exit $__agent_rc
"#;

/// Environment variables a model-driven shell never inherits from the runner
/// (the reference scrubs the same namespace: API credentials).
const SCRUBBED_PREFIXES: [&str; 1] = ["ANTHROPIC_"];

/// One shell, started, not yet running a command.
#[derive(Debug)]
pub struct Shell {
    pub spawned: Spawned,
    /// The runner's handle on the shell's stdin.
    input: File,
    /// Where the command's stdout and stderr go, and handles to watch their
    /// size.
    pub out_path: PathBuf,
    pub err_path: PathBuf,
    pub watched: Vec<File>,
    /// Where the shell writes the session's next snapshot.
    pub next_snapshot: PathBuf,
    /// A parked shell's go-ahead: the write end of its pipe, held by the
    /// runner alone. `None` once the shell runs.
    go: Option<File>,
}

/// The state and command a call hands its shell, each NUL-ended.
pub fn payload(state: &[u8], command: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(state.len() + command.len() + 2);
    p.extend_from_slice(state);
    p.push(0);
    p.extend_from_slice(command.as_bytes());
    p.push(0);
    p
}

/// The runner's environment as shell state, for a session's first call: what
/// `bash` would have inherited, less the scrubbed names and any name bash
/// cannot hold.
pub fn initial_state() -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for (k, v) in std::env::vars_os() {
        let (Some(k), v) = (k.to_str(), v.as_bytes()) else {
            continue;
        };
        if is_identifier(k) && passed_on(k) {
            declare(&mut out, k, v);
        }
    }
    out
}

/// Whether `name` can name a shell variable: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_identifier(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .enumerate()
            .all(|(i, b)| b == b'_' || b.is_ascii_alphabetic() || (i > 0 && b.is_ascii_digit()))
}

/// Whether a variable of this name reaches a model-driven shell: not the
/// call marker (the runner sets it per call), not `PWD` (the shell's own)
/// and not a scrubbed name.
pub fn passed_on(name: &str) -> bool {
    name != MARKER_VAR && name != OWN_NAME && !SCRUBBED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The variable a shell sets itself from where it starts: the runner's own
/// `PWD` names the directory the runner was started from, and evaluated as
/// state it would put every shell's `PWD` (and so its saved `cd`) there.
const OWN_NAME: &str = "PWD";

/// Appends `declare -x NAME='value'` (the value single-quoted, each `'`
/// written as `'\''`), which the shell evaluates as its state. The caller
/// checks the name ([`is_identifier`]); a value must hold no NUL, which ends
/// the state in the shell's input.
pub fn declare(out: &mut Vec<u8>, name: &str, value: &[u8]) {
    out.extend_from_slice(b"declare -x ");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"='");
    for &b in value {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.extend_from_slice(b"'\n");
}

/// What starting a shell needs of the runner: where it starts, where its
/// files go, the runner instance its call marker names, and the supervisor
/// that waits for it.
#[derive(Debug, Clone, Copy)]
pub struct Spawner<'a> {
    pub workdir: &'a Path,
    pub files: &'a CallFiles,
    pub instance: &'a str,
    pub supervisor: &'a Arc<Supervisor>,
}

/// Starts a shell. With `payload`, it starts running at once; without, it
/// parks until [`Shell::start`].
pub fn spawn(ctx: Spawner<'_>, payload: Option<&[u8]>) -> Result<Shell, Error> {
    let out_path = ctx.files.path("shell", "out");
    let err_path = ctx.files.path("shell", "err");
    let next_snapshot = ctx.files.path("shell", "snap");
    let remove = || {
        let _ = std::fs::remove_file(&out_path);
        let _ = std::fs::remove_file(&err_path);
    };
    let create = |p: &PathBuf| {
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(p)
            .map_err(|e| Error::io(format!("bash: cannot create {}", p.display()), e))
    };
    let dup = |f: &File| {
        f.try_clone()
            .map_err(|e| Error::io("bash: cannot duplicate an output file", e))
    };
    let files = create(&out_path).and_then(|out| {
        let err = create(&err_path)?;
        let watched = vec![dup(&out)?, dup(&err)?];
        Ok((out, err, watched))
    });
    let (out, err, watched) = match files {
        Ok(f) => f,
        Err(e) => {
            remove();
            return Err(e);
        }
    };
    let input = private_file(payload.unwrap_or_default()).and_then(|f| {
        let stdin = f.try_clone()?;
        Ok((f, stdin))
    });
    let (input, stdin) = match input {
        Ok(f) => f,
        Err(e) => {
            remove();
            return Err(Error::io("bash: cannot make the shell's input", e));
        }
    };
    // A parked shell's pipe: both ends close-on-exec, the read end handed to
    // the shell alone by the supervisor (see `Supervisor::spawn_with`).
    // The read end is kept above 2, where the shell's own stdin, stdout and
    // stderr go in the child and would replace it. (Rust's start-up reopens
    // a closed standard descriptor on /dev/null, so pipe2 should never give
    // one back; the pipe must not depend on that.)
    let made = || -> std::io::Result<_> {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
        let read = if read.as_raw_fd() < 3 {
            read.try_clone()?
        } else {
            read
        };
        Ok((read, write))
    };
    let pipe = match payload {
        Some(_) => None,
        None => match made() {
            Ok(p) => Some(p),
            Err(e) => {
                remove();
                return Err(Error::io("bash: cannot make a parked shell's pipe", e));
            }
        },
    };
    let marker = format!("{}.{}", ctx.instance, ctx.files.next_seq());
    let mut cmd = Command::new(BASH);
    cmd.args(["--noprofile", "--norc", "-c", WRAPPER, BASH])
        .arg(&next_snapshot);
    match &pipe {
        None => cmd.arg("run"),
        Some((read, _)) => cmd.arg("park").arg(read.as_raw_fd().to_string()),
    };
    cmd.current_dir(ctx.workdir)
        .stdin(Stdio::from(stdin))
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .env_clear()
        .env(OWN_NAME, ctx.workdir)
        .env(MARKER_VAR, &marker);
    let inherit = pipe.as_ref().map(|(read, _)| read.as_fd());
    let spawned = match ctx.supervisor.spawn_with(&mut cmd, inherit) {
        Ok(s) => s.with_marker(format!("{MARKER_VAR}={marker}")),
        Err(e) => {
            remove();
            return Err(Error::io(format!("bash: cannot start {BASH}"), e));
        }
    };
    Ok(Shell {
        spawned,
        input,
        out_path,
        err_path,
        watched,
        next_snapshot,
        // The read end closes here: the shell holds the only copy.
        go: pipe.map(|(_, write)| File::from(write)),
    })
}

impl Shell {
    /// Hands a parked shell its payload and lets it go; whether it could.
    /// One that could not (it died) is for the caller to discard before
    /// starting its own.
    pub fn start(&mut self, payload: &[u8]) -> bool {
        let Some(mut go) = self.go.take() else {
            return true;
        };
        let pid = self.spawned.pid;
        if self.spawned.has_exited() {
            tracing::debug!(pid, "the parked shell has exited; starting another");
            return false;
        }
        // The payload first: the shell reads it once it has its line.
        if self.input.write_all_at(payload, 0).is_err() {
            return false;
        }
        use std::io::Write;
        // A shell that died since is a broken pipe (EPIPE: the runner
        // ignores SIGPIPE), and the call starts its own.
        if go.write_all(b"go\n").is_err() {
            tracing::debug!(pid, "the parked shell is gone; starting another");
            return false;
        }
        true
    }

    /// Ends a shell that will not be used, and removes its files.
    pub fn discard(self) {
        crate::reaper::kill_group(self.spawned.pid);
        let _ = std::fs::remove_file(&self.out_path);
        let _ = std::fs::remove_file(&self.err_path);
        let _ = std::fs::remove_file(&self.next_snapshot);
    }
}

/// An anonymous in-memory file holding `bytes`, rewound: a descriptor only
/// the runner and the call's shell hold, so nothing can change the input
/// between the runner's checks and the shell's use of it.
fn private_file(bytes: &[u8]) -> std::io::Result<File> {
    use std::io::{Seek, Write};
    let mut f = match nix::sys::memfd::memfd_create(
        c"agent-shell-input",
        nix::sys::memfd::MFdFlags::MFD_CLOEXEC,
    ) {
        Ok(fd) => File::from(fd),
        // No memfd (an old or unusual kernel): an unlinked temporary file is
        // just as private.
        Err(_) => tempfile::tempfile()?,
    };
    f.write_all(bytes)?;
    f.rewind()?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_is_two_nul_ended_parts() {
        assert_eq!(
            payload(b"declare -x A='1'\n", "echo hi"),
            b"declare -x A='1'\n\0echo hi\0"
        );
    }

    #[test]
    fn initial_state_quotes_values_and_drops_scrubbed_names() {
        let s = String::from_utf8(initial_state()).unwrap();
        for line in s.lines() {
            assert!(line.starts_with("declare -x "), "{line}");
            assert!(!line.contains("ANTHROPIC_"), "{line}");
            // The runner's own directory is not the shell's.
            assert!(!line.starts_with("declare -x PWD="), "{line}");
        }
    }

    #[test]
    fn declarations_quote_every_quote_and_names_are_checked() {
        let mut out = Vec::new();
        declare(&mut out, "GREETING", b"it's 'warm'\nline");
        assert_eq!(
            out,
            b"declare -x GREETING='it'\\''s '\\''warm'\\''\nline'\n"
        );
        for good in ["A", "_", "a_1", "_9"] {
            assert!(is_identifier(good), "{good}");
        }
        for bad in ["", "1BAD", "A-B", "A B", "É", "a=b"] {
            assert!(!is_identifier(bad), "{bad}");
        }
        assert!(!passed_on("ANTHROPIC_API_KEY"));
        assert!(!passed_on(MARKER_VAR));
        assert!(!passed_on("PWD"));
        assert!(passed_on("HOME"));
    }
}
