//! read: a UTF-8 text file, whole or a `view_range` of lines.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};

use serde::Deserialize;

use super::{Ctx, parse, required};
use crate::fsutil::{
    BINARY_SNIFF_BYTES, OpenError, describe, looks_binary, open_regular, read_capped,
};
use crate::output::Output;

/// Largest file read (and edit) loads whole: the reference's cap.
pub use toolset::MAX_FILE_BYTES;

/// Most text a `view_range` collects before it stops; the output budget then
/// cuts it further, so this only bounds memory.
const MAX_RANGE_BYTES: usize = MAX_FILE_BYTES as usize;

#[derive(Deserialize)]
struct Input {
    file_path: Option<String>,
    view_range: Option<Vec<i64>>,
}

pub fn run(ctx: &Ctx, input: &[u8]) -> Output {
    let input: Input = match parse("read", input) {
        Ok(i) => i,
        Err(out) => return out,
    };
    let file_path = match required("read", "file_path", &input.file_path) {
        Ok(p) => p,
        Err(out) => return out,
    };
    let range = match input.view_range.as_deref() {
        None | Some([]) => None,
        Some(&[start, end]) => Some((start, end)),
        Some(_) => return Output::error("read: view_range must be [start_line, end_line]"),
    };
    let (path, _) = match ctx.target("read", file_path) {
        Ok(t) => t,
        Err(out) => return out,
    };
    let (file, meta) = match open_regular(&path) {
        Ok(f) => f,
        Err(OpenError::Directory) => {
            return Output::error(format!(
                "read: {file_path} is a directory, not a file; list it with glob or bash ls"
            ));
        }
        Err(e) => return Output::error(format!("read {file_path}: {}", e.describe())),
    };
    match range {
        None => whole(file, file_path, meta.len()),
        Some((start, end)) => ranged(file, file_path, meta.len(), start, end),
    }
}

fn binary_error(file_path: &str) -> Output {
    Output::error(format!(
        "read: {file_path} is a binary file (it contains NUL bytes); inspect it with bash (file, xxd, strings)"
    ))
}

/// The whole file, if it is within the cap. The stated size is checked
/// first, for the reference's message; the read itself stops one byte past
/// the cap whatever the size said, for files whose size lies (`/proc`).
fn whole(mut file: File, file_path: &str, size: u64) -> Output {
    if size > MAX_FILE_BYTES {
        return Output::error(format!(
            "read: {file_path} is {size} bytes, exceeds {MAX_FILE_BYTES}-byte limit. Use view_range, or bash (head/tail/sed), to read a slice."
        ));
    }
    let data = match read_capped(&mut file, size, MAX_FILE_BYTES) {
        Ok((_, true)) => {
            return Output::error(format!(
                "read: {file_path} holds more than the {MAX_FILE_BYTES}-byte limit. Use view_range, or bash (head/tail/sed), to read a slice."
            ));
        }
        Ok((d, false)) => d,
        Err(e) => return Output::error(format!("read {file_path}: {}", describe(&e))),
    };
    if looks_binary(&data) {
        return binary_error(file_path);
    }
    Output::ok(String::from_utf8_lossy(&data).into_owned())
}

/// How far a `view_range` read scans: the file's stated size, or for a file
/// that states none (a `/proc` or `/sys` file, which may be endless) the
/// whole-file cap.
fn scan_limit(size: u64) -> u64 {
    if size == 0 { MAX_FILE_BYTES } else { size }
}

/// Lines `start..=end` (1-based; `end` <= 0 or past the end means "to the
/// end"), streamed so a range of a file over the whole-file cap still works.
/// Selection follows the reference, which splits the file on "\n" (so a
/// trailing newline is followed by one empty last line) and joins the
/// selected lines with "\n": a start past the end, or an inverted range,
/// selects nothing.
fn ranged(file: File, file_path: &str, size: u64, start: i64, end: i64) -> Output {
    // Never past what the file was when opened: a file still being appended
    // to, or one whose size lies, cannot keep the call reading forever.
    let mut reader = BufReader::with_capacity(
        BINARY_SNIFF_BYTES.max(64 << 10),
        file.take(scan_limit(size)),
    );
    match reader.fill_buf() {
        Ok(head) if looks_binary(head) => return binary_error(file_path),
        Ok(_) => {}
        Err(e) => return Output::error(format!("read {file_path}: {}", describe(&e))),
    }
    let first = start.max(1) as u64;
    let last = if end > 0 { end as u64 } else { u64::MAX };
    if last < first {
        return Output::ok("");
    }
    match select(&mut reader, first, last) {
        Ok((out, stopped_at)) => {
            let mut text = String::from_utf8_lossy(&out).into_owned();
            if let Some(line) = stopped_at {
                text.push_str(&format!(
                    "\n[view_range stopped after {MAX_RANGE_BYTES} bytes, at line {line}; ask for fewer lines]"
                ));
            }
            Output::ok(text)
        }
        Err(e) => Output::error(format!("read {file_path}: {}", describe(&e))),
    }
}

/// The selected lines joined with "\n", and the line at which the memory
/// bound stopped the selection, if it did.
fn select<R: BufRead>(r: &mut R, first: u64, last: u64) -> std::io::Result<(Vec<u8>, Option<u64>)> {
    let mut out: Vec<u8> = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    let mut lineno: u64 = 0;
    let mut selected = 0u64;
    loop {
        lineno += 1;
        if lineno < first {
            if skip_line(r)? == 0 {
                // EOF before the range: the file's last line was lineno - 1,
                // or the virtual empty line, which is never past `first - 1`.
                return Ok((out, None));
            }
            continue;
        }
        line.clear();
        let room = MAX_RANGE_BYTES.saturating_sub(out.len());
        let n = r
            .by_ref()
            .take(room as u64 + 1)
            .read_until(b'\n', &mut line)?;
        let ended = line.last() == Some(&b'\n');
        if ended {
            line.pop();
        }
        if selected > 0 {
            out.push(b'\n');
        }
        if out.len() + line.len() > MAX_RANGE_BYTES {
            return Ok((out, Some(lineno)));
        }
        out.extend_from_slice(&line);
        selected += 1;
        // n == 0: this was the empty line after a final "\n" (or an empty
        // file); a line without "\n" is the last one too.
        if n == 0 || !ended || lineno >= last {
            return Ok((out, None));
        }
    }
}

/// Consumes one line without keeping it; returns the bytes consumed.
fn skip_line<R: BufRead>(r: &mut R) -> std::io::Result<usize> {
    let mut total = 0;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(total);
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                r.consume(i + 1);
                return Ok(total + i + 1);
            }
            None => {
                let n = buf.len();
                r.consume(n);
                total += n;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(data: &str, first: u64, last: u64) -> String {
        let (out, stopped) = select(&mut data.as_bytes(), first, last).unwrap();
        assert!(stopped.is_none());
        String::from_utf8(out).unwrap()
    }

    /// The reference splits on "\n" and joins the selection with "\n".
    fn reference(data: &str, first: u64, last: u64) -> String {
        let lines: Vec<&str> = data.split('\n').collect();
        let start = (first - 1) as usize;
        if start >= lines.len() {
            return String::new();
        }
        let end = if last == u64::MAX {
            lines.len()
        } else {
            (last as usize).min(lines.len())
        };
        if end < start {
            return String::new();
        }
        lines[start..end].join("\n")
    }

    #[test]
    fn ranges_match_reference() {
        for data in ["", "a", "a\n", "a\nb", "a\nb\n", "a\n\nb\n\n", "x\ny\nz"] {
            for first in 1..6 {
                for last in [1, 2, 3, 4, 5, 6, u64::MAX] {
                    if last < first {
                        continue;
                    }
                    assert_eq!(
                        sel(data, first, last),
                        reference(data, first, last),
                        "data={data:?} range=[{first},{last}]"
                    );
                }
            }
        }
    }
}
