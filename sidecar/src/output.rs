//! The output budget every result passes through: NUL bytes stripped, then
//! capped at [`toolset::MAX_OUTPUT_BYTES`] on a char boundary, the full output
//! spilled to a file named by the call id and the notice saying where.
//!
//! A command's output is never a pipe the runner drains into memory: it is a
//! file on disk ([`Body::File`]), of which only the head the model can see is
//! ever read. A gigabyte of output costs the runner ~100 KiB of memory and its
//! spill is a rename, not a copy through RAM.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use toolset::MAX_OUTPUT_BYTES;

/// What a tool produced, before the budget is applied.
#[derive(Debug)]
pub enum Body {
    Text(String),
    /// Output already on disk (bash, grep). The file is consumed: removed when
    /// it fits the budget, moved to the spill location when it does not.
    File(PathBuf),
    /// Two output files shown one after the other, with a newline between
    /// them when `separated`: a bash call's stdout and stderr, in the order
    /// and with the separator the reference gives (stderr first for a failed
    /// call; the newline whenever stderr is not empty). Both are consumed.
    Joined {
        first: PathBuf,
        second: PathBuf,
        separated: bool,
    },
}

/// One tool outcome on its way to becoming a [`crate::ToolResult`].
#[derive(Debug)]
pub struct Output {
    pub body: Body,
    /// Appended after the (possibly cut) body and always kept, so the model
    /// sees `exit code: 2` even under a megabyte of output.
    pub trailer: String,
    pub is_error: bool,
}

impl Output {
    pub fn ok(text: impl Into<String>) -> Self {
        Output {
            body: Body::Text(text.into()),
            trailer: String::new(),
            is_error: false,
        }
    }

    pub fn error(text: impl Into<String>) -> Self {
        Output {
            body: Body::Text(text.into()),
            trailer: String::new(),
            is_error: true,
        }
    }
}

/// Where a call's oversized output goes, and how much of it is kept.
#[derive(Debug, Clone)]
pub struct Spill {
    pub dir: PathBuf,
    /// Most spill files kept; the oldest go first.
    pub max_files: usize,
    /// Most bytes the spill files may hold together; the oldest go first,
    /// but the newest is always kept, whatever its size.
    pub max_bytes: u64,
}

/// Most directory entries looked at when pruning.
const MAX_SPILL_SCAN: usize = 1 << 16;

/// Default of [`Spill::max_files`].
pub const DEFAULT_SPILL_MAX_FILES: usize = 256;
/// Default of [`Spill::max_bytes`]: 2 GiB.
pub const DEFAULT_SPILL_MAX_BYTES: u64 = 2 << 30;

impl Spill {
    /// A spill directory with the default retention.
    pub fn new(dir: PathBuf) -> Self {
        Spill {
            dir,
            max_files: DEFAULT_SPILL_MAX_FILES,
            max_bytes: DEFAULT_SPILL_MAX_BYTES,
        }
    }

    /// Removes the oldest spill files until the retention bounds hold,
    /// never `newest`. Only files named as spills are counted or removed.
    /// Returns how many were removed.
    pub fn prune(&self, newest: &Path) -> usize {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return 0;
        };
        let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
            .flatten()
            .take(MAX_SPILL_SCAN)
            .filter(|e| {
                e.file_name()
                    .to_str()
                    .and_then(|n| n.strip_suffix(".txt"))
                    .is_some_and(|id| toolset::spill_file_name(id).is_ok())
            })
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                m.is_file().then(|| {
                    (
                        m.modified().unwrap_or(std::time::SystemTime::UNIX_EPOCH),
                        m.len(),
                        e.path(),
                    )
                })
            })
            .collect();
        files.sort();
        let mut count = files.len();
        let mut bytes: u64 = files.iter().map(|f| f.1).sum();
        let mut removed = 0;
        for (_, len, path) in files {
            if count <= self.max_files && bytes <= self.max_bytes {
                break;
            }
            if path == newest {
                continue;
            }
            if fs::remove_file(&path).is_ok() {
                removed += 1;
                count -= 1;
                bytes = bytes.saturating_sub(len);
            }
        }
        removed
    }

    fn path_for(&self, id: &str) -> Result<PathBuf, String> {
        toolset::spill_file_name(id)
            .map(|name| self.dir.join(name))
            .map_err(|e| e.to_string())
    }
}

/// Applies the budget. Never fails: a spill that cannot be written degrades
/// to a notice saying the full output was lost and why.
pub fn finish(out: Output, id: &str, spill: &Spill) -> (String, bool) {
    let Output {
        body,
        trailer,
        is_error,
    } = out;
    let trailer = toolset::sanitize_text(&trailer).into_owned();
    let budget = MAX_OUTPUT_BYTES.saturating_sub(trailer.len());
    let content = match body {
        Body::Text(text) => {
            let clean = toolset::sanitize_text(&text);
            if clean.len() <= budget {
                let mut s = clean.into_owned();
                append_trailer(&mut s, &trailer);
                s
            } else {
                let notice = spill_text(&clean, id, spill);
                compose(&clean, &notice, &trailer)
            }
        }
        Body::Joined {
            first,
            second,
            separated,
        } => joined(&first, &second, separated, budget, id, spill, &trailer),
        Body::File(path) => match read_head(&path, MAX_OUTPUT_BYTES) {
            Ok((head, more)) => {
                if !more && head.len() <= budget {
                    let _ = fs::remove_file(&path);
                    let mut s = head;
                    append_trailer(&mut s, &trailer);
                    s
                } else {
                    let notice = spill_file(&path, id, spill);
                    compose(&head, &notice, &trailer)
                }
            }
            Err(e) => {
                let _ = fs::remove_file(&path);
                format!(
                    "[the output could not be read back: {}]{trailer}",
                    crate::fsutil::describe(&e)
                )
            }
        },
    };
    (content, is_error)
}

/// The joined output of two files, within the budget: read from their
/// heads when it fits, otherwise spilled whole (a streamed copy of both into
/// the spill file, never a read into memory) with the notice.
fn joined(
    first: &Path,
    second: &Path,
    separated: bool,
    budget: usize,
    id: &str,
    spill: &Spill,
    trailer: &str,
) -> String {
    let remove = || {
        let _ = fs::remove_file(first);
        let _ = fs::remove_file(second);
    };
    let heads = read_head(first, MAX_OUTPUT_BYTES)
        .and_then(|a| Ok((a, read_head(second, MAX_OUTPUT_BYTES)?)));
    let ((a, a_more), (b, b_more)) = match heads {
        Ok(h) => h,
        Err(e) => {
            remove();
            return format!(
                "[the output could not be read back: {}]{trailer}",
                crate::fsutil::describe(&e)
            );
        }
    };
    let sep = if separated { "\n" } else { "" };
    let mut head = String::with_capacity(a.len() + sep.len() + b.len());
    head.push_str(&a);
    head.push_str(sep);
    head.push_str(&b);
    if !a_more && !b_more && head.len() <= budget {
        remove();
        append_trailer(&mut head, trailer);
        return head;
    }
    let notice = spill_joined(first, second, sep, id, spill);
    remove();
    compose(&head, &notice, trailer)
}

fn spill_joined(first: &Path, second: &Path, sep: &str, id: &str, spill: &Spill) -> String {
    let path = match spill.path_for(id) {
        Ok(p) => p,
        Err(e) => return lost_notice(&e),
    };
    let copy = || -> io::Result<u64> {
        fs::create_dir_all(&spill.dir)?;
        let mut out = fs::File::create(&path)?;
        let mut n = io::copy(&mut File::open(first)?, &mut out)?;
        io::Write::write_all(&mut out, sep.as_bytes())?;
        n += sep.len() as u64;
        n += io::copy(&mut File::open(second)?, &mut out)?;
        Ok(n)
    };
    match copy() {
        Ok(size) => {
            spill.prune(&path);
            notice_for(&path, size)
        }
        Err(e) => lost_notice(&format!(
            "{}: {}",
            path.display(),
            crate::fsutil::describe(&e)
        )),
    }
}

/// Appends the trailer (which starts with a newline) on a line of its own:
/// after output that already ended its line, or after no output at all, the
/// trailer's own newline would only add a blank line.
fn append_trailer(s: &mut String, trailer: &str) {
    match trailer.strip_prefix('\n') {
        Some(rest) if s.is_empty() || s.ends_with('\n') => s.push_str(rest),
        _ => s.push_str(trailer),
    }
}

/// head, cut so that head + "\n" + notice + trailer fits the budget.
pub(crate) fn compose(head: &str, notice: &str, trailer: &str) -> String {
    let tail_len = 1 + notice.len() + trailer.len();
    let keep = MAX_OUTPUT_BYTES.saturating_sub(tail_len);
    let mut s = String::with_capacity(MAX_OUTPUT_BYTES);
    s.push_str(toolset::truncate_runes(head, keep));
    s.push('\n');
    s.push_str(notice);
    s.push_str(trailer);
    if s.len() > MAX_OUTPUT_BYTES {
        // Only reachable with an absurd trailer; the budget still holds.
        let cut = toolset::truncate_runes(&s, MAX_OUTPUT_BYTES).len();
        s.truncate(cut);
    }
    s
}

fn notice_for(path: &Path, size: u64) -> String {
    toolset::spill_notice(&path.display().to_string(), size)
}

fn lost_notice(why: &str) -> String {
    format!(
        "[output truncated to {} KiB; the full output could not be saved: {why}]",
        MAX_OUTPUT_BYTES >> 10
    )
}

fn spill_text(full: &str, id: &str, spill: &Spill) -> String {
    let path = match spill.path_for(id) {
        Ok(p) => p,
        Err(e) => return lost_notice(&e),
    };
    let res = fs::create_dir_all(&spill.dir)
        .and_then(|()| crate::fsutil::atomic_write(&path, full.as_bytes(), None));
    match res {
        Ok(()) => {
            spill.prune(&path);
            notice_for(&path, full.len() as u64)
        }
        Err(e) => lost_notice(&format!(
            "{}: {}",
            path.display(),
            crate::fsutil::describe(&e)
        )),
    }
}

/// Moves the output file to the spill location: a rename on the same
/// filesystem, a streamed copy otherwise — never a read into memory.
fn spill_file(src: &Path, id: &str, spill: &Spill) -> String {
    let path = match spill.path_for(id) {
        Ok(p) => p,
        Err(e) => {
            let _ = fs::remove_file(src);
            return lost_notice(&e);
        }
    };
    let res = fs::create_dir_all(&spill.dir).and_then(|()| match fs::rename(src, &path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::CrossesDevices => {
            let copied = fs::copy(src, &path).map(drop);
            let _ = fs::remove_file(src);
            copied
        }
        Err(e) => Err(e),
    });
    match res {
        Ok(()) => {
            spill.prune(&path);
            let size = fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
            notice_for(&path, size)
        }
        Err(e) => {
            let _ = fs::remove_file(src);
            lost_notice(&format!(
                "{}: {}",
                path.display(),
                crate::fsutil::describe(&e)
            ))
        }
    }
}

/// Reads at most `limit` bytes that survive NUL stripping from the head of a
/// file, returning them as text and whether more follows. Memory stays at
/// `limit` plus one buffer however large the file is.
///
/// It stops at the length the file had when it was opened, so a background
/// job still appending to it cannot keep the call reading forever.
pub fn read_head(path: &Path, limit: usize) -> io::Result<(String, bool)> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    let mut reader = f.take(len);
    let mut kept: Vec<u8> =
        Vec::with_capacity(limit.min(usize::try_from(len).unwrap_or(limit)) + 1);
    let mut buf = vec![0u8; 64 << 10];
    let mut more = false;
    loop {
        let n = match reader.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        for &b in &buf[..n] {
            if b == 0 {
                continue;
            }
            if kept.len() == limit {
                more = true;
                break;
            }
            kept.push(b);
        }
        if more {
            break;
        }
    }
    Ok((bytes_to_text(kept, more), more))
}

/// Lossy UTF-8, except that a multi-byte character cut by the read limit is
/// dropped rather than turned into U+FFFD.
pub(crate) fn bytes_to_text(mut bytes: Vec<u8>, cut: bool) -> String {
    if cut
        && let Err(e) = std::str::from_utf8(&bytes)
        && e.error_len().is_none()
    {
        bytes.truncate(e.valid_up_to());
    }
    match String::from_utf8(bytes) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compose_respects_budget_and_keeps_trailer() {
        let head = "é".repeat(MAX_OUTPUT_BYTES);
        let s = compose(&head, "[notice]", "\nexit code: 3");
        assert!(s.len() <= MAX_OUTPUT_BYTES);
        assert!(s.ends_with("[notice]\nexit code: 3"));
    }

    #[test]
    fn cut_multibyte_is_dropped_not_replaced() {
        let mut b = "ab".as_bytes().to_vec();
        b.extend_from_slice(&"é".as_bytes()[..1]);
        assert_eq!(bytes_to_text(b, true), "ab");
    }

    #[test]
    fn read_head_strips_nul_and_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let mut data = vec![0u8; 1000];
        data.extend(std::iter::repeat_n(b'a', 50));
        fs::write(&p, &data).unwrap();
        let (s, more) = read_head(&p, 10).unwrap();
        assert_eq!(s, "a".repeat(10));
        assert!(more);
        let (s, more) = read_head(&p, 50).unwrap();
        assert_eq!(s.len(), 50);
        assert!(!more);
    }
}
