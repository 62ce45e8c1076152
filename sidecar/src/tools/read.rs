//! read: a UTF-8 text file, whole or a `view_range` of lines.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};

use serde_json::Value;

use crate::fsutil::{
    BINARY_SNIFF_BYTES, OpenError, describe, looks_binary, open_regular, read_capped,
};
use crate::output::Output;
use crate::tools::ctx::Ctx;
use crate::tools::input::{parse, required};

/// Most bytes one read returns, whole file or `view_range` selection (the
/// reference's read cap).
pub use toolset::MAX_READ_BYTES;

/// [`MAX_READ_BYTES`] as a length.
const CAP: usize = MAX_READ_BYTES as usize;

/// The reference's words for a view_range of any other shape.
const VIEW_RANGE_SHAPE: &str = "read: view_range must be [start_line, end_line]";

/// A read as its input asks for it, checked before the file is touched.
struct Request {
    file_path: String,
    range: Option<(i64, i64)>,
}

fn request(input: &[u8]) -> Result<Request, Output> {
    let input = parse("read", input)?;
    let file_path = input.string("file_path")?;
    let range = match input.get("view_range")? {
        None => None,
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(Value::Array(a)) => match (a.as_slice(), a.first().and_then(Value::as_i64)) {
            ([_, end], Some(start)) => end.as_i64().map(|end| (start, end)),
            _ => None,
        }
        .map(Some)
        .ok_or_else(|| Output::error(VIEW_RANGE_SHAPE))?,
        Some(_) => return Err(Output::error(VIEW_RANGE_SHAPE)),
    };
    let file_path = required("read", "file_path", &file_path)?.to_owned();
    Ok(Request { file_path, range })
}

/// [`request`]'s refusal, if any (for the fuzz targets).
pub(crate) fn check(input: &[u8]) -> Result<(), Output> {
    request(input).map(drop)
}

pub fn run(ctx: &Ctx, input: &[u8]) -> Output {
    let (file_path, range) = match request(input) {
        Ok(r) => (r.file_path, r.range),
        Err(out) => return out,
    };
    let file_path = file_path.as_str();
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
        Err(OpenError::NotRegular(kind)) => {
            return Output::error(format!("read: {file_path} is {kind}, not a regular file"));
        }
        Err(OpenError::Io(e)) => {
            return Output::error(format!("read {file_path}: {}", describe(&e)));
        }
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
/// first; the read itself stops one byte past the cap whatever the size
/// said, for files whose size lies (`/proc`).
fn whole(mut file: File, file_path: &str, size: u64) -> Output {
    if size > MAX_READ_BYTES {
        return Output::error(format!(
            "read: {file_path} is {size} bytes, exceeds {MAX_READ_BYTES}-byte limit. Use the view_range parameter to read specific line ranges, e.g. view_range: [1, 500]."
        ));
    }
    let data = match read_capped(&mut file, size, MAX_READ_BYTES) {
        Ok((_, true)) => {
            return Output::error(format!(
                "read: {file_path} holds more than the {MAX_READ_BYTES}-byte limit. Use the view_range parameter to read specific line ranges, e.g. view_range: [1, 500]."
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
/// that states none (a `/proc` or `/sys` file, which may be endless) the cap.
fn scan_limit(size: u64) -> u64 {
    if size == 0 { MAX_READ_BYTES } else { size }
}

/// Lines `start..=end` (1-based; `end` <= 0 or past the end means "to the
/// end"), streamed so a range of a file over the whole-file cap still works.
/// Selection follows the reference, which splits the file on "\n" (so a
/// trailing newline is followed by one empty last line) and joins the
/// selected lines with "\n": a start past the end, or an inverted range,
/// selects nothing. A selection over the cap is an error, as there.
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
    match select(&mut reader, first, last, CAP) {
        Ok(Some(out)) => Output::ok(String::from_utf8_lossy(&out).into_owned()),
        // One line cannot be narrowed further; a range can.
        Ok(None) if first == last => Output::error(format!(
            "read: line {first} of {file_path} alone exceeds {MAX_READ_BYTES}-byte limit. The read tool cannot return part of a line, so view_range cannot narrow this further."
        )),
        Ok(None) => Output::error(format!(
            "read: view_range [{start}, {end}] of {file_path} exceeds {MAX_READ_BYTES}-byte limit. Narrow the view_range to read a smaller portion."
        )),
        Err(e) => Output::error(format!("read {file_path}: {}", describe(&e))),
    }
}

/// The selected lines joined with "\n", or `None` once they pass `cap`
/// bytes. Never holds more than `cap` + 1 bytes of a line, however long.
fn select<R: BufRead>(
    r: &mut R,
    first: u64,
    last: u64,
    cap: usize,
) -> std::io::Result<Option<Vec<u8>>> {
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
                return Ok(Some(out));
            }
            continue;
        }
        line.clear();
        let room = cap.saturating_sub(out.len());
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
        if out.len() + line.len() > cap {
            return Ok(None);
        }
        out.extend_from_slice(&line);
        selected += 1;
        // n == 0: this was the empty line after a final "\n" (or an empty
        // file); a line without "\n" is the last one too.
        if n == 0 || !ended || lineno >= last {
            return Ok(Some(out));
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
        let out = select(&mut data.as_bytes(), first, last, CAP).unwrap();
        String::from_utf8(out.expect("within the cap")).unwrap()
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

    /// The reference errs exactly when the joined selection is over the
    /// cap; a line longer than the cap is never held whole.
    #[test]
    fn the_cap_applies_to_the_joined_selection() {
        for data in ["", "a", "a\n", "ab\ncd\n", "abc\n\nde", "x\ny\nz\n"] {
            for first in 1..5 {
                for last in [1, 2, 3, 4, u64::MAX] {
                    if last < first {
                        continue;
                    }
                    let want = reference(data, first, last);
                    for cap in 0..8 {
                        let got = select(&mut data.as_bytes(), first, last, cap).unwrap();
                        let expect = (want.len() <= cap).then(|| want.clone().into_bytes());
                        assert_eq!(
                            got, expect,
                            "data={data:?} range=[{first},{last}] cap={cap}"
                        );
                    }
                }
            }
        }
        let long = "x".repeat(1000);
        assert_eq!(select(&mut long.as_bytes(), 1, 1, 10).unwrap(), None);
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
