//! The runner's own files, out of the file tools' reach.
//!
//! The model may read and write anything the sandbox user can, except what
//! the runner itself depends on: its state (the shell snapshot and per-call
//! files), its socket, its binary, the toolset it enforces, and the programs
//! it executes. A `write` that planted commands in the snapshot would have
//! them run under the next `bash` call a human approves; a `write` over the
//! socket would cut the executor off. bash can still reach these files -- it
//! is the sandbox user -- which is why the snapshot is also verified by
//! digest before it is used (see [`crate::snapshot`]).

use std::path::{Path, PathBuf};

use crate::fsutil;

/// One protected path: a whole directory tree, or a single file.
#[derive(Debug, Clone)]
struct Entry {
    path: PathBuf,
    tree: bool,
    what: &'static str,
}

/// The set of protected paths, held both as given and with symlinks
/// resolved, so neither spelling gets past it.
#[derive(Debug, Clone, Default)]
pub struct Protected {
    entries: Vec<Entry>,
}

impl Protected {
    /// Protects the directory tree at `dir`.
    pub fn tree(mut self, dir: &Path, what: &'static str) -> Self {
        self.add(dir, true, what);
        self
    }

    /// Protects the single file at `file`.
    pub fn file(mut self, file: &Path, what: &'static str) -> Self {
        self.add(file, false, what);
        self
    }

    fn add(&mut self, path: &Path, tree: bool, what: &'static str) {
        let lexical = fsutil::lexical_clean(
            &std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        );
        let resolved = fsutil::canonical(&lexical);
        for p in [lexical, resolved] {
            if !self.entries.iter().any(|e| e.path == p && e.tree == tree) {
                self.entries.push(Entry {
                    path: p,
                    tree,
                    what,
                });
            }
        }
    }

    /// What protected thing `canonical` (an absolute path with symlinks
    /// resolved, see [`fsutil::canonical`]) is or lies inside, if any.
    pub fn check(&self, canonical: &Path) -> Option<&'static str> {
        self.entries.iter().find_map(|e| {
            let hit = if e.tree {
                canonical.starts_with(&e.path)
            } else {
                canonical == e.path
            };
            hit.then_some(e.what)
        })
    }

    /// The refusal a file tool answers with.
    pub fn refusal(tool: &str, shown: &str, what: &str) -> String {
        format!(
            "{tool}: {shown} is {what}, which the runner depends on; the file tools do not touch it"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_and_files_both_spellings() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(real.join("state")).unwrap();
        std::os::unix::fs::symlink(real.join("state"), real.join("alias")).unwrap();
        let p = Protected::default()
            .tree(&real.join("state"), "the runner's state directory")
            .file(&real.join("sock"), "the runner's socket");
        let c = |rel: &str| fsutil::canonical(&real.join(rel));
        assert!(p.check(&c("state/shell.snapshot")).is_some());
        assert!(p.check(&c("alias/shell.snapshot")).is_some());
        assert!(p.check(&c("state")).is_some());
        assert!(p.check(&c("sock")).is_some());
        assert!(p.check(&c("sock2")).is_none());
        assert!(p.check(&c("statex/a")).is_none());
        assert!(p.check(&c("work/../state/x")).is_some());
    }
}
