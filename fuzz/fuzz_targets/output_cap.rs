//! The output budget: `toolset::truncate_runes`, `cap_output`,
//! `cap_output_with_notice`, `sanitize_text`, `spill_file_name` (Go
//! `TruncateRunes`, `CapOutput`, `SanitizeText`, `SpillFile`'s naming), and
//! the runner's `compose` and `bytes_to_text`.
//!
//! Input: two bytes of a bound `n`, one byte of mode, then text. The text is
//! also repeated past `MAX_OUTPUT_BYTES` (100 KiB) to land the cap at every
//! offset of a multi-byte character.
//!
//! Invariants: no panic; every result is within its bound, is valid UTF-8
//! (a `&str`/`String` by type; checked again byte-wise), and is the longest
//! prefix of its input that fits on a character boundary, followed by the
//! exact marker; a text within the budget comes back unchanged; sanitising
//! removes exactly the NUL bytes; a spill file name is `<id>.txt` for an id
//! the rules allow and an error naming the id otherwise.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolset::MAX_OUTPUT_BYTES;

/// `head` is the longest prefix of `s` within `n` bytes that ends on a
/// character boundary.
fn longest_prefix(s: &str, head: &str, n: usize) {
    assert!(head.len() <= n, "{} bytes over a bound of {n}", head.len());
    assert!(s.starts_with(head), "not a prefix");
    assert!(std::str::from_utf8(head.as_bytes()).is_ok());
    if head.len() < s.len() {
        let next = s[head.len()..].chars().next().map_or(0, char::len_utf8);
        assert!(head.len() + next > n, "cut shorter than it had to be");
    }
}

fn big(text: &str, extra: usize) -> String {
    let unit = if text.is_empty() { "é" } else { text };
    let want = MAX_OUTPUT_BYTES - 128 + extra;
    let mut s = String::with_capacity(want + unit.len());
    while s.len() < want {
        s.push_str(unit);
    }
    s
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let n = usize::from(u16::from_le_bytes([data[0], data[1]]));
    let mode = data[2];
    let raw = &data[3..];
    let text = String::from_utf8_lossy(raw);
    let text = text.as_ref();

    longest_prefix(text, toolset::truncate_runes(text, n), n);

    let clean = toolset::sanitize_text(text);
    assert!(!clean.contains('\0'));
    assert_eq!(clean, text.replace('\0', ""));

    match toolset::spill_file_name(text) {
        Ok(name) => {
            assert_eq!(name, format!("{text}.txt"));
            assert!(!text.is_empty() && text.len() <= 128 && !text.starts_with('.'));
            assert!(
                text.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
            );
        }
        Err(e) => {
            assert!(matches!(e, toolset::ToolsetError::InvalidCallId { .. }));
            assert!(e.to_string().starts_with(&format!("call id {text:?} ")));
        }
    }

    // The runner's reading of a file head: lossy, a cut character dropped.
    let cut = mode & 2 != 0;
    let read = sidecar::fuzzing::bytes_to_text(raw.to_vec(), cut);
    match std::str::from_utf8(raw) {
        Ok(s) => assert_eq!(read, s),
        Err(e) if cut && e.error_len().is_none() => {
            assert_eq!(read.as_bytes(), &raw[..e.valid_up_to()]);
        }
        Err(_) => assert_eq!(read, String::from_utf8_lossy(raw)),
    }

    // Small texts are within budget: unchanged.
    assert_eq!(toolset::cap_output(text), text);

    if mode & 1 == 0 {
        return;
    }
    // Over the budget, at an offset of the repeated text's characters.
    let s = big(text, usize::from(mode >> 2) * 2);
    let capped = toolset::cap_output(&s);
    assert!(capped.len() <= MAX_OUTPUT_BYTES);
    if s.len() <= MAX_OUTPUT_BYTES {
        assert_eq!(capped, s.as_str());
    } else {
        let notice = format!("[output truncated: {} bytes in all]", s.len());
        let head = capped
            .strip_suffix(&format!("\n{notice}"))
            .expect("ends with the marker");
        longest_prefix(&s, head, MAX_OUTPUT_BYTES - 1 - notice.len());
    }
    let with = toolset::cap_output_with_notice(&s, text);
    assert!(with.len() <= MAX_OUTPUT_BYTES);
    if s.len() > MAX_OUTPUT_BYTES {
        let notice = toolset::truncate_runes(text, MAX_OUTPUT_BYTES - 1);
        let head = with
            .strip_suffix(&format!("\n{notice}"))
            .expect("ends with the notice");
        longest_prefix(&s, head, MAX_OUTPUT_BYTES - 1 - notice.len());
    }
    // The runner's composition: head, newline, notice, trailer.
    let trailer = format!("\nexit code: {n}");
    let composed = sidecar::fuzzing::compose(&s, text, &trailer);
    assert!(composed.len() <= MAX_OUTPUT_BYTES);
    let tail = format!("\n{text}{trailer}");
    if tail.len() <= MAX_OUTPUT_BYTES {
        let head = composed
            .strip_suffix(&tail)
            .expect("keeps notice and trailer");
        longest_prefix(&s, head, MAX_OUTPUT_BYTES - tail.len());
    }
});
