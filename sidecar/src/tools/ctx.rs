//! What the tools share for the life of a runner ([`Ctx`]) and the bounds
//! on one call ([`CallLimits`]). Below every tool: a tool reaches the others
//! only through what is here, never through another tool.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use crate::error::Error;
use crate::fsutil::{Journal, PathLocks};
use crate::guard::Protected;
use crate::output::Output;
use crate::reaper::Supervisor;
use crate::snapshot::Snapshot;
use crate::tools::callfiles::CallFiles;
use crate::tools::late::Late;
use crate::tools::programs::GrepBinary;
use crate::tools::shell::{self, Shell, Spawner};

/// What the tools share for the life of a runner.
#[derive(Debug)]
pub struct Ctx {
    /// Absolute; relative tool paths resolve against it.
    pub workdir: PathBuf,
    /// bash's state between calls, verified before each use.
    pub snapshot: Snapshot,
    /// Per-call working files (output, next snapshot).
    pub files: CallFiles,
    pub supervisor: Arc<Supervisor>,
    /// Names this runner process in call markers, so `restart` ends only its
    /// own calls' processes even where several runners share a machine.
    pub instance: String,
    /// Process groups of bash calls that may still have background jobs, so
    /// `restart` can end them as the reference's shell restart does.
    pub bash_groups: Mutex<HashSet<i32>>,
    /// The grep the sandbox has, found and probed once at start-up so that a
    /// file written later into a PATH directory is never run in its place.
    pub grep: GrepBinary,
    /// The runner's own files, which the file tools refuse.
    pub protected: Protected,
    /// One call at a time per file for write and edit.
    pub locks: PathLocks,
    /// Temporary files of writes in flight, swept at start-up.
    pub journal: Journal,
    pub limits: CallLimits,
    /// Calls whose background jobs outlived them, for their later output.
    pub late: Arc<Late>,
    /// A shell started ahead of the next bash call (see [`shell`]).
    pub parked: Mutex<Option<Shell>>,
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

impl Ctx {
    /// Sets up the state directory: the calls directory emptied of what a
    /// previous runner did not finish, the snapshot, and the write journal,
    /// whose leftover temporary files are swept.
    pub fn new(
        workdir: PathBuf,
        state_dir: &Path,
        supervisor: Arc<Supervisor>,
        grep: GrepBinary,
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
            files: CallFiles::new(calls_dir),
            late: Late::new(Arc::clone(&supervisor), limits.max_output_bytes),
            supervisor,
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
        self.files.path(id, ext)
    }

    /// What starting a bash call's shell needs of the runner.
    pub fn spawner(&self) -> Spawner<'_> {
        Spawner {
            workdir: &self.workdir,
            files: &self.files,
            instance: &self.instance,
            supervisor: &self.supervisor,
        }
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
