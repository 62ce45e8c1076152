//! edit: replace a unique occurrence of a string (or every one), atomically.

use std::path::Path;

use crate::fsutil::{OpenError, atomic_write, describe, looks_binary, open_regular, read_capped};
use crate::output::Output;
use crate::tools::ctx::Ctx;
use crate::tools::input::{parse, required};
use crate::tools::links::{link_target, replaced_link_note};
use toolset::MAX_FILE_BYTES;

/// The largest file an edit may produce: sixteen times what it may read,
/// room for any real edit, and a bound on the memory a `replace_all` takes.
pub const MAX_EDIT_RESULT_BYTES: u64 = 16 * MAX_FILE_BYTES;

/// An edit as its input asks for it, checked before the file is touched.
struct Request {
    file_path: String,
    old: String,
    new: String,
    replace_all: bool,
}

fn request(input: &[u8]) -> Result<Request, Output> {
    let input = parse("edit", input)?;
    let file_path = input.string("file_path")?;
    let old = input.string("old_string")?;
    let new = input.string("new_string")?;
    let replace_all = input.boolean("replace_all")?.unwrap_or(false);
    let file_path = required("edit", "file_path", &file_path)?.to_owned();
    let old = required("edit", "old_string", &old)?.to_owned();
    // An empty new_string deletes; an absent one is a malformed call.
    let Some(new) = new else {
        return Err(Output::error("edit: new_string is required"));
    };
    Ok(Request {
        file_path,
        old,
        new,
        replace_all,
    })
}

/// [`request`]'s refusal, if any (for the fuzz targets).
pub(crate) fn check(input: &[u8]) -> Result<(), Output> {
    request(input).map(drop)
}

pub fn run(ctx: &Ctx, input: &[u8]) -> Output {
    let req = match request(input) {
        Ok(r) => r,
        Err(out) => return out,
    };
    let (file_path, old, new) = (req.file_path.as_str(), req.old.as_str(), req.new.as_str());
    let (path, key) = match ctx.target("edit", file_path) {
        Ok(t) => t,
        Err(out) => return out,
    };
    // Read, replace and rename as one step per file: a concurrent edit of
    // the same file waits instead of overwriting this one with stale text.
    let _held = ctx.locks.lock(key);
    let content = match read_text(&path, file_path) {
        Ok(c) => c,
        Err(out) => return out,
    };
    let (updated, count) = match replace(&content, old, new, req.replace_all, file_path) {
        Ok(r) => r,
        Err(out) => return out,
    };
    let link = link_target(&path);
    if let Err(e) = atomic_write(&path, updated.as_bytes(), Some(&ctx.journal)) {
        return Output::error(format!("edit {file_path}: {}", describe(&e)));
    }
    match link {
        None => Output::ok(format!("edited {file_path} ({count} replacement(s))")),
        Some(t) => Output::ok(format!(
            "edited {file_path} ({count} replacement(s){})",
            replaced_link_note(file_path, &t)
        )),
    }
}

/// The file as text, or the tool error saying why it cannot be edited:
/// not a regular file, over the cap, binary, or not UTF-8.
fn read_text(path: &Path, file_path: &str) -> Result<String, Output> {
    let (mut file, meta) = match open_regular(path) {
        Ok(f) => f,
        Err(OpenError::Directory) => {
            return Err(Output::error(format!(
                "edit: {file_path} is a directory, not a regular file"
            )));
        }
        Err(OpenError::NotRegular(kind)) => {
            return Err(Output::error(format!(
                "edit: {file_path} is {kind}, not a regular file"
            )));
        }
        Err(OpenError::Io(e)) => {
            return Err(Output::error(format!("edit {file_path}: {}", describe(&e))));
        }
    };
    if meta.len() > MAX_FILE_BYTES {
        return Err(Output::error(format!(
            "edit: {file_path} is {} bytes, exceeds {MAX_FILE_BYTES}-byte limit. Use bash (sed/awk) to modify a large file.",
            meta.len()
        )));
    }
    let data = match read_capped(&mut file, meta.len(), MAX_FILE_BYTES) {
        Ok((_, true)) => {
            return Err(Output::error(format!(
                "edit: {file_path} holds more than the {MAX_FILE_BYTES}-byte limit. Use bash (sed/awk) to modify a large file."
            )));
        }
        Ok((d, false)) => d,
        Err(e) => return Err(Output::error(format!("edit {file_path}: {}", describe(&e)))),
    };
    if looks_binary(&data) {
        return Err(Output::error(format!(
            "edit: {file_path} is a binary file (it contains NUL bytes); modify it with bash"
        )));
    }
    // Not lossy: rewriting a file whose invalid bytes became U+FFFD would
    // corrupt the parts the edit never touched.
    String::from_utf8(data).map_err(|_| {
        Output::error(format!(
            "edit: {file_path} is not valid UTF-8; modify it with bash (sed/awk)"
        ))
    })
}

/// The edited text and the number of replacements, or the tool error:
/// `old` absent, not unique without `replace_all`, or a result too large.
fn replace(
    content: &str,
    old: &str,
    new: &str,
    replace_all: bool,
    file_path: &str,
) -> Result<(String, usize), Output> {
    let count = content.matches(old).count();
    if count == 0 {
        return Err(Output::error(format!(
            "edit: old_string not found in {file_path}"
        )));
    }
    if count > 1 && !replace_all {
        return Err(Output::error(format!(
            "edit: old_string appears {count} times in {file_path} (must be unique, or set replace_all)"
        )));
    }
    // Bounded before it is built: a short old_string replaced by a long
    // new_string everywhere can ask for gigabytes.
    let grown = (new.len() as u64).saturating_sub(old.len() as u64);
    let shrunk = (old.len() as u64).saturating_sub(new.len() as u64);
    let result_len = (content.len() as u64)
        .saturating_add(grown.saturating_mul(count as u64))
        .saturating_sub(shrunk.saturating_mul(count as u64));
    if result_len > MAX_EDIT_RESULT_BYTES {
        return Err(Output::error(format!(
            "edit: the result would be {result_len} bytes, over the {MAX_EDIT_RESULT_BYTES}-byte limit of an edit; write the file with write or bash instead"
        )));
    }
    Ok((content.replace(old, new), count))
}
