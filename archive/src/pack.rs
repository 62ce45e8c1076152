//! A directory, file or link into a tar stream.
//!
//! The walk never follows a symbolic link (a link is archived as a link),
//! so it cannot leave the tree it was given, and it opens each file
//! without following a link and without blocking, then archives what the
//! open descriptor is: a file swapped for a FIFO between the listing and
//! the open is skipped, not waited on. Directories are listed in name
//! order, so the same tree gives the same archive.

use std::fs::{File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::{Limits, MAX_NAME_BYTES};

/// What was archived.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Packed {
    /// The source was a directory: the archive holds what is inside it,
    /// named relative to it. Otherwise it holds the one file or link,
    /// under its own name.
    pub directory: bool,
    /// Entries written.
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
    /// What was left out, at most [`MAX_SKIPPED_SHOWN`] of them named
    /// (relative to the source), each with why.
    pub skipped: Vec<String>,
    /// How many were left out in all.
    pub skipped_count: u64,
}

/// Most skipped entries named in [`Packed::skipped`].
pub const MAX_SKIPPED_SHOWN: usize = 32;

/// Archives `source` (absolute, symlinks resolved: then every path the
/// walk builds is a real path, which is what `exclude` is asked about)
/// into `out`. `exclude` says which paths are not to be archived (the
/// runner's own files); they and anything that is not a file, directory
/// or link are left out and listed in [`Packed::skipped`].
pub fn pack<W: Write>(
    source: &Path,
    limits: Limits,
    exclude: &dyn Fn(&Path) -> Option<&'static str>,
    out: W,
) -> Result<Packed, Error> {
    pack_as(source, None, limits, exclude, out)
}

/// [`pack`], with a file or link archived under `name` instead of its own
/// (`kubectl agent cp a.txt SESSION:b.txt`); a directory's entries are
/// named relative to it either way.
pub fn pack_as<W: Write>(
    source: &Path,
    name: Option<&Path>,
    limits: Limits,
    exclude: &dyn Fn(&Path) -> Option<&'static str>,
    out: W,
) -> Result<Packed, Error> {
    let meta = std::fs::symlink_metadata(source)
        .map_err(|e| Error::io(format!("cannot read {}", source.display()), e))?;
    let mut p = Packer {
        builder: tar::Builder::new(out),
        limits,
        exclude,
        packed: Packed {
            directory: meta.is_dir(),
            ..Packed::default()
        },
    };
    if let Some(why) = exclude(source) {
        return Err(Error::Malformed(format!(
            "{} is {why}, which is never archived",
            source.display()
        )));
    }
    if meta.is_dir() {
        p.walk(source)?;
    } else {
        let name = name
            .map(Path::to_path_buf)
            .or_else(|| source.file_name().map(PathBuf::from))
            .ok_or_else(|| Error::Malformed(format!("{} names no file", source.display())))?;
        if !p.entry(source, &name, &meta)? {
            return Err(Error::Malformed(format!(
                "{} is not a file, directory or symbolic link",
                source.display()
            )));
        }
    }
    p.builder
        .finish()
        .map_err(|e| Error::io("cannot write the archive", e))?;
    Ok(p.packed)
}

struct Packer<'a, W: Write> {
    builder: tar::Builder<W>,
    limits: Limits,
    exclude: &'a dyn Fn(&Path) -> Option<&'static str>,
    packed: Packed,
}

impl<W: Write> Packer<'_, W> {
    /// Depth first, each directory's entries in name order; the stack holds
    /// directories still to list, never a listing bigger than the entry
    /// limit allows.
    fn walk(&mut self, root: &Path) -> Result<(), Error> {
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let dir = root.join(&rel);
            let mut names = Vec::new();
            let listing = std::fs::read_dir(&dir)
                .map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
            for entry in listing {
                let entry =
                    entry.map_err(|e| Error::io(format!("cannot list {}", dir.display()), e))?;
                names.push(entry.file_name());
                if self.packed.entries + names.len() as u64 > self.limits.max_entries {
                    return Err(Error::TooManyEntries {
                        limit: self.limits.max_entries,
                    });
                }
            }
            names.sort();
            let mut subdirs = Vec::new();
            for name in names {
                let path = dir.join(&name);
                let rel = rel.join(&name);
                let meta = match std::fs::symlink_metadata(&path) {
                    Ok(m) => m,
                    // Gone since the listing (a background job's temp file).
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(Error::io(format!("cannot read {}", path.display()), e)),
                };
                if let Some(why) = (self.exclude)(&path) {
                    self.skip(&rel, why);
                    continue;
                }
                if self.entry(&path, &rel, &meta)? && meta.is_dir() {
                    subdirs.push(rel);
                }
            }
            // Reversed onto the stack, so they come off in name order.
            stack.extend(subdirs.into_iter().rev());
        }
        Ok(())
    }

    fn skip(&mut self, rel: &Path, why: &str) {
        self.packed.skipped_count += 1;
        if self.packed.skipped.len() < crate::pack::MAX_SKIPPED_SHOWN {
            self.packed
                .skipped
                .push(format!("{}: {why}", rel.display()));
        }
    }

    fn count(&mut self) -> Result<(), Error> {
        self.packed.entries += 1;
        if self.packed.entries > self.limits.max_entries {
            return Err(Error::TooManyEntries {
                limit: self.limits.max_entries,
            });
        }
        Ok(())
    }

    /// Archives one entry; `false` when it is of a kind that is skipped.
    fn entry(&mut self, path: &Path, rel: &Path, meta: &Metadata) -> Result<bool, Error> {
        use std::os::unix::ffi::OsStrExt;
        if rel.as_os_str().len() > MAX_NAME_BYTES {
            return Err(Error::Malformed(format!(
                "{}: the name is longer than {MAX_NAME_BYTES} bytes",
                rel.display()
            )));
        }
        let ft = meta.file_type();
        let mut header = tar::Header::new_gnu();
        header.set_mode(meta.mode() & 0o7777);
        header.set_mtime(meta.mtime().max(0) as u64);
        let wrote = |e| Error::io(format!("cannot archive {}", rel.display()), e);
        if ft.is_dir() {
            self.count()?;
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            self.builder
                .append_data(&mut header, rel, io::empty())
                .map_err(wrote)?;
            Ok(true)
        } else if ft.is_symlink() {
            let target = std::fs::read_link(path)
                .map_err(|e| Error::io(format!("cannot read link {}", path.display()), e))?;
            if target.as_os_str().as_bytes().len() > MAX_NAME_BYTES {
                self.skip(rel, "a symbolic link whose target is over 4096 bytes");
                return Ok(false);
            }
            self.count()?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            self.builder
                .append_link(&mut header, rel, &target)
                .map_err(wrote)?;
            Ok(true)
        } else if ft.is_file() {
            self.file(path, rel, header)
        } else {
            self.skip(rel, special(meta));
            Ok(false)
        }
    }

    fn file(&mut self, path: &Path, rel: &Path, mut header: tar::Header) -> Result<bool, Error> {
        // Not following a link and not blocking: what is opened is judged
        // from its own descriptor, whatever the listing said.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc_flags())
            .open(path);
        let file = match file {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(Error::io(format!("cannot open {}", path.display()), e)),
        };
        let meta = file
            .metadata()
            .map_err(|e| Error::io(format!("cannot stat {}", path.display()), e))?;
        if !meta.is_file() {
            self.skip(rel, special(&meta));
            return Ok(false);
        }
        let size = meta.len();
        if self.packed.bytes.saturating_add(size) > self.limits.max_bytes {
            return Err(Error::TooLarge {
                entry: rel.display().to_string(),
                size,
                limit: self.limits.max_bytes,
            });
        }
        self.count()?;
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(meta.mode() & 0o7777);
        header.set_mtime(meta.mtime().max(0) as u64);
        header.set_size(size);
        let exact = Exact {
            inner: file,
            left: size,
        };
        self.builder
            .append_data(&mut header, rel, exact)
            .map_err(|e| Error::io(format!("cannot archive {}", rel.display()), e))?;
        self.packed.bytes += size;
        Ok(true)
    }
}

/// `O_NOFOLLOW | O_NONBLOCK`.
fn libc_flags() -> i32 {
    libc::O_NOFOLLOW | libc::O_NONBLOCK
}

/// What kind of thing a skipped entry is.
fn special(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let ft = meta.file_type();
    if ft.is_fifo() {
        "a FIFO, not archived"
    } else if ft.is_socket() {
        "a socket, not archived"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device, not archived"
    } else {
        "not a file, directory or link, not archived"
    }
}

/// Exactly `left` bytes of a file: one that shrank while it was archived
/// is an error (the header already promised its size), one that grew is
/// cut at the size it had when it was opened.
struct Exact {
    inner: File,
    left: u64,
}

impl Read for Exact {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while it was being archived",
            ));
        }
        self.left -= n as u64;
        Ok(n)
    }
}
