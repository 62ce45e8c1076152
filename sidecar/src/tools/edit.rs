//! edit: replace a unique occurrence of a string (or every one), atomically.

use serde::Deserialize;

use super::{Ctx, parse, required};
use crate::fsutil::{atomic_write, describe, looks_binary, read_all};
use crate::output::Output;
use crate::tools::read::MAX_FILE_BYTES;

#[derive(Deserialize)]
struct Input {
    file_path: Option<String>,
    old_string: Option<String>,
    new_string: Option<String>,
    #[serde(default)]
    replace_all: bool,
}

pub fn run(ctx: &Ctx, input: &[u8]) -> Output {
    let input: Input = match parse("edit", input) {
        Ok(i) => i,
        Err(out) => return out,
    };
    let file_path = match required("edit", "file_path", &input.file_path) {
        Ok(p) => p,
        Err(out) => return out,
    };
    let old = match required("edit", "old_string", &input.old_string) {
        Ok(s) => s,
        Err(out) => return out,
    };
    // An empty new_string deletes; an absent one is a malformed call.
    let Some(new) = input.new_string.as_deref() else {
        return Output::error("edit: new_string is required");
    };
    let path = ctx.resolve(file_path);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(e) => return Output::error(format!("edit {file_path}: {}", describe(&e))),
    };
    if meta.is_dir() {
        return Output::error(format!("edit {file_path}: is a directory"));
    }
    if !meta.is_file() {
        return Output::error(format!("edit: {file_path} is not a regular file"));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Output::error(format!(
            "edit: {file_path} is {} bytes, exceeds {MAX_FILE_BYTES}-byte limit. Use bash (sed/awk) to modify a large file.",
            meta.len()
        ));
    }
    let data = match read_all(&path, meta.len()) {
        Ok(d) => d,
        Err(e) => return Output::error(format!("edit {file_path}: {}", describe(&e))),
    };
    if looks_binary(&data) {
        return Output::error(format!(
            "edit: {file_path} is a binary file (it contains NUL bytes); modify it with bash"
        ));
    }
    // Not lossy: rewriting a file whose invalid bytes became U+FFFD would
    // corrupt the parts the edit never touched.
    let Ok(content) = String::from_utf8(data) else {
        return Output::error(format!(
            "edit: {file_path} is not valid UTF-8; modify it with bash (sed/awk)"
        ));
    };
    let count = content.matches(old).count();
    if count == 0 {
        return Output::error(format!("edit: old_string not found in {file_path}"));
    }
    if count > 1 && !input.replace_all {
        return Output::error(format!(
            "edit: old_string appears {count} times in {file_path} (must be unique, or set replace_all)"
        ));
    }
    let updated = content.replace(old, new);
    if let Err(e) = atomic_write(&path, updated.as_bytes()) {
        return Output::error(format!("edit {file_path}: {}", describe(&e)));
    }
    Output::ok(format!("edited {file_path} ({count} replacement(s))"))
}
