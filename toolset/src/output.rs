//! What every tool result goes through before the model reads it: NUL bytes
//! stripped, then a cap at [`MAX_OUTPUT_BYTES`] that never splits a
//! character, and the name of the file a cut output is spilled to.

use std::borrow::Cow;

use crate::MAX_OUTPUT_BYTES;
use crate::error::ToolsetError;

/// Strips NUL bytes. A NUL inside a JSON string is legal but is refused by
/// stores that keep results (Postgres jsonb among them), and one byte of
/// `/dev/zero` on stdout is enough to put one there. Run before the cap so
/// the budget is spent on bytes that survive.
pub fn sanitize_text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', ""))
    } else {
        Cow::Borrowed(s)
    }
}

/// `s` cut to at most `n` bytes, backing off to a character boundary, so a
/// split multi-byte character never turns into U+FFFD downstream.
pub fn truncate_runes(s: &str, n: usize) -> &str {
    if s.len() <= n {
        return s;
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` trimmed to [`MAX_OUTPUT_BYTES`], the truncation marked. The result,
/// marker included, never exceeds the cap.
pub fn cap_output(s: &str) -> Cow<'_, str> {
    if s.len() <= MAX_OUTPUT_BYTES {
        return Cow::Borrowed(s);
    }
    let notice = format!("[output truncated: {} bytes in all]", s.len());
    cap_output_with_notice(s, &notice)
}

/// [`cap_output`] with the caller's own marker (the runner's says where the
/// full output was spilled). The marker follows the kept text after a
/// newline; text and marker together stay within [`MAX_OUTPUT_BYTES`].
pub fn cap_output_with_notice<'a>(s: &'a str, notice: &str) -> Cow<'a, str> {
    if s.len() <= MAX_OUTPUT_BYTES {
        return Cow::Borrowed(s);
    }
    let notice = truncate_runes(notice, MAX_OUTPUT_BYTES - 1);
    let head = truncate_runes(s, MAX_OUTPUT_BYTES - 1 - notice.len());
    let mut out = String::with_capacity(head.len() + 1 + notice.len());
    out.push_str(head);
    out.push('\n');
    out.push_str(notice);
    Cow::Owned(out)
}

/// The marker a runner appends when it cut an output and saved the whole of
/// it at `path`. Shared so that every tool words it the same way and a model
/// that learned where its truncated output goes is right for all of them.
pub fn spill_notice(path: &str, total_bytes: u64) -> String {
    format!(
        "[output truncated at {} KiB; the full output ({total_bytes} bytes) is saved in {path}; view it in slices, e.g. sed -n '1,200p' {path}]",
        MAX_OUTPUT_BYTES >> 10
    )
}

/// The file name one call's spilled output gets: `<id>.txt`. The id comes
/// from the caller (the tool-use id), so it is checked to be a plain file
/// name: no separator, no leading dot, nothing a shell or a path would read
/// as structure.
pub fn spill_file_name(call_id: &str) -> Result<String, ToolsetError> {
    let refuse = |reason| {
        Err(ToolsetError::InvalidCallId {
            id: call_id.to_owned(),
            reason,
        })
    };
    if call_id.is_empty() {
        return refuse("it is empty");
    }
    if call_id.len() > 128 {
        return refuse("it is longer than 128 bytes");
    }
    if call_id.starts_with('.') {
        return refuse("it starts with a dot");
    }
    if !call_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return refuse("only letters, digits, '.', '_' and '-' are allowed");
    }
    Ok(format!("{call_id}.txt"))
}
