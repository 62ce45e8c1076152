//! The six tools. Each parses its own input (the reference's field names and
//! requiredness) and answers with an [`Output`]: a tool error is an `Output`
//! with `is_error`, a fault of the runner is an `Err`.

pub mod bash;
pub mod edit;
pub mod glob;
pub mod grep;
pub mod read;
pub mod write;

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::de::DeserializeOwned;

use crate::output::Output;
use crate::reaper::Supervisor;

/// What the tools share for the life of a runner.
#[derive(Debug)]
pub struct Ctx {
    /// Absolute; relative tool paths resolve against it.
    pub workdir: PathBuf,
    /// bash's snapshot file: the session's shell state between calls.
    pub snapshot: PathBuf,
    /// Per-call working files (output, next snapshot).
    pub calls_dir: PathBuf,
    pub supervisor: Arc<Supervisor>,
    seq: AtomicU64,
    /// Process groups of bash calls that may still have background jobs, so
    /// `restart` can end them as the reference's shell restart does.
    pub bash_groups: Mutex<HashSet<i32>>,
    pub grep: tokio::sync::OnceCell<grep::GrepBinary>,
}

impl Ctx {
    pub fn new(
        workdir: PathBuf,
        snapshot: PathBuf,
        calls_dir: PathBuf,
        supervisor: Arc<Supervisor>,
    ) -> Self {
        Ctx {
            workdir,
            snapshot,
            calls_dir,
            supervisor,
            seq: AtomicU64::new(0),
            bash_groups: Mutex::new(HashSet::new()),
            grep: tokio::sync::OnceCell::new(),
        }
    }

    /// A per-call working file, unique even when two calls share an id.
    pub fn call_file(&self, id: &str, ext: &str) -> PathBuf {
        let n = self.seq.fetch_add(1, Ordering::Relaxed);
        self.calls_dir.join(format!("{n}.{id}.{ext}"))
    }

    pub fn resolve(&self, p: &str) -> PathBuf {
        crate::fsutil::resolve(&self.workdir, p)
    }
}

/// Decodes a tool's input the way the reference does (unknown fields are
/// ignored), answering a malformed one with `invalid <tool> input: ...`.
pub(crate) fn parse<T: DeserializeOwned>(tool: &str, input: &[u8]) -> Result<T, Output> {
    let trimmed = input.trim_ascii();
    let input: &[u8] = if trimmed.is_empty() { b"{}" } else { input };
    serde_json::from_slice(input).map_err(|e| Output::error(format!("invalid {tool} input: {e}")))
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
