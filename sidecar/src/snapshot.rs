//! bash's state between calls, trusted only as the runner wrote it.
//!
//! The snapshot (exported variables, functions, cwd) is shell code that every
//! `bash` call runs first. Anything that could change it behind the runner's
//! back -- a `write` call, a background job of an earlier call -- could make
//! the next call a human approves run commands nobody approved. So the
//! runner keeps the SHA-256 of the snapshot it installed (in memory, and in a
//! digest file for a restarted runner), reads the snapshot into memory
//! before each call, and hands bash those verified bytes on its standard
//! input rather than a path it would open again. A snapshot that does not
//! match is discarded and the call says so.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use sha2::{Digest, Sha256};

/// The largest snapshot kept. A shell whose exported state outgrows it
/// starts the next call fresh, with a notice: past this size sourcing it
/// would cost every call more than the call itself.
pub const MAX_SNAPSHOT_BYTES: u64 = 4 << 20;

/// The session's shell snapshot and the digest that vouches for it.
#[derive(Debug)]
pub struct Snapshot {
    path: PathBuf,
    digest_path: PathBuf,
    /// The digest of the snapshot the runner installed; `None` when there is
    /// none. Guarded so a load never sees a snapshot and a digest from two
    /// different installs.
    current: Mutex<Option<[u8; 32]>>,
}

/// What bash starts from.
#[derive(Debug)]
pub struct Loaded {
    /// The verified snapshot; `None` starts a fresh shell.
    pub state: Option<Vec<u8>>,
    /// Said in the call's result when the snapshot could not be used.
    pub notice: Option<String>,
}

impl Snapshot {
    /// The snapshot at `path`, vouched for by `path` + ".sha256" as a
    /// previous runner left it.
    pub fn open(path: PathBuf) -> Snapshot {
        let digest_path = path.with_extension("snapshot.sha256");
        let current = fs::read_to_string(&digest_path)
            .ok()
            .and_then(|s| hex::decode(s.trim()).ok())
            .and_then(|v| <[u8; 32]>::try_from(v).ok());
        Snapshot {
            path,
            digest_path,
            current: Mutex::new(current),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads and verifies the snapshot. A missing snapshot is a fresh shell;
    /// one that was changed, removed or replaced since the runner installed
    /// it is discarded, with a notice.
    pub fn load(&self) -> Loaded {
        let current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let data = read_bounded(&self.path, MAX_SNAPSHOT_BYTES);
        let fresh = |notice: Option<String>| Loaded {
            state: None,
            notice,
        };
        match (data, *current) {
            (Ok(None), None) => fresh(None),
            (Ok(None), Some(_)) => fresh(Some(
                "[the shell state file was removed outside the runner; this call starts from a fresh shell]".into(),
            )),
            (Ok(Some(bytes)), Some(want)) if digest(&bytes) == want => Loaded {
                state: Some(bytes),
                notice: None,
            },
            (Ok(Some(_)), _) | (Err(_), _) => {
                let _ = fs::remove_file(&self.path);
                fresh(Some(
                    "[the shell state file was changed outside the runner; it was discarded and this call starts from a fresh shell]".into(),
                ))
            }
        }
    }

    /// Installs the snapshot bash wrote at `next` (consumed) as the
    /// session's state. An unchanged snapshot is left alone (renaming over
    /// an existing file makes ext4 start writeback, a flush per call for
    /// nothing). Returns a notice when the new state could not be kept.
    pub fn install(&self, next: &Path) -> Option<String> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        let data = read_bounded(next, MAX_SNAPSHOT_BYTES);
        let bytes = match data {
            Ok(Some(b)) => b,
            Ok(None) => return None,
            Err(Oversized) => {
                let _ = fs::remove_file(next);
                return Some(format!(
                    "[the shell state grew past {} MiB and was not kept; the next call starts from the state before this one]",
                    MAX_SNAPSHOT_BYTES >> 20
                ));
            }
        };
        let d = digest(&bytes);
        if *current == Some(d) {
            let _ = fs::remove_file(next);
            return None;
        }
        // Digest first: a crash between the two leaves a digest that does not
        // match, which discards the state -- the safe reading.
        let res = crate::fsutil::atomic_write(&self.digest_path, hex::encode(d).as_bytes(), None)
            .and_then(|()| fs::rename(next, &self.path));
        match res {
            Ok(()) => {
                *current = Some(d);
                None
            }
            Err(e) => {
                let _ = fs::remove_file(next);
                *current = None;
                let _ = fs::remove_file(&self.path);
                Some(format!(
                    "[the shell state could not be saved ({}); the next call starts from a fresh shell]",
                    crate::fsutil::describe(&e)
                ))
            }
        }
    }

    /// Forgets the state (`restart`).
    pub fn clear(&self) -> io::Result<()> {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        *current = None;
        let _ = fs::remove_file(&self.digest_path);
        match fs::remove_file(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

/// The snapshot was larger than its bound (or unreadable).
#[derive(Debug)]
struct Oversized;

/// `Ok(None)` when there is no file; the bytes when there is a regular file
/// within `cap`; `Err` otherwise.
fn read_bounded(path: &Path, cap: u64) -> Result<Option<Vec<u8>>, Oversized> {
    match crate::fsutil::open_regular(path) {
        Ok((mut f, meta)) => match crate::fsutil::read_capped(&mut f, meta.len(), cap) {
            Ok((bytes, false)) => Ok(Some(bytes)),
            _ => Err(Oversized),
        },
        Err(crate::fsutil::OpenError::Io(e)) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(_) => Err(Oversized),
    }
}

fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installed_state_loads_and_tampering_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let snap = Snapshot::open(dir.path().join("shell.snapshot"));
        let l = snap.load();
        assert!(l.state.is_none() && l.notice.is_none());

        let next = dir.path().join("next");
        fs::write(&next, "export A=1\n").unwrap();
        assert!(snap.install(&next).is_none());
        assert!(!next.exists());
        let l = snap.load();
        assert_eq!(l.state.unwrap(), b"export A=1\n");

        // A restarted runner trusts what the digest file vouches for.
        let again = Snapshot::open(dir.path().join("shell.snapshot"));
        assert!(again.load().state.is_some());

        fs::write(
            dir.path().join("shell.snapshot"),
            "export A=1\nid > planted\n",
        )
        .unwrap();
        let l = snap.load();
        assert!(l.state.is_none());
        assert!(l.notice.unwrap().contains("changed outside the runner"));
        assert!(!dir.path().join("shell.snapshot").exists());
    }

    #[test]
    fn a_snapshot_nobody_vouches_for_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("shell.snapshot"), "id > planted\n").unwrap();
        let snap = Snapshot::open(dir.path().join("shell.snapshot"));
        let l = snap.load();
        assert!(l.state.is_none());
        assert!(l.notice.is_some());
    }
}
