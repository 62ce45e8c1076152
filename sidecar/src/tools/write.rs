//! write: a whole file, atomically, creating parent directories.

use serde::Deserialize;

use super::{Ctx, link_target, parse, replaced_link_note, required};
use crate::fsutil::{atomic_write, describe, special_kind};
use crate::output::Output;

#[derive(Deserialize)]
struct Input {
    file_path: Option<String>,
    content: Option<String>,
}

pub fn run(ctx: &Ctx, input: &[u8]) -> Output {
    let input: Input = match parse("write", input) {
        Ok(i) => i,
        Err(out) => return out,
    };
    let file_path = match required("write", "file_path", &input.file_path) {
        Ok(p) => p,
        Err(out) => return out,
    };
    // Empty content is a legitimate write (truncate a file); absent is not.
    let Some(content) = input.content.as_deref() else {
        return Output::error("write: content is required");
    };
    // A trailing "/" names a directory; dropping it (as the reference's path
    // cleaning does) would write a file the model did not name.
    if file_path.ends_with('/') {
        return Output::error(format!(
            "write {file_path}: the path ends in \"/\", which names a directory; give the file's path without it"
        ));
    }
    let (path, key) = match ctx.target("write", file_path) {
        Ok(t) => t,
        Err(out) => return out,
    };
    let _held = ctx.locks.lock(key);
    if let Ok(meta) = std::fs::metadata(&path) {
        if meta.is_dir() {
            return Output::error(format!("write {file_path}: is a directory"));
        }
        if let Some(kind) = special_kind(&meta) {
            return Output::error(format!("write: {file_path} is {kind}, not a regular file"));
        }
    }
    if let Some(dir) = path.parent()
        && !dir.as_os_str().is_empty()
        && let Err(e) = std::fs::create_dir_all(dir)
    {
        // create_dir_all reports a file where a directory should be as
        // "exists"; what is wrong with it is that it is not a directory.
        let why = if e.kind() == std::io::ErrorKind::AlreadyExists {
            "not a directory".to_owned()
        } else {
            describe(&e)
        };
        return Output::error(format!("write {file_path}: mkdir: {why}"));
    }
    let link = link_target(&path);
    if let Err(e) = atomic_write(&path, content.as_bytes(), Some(&ctx.journal)) {
        return Output::error(format!("write {file_path}: {}", describe(&e)));
    }
    match link {
        None => Output::ok(format!("wrote {} bytes to {file_path}", content.len())),
        Some(t) => Output::ok(format!(
            "wrote {} bytes to {file_path}{}",
            content.len(),
            replaced_link_note(file_path, &t)
        )),
    }
}
