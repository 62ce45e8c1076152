//! The six tools. Each parses its own input (the reference's field names and
//! requiredness) and answers with an [`Output`]: a tool error is an `Output`
//! with `is_error`, a fault of the runner is an `Err`.

pub mod bash;
pub mod edit;
pub mod glob;
pub mod grep;
pub mod read;
pub mod shell;
pub mod write;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use serde::de::DeserializeOwned;

use crate::Error;
use crate::fsutil::{Journal, PathLocks};
use crate::guard::Protected;
use crate::output::Output;
use crate::reaper::Supervisor;
use crate::snapshot::Snapshot;

/// What the tools share for the life of a runner.
#[derive(Debug)]
pub struct Ctx {
    /// Absolute; relative tool paths resolve against it.
    pub workdir: PathBuf,
    /// bash's state between calls, verified before each use.
    pub snapshot: Snapshot,
    /// Per-call working files (output, next snapshot).
    pub calls_dir: PathBuf,
    pub supervisor: Arc<Supervisor>,
    seq: AtomicU64,
    /// Names this runner process in call markers, so `restart` ends only its
    /// own calls' processes even where several runners share a machine.
    pub instance: String,
    /// Process groups of bash calls that may still have background jobs, so
    /// `restart` can end them as the reference's shell restart does.
    pub bash_groups: Mutex<HashSet<i32>>,
    /// The grep the sandbox has, found and probed once at start-up so that a
    /// file written later into a PATH directory is never run in its place.
    pub grep: grep::GrepBinary,
    /// The runner's own files, which the file tools refuse.
    pub protected: Protected,
    /// One call at a time per file for write and edit.
    pub locks: PathLocks,
    /// Temporary files of writes in flight, swept at start-up.
    pub journal: Journal,
    pub limits: CallLimits,
    /// A shell started ahead of the next bash call (see [`shell`]).
    pub parked: Mutex<Option<shell::Shell>>,
    /// What a session's first shell evaluates: the runner's environment,
    /// and for a warm pool's sandbox the bound session's after it (see
    /// [`Ctx::bind_env`]). Behind a lock because binding comes after start.
    initial_state: RwLock<Arc<Vec<u8>>>,
}

/// Bounds on what one call may consume.
#[derive(Debug, Clone, Copy)]
pub struct CallLimits {
    /// Most bytes of output a bash or grep call may produce (on disk; the
    /// model sees 100 KiB of it). Past it the call is ended.
    pub max_output_bytes: u64,
    /// Whether a shell is started ahead of the next bash call (see
    /// [`shell`]); off, every call starts its own.
    pub park_shells: bool,
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            max_output_bytes: DEFAULT_MAX_CALL_OUTPUT_BYTES,
            park_shells: true,
        }
    }
}

/// The default of [`CallLimits::max_output_bytes`]: 1 GiB.
pub const DEFAULT_MAX_CALL_OUTPUT_BYTES: u64 = 1 << 30;

/// The shell every bash call runs; the sandbox image must have it.
pub const BASH: &str = "/bin/bash";

impl Ctx {
    /// Sets up the state directory: the calls directory emptied of what a
    /// previous runner did not finish, the snapshot, and the write journal,
    /// whose leftover temporary files are swept.
    pub fn new(
        workdir: PathBuf,
        state_dir: &Path,
        supervisor: Arc<Supervisor>,
        grep: grep::GrepBinary,
        protected: Protected,
        limits: CallLimits,
    ) -> Result<Self, Error> {
        let calls_dir = state_dir.join("calls");
        std::fs::create_dir_all(&calls_dir)
            .map_err(|e| Error::io(format!("cannot create {}", calls_dir.display()), e))?;
        if let Ok(entries) = std::fs::read_dir(&calls_dir) {
            for entry in entries.flatten() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let journal_path = state_dir.join("writes.journal");
        let journal = Journal::open(journal_path.clone())
            .map_err(|e| Error::io(format!("cannot open {}", journal_path.display()), e))?;
        let swept = journal.sweep();
        if swept > 0 {
            tracing::info!(
                files = swept,
                "removed temporary files of interrupted writes"
            );
        }
        Ok(Ctx {
            workdir,
            snapshot: Snapshot::open(state_dir.join("shell.snapshot")),
            calls_dir,
            supervisor,
            seq: AtomicU64::new(0),
            instance: instance_id(),
            bash_groups: Mutex::new(HashSet::new()),
            grep,
            protected,
            locks: PathLocks::default(),
            journal,
            limits,
            parked: Mutex::new(None),
            initial_state: RwLock::new(Arc::new(shell::initial_state())),
        })
    }

    /// What a session's first shell evaluates (no snapshot yet).
    pub fn initial_state(&self) -> Arc<Vec<u8>> {
        let state = self
            .initial_state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(&state)
    }

    /// Adds a bound session's environment to the initial state, after the
    /// runner's own, so the session's value of a name wins over the pool
    /// template's. Names that cannot reach a shell (not an identifier, the
    /// call marker, a scrubbed prefix) are left out, as they are from the
    /// runner's environment; their names are returned so the caller can
    /// say so. A value must hold no NUL (the binding is checked first).
    pub fn bind_env<'a>(&self, env: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
        let mut dropped = Vec::new();
        let mut extra = Vec::new();
        for (name, value) in env {
            if shell::is_identifier(name) && shell::passed_on(name) && !value.contains('\0') {
                shell::declare(&mut extra, name, value.as_bytes());
            } else {
                dropped.push(name.to_owned());
            }
        }
        let mut state = self
            .initial_state
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut next = Vec::with_capacity(state.len() + extra.len());
        next.extend_from_slice(&state);
        next.extend_from_slice(&extra);
        *state = Arc::new(next);
        dropped
    }

    /// A per-call working file, unique even when two calls share an id.
    pub fn call_file(&self, id: &str, ext: &str) -> PathBuf {
        let n = self.next_seq();
        self.calls_dir.join(format!("{n}.{id}.{ext}"))
    }

    /// A number no other call of this runner gets.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }

    pub fn resolve(&self, p: &str) -> PathBuf {
        crate::fsutil::resolve(&self.workdir, p)
    }

    /// Resolves a file tool's path and refuses the runner's own files.
    /// Returns the path as resolved and with symlinks resolved (the key
    /// under which calls on one file are serialised).
    pub fn target(&self, tool: &str, shown: &str) -> Result<(PathBuf, PathBuf), Output> {
        let path = self.resolve(shown);
        let canonical = crate::fsutil::canonical(&path);
        match self.protected.check(&canonical) {
            Some(what) => Err(Output::error(Protected::refusal(tool, shown, what))),
            None => Ok((path, canonical)),
        }
    }
}

/// The pid and the start instant's low bits: unique among the runners alive
/// on one machine, and unlike the pid alone, not reused by a restarted runner.
fn instance_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos:x}", std::process::id())
}

/// Decodes a tool's input the way the reference does (unknown fields are
/// ignored), answering a malformed one with `invalid <tool> input: ...`,
/// naming the field when the fault is inside one (`invalid bash input:
/// timeout_ms: invalid type: ...`), as the reference's decoder does.
/// Empty input (nothing, or only JSON whitespace) is not JSON: it gets the
/// reference's own words for it rather than serde's position report.
pub(crate) fn parse<T: DeserializeOwned>(tool: &str, input: &[u8]) -> Result<T, Output> {
    if input
        .iter()
        .all(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return Err(Output::error(format!(
            "invalid {tool} input: unexpected end of JSON input"
        )));
    }
    let mut de = serde_json::Deserializer::from_slice(input);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match path.as_str() {
            "." => Output::error(format!("invalid {tool} input: {inner}")),
            _ => Output::error(format!("invalid {tool} input: {path}: {inner}")),
        }
    })?;
    // Trailing characters after the object, as serde_json::from_slice checks.
    de.end()
        .map_err(|e| Output::error(format!("invalid {tool} input: {e}")))?;
    Ok(value)
}

/// Checks a call's input as the tool named `tool` would before it touches
/// anything: decoding, required fields, the shape of each field (and glob's
/// pattern). `Err` carries the tool error the call would answer with. For
/// the fuzz targets; [`crate::Runner::run`] goes through each tool's `run`,
/// which uses the same checks.
#[doc(hidden)]
pub fn check_input(tool: &str, input: &[u8]) -> Result<(), String> {
    let checked = match tool {
        "bash" => bash::check(input),
        "read" => read::check(input),
        "write" => write::check(input),
        "edit" => edit::check(input),
        "glob" => glob::check(input),
        "grep" => grep::check(input),
        other => Err(Output::error(format!("unknown tool {other:?}"))),
    };
    checked.map_err(|out| match out.body {
        crate::output::Body::Text(text) => text,
        _ => String::new(),
    })
}

/// The target of `path` if it is a symbolic link, which write and edit
/// replace with a regular file rather than write through.
pub(crate) fn link_target(path: &Path) -> Option<PathBuf> {
    std::fs::symlink_metadata(path)
        .ok()
        .filter(|m| m.file_type().is_symlink())
        .and_then(|_| std::fs::read_link(path).ok())
}

/// What a write or edit result adds when it replaced a symbolic link, so the
/// model is not left believing the link's target changed.
pub(crate) fn replaced_link_note(shown: &str, target: &Path) -> String {
    format!(
        "; {shown} was a symbolic link to {}: it is now a regular file with the new content, and the link's target was not written",
        target.display()
    )
}

/// A required, non-empty string field.
pub(crate) fn required<'a>(
    tool: &str,
    field: &str,
    v: &'a Option<String>,
) -> Result<&'a str, Output> {
    match v.as_deref() {
        Some(s) if !s.is_empty() => Ok(s),
        _ => Err(Output::error(format!("{tool}: {field} is required"))),
    }
}

/// Finds a program on PATH, considering only absolute PATH entries, so a file
/// planted in the working directory is never run in its place.
pub(crate) fn look_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .filter(|d| d.is_absolute())
        .map(|d| d.join(name))
        .find(|p| {
            std::fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

#[cfg(test)]
mod tests {
    use super::check_input;

    fn refusal(tool: &str, input: &str) -> String {
        check_input(tool, input.as_bytes()).expect_err(input)
    }

    /// What the runner_input fuzz target's "every refusal names a path"
    /// invariant requires. Before, serde's message for a field of the wrong
    /// type named no field (`invalid bash input: invalid type: string "5",
    /// expected i64 ...`), where the reference's decoder names it.
    #[test]
    fn refusals_name_the_field_at_fault() {
        assert_eq!(
            refusal("bash", r#"{"command":"x","timeout_ms":"5"}"#),
            "invalid bash input: timeout_ms: invalid type: string \"5\", expected i64 at line 1 column 31"
        );
        assert!(
            refusal("read", r#"{"file_path":"a","view_range":[1.5,2]}"#)
                .starts_with("invalid read input: view_range[0]: invalid type: floating point")
        );
        assert!(
            refusal(
                "edit",
                r#"{"file_path":"a","old_string":"x","new_string":"y","replace_all":"yes"}"#
            )
            .starts_with("invalid edit input: replace_all: invalid type")
        );
        // Not an object, or not JSON: only the tool's input as a whole.
        assert!(refusal("bash", "null").starts_with("invalid bash input: invalid type: null"));
        assert!(
            refusal("bash", r#"{"command":"x"} x"#)
                .starts_with("invalid bash input: trailing characters")
        );
        assert_eq!(
            refusal("grep", " "),
            "invalid grep input: unexpected end of JSON input"
        );
        // The checks after decoding.
        assert_eq!(refusal("bash", "{}"), "bash: command is required");
        assert_eq!(check_input("bash", br#"{"restart":true}"#), Ok(()));
        assert!(
            refusal("glob", r#"{"pattern":"a["}"#).starts_with("glob: invalid pattern \"a[\": ")
        );
        assert!(
            refusal("write", r#"{"file_path":"d/","content":""}"#)
                .starts_with("write d/: the path ends in")
        );
        assert_eq!(
            refusal("read", r#"{"file_path":"a","view_range":[1]}"#),
            "read: view_range must be [start_line, end_line]"
        );
    }
}
