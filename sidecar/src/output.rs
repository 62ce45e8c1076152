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
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use toolset::MAX_OUTPUT_BYTES;

/// What a tool produced, before the budget is applied.
#[derive(Debug)]
pub enum Body {
    Text(String),
    /// Output already on disk (bash, grep). The file is consumed: removed when
    /// it fits the budget, moved to the spill location when it does not.
    File(PathBuf),
    /// Pieces shown one after the other: text, and ranges of files already
    /// open (a bash call's stdout and stderr, what earlier calls'
    /// background jobs wrote since). Read by position, so a file that is
    /// still being appended to, or was unlinked, reads the same; nothing
    /// here is removed, the files' owners unlink them.
    Parts(Vec<Part>),
}

/// One piece of [`Body::Parts`].
#[derive(Debug, Clone)]
pub enum Part {
    Text(String),
    /// `len` bytes of `file` from `start`.
    Range {
        file: Arc<File>,
        start: u64,
        len: u64,
    },
    /// Output from elsewhere than the call itself (what an earlier call's
    /// background jobs wrote since), between its header and footer lines.
    /// Its body is shown within [`FRAMED_BUDGET`] so that it never pushes
    /// the call's own output out of the result; past that, every framed
    /// part is saved whole beside the call's spill file, and each shows
    /// its head and its footer.
    Framed {
        header: String,
        body: Vec<Part>,
        footer: String,
    },
}

/// Most bytes of [`Part::Framed`] bodies one result shows, together.
pub const FRAMED_BUDGET: usize = 32 << 10;

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
        Body::Parts(parts) => {
            let parts = condense_framed(parts, id, spill);
            from_parts(&parts, budget, id, spill, &trailer)
        }
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

/// The parts with every [`Part::Framed`] opened up: whole when their
/// bodies fit [`FRAMED_BUDGET`] together, otherwise saved whole to
/// `<id>.background.txt` in the spill directory and each cut to its share,
/// keeping its header and footer, with one line naming the file.
fn condense_framed(parts: Vec<Part>, id: &str, spill: &Spill) -> Vec<Part> {
    let framed = parts
        .iter()
        .filter(|p| matches!(p, Part::Framed { .. }))
        .count();
    if framed == 0 {
        return parts;
    }
    let total: u64 = parts
        .iter()
        .map(|p| match p {
            Part::Framed { body, .. } => body.iter().map(part_len).sum(),
            _ => 0,
        })
        .sum();
    if total <= FRAMED_BUDGET as u64 {
        return flatten(parts);
    }
    let share = FRAMED_BUDGET / framed;
    let whole = flatten(
        parts
            .iter()
            .filter(|p| matches!(p, Part::Framed { .. }))
            .cloned()
            .collect(),
    );
    let name = format!("{}.background", toolset::truncate_runes(id, 100));
    let saved = match spill.path_for(&name) {
        Ok(path) => match write_parts(&whole, &path, spill) {
            Ok(size) => format!(
                "[background output is shown up to {share} bytes per call; all of it ({size} bytes) is saved in {p}; view it in slices, e.g. sed -n '1,200p' {p}]\n",
                p = path.display()
            ),
            Err(e) => format!(
                "[background output is shown up to {share} bytes per call; the rest could not be saved: {}]\n",
                crate::fsutil::describe(&e)
            ),
        },
        Err(e) => format!(
            "[background output is shown up to {share} bytes per call; the rest could not be saved: {e}]\n"
        ),
    };
    let last_framed = parts
        .iter()
        .rposition(|p| matches!(p, Part::Framed { .. }))
        .unwrap_or(0);
    let mut out = Vec::new();
    for (i, p) in parts.into_iter().enumerate() {
        let Part::Framed {
            header,
            body,
            footer,
        } = p
        else {
            out.push(p);
            continue;
        };
        out.push(Part::Text(header));
        match read_parts(&body, share) {
            Ok((head, more)) => {
                let ends_line = head.is_empty() || head.ends_with('\n');
                out.push(Part::Text(head));
                if more {
                    let nl = if ends_line { "" } else { "\n" };
                    out.push(Part::Text(format!("{nl}[... cut here]\n")));
                } else if !ends_line {
                    out.push(Part::Text("\n".into()));
                }
            }
            Err(e) => out.push(Part::Text(format!(
                "[it could not be read back: {}]\n",
                crate::fsutil::describe(&e)
            ))),
        }
        out.push(Part::Text(footer));
        if i == last_framed {
            out.push(Part::Text(saved.clone()));
        }
    }
    out
}

/// The parts with every [`Part::Framed`] laid out whole: header, body (a
/// newline added when it does not end its line), footer.
fn flatten(parts: Vec<Part>) -> Vec<Part> {
    let mut out = Vec::with_capacity(parts.len());
    for p in parts {
        let Part::Framed {
            header,
            body,
            footer,
        } = p
        else {
            out.push(p);
            continue;
        };
        let ends_line = last_byte(&body).is_none_or(|b| b == b'\n');
        out.push(Part::Text(header));
        out.extend(flatten(body));
        if !ends_line {
            out.push(Part::Text("\n".into()));
        }
        out.push(Part::Text(footer));
    }
    out
}

/// How many bytes a part holds (before NUL stripping).
fn part_len(p: &Part) -> u64 {
    match p {
        Part::Text(t) => t.len() as u64,
        Part::Range { len, .. } => *len,
        Part::Framed {
            header,
            body,
            footer,
        } => (header.len() + footer.len()) as u64 + body.iter().map(part_len).sum::<u64>(),
    }
}

/// The last byte the parts hold, if any.
fn last_byte(parts: &[Part]) -> Option<u8> {
    for p in parts.iter().rev() {
        match p {
            Part::Text(t) => {
                if let Some(&b) = t.as_bytes().last() {
                    return Some(b);
                }
            }
            Part::Range { file, start, len } if *len > 0 => {
                let mut b = [0u8; 1];
                return match file.read_at(&mut b, start + len - 1) {
                    Ok(1) => Some(b[0]),
                    _ => None,
                };
            }
            Part::Range { .. } => {}
            Part::Framed { footer, .. } => return footer.as_bytes().last().copied(),
        }
    }
    None
}

/// The parts' text within the budget: read from their heads when it fits,
/// otherwise spilled whole (a streamed copy of every part into the spill
/// file, never a read into memory) with the notice.
fn from_parts(parts: &[Part], budget: usize, id: &str, spill: &Spill, trailer: &str) -> String {
    let (mut head, more) = match read_parts(parts, MAX_OUTPUT_BYTES) {
        Ok(h) => h,
        Err(e) => {
            return format!(
                "[the output could not be read back: {}]{trailer}",
                crate::fsutil::describe(&e)
            );
        }
    };
    if !more && head.len() <= budget {
        append_trailer(&mut head, trailer);
        return head;
    }
    let notice = spill_parts(parts, id, spill);
    compose(&head, &notice, trailer)
}

/// At most `limit` bytes that survive NUL stripping from the head of the
/// parts together, as text, and whether more follows. Memory stays at
/// `limit` plus one buffer whatever the parts hold.
pub fn read_parts(parts: &[Part], limit: usize) -> io::Result<(String, bool)> {
    let mut kept: Vec<u8> = Vec::new();
    let mut more = false;
    let mut keep = |bytes: &[u8]| -> bool {
        for &b in bytes {
            if b == 0 {
                continue;
            }
            if kept.len() == limit {
                more = true;
                return false;
            }
            kept.push(b);
        }
        true
    };
    let mut buf = vec![0u8; 64 << 10];
    'parts: for part in parts {
        match part {
            // Opened up by `condense_framed` before anything is read.
            Part::Framed { .. } => {}
            Part::Text(t) => {
                if !keep(t.as_bytes()) {
                    break 'parts;
                }
            }
            Part::Range { file, start, len } => {
                let end = start.saturating_add(*len);
                let mut at = *start;
                while at < end {
                    let want = buf
                        .len()
                        .min(usize::try_from(end - at).unwrap_or(buf.len()));
                    let n = match file.read_at(&mut buf[..want], at) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    at += n as u64;
                    if !keep(&buf[..n]) {
                        break 'parts;
                    }
                }
            }
        }
    }
    Ok((bytes_to_text(kept, more), more))
}

/// Every part, whole, into the call's spill file.
fn spill_parts(parts: &[Part], id: &str, spill: &Spill) -> String {
    let path = match spill.path_for(id) {
        Ok(p) => p,
        Err(e) => return lost_notice(&e),
    };
    match write_parts(parts, &path, spill) {
        Ok(size) => notice_for(&path, size),
        Err(e) => lost_notice(&format!(
            "{}: {}",
            path.display(),
            crate::fsutil::describe(&e)
        )),
    }
}

/// Writes the parts whole to `path` in the spill directory (a streamed
/// copy, never a read into memory), then prunes the spills; the bytes
/// written.
fn write_parts(parts: &[Part], path: &Path, spill: &Spill) -> io::Result<u64> {
    fs::create_dir_all(&spill.dir)?;
    let mut out = io::BufWriter::new(fs::File::create(path)?);
    let mut n = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    for part in parts {
        match part {
            Part::Text(t) => {
                io::Write::write_all(&mut out, t.as_bytes())?;
                n += t.len() as u64;
            }
            // Opened up by `condense_framed` before anything is written.
            Part::Framed { .. } => {}
            Part::Range { file, start, len } => {
                let end = start.saturating_add(*len);
                let mut at = *start;
                while at < end {
                    let want = buf
                        .len()
                        .min(usize::try_from(end - at).unwrap_or(buf.len()));
                    let got = match file.read_at(&mut buf[..want], at) {
                        Ok(0) => break,
                        Ok(got) => got,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    io::Write::write_all(&mut out, &buf[..got])?;
                    at += got as u64;
                    n += got as u64;
                }
            }
        }
    }
    io::Write::flush(&mut out)?;
    drop(out);
    spill.prune(path);
    Ok(n)
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
    fn parts_read_in_order_within_one_limit() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        fs::write(&p, b"0123\x00456789").unwrap();
        let file = Arc::new(File::open(&p).unwrap());
        let parts = vec![
            Part::Text("a\0b".into()),
            Part::Range {
                file: Arc::clone(&file),
                start: 2,
                len: 6,
            },
            Part::Text("end".into()),
        ];
        assert_eq!(
            read_parts(&parts, 100).unwrap(),
            ("ab23456end".into(), false)
        );
        assert_eq!(read_parts(&parts, 4).unwrap(), ("ab23".into(), true));
        // A framed part is opened up whole when it fits, a newline added
        // where its body does not end a line.
        let framed = flatten(vec![Part::Framed {
            header: "[h]\n".into(),
            body: vec![Part::Range {
                file,
                start: 0,
                len: 3,
            }],
            footer: "[f]\n".into(),
        }]);
        assert_eq!(
            read_parts(&framed, 100).unwrap(),
            ("[h]\n012\n[f]\n".into(), false)
        );
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
