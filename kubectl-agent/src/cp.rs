//! `kubectl agent cp`: files and directories to and from a session's
//! workspace, on the runner's Export and Import (through the same
//! port-forward as calls; the gateway does not carry them).
//!
//! Both directions are all or nothing and bounded: a download is unpacked
//! with the same checks the runner applies to an import (the sandbox's
//! files are the model's, so its archive is as hostile as any), into a
//! staging directory beside the target, and renamed into place only when
//! it was accepted whole; an upload is staged by the runner the same way.
//!
//! Where things land, as `cp -r` would put them when the target does not
//! exist: `cp SESSION:src ./out` makes `./out` (or `./out/src` when `./out`
//! is a directory already); `cp ./dir SESSION:dst` makes `dst` from the
//! directory's contents (or adds them to `dst` when it exists); `cp
//! ./a.txt SESSION:b.txt` makes `b.txt`, and `SESSION:dir/` (a trailing
//! slash) puts `a.txt` inside `dir`. An existing target is never replaced
//! or merged into on a name clash without `--overwrite`.

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};

use archive::Staging;
use runner_api::chunks::ChunkReader;
use runner_api::proto::{ExportRequest, ImportHeader};

use crate::error::Error;

/// The bound on one copy's file bytes when `--max-bytes` is not given, on
/// this side (the runner applies its own maximum too).
pub const DEFAULT_MAX_BYTES: u64 = 2 << 30;

/// Most bytes of an upload in one message.
const CHUNK_BYTES: usize = 1 << 20;

/// One side of a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    Local(PathBuf),
    /// `SESSION:PATH`, the path relative to the session's workdir.
    Session {
        name: String,
        path: String,
    },
}

impl Place {
    /// `NAME:PATH` is a session's when NAME could name one (a DNS
    /// subdomain); anything else is a local path (`./a:b` for a local file
    /// with a colon).
    pub fn parse(arg: &str) -> Place {
        match arg.split_once(':') {
            Some((name, path)) if is_session_name(name) => Place::Session {
                name: name.to_owned(),
                path: path.to_owned(),
            },
            _ => Place::Local(PathBuf::from(arg)),
        }
    }
}

fn is_session_name(s: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !s.is_empty()
        && s.len() <= 253
        && s.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && alnum(s.as_bytes()[0])
        && alnum(s.as_bytes()[s.len() - 1])
}

/// How to copy.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Replace what is in the way (a directory whole).
    pub overwrite: bool,
    /// Most bytes of file content; 0 is [`DEFAULT_MAX_BYTES`].
    pub max_bytes: u64,
    /// Take symbolic links that lead out of the copied tree (refused
    /// otherwise); nothing is written through a link either way.
    pub allow_escaping_symlinks: bool,
}

impl Options {
    fn limits(&self) -> archive::Limits {
        archive::Limits {
            max_bytes: if self.max_bytes == 0 {
                DEFAULT_MAX_BYTES
            } else {
                self.max_bytes
            },
            max_entries: archive::MAX_ENTRIES,
        }
    }
}

/// What a copy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Copied {
    pub entries: u64,
    pub bytes: u64,
    /// Where it went.
    pub to: String,
    /// What the runner left out of a download, with why.
    pub skipped: Vec<String>,
    pub skipped_count: u64,
}

fn local(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let context = context.into();
    move |source| Error::Local { context, source }
}

/// Copies the session's `remote` (relative to its workdir) to `local`.
pub async fn download(
    runner: &mut runner_api::Client,
    remote: &str,
    local_path: &Path,
    opts: Options,
) -> Result<Copied, Error> {
    let limits = opts.limits();
    let name = Path::new(remote)
        .file_name()
        .map_or_else(|| PathBuf::from("workspace"), PathBuf::from);
    let target = if local_path.is_dir() {
        local_path.join(&name)
    } else {
        local_path.to_path_buf()
    };
    let exists = std::fs::symlink_metadata(&target).is_ok();
    if exists && !opts.overwrite {
        return Err(Error::Cp(format!(
            "{} exists; give --overwrite to replace it",
            target.display()
        )));
    }
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let staging = tempfile::Builder::new()
        .prefix(".kubectl-agent-cp-")
        .tempdir_in(&parent)
        .map_err(local(format!("cannot stage in {}", parent.display())))?;
    let staging = Staging::adopt(staging.keep());
    let (header, mut archive) = runner
        .export(ExportRequest {
            path: remote.to_owned(),
            max_bytes: opts.max_bytes,
            ..ExportRequest::default()
        })
        .await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<std::io::Result<Vec<u8>>>(4);
    let into = staging.path().to_path_buf();
    let unpack_opts = archive::UnpackOptions {
        limits,
        allow_escaping_symlinks: opts.allow_escaping_symlinks,
    };
    let unpacking = tokio::task::spawn_blocking(move || {
        archive::unpack(ChunkReader::new(rx), &into, unpack_opts)
    });
    let received = async {
        loop {
            let item = match archive.next().await {
                Ok(Some(chunk)) => Ok(chunk),
                Ok(None) => return Ok(()),
                Err(e) => Err(e),
            };
            match item {
                Ok(chunk) => {
                    if tx.send(Ok(chunk)).await.is_err() {
                        // The unpacker stopped: its error says why.
                        return Ok(());
                    }
                }
                Err(e) => {
                    let _ = tx
                        .send(Err(std::io::Error::other("the export stream broke")))
                        .await;
                    return Err(e);
                }
            }
        }
    }
    .await;
    drop(tx);
    let unpacked = unpacking
        .await
        .map_err(|e| Error::Cp(format!("the unpacking task failed: {e}")))?;
    received?;
    let done = unpacked?;
    let source = if header.directory {
        staging.path().to_path_buf()
    } else {
        let mut entries = std::fs::read_dir(staging.path())
            .map_err(local("cannot list the staging directory"))?;
        match (entries.next(), entries.next()) {
            (Some(Ok(only)), None) => only.path(),
            _ => {
                return Err(Error::Cp(
                    "the runner said one file and sent another number of entries".into(),
                ));
            }
        }
    };
    let mut staging = staging;
    replace(&source, &target, exists, &parent)?;
    if header.directory {
        staging.keep();
    }
    Ok(Copied {
        entries: done.entries,
        bytes: done.bytes,
        to: target.display().to_string(),
        skipped: header.skipped,
        skipped_count: header.skipped_count,
    })
}

/// Renames `source` to `target`; one that `exists` is moved aside first
/// and removed after, or put back if the rename fails.
fn replace(source: &Path, target: &Path, exists: bool, parent: &Path) -> Result<(), Error> {
    if !exists {
        return std::fs::rename(source, target).map_err(local(format!(
            "cannot move the copy to {}",
            target.display()
        )));
    }
    let aside = tempfile::Builder::new()
        .prefix(".kubectl-agent-cp-old-")
        .tempdir_in(parent)
        .map_err(local(format!("cannot stage in {}", parent.display())))?;
    let aside = Staging::adopt(aside.keep());
    let old = aside.path().join("old");
    std::fs::rename(target, &old)
        .map_err(local(format!("cannot move {} aside", target.display())))?;
    if let Err(e) = std::fs::rename(source, target) {
        let _ = std::fs::rename(&old, target);
        return Err(local(format!(
            "cannot move the copy to {}",
            target.display()
        ))(e));
    }
    Ok(())
}

/// Copies `local` to the session's `remote` (relative to its workdir).
pub async fn upload(
    runner: &mut runner_api::Client,
    local_path: &Path,
    remote: &str,
    opts: Options,
) -> Result<Copied, Error> {
    let meta = std::fs::symlink_metadata(local_path)
        .map_err(local(format!("cannot read {}", local_path.display())))?;
    // A directory's contents go into `remote`; so does a file when
    // `remote` names a directory (empty, or a trailing slash).
    let (into, name) = if meta.is_dir() || remote.is_empty() || remote.ends_with('/') {
        (remote.to_owned(), None)
    } else {
        let p = Path::new(remote);
        let parent = p
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default();
        (parent, p.file_name().map(PathBuf::from))
    };
    let limits = opts.limits();
    let source = std::path::absolute(local_path)
        .map_err(local(format!("cannot resolve {}", local_path.display())))?;
    let packed = tokio::task::spawn_blocking(move || {
        let mut file = tempfile::tempfile().map_err(local("cannot create a temporary file"))?;
        let packed = archive::pack_as(&source, name.as_deref(), limits, &|_| None, &mut file)?;
        file.rewind()
            .map_err(local("cannot read the temporary file"))?;
        Ok::<_, Error>((packed, file))
    })
    .await
    .map_err(|e| Error::Cp(format!("the packing task failed: {e}")))?;
    let (packed, mut file) = packed?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    tokio::task::spawn_blocking(move || {
        loop {
            let mut buf = vec![0; CHUNK_BYTES];
            match file.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    buf.truncate(n);
                    if tx.blocking_send(buf).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let header = ImportHeader {
        path: into.clone(),
        overwrite: opts.overwrite,
        max_bytes: opts.max_bytes,
        allow_escaping_symlinks: opts.allow_escaping_symlinks,
        ..ImportHeader::default()
    };
    let done = runner
        .import(header, tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?;
    Ok(Copied {
        entries: done.entries,
        bytes: done.file_bytes,
        to: format!(
            "{} (in the workdir)",
            if into.is_empty() { "." } else { &into }
        ),
        skipped: packed.skipped,
        skipped_count: packed.skipped_count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_places_are_told_from_local_ones() {
        assert_eq!(
            Place::parse("demo:src/a.txt"),
            Place::Session {
                name: "demo".into(),
                path: "src/a.txt".into()
            }
        );
        assert_eq!(
            Place::parse("demo:"),
            Place::Session {
                name: "demo".into(),
                path: String::new()
            }
        );
        assert_eq!(Place::parse("./a:b"), Place::Local("./a:b".into()));
        assert_eq!(Place::parse("/tmp/x"), Place::Local("/tmp/x".into()));
        assert_eq!(Place::parse("Upper:x"), Place::Local("Upper:x".into()));
    }
}
