//! The runner's per-call working files (a call's output, the next shell
//! snapshot): one directory, one counter, so that two calls never share a
//! file even when they share an id.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub struct CallFiles {
    dir: PathBuf,
    seq: AtomicU64,
}

impl CallFiles {
    pub fn new(dir: PathBuf) -> Self {
        CallFiles {
            dir,
            seq: AtomicU64::new(0),
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A working file for call `id`, named for no other.
    pub fn path(&self, id: &str, ext: &str) -> PathBuf {
        let n = self.next_seq();
        self.dir.join(format!("{n}.{id}.{ext}"))
    }

    /// A number no other call of this runner gets.
    pub fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::Relaxed)
    }
}
