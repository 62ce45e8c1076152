//! Filesystem helpers shared by the file tools.

use std::fs::{self, File, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of a file write/edit creates, or replaces when nothing carries over.
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// How many leading bytes decide whether a file is binary (grep and git sniff
/// the same way: a NUL byte in the head).
pub const BINARY_SNIFF_BYTES: usize = 8 << 10;

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

/// Reads a whole (size-checked) file.
pub fn read_all(path: &Path, size_hint: u64) -> io::Result<Vec<u8>> {
    let mut f = File::open(path)?;
    let mut buf = Vec::with_capacity(usize::try_from(size_hint).unwrap_or(0).saturating_add(1));
    f.read_to_end(&mut buf)?;
    Ok(buf)
}

/// Writes `data` to `path` atomically: a temporary file in the same
/// directory, renamed over the target, so a reader never sees half a file and
/// a failed write leaves the old one intact.
///
/// The permission bits of a regular file being replaced carry over (a script
/// made executable with `chmod +x` stays executable after an edit); a new
/// file, or a symlink being replaced, gets [`DEFAULT_FILE_MODE`]. The rename
/// replaces a symlink rather than writing through it.
pub fn atomic_write(path: &Path, data: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mode = match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_file() => m.mode() & 0o7777,
        _ => DEFAULT_FILE_MODE,
    };
    let mut tmp = tempfile::Builder::new()
        .prefix(".agent-write-")
        .suffix(".tmp")
        .tempfile_in(dir)?;
    tmp.write_all(data)?;
    // fchmod on a file we own: cannot fail for lack of privilege. If it does
    // fail anyway (an odd filesystem), the file still lands, with tempfile's
    // 0600, rather than the write failing.
    let _ = tmp.as_file().set_permissions(Permissions::from_mode(mode));
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}
