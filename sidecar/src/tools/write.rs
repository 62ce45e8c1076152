//! write: a whole file, atomically, creating parent directories.

use crate::fsutil::{atomic_write, describe, special_kind};
use crate::output::Output;
use crate::tools::ctx::Ctx;
use crate::tools::input::{parse, required};
use crate::tools::links::{link_target, replaced_link_note};

/// A write as its input asks for it, checked before the disk is touched.
struct Request {
    file_path: String,
    content: String,
}

fn request(input: &[u8]) -> Result<Request, Output> {
    let input = parse("write", input)?;
    let file_path = input.string("file_path")?;
    let content = input.string("content")?;
    let file_path = required("write", "file_path", &file_path)?.to_owned();
    // Empty content is a legitimate write (truncate a file); absent is not.
    let Some(content) = content else {
        return Err(Output::error("write: content is required"));
    };
    // A trailing "/" names a directory; dropping it (as the reference's path
    // cleaning does) would write a file the model did not name.
    if file_path.ends_with('/') {
        return Err(Output::error(format!(
            "write {file_path}: the path ends in \"/\", which names a directory; give the file's path without it"
        )));
    }
    Ok(Request { file_path, content })
}

/// [`request`]'s refusal, if any (for the fuzz targets).
pub(crate) fn check(input: &[u8]) -> Result<(), Output> {
    request(input).map(drop)
}

pub fn run(ctx: &Ctx, input: &[u8]) -> Output {
    let (file_path, content) = match request(input) {
        Ok(r) => (r.file_path, r.content),
        Err(out) => return out,
    };
    let (file_path, content) = (file_path.as_str(), content.as_str());
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
