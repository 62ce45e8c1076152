//! Filesystem helpers shared by the file tools.
//!
//! Every byte a tool reads comes through [`open_regular`] and [`read_capped`]:
//! the file is opened first and its type taken from the open descriptor, so a
//! path swapped for a FIFO between a check and the open cannot block a worker,
//! and at most the cap plus one byte is ever read, whatever size the file
//! claims (a `/proc` file says 0 and may be endless).

use std::collections::HashSet;
use std::fs::{self, File, Metadata, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Condvar, Mutex, PoisonError};

/// Mode of a file write/edit creates, or replaces when nothing carries over.
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// How many leading bytes decide whether a file is binary (grep and git sniff
/// the same way: a NUL byte in the head).
pub const BINARY_SNIFF_BYTES: usize = 8 << 10;

/// Prefix and suffix of the temporary file an atomic write renames into place;
/// the start-up sweep removes only names of this shape.
pub const TEMP_PREFIX: &str = ".agent-write-";
pub const TEMP_SUFFIX: &str = ".tmp";

/// Resolves a tool path: relative against the workdir, absolute as given.
/// There is deliberately no confinement check — the container is the
/// boundary, and bash ignores any lexical rule the file tools would follow.
pub fn resolve(workdir: &Path, p: &str) -> PathBuf {
    let path = Path::new(p);
    if path.is_absolute() {
        path.to_path_buf()
    } else {
        workdir.join(path)
    }
}

/// The same wording for the same failure whichever syscall produced it,
/// without Rust's "(os error N)" suffix, which tells the model nothing.
pub fn describe(err: &io::Error) -> String {
    use io::ErrorKind as K;
    match err.kind() {
        K::NotFound => "no such file or directory".into(),
        K::PermissionDenied => "permission denied".into(),
        K::NotADirectory => "not a directory".into(),
        K::IsADirectory => "is a directory".into(),
        K::AlreadyExists => "file exists".into(),
        K::ReadOnlyFilesystem => "read-only file system".into(),
        K::StorageFull => "no space left on device".into(),
        K::InvalidFilename => "file name too long".into(),
        _ => {
            let s = err.to_string();
            match s.find(" (os error") {
                Some(i) => s[..i].to_lowercase(),
                None => s,
            }
        }
    }
}

/// Whether the head of a file marks it as binary.
pub fn looks_binary(head: &[u8]) -> bool {
    head[..head.len().min(BINARY_SNIFF_BYTES)].contains(&0)
}

/// Why a path cannot be read as a regular file.
#[derive(Debug)]
pub enum OpenError {
    Io(io::Error),
    Directory,
    /// A FIFO, device or socket: reading one could block forever or never end.
    NotRegular(&'static str),
}

impl OpenError {
    /// The reason, worded for the model.
    pub fn describe(&self) -> String {
        match self {
            OpenError::Io(e) => describe(e),
            OpenError::Directory => "is a directory".into(),
            OpenError::NotRegular(kind) => {
                format!("is {kind}, not a regular file; the file tools only read regular files")
            }
        }
    }
}

/// What kind of non-regular file `meta` describes, or `None` for a regular file.
pub fn special_kind(meta: &Metadata) -> Option<&'static str> {
    let t = meta.file_type();
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a regular file")
    }
}

/// Opens a regular file for reading, and only a regular file.
///
/// The path is stat'ed first so that a device is never opened at all (opening
/// some has effects: a tape rewinds, a watchdog arms), then opened without
/// blocking and checked again on the descriptor, which is what the read will
/// actually use: a FIFO swapped in between the two is refused, not waited on.
pub fn open_regular(path: &Path) -> Result<(File, Metadata), OpenError> {
    let before = fs::metadata(path).map_err(OpenError::Io)?;
    check_regular(&before)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(OpenError::Io)?;
    let meta = file.metadata().map_err(OpenError::Io)?;
    check_regular(&meta)?;
    Ok((file, meta))
}

fn check_regular(meta: &Metadata) -> Result<(), OpenError> {
    if meta.is_dir() {
        return Err(OpenError::Directory);
    }
    match special_kind(meta) {
        None => Ok(()),
        Some(kind) => Err(OpenError::NotRegular(kind)),
    }
}

/// Reads at most `cap` bytes, and reports whether there was more. Never
/// allocates past `cap + 1` bytes, whatever the file's stated size: a size of
/// 0 is what `/proc/self/pagemap` states, and it does not end.
pub fn read_capped(file: &mut File, size_hint: u64, cap: u64) -> io::Result<(Vec<u8>, bool)> {
    let want = size_hint.min(cap).saturating_add(1);
    let mut buf = Vec::with_capacity(usize::try_from(want).unwrap_or(0).min(1 << 20));
    Read::by_ref(file)
        .take(cap.saturating_add(1))
        .read_to_end(&mut buf)?;
    let over = buf.len() as u64 > cap;
    if over {
        buf.truncate(cap as usize);
    }
    Ok((buf, over))
}

/// Why one of the runner's own input files (the toolset, the binding)
/// could not be read.
#[derive(Debug)]
pub enum ConfigReadError {
    /// Not there (yet): a warm sandbox's files appear when it is claimed.
    Missing,
    /// There, but not readable as asked; the message names the file and why.
    Unusable(String),
}

impl std::fmt::Display for ConfigReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigReadError::Missing => f.write_str("no such file or directory"),
            ConfigReadError::Unusable(m) => f.write_str(m),
        }
    }
}

/// Reads a file the operator hands the runner (through a mounted
/// ConfigMap), whole, and only if it holds at most `cap` bytes. It goes
/// through [`open_regular`] and [`read_capped`] like a tool's read, because
/// the sandbox user can replace these files too: a FIFO in their place must
/// not block the runner, nor an endless file grow it.
pub fn read_config_file(path: &Path, cap: u64) -> Result<Vec<u8>, ConfigReadError> {
    let (mut file, meta) = open_regular(path).map_err(|e| match e {
        OpenError::Io(e) if e.kind() == io::ErrorKind::NotFound => ConfigReadError::Missing,
        OpenError::NotRegular(kind) => {
            ConfigReadError::Unusable(format!("is {kind}, not a regular file"))
        }
        e => ConfigReadError::Unusable(e.describe()),
    })?;
    if meta.len() > cap {
        return Err(too_large(cap));
    }
    let (bytes, over) = read_capped(&mut file, meta.len(), cap)
        .map_err(|e| ConfigReadError::Unusable(describe(&e)))?;
    if over {
        return Err(too_large(cap));
    }
    Ok(bytes)
}

fn too_large(cap: u64) -> ConfigReadError {
    ConfigReadError::Unusable(format!(
        "larger than {cap} bytes, the most the runner reads of it (a ConfigMap holds 1 MiB)"
    ))
}

/// Writes `data` to `path` atomically and durably: a temporary file in the
/// same directory, fsynced, renamed over the target, then the directory
/// fsynced, so a reader never sees half a file, a failed write leaves the old
/// one intact, and an answered write survives a crash of the node.
///
/// The permission bits of a regular file being replaced carry over (a script
/// made executable with `chmod +x` stays executable after an edit); a new
/// file, or a symlink being replaced, gets [`DEFAULT_FILE_MODE`]. The rename
/// replaces a symlink rather than writing through it.
///
/// `journal` records the temporary file's name before it exists, so a runner
/// killed mid-write removes it on its next start ([`Journal::sweep`]).
pub fn atomic_write(path: &Path, data: &[u8], journal: Option<&Journal>) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mode = match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => m.mode() & 0o7777,
        _ => DEFAULT_FILE_MODE,
    };
    let tmp_path = dir.join(format!(
        "{TEMP_PREFIX}{}-{}{TEMP_SUFFIX}",
        std::process::id(),
        next_temp_seq()
    ));
    if let Some(j) = journal {
        j.record(&tmp_path)?;
    }
    let res = write_then_rename(&tmp_path, path, dir, data, mode);
    if res.is_err() {
        let _ = fs::remove_file(&tmp_path);
    }
    res
}

fn write_then_rename(
    tmp: &Path,
    path: &Path,
    dir: &Path,
    data: &[u8],
    mode: u32,
) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(tmp)?;
    f.write_all(data)?;
    // fchmod on a file we own: cannot fail for lack of privilege. If it does
    // fail anyway (an odd filesystem), the file still lands with 0600 rather
    // than the write failing.
    let _ = f.set_permissions(Permissions::from_mode(mode));
    f.sync_all()?;
    drop(f);
    fs::rename(tmp, path)?;
    // The rename is durable only once the directory is; a directory that
    // cannot be opened for fsync (an odd filesystem) still has the file.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn next_temp_seq() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    SEQ.fetch_add(1, Ordering::Relaxed)
}

/// Whether a file name is one [`atomic_write`] gives its temporary files.
pub fn is_temp_name(name: &str) -> bool {
    name.starts_with(TEMP_PREFIX) && name.ends_with(TEMP_SUFFIX) && !name.contains('/')
}

/// The names of temporary files writes have created, one per line, appended
/// before each file exists. A runner killed between the create and the
/// rename leaves the temporary file behind; the next runner reads the
/// journal and removes every listed file that is still there.
#[derive(Debug)]
pub struct Journal {
    path: PathBuf,
    file: Mutex<File>,
}

/// Past this size the journal is emptied once no write is between its create
/// and its rename, so it stays small however many writes a session makes.
const JOURNAL_ROTATE_BYTES: u64 = 1 << 20;

impl Journal {
    pub fn open(path: PathBuf) -> io::Result<Journal> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)?;
        Ok(Journal {
            path,
            file: Mutex::new(file),
        })
    }

    fn record(&self, tmp: &Path) -> io::Result<()> {
        use std::os::unix::ffi::OsStrExt;
        let mut line = tmp.as_os_str().as_bytes().to_vec();
        if line.contains(&b'\n') {
            // A name the journal cannot hold cannot be swept either.
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a path with a newline cannot be written atomically",
            ));
        }
        line.push(b'\n');
        let mut f = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        if f.metadata().map(|m| m.len()).unwrap_or(0) > JOURNAL_ROTATE_BYTES {
            // Entries of writes that finished are only noise; an entry of a
            // write still in flight is lost, which costs at most one stray
            // temporary file after a crash during this instant.
            let _ = f.set_len(0);
        }
        f.write_all(&line)
    }

    /// Removes the temporary files an interrupted runner left, then empties
    /// the journal. Only names of the temporary-file shape are removed, so a
    /// planted line cannot delete anything else. Reads at most a bounded
    /// amount. Returns how many files were removed.
    pub fn sweep(&self) -> usize {
        use std::os::unix::ffi::OsStrExt;
        let f = self.file.lock().unwrap_or_else(PoisonError::into_inner);
        let mut data = Vec::new();
        let read = File::open(&self.path)
            .and_then(|r| r.take(4 * JOURNAL_ROTATE_BYTES).read_to_end(&mut data));
        let mut removed = 0;
        if read.is_ok() {
            let mut seen = HashSet::new();
            for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                let p = Path::new(std::ffi::OsStr::from_bytes(line));
                let name_ok = p
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(is_temp_name);
                if !name_ok || !p.is_absolute() || !seen.insert(p.to_path_buf()) {
                    continue;
                }
                if let Ok(m) = fs::symlink_metadata(p)
                    && m.file_type().is_file()
                    && fs::remove_file(p).is_ok()
                {
                    removed += 1;
                }
            }
        }
        let _ = f.set_len(0);
        removed
    }
}

/// Calls on the same file, one at a time: two concurrent edits of one file
/// would otherwise each read the old content and the second rename would
/// drop the first edit.
#[derive(Debug, Default)]
pub struct PathLocks {
    busy: Mutex<HashSet<PathBuf>>,
    freed: Condvar,
}

/// Held while a call works on a path; dropping it lets the next one in.
#[derive(Debug)]
pub struct PathGuard<'a> {
    locks: &'a PathLocks,
    key: PathBuf,
}

impl PathLocks {
    /// Waits until no other call holds `key`, then holds it.
    pub fn lock(&self, key: PathBuf) -> PathGuard<'_> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while busy.contains(&key) {
            busy = self
                .freed
                .wait(busy)
                .unwrap_or_else(PoisonError::into_inner);
        }
        busy.insert(key.clone());
        PathGuard { locks: self, key }
    }
}

impl Drop for PathGuard<'_> {
    fn drop(&mut self) {
        let mut busy = self
            .locks
            .busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        busy.remove(&self.key);
        self.locks.freed.notify_all();
    }
}

/// The path with symlinks resolved as far as it exists, the rest appended
/// lexically: what a write to a file that does not exist yet would create.
/// `path` must be absolute.
pub fn canonical(path: &Path) -> PathBuf {
    if let Ok(p) = fs::canonicalize(path) {
        return p;
    }
    let clean = lexical_clean(path);
    let mut existing = clean.as_path();
    let mut rest: Vec<&std::ffi::OsStr> = Vec::new();
    // Bounded by the number of components.
    while let Some(parent) = existing.parent() {
        if let Some(name) = existing.file_name() {
            rest.push(name);
        }
        existing = parent;
        if let Ok(mut p) = fs::canonicalize(existing) {
            for name in rest.iter().rev() {
                p.push(name);
            }
            return p;
        }
    }
    clean
}

/// Drops `.` and folds `..` lexically, so `/w/sub/../x` reads `/w/x`.
pub fn lexical_clean(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_capped_never_reads_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, vec![b'a'; 1000]).unwrap();
        let (mut f, _) = open_regular(&p).unwrap();
        let (data, over) = read_capped(&mut f, 0, 10).unwrap();
        assert_eq!(data.len(), 10);
        assert!(over);
        let (mut f, _) = open_regular(&p).unwrap();
        let (data, over) = read_capped(&mut f, 1000, 1000).unwrap();
        assert_eq!(data.len(), 1000);
        assert!(!over);
    }

    #[test]
    fn special_files_are_refused_before_any_read() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(matches!(
            open_regular(&fifo),
            Err(OpenError::NotRegular("a FIFO (named pipe)"))
        ));
        assert!(matches!(
            open_regular(Path::new("/dev/zero")),
            Err(OpenError::NotRegular("a character device"))
        ));
        assert!(matches!(
            open_regular(dir.path()),
            Err(OpenError::Directory)
        ));
    }

    #[test]
    fn canonical_resolves_the_existing_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let real = fs::canonicalize(dir.path()).unwrap();
        std::os::unix::fs::symlink(&real, real.join("link")).unwrap();
        assert_eq!(
            canonical(&real.join("link/new/../x.txt")),
            real.join("x.txt")
        );
        assert_eq!(canonical(&real.join("link/a/b")), real.join("a/b"));
    }

    #[test]
    fn journal_sweeps_only_temp_names() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::open(dir.path().join("journal")).unwrap();
        let tmp = dir.path().join(".agent-write-1-2.tmp");
        let other = dir.path().join("keep.txt");
        fs::write(&tmp, "x").unwrap();
        fs::write(&other, "x").unwrap();
        j.record(&tmp).unwrap();
        j.record(&other).unwrap();
        assert_eq!(j.sweep(), 1);
        assert!(!tmp.exists());
        assert!(other.exists());
    }

    #[test]
    fn path_locks_serialise_one_key() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicUsize, Ordering};
        let locks = Arc::new(PathLocks::default());
        let inside = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..8)
            .map(|_| {
                let (locks, inside) = (locks.clone(), inside.clone());
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        let _g = locks.lock(PathBuf::from("/k"));
                        assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }
}
