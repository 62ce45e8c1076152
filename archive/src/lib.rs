//! Workspace archives: what the runner's `Export` streams, what its
//! `Import` accepts, and what `kubectl agent cp` writes and reads on the
//! user's side. One implementation for both ends, because both ends face a
//! hostile peer: the sandbox's files are the model's, and an archive sent
//! to the runner is whatever a client chose to send.
//!
//! The format is plain tar (ustar headers, GNU long names, PAX records),
//! so `tar -x` reads an export and `tar -c` writes an import.
//!
//! - [`pack`]: a directory (or one file or link) into a tar stream, never
//!   following a symbolic link, skipping what the caller excludes and what
//!   is not a file, a directory or a link, within [`Limits`].
//! - [`unpack`]: a tar stream into an empty staging directory, every entry
//!   checked before anything is written for it (names, link targets, types,
//!   sizes, counts); the caller moves the staging directory into place only
//!   when the whole archive was accepted.
//! - [`Staging`]: the directory an unpack fills, gone unless kept.
//! - [`Error`]: what was refused, naming the entry.

pub mod error;
pub mod name;
pub mod pack;
pub mod staging;
pub mod unpack;

pub use error::{Error, Problem};
pub use pack::{Packed, pack, pack_as};
pub use staging::Staging;
pub use unpack::{UnpackOptions, Unpacked, unpack};

/// Removes a tree, making its directories writable first: an archive may
/// hold read-only directories (0555), whose entries `remove_dir_all` alone
/// cannot remove (so a refused or replaced import could not be cleaned
/// up). Links are never followed. Best effort: what cannot be removed is
/// left.
pub fn remove_tree(root: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            continue;
        }
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
        if let Ok(listing) = std::fs::read_dir(&dir) {
            for entry in listing.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    stack.push(entry.path());
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(root);
}

/// Bounds on one archive, on either side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes of file content (the sum of the regular files' sizes).
    pub max_bytes: u64,
    /// Most entries, each directory, file and link one (and, when
    /// unpacking, each long-name or PAX record one, so a stream of them
    /// cannot run without end).
    pub max_entries: u64,
}

/// The most entries an archive may hold, whatever a request asks.
pub const MAX_ENTRIES: u64 = 1_000_000;

/// The longest entry name or link target accepted (Linux's `PATH_MAX`).
pub const MAX_NAME_BYTES: usize = 4096;

/// The largest PAX record block or GNU long-name entry read into memory.
pub const MAX_META_BYTES: u64 = 64 << 10;

/// The tar block size.
pub(crate) const BLOCK: u64 = 512;

/// Permission bits kept on unpacking: setuid and setgid are dropped, so an
/// archive cannot plant a program that runs as someone else.
pub const KEPT_MODE_BITS: u32 = 0o1777;
