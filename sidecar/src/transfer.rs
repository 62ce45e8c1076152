//! Export and import of the workspace: the file half of a checkpoint, and
//! what `kubectl agent cp` rides on.
//!
//! The rules, each for a reason:
//! - Paths are under the workdir (with symlinks resolved): these RPCs are
//!   the session's workspace going out and coming in, not a way around
//!   the container's filesystem.
//! - The runner's own files (its state directory with the shell snapshot,
//!   its socket, the toolset and binding files, its binary, the spill and
//!   TLS directories) are never exported and never imported over, wherever
//!   they sit: a checkpoint must not carry the runner's keys or let a fork
//!   plant a snapshot.
//! - An export is archived to an unnamed file in the state directory while
//!   the runner holds the workspace still (see [`crate::runner`]), and only
//!   then streamed, so a slow reader never holds a tool call up.
//! - An import is unpacked into a staging directory beside its target
//!   (same filesystem, so the final move is a rename), with every entry
//!   checked by the `archive` crate, and moved into place only when the
//!   whole archive was accepted; a refused one is removed whole.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use archive::Staging;
use runner_api::proto::{ExportHeader, ExportRequest, ImportHeader, ImportResponse, ShellState};

use crate::error::Error;
use crate::fsutil;
use crate::guard::Protected;
use crate::tools::ctx::Ctx;

/// Default of the runner's most bytes of file content in one archive.
pub const DEFAULT_MAX_TRANSFER_BYTES: u64 = 2 << 30;

/// Names of the staging directories an import makes; one a killed runner
/// left behind is removed by the next import into the same directory.
const STAGING_PREFIX: &str = ".agentplane-import-";
const REPLACED_PREFIX: &str = ".agentplane-replaced-";

/// Most conflicting names an import refusal lists.
const CONFLICTS_SHOWN: usize = 8;

/// How deep an import merges into directories holding the runner's files.
const MERGE_DEPTH: usize = 8;

/// The runner's side of transfers: its bounds and what is never moved.
#[derive(Debug)]
pub struct Transfers {
    /// Most bytes of file content an archive may hold, whatever is asked.
    pub max_bytes: u64,
    /// Trees besides the runner's protected files that are never exported
    /// or imported into: the spill directory, the TLS directory.
    pub private: Protected,
    /// Where exports are archived before they are streamed.
    pub spool_dir: PathBuf,
}

/// An export, archived: its header and the archive, read from the start.
#[derive(Debug)]
pub struct Exported {
    pub header: ExportHeader,
    pub archive: File,
}

/// An accepted archive in its staging directory, not yet in place.
#[derive(Debug)]
pub struct Staged {
    /// Where the archive's entries go (symlinks resolved).
    dest: PathBuf,
    /// The target existed: the top-level entries are moved into it.
    into: bool,
    overwrite: bool,
    staging: Staging,
    /// The snapshot to install, when the import carries bash's state.
    snapshot: Option<Vec<u8>>,
    response: ImportResponse,
}

fn refused(message: impl Into<String>) -> Error {
    Error::TransferRefused {
        message: message.into(),
    }
}

impl Transfers {
    /// The bounds of one archive: the request's, which may not pass the
    /// runner's (0 asks for the runner's).
    fn limits(&self, max_bytes: u64, max_entries: u64) -> Result<archive::Limits, Error> {
        if max_bytes > self.max_bytes {
            return Err(refused(format!(
                "max_bytes {max_bytes} is over the runner's maximum of {} (serve --max-transfer-bytes); ask for at most that",
                self.max_bytes
            )));
        }
        if max_entries > archive::MAX_ENTRIES {
            return Err(refused(format!(
                "max_entries {max_entries} is over the maximum of {}",
                archive::MAX_ENTRIES
            )));
        }
        let pick = |asked: u64, max: u64| if asked == 0 { max } else { asked };
        Ok(archive::Limits {
            max_bytes: pick(max_bytes, self.max_bytes),
            max_entries: pick(max_entries, archive::MAX_ENTRIES),
        })
    }

    /// What the runner keeps to itself at `path` (real), if anything.
    fn private(&self, ctx: &Ctx, path: &Path) -> Option<&'static str> {
        ctx.protected
            .check(path)
            .or_else(|| self.private.check(path))
    }

    /// What the runner keeps to itself strictly inside the directory
    /// `dir` (real), if anything.
    fn private_inside(&self, ctx: &Ctx, dir: &Path) -> Option<&'static str> {
        ctx.protected
            .inside(dir)
            .or_else(|| self.private.inside(dir))
    }

    /// The moves that put `staging`'s entries into `dest`: one per entry,
    /// except that an existing directory holding the runner's own files
    /// (its state directory under a persistent workspace's `.agentplane`)
    /// is never replaced whole: the archive's directory of that name is
    /// merged into it, entry by entry, by the same rule. Landing on the
    /// runner's files themselves is refused.
    fn plan_moves(
        &self,
        ctx: &Ctx,
        staging: &Path,
        dest: &Path,
        depth: usize,
        out: &mut Vec<(PathBuf, PathBuf)>,
    ) -> Result<(), Error> {
        let listing = fs::read_dir(staging)
            .map_err(|e| Error::io(format!("cannot list {}", staging.display()), e))?;
        let mut names = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| Error::io("cannot list the staging directory", e))?;
            names.push(entry.file_name());
        }
        names.sort();
        for name in &names {
            let (src, target) = (staging.join(name), dest.join(name));
            if let Some(what) = self.private(ctx, &target) {
                return Err(refused(format!(
                    "the archive's {} would land on {what}, which is never imported over",
                    target
                        .strip_prefix(&ctx.workdir)
                        .unwrap_or(&target)
                        .display()
                )));
            }
            let existing = fs::symlink_metadata(&target).ok();
            let holds = existing
                .as_ref()
                .filter(|m| m.is_dir())
                .and_then(|_| self.private_inside(ctx, &target));
            match holds {
                None => out.push((src, target)),
                Some(what) => {
                    let both_dirs = fs::symlink_metadata(&src).is_ok_and(|m| m.is_dir());
                    // The runner's own paths are a few levels deep at most.
                    if !both_dirs || depth >= MERGE_DEPTH {
                        return Err(refused(format!(
                            "the archive's {} would replace a directory holding {what}, which is never imported over",
                            target
                                .strip_prefix(&ctx.workdir)
                                .unwrap_or(&target)
                                .display()
                        )));
                    }
                    self.plan_moves(ctx, &src, &target, depth + 1, out)?;
                }
            }
        }
        Ok(())
    }

    /// `path` (relative to the workdir, or absolute inside it) with its
    /// parent's symlinks resolved; the last component is left as is, so a
    /// link there is the link. Refused outside the workdir or on the
    /// runner's own files.
    fn inside(&self, ctx: &Ctx, path: &str) -> Result<PathBuf, Error> {
        let shown = if path.is_empty() { "." } else { path };
        let workdir = fsutil::canonical(&ctx.workdir);
        let lexical = fsutil::lexical_clean(&fsutil::resolve(&ctx.workdir, shown));
        let real = if lexical == fsutil::lexical_clean(&ctx.workdir) || lexical == workdir {
            workdir.clone()
        } else {
            match (lexical.parent(), lexical.file_name()) {
                (Some(parent), Some(name)) => fsutil::canonical(parent).join(name),
                // The root itself: outside any workdir but `/`.
                _ => PathBuf::from("/"),
            }
        };
        if !real.starts_with(&workdir) {
            return Err(refused(format!(
                "{shown} is outside the workdir {} (symbolic links resolved); exports and imports stay inside it",
                ctx.workdir.display()
            )));
        }
        if let Some(what) = self.private(ctx, &real) {
            return Err(refused(format!(
                "{shown} is {what}, which is never exported or imported"
            )));
        }
        Ok(real)
    }

    /// Archives `req.path` into an unnamed file in the spool directory,
    /// with bash's state when asked. The caller holds the workspace still.
    pub fn export(&self, ctx: &Ctx, req: &ExportRequest) -> Result<Exported, Error> {
        let limits = self.limits(req.max_bytes, req.max_entries)?;
        let root = self.inside(ctx, &req.path)?;
        if let Err(e) = fs::symlink_metadata(&root) {
            return Err(refused(format!(
                "{}: {}",
                if req.path.is_empty() { "." } else { &req.path },
                fsutil::describe(&e)
            )));
        }
        let shell_state = if req.shell_state {
            let lexical = fsutil::lexical_clean(&fsutil::resolve(&ctx.workdir, &req.path));
            Some(self.shell_state(ctx, &[&root, &lexical])?)
        } else {
            None
        };
        fs::create_dir_all(&self.spool_dir)
            .map_err(|e| Error::io(format!("cannot create {}", self.spool_dir.display()), e))?;
        // Unnamed: gone with the runner, whatever ends it.
        let file = tempfile::tempfile_in(&self.spool_dir).map_err(|e| {
            Error::io(
                format!("cannot create a file in {}", self.spool_dir.display()),
                e,
            )
        })?;
        // Background jobs earlier calls left are no call the lock holds:
        // they are stopped while the archive is written, continued after
        // (also when packing fails: the guard's drop).
        let _paused = Paused::all_calls(ctx);
        let exclude = |p: &Path| self.private(ctx, p);
        let mut out = BufWriter::new(file);
        let packed = archive::pack(&root, limits, &exclude, &mut out).map_err(export_error)?;
        out.flush()
            .map_err(|e| Error::io("cannot write the export's archive", e))?;
        let mut file = out
            .into_inner()
            .map_err(|e| Error::io("cannot write the export's archive", e.into_error()))?;
        let archive_bytes = file
            .stream_position()
            .map_err(|e| Error::io("cannot read the export's archive", e))?;
        file.rewind()
            .map_err(|e| Error::io("cannot read the export's archive", e))?;
        Ok(Exported {
            header: ExportHeader {
                directory: packed.directory,
                archive_bytes,
                entries: packed.entries,
                file_bytes: packed.bytes,
                skipped: packed.skipped,
                skipped_count: packed.skipped_count,
                shell_state,
            },
            archive: file,
        })
    }

    /// What a hold does once the workspace is still: bash's state (when
    /// asked) relative to the workdir, background jobs paused, and the
    /// workspace's filesystem flushed to its disk, so a copy of the volume
    /// taken now holds every write a finished call made. The jobs stay
    /// paused until the returned guard is dropped.
    pub fn hold(
        &self,
        ctx: &Ctx,
        shell_state: bool,
    ) -> Result<(Option<ShellState>, Paused), Error> {
        let state = if shell_state {
            let workdir = fsutil::canonical(&ctx.workdir);
            let lexical = fsutil::lexical_clean(&ctx.workdir);
            Some(self.shell_state(ctx, &[&workdir, &lexical])?)
        } else {
            None
        };
        let paused = Paused::all_calls(ctx);
        sync_filesystem(&ctx.workdir)?;
        Ok((state, paused))
    }

    /// bash's state as the next call would start from it, relative to the
    /// exported directory (spelled each way in `roots`).
    fn shell_state(&self, ctx: &Ctx, roots: &[&Path]) -> Result<ShellState, Error> {
        let roots: Vec<&[u8]> = roots.iter().map(|r| r.as_os_str().as_bytes()).collect();
        let loaded = ctx.snapshot.load();
        match loaded.state {
            Some(snapshot) => crate::shellstate::export(&snapshot, &ctx.initial_state(), &roots)
                .map_err(|e| refused(format!("bash's saved state cannot be exported: {e}"))),
            // No state yet: a fresh shell in the workdir.
            None => {
                let workdir = ctx.workdir.as_os_str().as_bytes();
                let cwd = crate::shellstate::export(
                    &[
                        b"builtin cd -- ".as_slice(),
                        b"'",
                        workdir,
                        b"' 2>/dev/null\n",
                    ]
                    .concat(),
                    b"",
                    &roots,
                )
                .map(|s| s.cwd)
                .unwrap_or_default();
                Ok(ShellState {
                    cwd,
                    ..ShellState::default()
                })
            }
        }
    }

    /// Unpacks `input` into a staging directory beside the import's target.
    /// Nothing of the workspace changes; on `Err` the staging is removed.
    pub fn stage(
        &self,
        ctx: &Ctx,
        header: &ImportHeader,
        input: impl Read,
    ) -> Result<Staged, Error> {
        let limits = self.limits(header.max_bytes, header.max_entries)?;
        let dest = self.inside(ctx, &header.path)?;
        let shown = if header.path.is_empty() {
            "."
        } else {
            &header.path
        };
        let into = match fs::symlink_metadata(&dest) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(refused(format!(
                    "{shown} is a symbolic link; import into the directory it names"
                )));
            }
            Ok(m) if m.is_dir() => true,
            Ok(_) => {
                return Err(refused(format!("{shown} exists and is not a directory")));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(e) => return Err(refused(format!("{shown}: {}", fsutil::describe(&e)))),
        };
        // Staged in the target, or for a new target in its nearest
        // existing ancestor (inside the workdir, on the same filesystem):
        // the missing parents are made only when the archive is moved into
        // place, so a refused one leaves no directory behind either.
        let parent = if into {
            dest.clone()
        } else {
            let mut at = dest.parent().unwrap_or(&dest).to_path_buf();
            while !fs::symlink_metadata(&at).is_ok_and(|m| m.is_dir()) {
                match at.parent() {
                    Some(p) => at = p.to_path_buf(),
                    None => break,
                }
            }
            if !at.starts_with(fsutil::canonical(&ctx.workdir)) {
                return Err(refused(format!(
                    "{shown}: a parent directory in the way is not a directory"
                )));
            }
            at
        };
        sweep(&parent);
        let snapshot = match &header.shell_state {
            Some(state) => Some(
                crate::shellstate::import(state, &ctx.initial_state(), dest.as_os_str().as_bytes())
                    .map_err(|e| refused(format!("shell_state: {e}")))?,
            ),
            None => None,
        };
        let staging = stage(&parent, STAGING_PREFIX)?;
        let opts = archive::UnpackOptions {
            limits,
            allow_escaping_symlinks: header.allow_escaping_symlinks,
        };
        // On error the staging is dropped here, and with it all it holds.
        let done = archive::unpack(input, staging.path(), opts).map_err(import_error)?;
        Ok(Staged {
            dest,
            into,
            overwrite: header.overwrite,
            staging,
            snapshot,
            response: ImportResponse {
                entries: done.entries,
                file_bytes: done.bytes,
            },
        })
    }

    /// Moves a staged archive into place and installs its bash state. The
    /// caller holds the workspace still.
    pub fn commit(&self, ctx: &Ctx, mut staged: Staged) -> Result<ImportResponse, Error> {
        if staged.into {
            self.move_entries(ctx, &staged)?;
        } else {
            if fs::symlink_metadata(&staged.dest).is_ok() {
                return Err(refused(format!(
                    "{} appeared while the archive was unpacked; import again",
                    staged.dest.display()
                )));
            }
            if let Some(parent) = staged.dest.parent() {
                fs::create_dir_all(parent).map_err(|e| {
                    refused(format!(
                        "cannot create {}: {}",
                        parent.display(),
                        fsutil::describe(&e)
                    ))
                })?;
                // Made through real directories only: a link planted on
                // the way since the check would show here.
                if fsutil::canonical(parent) != parent {
                    return Err(refused(format!(
                        "{} changed while the archive was unpacked; import again",
                        parent.display()
                    )));
                }
            }
            fs::rename(staged.staging.path(), &staged.dest).map_err(|e| {
                Error::io(
                    format!("cannot move the import to {}", staged.dest.display()),
                    e,
                )
            })?;
            // Renamed away: nothing left to remove.
            staged.staging.keep();
        }
        if let Some(snapshot) = &staged.snapshot {
            let next = ctx.call_file("import", "snap");
            fs::write(&next, snapshot)
                .map_err(|e| Error::io(format!("cannot write {}", next.display()), e))?;
            if let Some(notice) = ctx.snapshot.install(&next) {
                return Err(Error::io(
                    "the files were imported but bash's state was not",
                    io::Error::other(notice),
                ));
            }
        }
        Ok(staged.response)
    }

    /// Moves each top-level entry of the staging directory into the
    /// existing target (see [`Self::plan_moves`]): all of them, or (on a
    /// conflict or a failure) none.
    fn move_entries(&self, ctx: &Ctx, staged: &Staged) -> Result<(), Error> {
        let staging = staged.staging.path();
        let mut moves = Vec::new();
        self.plan_moves(ctx, staging, &staged.dest, 0, &mut moves)?;
        let mut conflicts: Vec<String> = moves
            .iter()
            .filter(|(_, target)| fs::symlink_metadata(target).is_ok())
            .map(|(_, target)| {
                target
                    .strip_prefix(&staged.dest)
                    .unwrap_or(target)
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        if !conflicts.is_empty() && !staged.overwrite {
            let n = conflicts.len();
            conflicts.truncate(CONFLICTS_SHOWN);
            return Err(refused(format!(
                "{n} of the archive's entries already exist in {}: {}{}; import with overwrite to replace them",
                staged.dest.display(),
                conflicts.join(", "),
                if n > CONFLICTS_SHOWN { ", ..." } else { "" }
            )));
        }
        let trash = stage(&staged.dest, REPLACED_PREFIX)?;
        // (move, where an old entry went in the trash), to undo.
        let mut done: Vec<(&(PathBuf, PathBuf), Option<PathBuf>)> = Vec::new();
        let mut result = Ok(());
        for (i, mv) in moves.iter().enumerate() {
            let (src, target) = mv;
            let old = fs::symlink_metadata(target)
                .is_ok()
                .then(|| trash.path().join(i.to_string()));
            let step = (|| {
                if let Some(old) = &old {
                    fs::rename(target, old)?;
                }
                fs::rename(src, target).inspect_err(|_| {
                    if let Some(old) = &old {
                        let _ = fs::rename(old, target);
                    }
                })
            })();
            match step {
                Ok(()) => done.push((mv, old)),
                Err(e) => {
                    result = Err(Error::io(
                        format!("cannot move {} into place", target.display()),
                        e,
                    ));
                    break;
                }
            }
        }
        if result.is_err() {
            for ((src, target), old) in done.into_iter().rev() {
                let _ = fs::rename(target, src);
                if let Some(old) = old {
                    let _ = fs::rename(old, target);
                }
            }
        }
        result
    }
}

/// Removes staging directories a killed runner left in `dir`. Imports run
/// one at a time, so none of them is in use.
fn sweep(dir: &Path) {
    let Ok(listing) = fs::read_dir(dir) else {
        return;
    };
    for entry in listing.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if (name.starts_with(STAGING_PREFIX) || name.starts_with(REPLACED_PREFIX))
            && entry.file_type().is_ok_and(|t| t.is_dir())
        {
            archive::remove_tree(&entry.path());
        }
    }
}

/// Background jobs of this runner's calls, stopped until dropped.
#[derive(Debug)]
pub struct Paused(Vec<i32>);

impl Paused {
    pub fn all_calls(ctx: &Ctx) -> Paused {
        let prefix = format!("{}={}.", crate::procs::MARKER_VAR, ctx.instance);
        let pids = crate::procs::pause_all_calls(&prefix, &ctx.supervisor.live_pids());
        if !pids.is_empty() {
            tracing::info!(
                processes = pids.len(),
                "background jobs stopped while the export is archived"
            );
        }
        Paused(pids)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        crate::procs::resume(&self.0);
    }
}

/// Flushes the filesystem holding `dir` to its disk (syncfs(2)).
fn sync_filesystem(dir: &Path) -> Result<(), Error> {
    let f = File::open(dir).map_err(|e| Error::io(format!("cannot open {}", dir.display()), e))?;
    nix::unistd::syncfs(&f).map_err(|e| {
        Error::io(
            format!("cannot flush {} to its disk", dir.display()),
            e.into(),
        )
    })
}

/// A directory of the runner's making inside the workspace (a staging
/// directory, or where replaced entries wait), removed with all it holds
/// when dropped, unless kept.
fn stage(parent: &Path, prefix: &str) -> Result<Staging, Error> {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(parent)
        .map_err(|e| Error::io(format!("cannot stage in {}", parent.display()), e))?;
    Ok(Staging::adopt(dir.keep()))
}

/// An export's archive error: a limit reached is the request's to change;
/// the rest is the runner's fault.
fn export_error(e: archive::Error) -> Error {
    match e {
        archive::Error::Io { context, source } => Error::Io { context, source },
        other => refused(format!("export: {other}")),
    }
}

/// An import's archive error: a refused entry or archive is the sender's;
/// a write that failed is the runner's.
fn import_error(e: archive::Error) -> Error {
    match e {
        archive::Error::Io { context, source }
            if !context.starts_with("cannot read the archive") =>
        {
            Error::Io { context, source }
        }
        other => refused(format!("import refused, nothing was written: {other}")),
    }
}
