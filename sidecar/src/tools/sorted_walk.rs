//! The regular files below a directory, in path order, one at a time.
//!
//! grep's answer must not depend on the order a file system happens to list
//! a directory in (the same tree on two file systems gave two answers), and
//! it must not be sorted after the fact either: a search's output can be a
//! gigabyte. So the walk itself goes in order: each directory's entries are
//! sorted by name as bytes and visited depth first, a subdirectory where its
//! name falls, which is the reference's order (Go's `filepath.WalkDir`).
//! Only the listings on the path from the root to the current directory are
//! held, each bounded.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Most entries of one directory held (and so searched); a directory with
/// more is cut, and the walk says where.
pub const MAX_DIR_ENTRIES: usize = 200_000;
/// Most entries held at once over the whole path from the root, so that a
/// deep chain of large directories stays bounded too.
pub const MAX_HELD_ENTRIES: usize = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
}

#[derive(Debug)]
struct Level {
    dir: PathBuf,
    /// Sorted by name, consumed from the front.
    entries: std::vec::IntoIter<(OsString, Kind)>,
}

/// A walk in path order. Symbolic links are neither followed nor returned
/// (below the root: GNU grep's `-r`), nor are FIFOs, sockets and devices,
/// which a search could block on; directories named in `skip` are not
/// entered. Directories that cannot be listed are passed over.
#[derive(Debug)]
pub struct SortedWalk {
    stack: Vec<Level>,
    held: usize,
    skip: &'static [&'static str],
    /// The first directory whose listing was cut at a bound.
    cut: Option<PathBuf>,
}

impl SortedWalk {
    pub fn new(root: &Path, skip: &'static [&'static str]) -> Self {
        let mut walk = SortedWalk {
            stack: Vec::new(),
            held: 0,
            skip,
            cut: None,
        };
        walk.enter(root.to_path_buf());
        walk
    }

    /// The directory whose entries were not all searched, if any.
    pub fn cut(&self) -> Option<&Path> {
        self.cut.as_deref()
    }

    /// The next regular file in path order.
    pub fn next_file(&mut self) -> Option<PathBuf> {
        loop {
            let level = self.stack.last_mut()?;
            let Some((name, kind)) = level.entries.next() else {
                let done = self.stack.pop();
                self.held -= done.map_or(0, |l| l.entries.len());
                continue;
            };
            self.held -= 1;
            let path = level.dir.join(&name);
            match kind {
                Kind::File => return Some(path),
                Kind::Dir => self.enter(path),
            }
        }
    }

    fn enter(&mut self, dir: PathBuf) {
        let Ok(listing) = std::fs::read_dir(&dir) else {
            return;
        };
        let room = MAX_DIR_ENTRIES.min(MAX_HELD_ENTRIES.saturating_sub(self.held));
        let mut entries = Vec::new();
        for entry in listing {
            let Ok(entry) = entry else { continue };
            // Not followed: the entry's own type, never its target's.
            let Ok(t) = entry.file_type() else { continue };
            let name = entry.file_name();
            let kind = if t.is_dir() {
                if self.skip.iter().any(|s| name.as_bytes() == s.as_bytes()) {
                    continue;
                }
                Kind::Dir
            } else if t.is_file() {
                Kind::File
            } else {
                continue;
            };
            if entries.len() == room {
                if self.cut.is_none() {
                    self.cut = Some(dir.clone());
                }
                break;
            }
            entries.push((name, kind));
        }
        entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        self.held += entries.len();
        self.stack.push(Level {
            dir,
            entries: entries.into_iter(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(root: &Path, skip: &'static [&'static str]) -> Vec<String> {
        let mut w = SortedWalk::new(root, skip);
        std::iter::from_fn(|| w.next_file())
            .map(|p| p.strip_prefix(root).unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn files_come_in_path_order_depth_first() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        // Created out of order, so the listing order is not the answer.
        for p in [
            "b",
            "a.txt",
            "a/z",
            "a/b/c",
            "A",
            "a-",
            ".git/x",
            "sub/.git/y",
            "ü",
        ] {
            let p = root.join(p);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, "x").unwrap();
        }
        std::os::unix::fs::symlink(root.join("a.txt"), root.join("link")).unwrap();
        std::os::unix::fs::symlink(root.join("a"), root.join("dirlink")).unwrap();
        nix::unistd::mkfifo(&root.join("fifo"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(
            all(root, &[".git"]),
            ["A", "a/b/c", "a/z", "a-", "a.txt", "b", "ü"]
        );
        assert_eq!(all(root, &[]).len(), 9);
        // A missing or unreadable root is an empty walk, not a failure.
        assert!(all(&root.join("nope"), &[]).is_empty());
    }
}
