//! A hostile tar stream into an empty staging directory.
//!
//! The headers are read here, block by block, rather than through the tar
//! crate's `Archive`, whose long-name and PAX handling reads such an entry
//! whole into memory whatever size it states; here those are read only up
//! to [`MAX_META_BYTES`]. The tar crate still parses each header.
//!
//! Every entry is judged before anything is written for it: its name
//! (relative, no `..`), its parents (real directories this archive made,
//! never a link), its type (file, directory, symbolic link, hard link;
//! never a device, FIFO, socket or sparse file), its size against what is
//! left of the limit, and a link's target (inside the tree). Files are
//! created new (never opened through an existing name), owned by whoever
//! runs this (the sandbox user, for the runner), and their modes lose
//! setuid and setgid. Nothing here deletes: a refused archive leaves its
//! partial staging directory for the caller to remove.

use std::collections::HashSet;
use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use crate::error::{Error, Problem};
use crate::name::{components, join, link_stays_inside};
use crate::{BLOCK, KEPT_MODE_BITS, Limits, MAX_META_BYTES, MAX_NAME_BYTES};

/// How to unpack.
#[derive(Debug, Clone, Copy)]
pub struct UnpackOptions {
    pub limits: Limits,
    /// Take symbolic links whose target leaves the tree (absolute, or `..`
    /// above the top), as a Python virtualenv's `bin/python` is. Off, they
    /// are refused. Either way nothing is ever written through a link.
    pub allow_escaping_symlinks: bool,
}

/// What was unpacked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unpacked {
    /// Files, directories and links made (not counting the top).
    pub entries: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// The mode of a directory an entry's name implied but no entry gave.
const IMPLIED_DIR_MODE: u32 = 0o755;

/// Unpacks `input` into `staging`, an empty directory. On `Err`, what was
/// written so far is still in `staging`.
pub fn unpack(input: impl Read, staging: &Path, opts: UnpackOptions) -> Result<Unpacked, Error> {
    let mut u = Unpacker {
        input,
        staging,
        opts,
        done: Unpacked::default(),
        headers: 0,
        dirs: Vec::new(),
        made: HashSet::new(),
        top_mode: None,
    };
    u.run()?;
    u.finish_dirs()?;
    Ok(u.done)
}

/// What a PAX record block or GNU long-name entry said about the next entry.
#[derive(Default)]
struct Pending {
    path: Option<Vec<u8>>,
    link: Option<Vec<u8>>,
    size: Option<u64>,
}

struct Unpacker<'a, R: Read> {
    input: R,
    staging: &'a Path,
    opts: UnpackOptions,
    done: Unpacked,
    /// Headers read, metadata ones included.
    headers: u64,
    /// Directories made, with the mode and time to give them at the end
    /// (a read-only directory must stay writable until its entries are in).
    dirs: Vec<(PathBuf, u32, Option<u64>)>,
    /// Paths (relative) this archive made, so a second entry of one name
    /// is refused rather than written over the first.
    made: HashSet<PathBuf>,
    top_mode: Option<(u32, Option<u64>)>,
}

impl<R: Read> Unpacker<'_, R> {
    fn run(&mut self) -> Result<(), Error> {
        let mut pending = Pending::default();
        loop {
            let mut block = [0u8; BLOCK as usize];
            if !self.read_block(&mut block)? {
                return Err(Error::Malformed(
                    "the stream ended before the archive's end marker (truncated?)".into(),
                ));
            }
            if block.iter().all(|&b| b == 0) {
                // The end marker; a second zero block may follow, and
                // whatever comes after is not read.
                return Ok(());
            }
            self.headers += 1;
            if self.headers > self.opts.limits.max_entries.saturating_mul(2) + 16 {
                return Err(Error::TooManyEntries {
                    limit: self.opts.limits.max_entries,
                });
            }
            let header = tar::Header::from_byte_slice(&block);
            check_sum(&block, header)?;
            let kind = block[156];
            let stated = header
                .entry_size()
                .map_err(|e| Error::Malformed(format!("an unreadable size field: {e}")))?;
            match kind {
                b'x' => {
                    let data = self.meta(stated, "a PAX record block")?;
                    pending = parse_pax(&data, pending)?;
                    continue;
                }
                b'g' => {
                    // Global PAX records (comments, a creator's charset) say
                    // nothing this reader uses.
                    self.meta(stated, "a global PAX record block")?;
                    continue;
                }
                b'L' => {
                    let mut data = self.meta(stated, "a GNU long name")?;
                    trim_nuls(&mut data);
                    pending.path = Some(data);
                    continue;
                }
                b'K' => {
                    let mut data = self.meta(stated, "a GNU long link name")?;
                    trim_nuls(&mut data);
                    pending.link = Some(data);
                    continue;
                }
                _ => {}
            }
            let p = std::mem::take(&mut pending);
            let name = p.path.unwrap_or_else(|| header.path_bytes().into_owned());
            let size = p.size.unwrap_or(stated);
            let link = p
                .link
                .or_else(|| header.link_name_bytes().map(|l| l.into_owned()));
            let mode = header.mode().unwrap_or(0o644) & KEPT_MODE_BITS;
            let mtime = header.mtime().ok();
            self.entry(kind, &name, size, link, mode, mtime)?;
        }
    }

    /// Reads one block; `false` at a clean end of the stream.
    fn read_block(&mut self, block: &mut [u8; BLOCK as usize]) -> Result<bool, Error> {
        let mut got = 0;
        while got < block.len() {
            match self.input.read(&mut block[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => {
                    return Err(Error::Malformed(
                        "the stream ended inside a header block (truncated?)".into(),
                    ));
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io("cannot read the archive", e)),
            }
        }
        Ok(true)
    }

    /// Reads a metadata entry's data (at most [`MAX_META_BYTES`]) and its
    /// padding.
    fn meta(&mut self, size: u64, what: &str) -> Result<Vec<u8>, Error> {
        if size > MAX_META_BYTES {
            return Err(Error::Malformed(format!(
                "{what} of {size} bytes; at most {MAX_META_BYTES} are read"
            )));
        }
        let mut data = vec![0; size as usize];
        self.input
            .read_exact(&mut data)
            .map_err(|e| truncated(e, what))?;
        self.skip_padding(size)?;
        Ok(data)
    }

    fn skip_padding(&mut self, size: u64) -> Result<(), Error> {
        let pad = (BLOCK - size % BLOCK) % BLOCK;
        let mut buf = [0u8; BLOCK as usize];
        self.input
            .read_exact(&mut buf[..pad as usize])
            .map_err(|e| truncated(e, "an entry's padding"))
    }

    fn entry(
        &mut self,
        kind: u8,
        name: &[u8],
        size: u64,
        link: Option<Vec<u8>>,
        mode: u32,
        mtime: Option<u64>,
    ) -> Result<(), Error> {
        let refuse = |p: Problem| Error::entry(name, p);
        // The type first: a device is refused as a device, whatever its name.
        match kind {
            b'0' | b'\0' | b'7' | b'5' | b'2' | b'1' => {}
            b'3' => return Err(refuse(Problem::Special("character device"))),
            b'4' => return Err(refuse(Problem::Special("block device"))),
            b'6' => return Err(refuse(Problem::Special("FIFO"))),
            b'S' => return Err(refuse(Problem::Sparse)),
            other => return Err(refuse(Problem::Unsupported(other))),
        }
        let parts = components(name).map_err(refuse)?;
        let is_file = matches!(kind, b'0' | b'\0' | b'7');
        if !is_file && size > 0 {
            return Err(Error::Malformed(format!(
                "entry {:?} is not a file but states {size} bytes of data",
                crate::name::shown(name)
            )));
        }
        if parts.is_empty() {
            // The top directory itself: only its mode is taken.
            if kind != b'5' {
                return Err(refuse(Problem::BadName("names the top directory")));
            }
            self.top_mode = Some((mode, mtime));
            return Ok(());
        }
        self.count()?;
        let rel = join(&parts);
        self.parents(name, &parts)?;
        let path = self.staging.join(&rel);
        let exists = fs::symlink_metadata(&path).is_ok();
        if kind == b'5' && exists && self.is_dir_we_made(&rel) {
            // A directory named again (or after an entry inside it):
            // its mode is the later one.
            self.dirs.retain(|(p, _, _)| p != &rel);
            self.dirs.push((rel, mode, mtime));
            return Ok(());
        }
        if exists {
            return Err(refuse(Problem::Duplicate));
        }
        match kind {
            b'5' => {
                fs::create_dir(&path).map_err(|e| write_err(name, e))?;
                fs::set_permissions(&path, fs::Permissions::from_mode(0o700))
                    .map_err(|e| write_err(name, e))?;
                self.dirs.push((rel.clone(), mode, mtime));
            }
            b'2' => {
                let target = link.unwrap_or_default();
                check_target(&target).map_err(refuse)?;
                if !self.opts.allow_escaping_symlinks && !link_stays_inside(&parts, &target) {
                    return Err(refuse(Problem::SymlinkEscapes {
                        target: crate::name::shown(&target),
                    }));
                }
                use std::os::unix::ffi::OsStrExt;
                std::os::unix::fs::symlink(std::ffi::OsStr::from_bytes(&target), &path)
                    .map_err(|e| write_err(name, e))?;
            }
            b'1' => {
                let target = link.unwrap_or_default();
                let source = self.hard_link_source(&target).ok_or_else(|| {
                    refuse(Problem::HardLinkOutside {
                        target: crate::name::shown(&target),
                    })
                })?;
                fs::hard_link(&source, &path).map_err(|e| write_err(name, e))?;
            }
            _ => self.file(name, &path, size, mode, mtime)?,
        }
        self.made.insert(rel);
        Ok(())
    }

    fn count(&mut self) -> Result<(), Error> {
        self.done.entries += 1;
        if self.done.entries > self.opts.limits.max_entries {
            return Err(Error::TooManyEntries {
                limit: self.opts.limits.max_entries,
            });
        }
        Ok(())
    }

    fn is_dir_we_made(&self, rel: &Path) -> bool {
        self.made.contains(rel)
            && fs::symlink_metadata(self.staging.join(rel)).is_ok_and(|m| m.is_dir())
    }

    /// Makes the entry's parents as directories, refusing a parent that is
    /// a link or a file an earlier entry made.
    fn parents(&mut self, name: &[u8], parts: &[&[u8]]) -> Result<(), Error> {
        let mut rel = PathBuf::new();
        for c in &parts[..parts.len() - 1] {
            rel.push(join(&[c]));
            let path = self.staging.join(&rel);
            match fs::symlink_metadata(&path) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(Error::entry(
                        name,
                        Problem::ThroughSymlink {
                            link: rel.display().to_string(),
                        },
                    ));
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => return Err(Error::entry(name, Problem::ParentNotDirectory)),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(&path).map_err(|e| write_err(name, e))?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(0o700))
                        .map_err(|e| write_err(name, e))?;
                    self.dirs.push((rel.clone(), IMPLIED_DIR_MODE, None));
                    self.made.insert(rel.clone());
                }
                Err(e) => return Err(write_err(name, e)),
            }
        }
        Ok(())
    }

    /// The path of the regular file an earlier entry made under `target`,
    /// reached through real directories only.
    fn hard_link_source(&self, target: &[u8]) -> Option<PathBuf> {
        let parts = components(target).ok()?;
        if parts.is_empty() {
            return None;
        }
        let mut rel = PathBuf::new();
        for (i, c) in parts.iter().enumerate() {
            rel.push(join(&[c]));
            let m = fs::symlink_metadata(self.staging.join(&rel)).ok()?;
            let last = i + 1 == parts.len();
            if (last && !m.is_file()) || (!last && !m.is_dir()) {
                return None;
            }
        }
        self.made.contains(&rel).then(|| self.staging.join(rel))
    }

    fn file(
        &mut self,
        name: &[u8],
        path: &Path,
        size: u64,
        mode: u32,
        mtime: Option<u64>,
    ) -> Result<(), Error> {
        let limit = self.opts.limits.max_bytes;
        if self.done.bytes.saturating_add(size) > limit {
            return Err(Error::TooLarge {
                entry: crate::name::shown(name),
                size,
                limit,
            });
        }
        // create_new: never opens an existing name, a link included.
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| write_err(name, e))?;
        let copied = self.copy_to(&mut f, size, name)?;
        if copied < size {
            return Err(Error::Malformed(format!(
                "the stream ended inside {:?} ({copied} of {size} bytes; truncated?)",
                crate::name::shown(name)
            )));
        }
        self.skip_padding(size)?;
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|e| write_err(name, e))?;
        if let Some(t) = mtime {
            let _ = f.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(t));
        }
        self.done.bytes += size;
        Ok(())
    }

    /// Copies up to `size` bytes of input into `f`; a failed read is the
    /// archive's (a stream that broke), a failed write this side's.
    fn copy_to(&mut self, f: &mut fs::File, size: u64, name: &[u8]) -> Result<u64, Error> {
        use std::io::Write;
        let mut buf = vec![0u8; 64 << 10];
        let mut copied = 0u64;
        while copied < size {
            let want = buf
                .len()
                .min(usize::try_from(size - copied).unwrap_or(usize::MAX));
            let n = match self.input.read(&mut buf[..want]) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Error::io("cannot read the archive", e)),
            };
            f.write_all(&buf[..n]).map_err(|e| write_err(name, e))?;
            copied += n as u64;
        }
        Ok(copied)
    }

    /// Gives the directories their modes and times, deepest first (setting
    /// a child's time changes its parent's), then the top's mode.
    fn finish_dirs(&mut self) -> Result<(), Error> {
        self.dirs
            .sort_by_key(|(p, _, _)| std::cmp::Reverse(p.components().count()));
        for (rel, mode, mtime) in &self.dirs {
            set_dir(&self.staging.join(rel), *mode, *mtime)
                .map_err(|e| Error::io(format!("cannot set the mode of {}", rel.display()), e))?;
        }
        let (mode, mtime) = self.top_mode.unwrap_or((IMPLIED_DIR_MODE, None));
        set_dir(self.staging, mode, mtime)
            .map_err(|e| Error::io("cannot set the mode of the top directory", e))
    }
}

fn set_dir(path: &Path, mode: u32, mtime: Option<u64>) -> io::Result<()> {
    if let Some(t) = mtime
        && let Ok(d) = fs::File::open(path)
    {
        let _ = d.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(t));
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

fn check_target(target: &[u8]) -> Result<(), Problem> {
    if target.is_empty() {
        return Err(Problem::BadName("a link with an empty target"));
    }
    if target.len() > MAX_NAME_BYTES {
        return Err(Problem::BadName("a link target longer than 4096 bytes"));
    }
    if target.contains(&0) {
        return Err(Problem::BadName("a link target with a NUL byte"));
    }
    Ok(())
}

fn write_err(name: &[u8], e: io::Error) -> Error {
    Error::io(format!("cannot write {:?}", crate::name::shown(name)), e)
}

fn truncated(e: io::Error, what: &str) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Error::Malformed(format!("the stream ended inside {what} (truncated?)"))
    } else {
        Error::io("cannot read the archive", e)
    }
}

fn trim_nuls(data: &mut Vec<u8>) {
    while data.last() == Some(&0) {
        data.pop();
    }
}

/// The header checksum: the byte sum with the checksum field as spaces.
fn check_sum(block: &[u8; BLOCK as usize], header: &tar::Header) -> Result<(), Error> {
    let stated = header
        .cksum()
        .map_err(|_| Error::Malformed("a header with an unreadable checksum field".into()))?;
    let sum: u32 = block
        .iter()
        .enumerate()
        .map(|(i, &b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u32::from(b)
            }
        })
        .sum();
    if sum != stated {
        return Err(Error::Malformed(format!(
            "a header whose checksum is wrong ({stated}, the bytes sum to {sum}): not a tar stream, or a corrupted one"
        )));
    }
    Ok(())
}

/// PAX records, `LEN KEY=VALUE\n` each: `path`, `linkpath` and `size` are
/// taken; a GNU sparse record refuses the entry; others are ignored.
fn parse_pax(mut data: &[u8], mut pending: Pending) -> Result<Pending, Error> {
    let bad = |why: &str| Error::Malformed(format!("a PAX record block that is malformed: {why}"));
    while !data.is_empty() {
        if data.iter().all(|&b| b == 0) {
            break;
        }
        let sp = data
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| bad("no length"))?;
        let len: usize = std::str::from_utf8(&data[..sp])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| bad("a length that is not a number"))?;
        if len <= sp + 1 || len > data.len() || data[len - 1] != b'\n' {
            return Err(bad("a record length that does not fit"));
        }
        let record = &data[sp + 1..len - 1];
        data = &data[len..];
        let eq = record
            .iter()
            .position(|&b| b == b'=')
            .ok_or_else(|| bad("a record without `=`"))?;
        let (key, value) = (&record[..eq], &record[eq + 1..]);
        match key {
            b"path" => pending.path = Some(value.to_vec()),
            b"linkpath" => pending.link = Some(value.to_vec()),
            b"size" => {
                pending.size = Some(
                    std::str::from_utf8(value)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| bad("a size that is not a number"))?,
                );
            }
            k if k.starts_with(b"GNU.sparse.") => {
                let name = pending
                    .path
                    .clone()
                    .unwrap_or_else(|| b"(unnamed)".to_vec());
                return Err(Error::entry(&name, Problem::Sparse));
            }
            _ => {}
        }
    }
    Ok(pending)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_bytes: 1 << 20,
        max_entries: 100,
    };

    /// What pack writes, unpack takes back: long names (GNU records),
    /// modes, links, empty directories, with the runner's files excluded.
    #[test]
    fn a_packed_tree_unpacks_the_same() {
        let src = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(src.path()).unwrap();
        let long = "n".repeat(120);
        fs::create_dir_all(root.join("d").join(&long)).unwrap();
        fs::write(root.join("d").join(&long).join("f"), "deep").unwrap();
        fs::create_dir(root.join("empty")).unwrap();
        fs::write(root.join("x"), "x").unwrap();
        fs::set_permissions(root.join("x"), fs::Permissions::from_mode(0o741)).unwrap();
        std::os::unix::fs::symlink("d", root.join("l")).unwrap();
        fs::create_dir(root.join("secret")).unwrap();
        let secret = root.join("secret");
        let exclude = |p: &Path| (p == secret).then_some("the runner's");
        let mut bytes = Vec::new();
        let packed = crate::pack(&root, LIMITS, &exclude, &mut bytes).unwrap();
        assert!(packed.directory);
        assert_eq!(packed.skipped_count, 1);
        assert_eq!(packed.entries, 6);

        let dst = tempfile::tempdir().unwrap();
        let opts = UnpackOptions {
            limits: LIMITS,
            allow_escaping_symlinks: false,
        };
        let done = unpack(bytes.as_slice(), dst.path(), opts).unwrap();
        assert_eq!(done.entries, 6);
        let d = dst.path();
        assert_eq!(
            fs::read_to_string(d.join("d").join(&long).join("f")).unwrap(),
            "deep"
        );
        assert_eq!(
            fs::metadata(d.join("x")).unwrap().permissions().mode() & 0o7777,
            0o741
        );
        assert_eq!(fs::read_link(d.join("l")).unwrap(), Path::new("d"));
        assert!(d.join("empty").is_dir());
        assert!(!d.join("secret").exists());
    }

    #[test]
    fn pax_paths_are_taken_and_sizes_past_the_limit_refused() {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_ustar();
        h.set_size(3);
        h.set_mode(0o644);
        b.append_pax_extensions([("path", &b"from/pax"[..])])
            .unwrap();
        b.append_data(&mut h, "short", &b"abc"[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        let dst = tempfile::tempdir().unwrap();
        let opts = UnpackOptions {
            limits: LIMITS,
            allow_escaping_symlinks: false,
        };
        unpack(bytes.as_slice(), dst.path(), opts).unwrap();
        assert_eq!(
            fs::read_to_string(dst.path().join("from/pax")).unwrap(),
            "abc"
        );

        let dst = tempfile::tempdir().unwrap();
        let tight = UnpackOptions {
            limits: Limits {
                max_bytes: 2,
                max_entries: 100,
            },
            ..opts
        };
        let e = unpack(bytes.as_slice(), dst.path(), tight).unwrap_err();
        assert!(e.to_string().contains("\"from/pax\""), "{e}");
    }
}
