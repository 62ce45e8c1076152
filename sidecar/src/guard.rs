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
    /// Resolved again at each check: a file the kubelet mounts from a
    /// ConfigMap is a symlink into a timestamped directory that changes at
    /// every update (and a warm sandbox's files do not exist at start).
    live: bool,
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
        self.add(dir, true, false, what);
        self
    }

    /// Protects the single file at `file`.
    pub fn file(mut self, file: &Path, what: &'static str) -> Self {
        self.add(file, false, false, what);
        self
    }

    /// Protects the single file at `file`, wherever its symlinks lead at the
    /// time of each check: for files that are replaced by swapping a link
    /// (a mounted ConfigMap's), or that appear after start.
    pub fn swapped_file(mut self, file: &Path, what: &'static str) -> Self {
        self.add(file, false, true, what);
        self
    }

    fn add(&mut self, path: &Path, tree: bool, live: bool, what: &'static str) {
        let lexical = fsutil::lexical_clean(
            &std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
        );
        let resolved = fsutil::canonical(&lexical);
        for p in [lexical, resolved] {
            match self
                .entries
                .iter_mut()
                .find(|e| e.path == p && e.tree == tree)
            {
                Some(e) => e.live |= live,
                None => self.entries.push(Entry {
                    path: p,
                    tree,
                    live,
                    what,
                }),
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
                canonical == e.path || (e.live && canonical == fsutil::canonical(&e.path))
            };
            hit.then_some(e.what)
        })
    }

    /// What of the runner's lies strictly inside the directory `dir`
    /// (real), if anything: replacing `dir` whole would remove it.
    pub fn inside(&self, dir: &Path) -> Option<&'static str> {
        self.entries
            .iter()
            .find(|e| e.path != dir && e.path.starts_with(dir))
            .map(|e| e.what)
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

    /// A ConfigMap volume: `f` is a link to `..data/f`, `..data` a link to
    /// a timestamped directory the kubelet replaces at each update. A file
    /// that did not exist when protected is protected once it does.
    #[test]
    fn swapped_files_are_followed_where_they_lead_now() {
        let dir = tempfile::tempdir().unwrap();
        let real = std::fs::canonicalize(dir.path()).unwrap();
        let p = Protected::default().swapped_file(&real.join("binding.json"), "a runner file");
        let c = |rel: &str| fsutil::canonical(&real.join(rel));
        assert!(p.check(&c("binding.json")).is_some());
        std::fs::create_dir(real.join("..2024_1")).unwrap();
        std::fs::write(real.join("..2024_1/binding.json"), b"{}").unwrap();
        std::os::unix::fs::symlink("..2024_1", real.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/binding.json", real.join("binding.json")).unwrap();
        assert!(p.check(&c("binding.json")).is_some());
        assert!(p.check(&c("..data/binding.json")).is_some());
        assert!(p.check(&c("..2024_1/binding.json")).is_some());
        assert!(p.check(&c("..2024_1/other.json")).is_none());
    }
}
