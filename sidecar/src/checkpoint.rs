//! The runner's two parts in checkpoints and forks (docs/checkpoints.md):
//!
//! - **`agent-sidecar checkpoint-sink`**: a short-lived server in a pod of
//!   its own that takes one `Import` stream -- the archive a session's
//!   runner exported, relayed by the operator -- and stores it, as it came,
//!   on the checkpoint's volume: `archive.tar`, bash's state
//!   (`shell-state.pb`, the `ShellState` message) and, written last, the
//!   manifest `checkpoint.json` that says the set is whole. It unpacks
//!   nothing: the archive is checked entry by entry where it is used, by
//!   the fork's runner, with the same rules as any import. Every other RPC
//!   is refused. It exits after one stored archive, or when no archive
//!   came before its deadline.
//! - **`serve --restore-from DIR`**: before it serves, a fork's runner
//!   imports the stored archive and state into its workdir, once: a marker
//!   in its state directory (which lives as long as the shell's snapshot)
//!   keeps a restarted runner from importing again over the fork's own
//!   changes.
//!
//! Bounds: the archive may not pass `--max-archive-bytes` (the volume's
//! size, less a margin), an import stream that stops sending is dropped
//! after [`crate::service::IMPORT_IDLE`], the stored state is at most
//! [`MAX_STATE_BYTES`], the manifest [`MAX_MANIFEST_BYTES`].

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use runner_api::proto::runner_server::{Runner as RunnerRpc, RunnerServer};
use runner_api::proto::{
    AttachRequest, CancelRequest, CancelResponse, ExportChunk, ExportRequest, ImportChunk,
    ImportHeader, ImportResponse, ListToolsRequest, ListToolsResponse, RunEvent, RunRequest,
    RunResponse, ShellState, import_chunk,
};
use serde::{Deserialize, Serialize};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream, UnixListenerStream};
use tonic::{Request, Response, Status};

use crate::error::Error;
use crate::runner::Runner;

/// The stored archive, as the source runner exported it.
pub const ARCHIVE_FILE: &str = "archive.tar";
/// bash's state, a `ShellState` message (absent: none was taken).
pub const STATE_FILE: &str = runner_api::CHECKPOINT_STATE;
/// Written last: the set is whole.
pub const MANIFEST_FILE: &str = runner_api::CHECKPOINT_MANIFEST;
/// In a fork runner's state directory: the checkpoint was imported.
pub const RESTORED_MARKER: &str = "restored-from-checkpoint";
/// Most bytes of stored shell state (the runner sends at most 3 MiB).
pub const MAX_STATE_BYTES: u64 = 4 << 20;
/// Most bytes of a manifest.
pub const MAX_MANIFEST_BYTES: u64 = 64 << 10;
/// How long the sink waits, after its archive is stored, before it exits
/// (the response must reach the operator first).
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// What `checkpoint.json` says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    /// Bytes of `archive.tar` (0 when the files are on a volume).
    pub archive_bytes: u64,
    /// Whether `shell-state.pb` is part of the set.
    pub shell_state: bool,
    /// Where the files are.
    #[serde(default)]
    pub files: Files,
    /// The checkpoint's UID, for a checkpoint whose files are on a volume:
    /// the fork's own import is told apart by it from one its source had
    /// made (the source's state directory comes with the volume).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub checkpoint: String,
}

/// Where a checkpoint's files are.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Files {
    /// In `archive.tar`, imported into the workdir.
    #[default]
    Archive,
    /// Already in the workdir: the fork's workspace claim was made from a
    /// VolumeSnapshot of its source's. Only bash's state is imported.
    Volume,
}

/// The sink's settings (the command line's).
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// The checkpoint volume's mount.
    pub dir: PathBuf,
    /// Most bytes of archive stored.
    pub max_archive_bytes: u64,
    /// Serve on this Unix socket (tests, a local relay).
    pub socket: Option<PathBuf>,
    /// Serve the operator here with mutual TLS from the certificates in
    /// the directory (the runner's).
    pub tls: Option<(std::net::SocketAddr, PathBuf)>,
    /// Exit with an error when no archive was stored by then.
    pub deadline: Duration,
}

/// The sink's one service.
#[derive(Debug, Clone)]
struct Sink {
    config: Arc<SinkConfig>,
    /// One import at a time.
    slot: Arc<tokio::sync::Semaphore>,
    /// Raised once an archive is stored.
    stored: Arc<tokio::sync::Notify>,
}

fn refused(message: impl Into<String>) -> Status {
    runner_api::Refusal::TransferRefused.status(message.into())
}

fn not_here() -> Status {
    Status::unimplemented("this is a checkpoint sink: it takes one Import and serves nothing else")
}

#[tonic::async_trait]
impl RunnerRpc for Sink {
    type RunStreamStream = ReceiverStream<Result<RunEvent, Status>>;
    type AttachStream = ReceiverStream<Result<RunEvent, Status>>;
    type ExportStream = ReceiverStream<Result<ExportChunk, Status>>;
    type HoldStream = ReceiverStream<Result<runner_api::proto::HoldEvent, Status>>;

    async fn run(&self, _: Request<RunRequest>) -> Result<Response<RunResponse>, Status> {
        Err(not_here())
    }
    async fn run_stream(
        &self,
        _: Request<RunRequest>,
    ) -> Result<Response<Self::RunStreamStream>, Status> {
        Err(not_here())
    }
    async fn attach(
        &self,
        _: Request<AttachRequest>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        Err(not_here())
    }
    async fn cancel(&self, _: Request<CancelRequest>) -> Result<Response<CancelResponse>, Status> {
        Err(not_here())
    }
    async fn list_tools(
        &self,
        _: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        Err(not_here())
    }
    async fn export(
        &self,
        _: Request<ExportRequest>,
    ) -> Result<Response<Self::ExportStream>, Status> {
        Err(not_here())
    }
    async fn hold(
        &self,
        _: Request<tonic::Streaming<runner_api::proto::HoldRequest>>,
    ) -> Result<Response<Self::HoldStream>, Status> {
        Err(not_here())
    }

    async fn import(
        &self,
        request: Request<tonic::Streaming<ImportChunk>>,
    ) -> Result<Response<ImportResponse>, Status> {
        let _slot = Arc::clone(&self.slot).try_acquire_owned().map_err(|_| {
            runner_api::Refusal::Busy.status("the checkpoint sink is already storing an archive")
        })?;
        let mut stream = request.into_inner();
        let header = match next(&mut stream).await? {
            Some(ImportChunk {
                part: Some(import_chunk::Part::Header(h)),
            }) => h,
            _ => return Err(refused("an import's first message must be its header")),
        };
        if !header.path.is_empty() {
            return Err(refused(
                "the checkpoint sink stores a whole archive: path must be empty",
            ));
        }
        let dir = &self.config.dir;
        // The set is no longer whole from here until the new manifest.
        remove(&dir.join(MANIFEST_FILE))?;
        let partial = dir.join(format!(".{ARCHIVE_FILE}.partial"));
        let mut out = create(&partial)
            .map_err(|e| internal(format!("cannot create {}", partial.display()), &e))?;
        let mut written: u64 = 0;
        while let Some(chunk) = next(&mut stream).await? {
            let data = match chunk.part {
                Some(import_chunk::Part::Data(d)) => d,
                _ => {
                    let _ = fs::remove_file(&partial);
                    return Err(refused("a second header in the import stream"));
                }
            };
            written = written.saturating_add(data.len() as u64);
            if written > self.config.max_archive_bytes {
                let _ = fs::remove_file(&partial);
                return Err(refused(format!(
                    "the archive is larger than the checkpoint's volume takes ({} bytes, --max-archive-bytes); ask for a smaller maxBytes or a larger checkpoint volume",
                    self.config.max_archive_bytes
                )));
            }
            if let Err(e) = out.write_all(&data) {
                let _ = fs::remove_file(&partial);
                return Err(internal(format!("cannot write {}", partial.display()), &e));
            }
        }
        let stored = store(dir, out, &partial, written, header.shell_state.as_ref());
        if let Err(e) = &stored {
            let _ = fs::remove_file(&partial);
            tracing::warn!(error = %e, "checkpoint not stored");
        }
        stored.map_err(|e| e.to_status())?;
        tracing::info!(archive_bytes = written, "checkpoint stored");
        self.stored.notify_one();
        Ok(Response::new(ImportResponse {
            entries: 0,
            file_bytes: written,
        }))
    }
}

fn internal(context: String, e: &std::io::Error) -> Status {
    Status::internal(format!("{context}: {e}"))
}

/// The next message, or an error when none came for
/// [`crate::service::IMPORT_IDLE`].
async fn next(stream: &mut tonic::Streaming<ImportChunk>) -> Result<Option<ImportChunk>, Status> {
    match tokio::time::timeout(crate::service::IMPORT_IDLE, stream.message()).await {
        Ok(Ok(m)) => Ok(m),
        Ok(Err(e)) => Err(refused(format!("the import stream broke: {}", e.message()))),
        Err(_) => Err(refused(format!(
            "the import stream sent nothing for {} s",
            crate::service::IMPORT_IDLE.as_secs()
        ))),
    }
}

fn remove(path: &Path) -> Result<(), Status> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(internal(format!("cannot remove {}", path.display()), &e)),
    }
}

/// A new file, readable by the fork's user (the volume is mounted read-only
/// there), never through a link.
fn create(path: &Path) -> std::io::Result<File> {
    let _ = fs::remove_file(path);
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Makes the received archive and state the stored set: each synced and
/// renamed into place, the manifest last.
fn store(
    dir: &Path,
    archive: File,
    partial: &Path,
    archive_bytes: u64,
    state: Option<&ShellState>,
) -> Result<(), Error> {
    let io = |what: &str, p: &Path| {
        let shown = format!("cannot {what} {}", p.display());
        move |e| Error::io(shown, e)
    };
    archive.sync_all().map_err(io("sync", partial))?;
    drop(archive);
    fs::rename(partial, dir.join(ARCHIVE_FILE)).map_err(io("rename", partial))?;
    let state_path = dir.join(STATE_FILE);
    match state {
        Some(s) => write_whole(&state_path, &s.encode_to_vec())?,
        None => match fs::remove_file(&state_path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(
                    format!("cannot remove {}", state_path.display()),
                    e,
                ));
            }
            _ => {}
        },
    }
    let manifest = Manifest {
        archive_bytes,
        shell_state: state.is_some(),
        files: Files::Archive,
        checkpoint: String::new(),
    };
    let body = serde_json::to_vec(&manifest)
        .map_err(|e| Error::io("cannot encode the manifest", std::io::Error::other(e)))?;
    write_whole(&dir.join(MANIFEST_FILE), &body)?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Writes `bytes` to `path` through a temporary name and a rename.
fn write_whole(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.partial"));
    let mut f =
        create(&tmp).map_err(|e| Error::io(format!("cannot create {}", tmp.display()), e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(format!("cannot write {}", tmp.display()), e))?;
    fs::rename(&tmp, path).map_err(|e| Error::io(format!("cannot rename {}", tmp.display()), e))
}

/// Runs the sink until one archive is stored (then `Ok`) or the deadline
/// passes (then an error saying so).
pub async fn sink(config: SinkConfig) -> Result<(), Error> {
    if config.socket.is_none() && config.tls.is_none() {
        return Err(Error::Usage(
            "checkpoint-sink needs --socket or --listen-tls (with --tls-dir)".into(),
        ));
    }
    let meta = fs::metadata(&config.dir)
        .map_err(|e| Error::io(format!("cannot use {}", config.dir.display()), e))?;
    if !meta.is_dir() {
        return Err(Error::Usage(format!(
            "{} is not a directory",
            config.dir.display()
        )));
    }
    let stored = Arc::new(tokio::sync::Notify::new());
    let svc = RunnerServer::new(Sink {
        config: Arc::new(config.clone()),
        slot: Arc::new(tokio::sync::Semaphore::new(1)),
        stored: Arc::clone(&stored),
    })
    .max_decoding_message_size(8 << 20);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut servers = tokio::task::JoinSet::new();
    if let Some(path) = &config.socket {
        let l = crate::service::bind_socket(path).await?;
        let router = tonic::transport::Server::builder().add_service(svc.clone());
        let rx = stop_rx.clone();
        servers.spawn(async move {
            router
                .serve_with_incoming_shutdown(UnixListenerStream::new(l), stopped(rx))
                .await
                .map_err(|e| Error::Transport {
                    context: "serving the checkpoint sink's socket".into(),
                    source: e,
                })
        });
    }
    if let Some((addr, dir)) = &config.tls {
        let tls = crate::mtls::server_config(dir)?;
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::io(format!("cannot listen on {addr}"), e))?;
        let router = tonic::transport::Server::builder()
            .tls_config(tls)
            .map_err(|e| Error::Transport {
                context: "configuring the checkpoint sink's TLS listener".into(),
                source: e,
            })?
            .add_service(svc);
        let rx = stop_rx.clone();
        servers.spawn(async move {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(l), stopped(rx))
                .await
                .map_err(|e| Error::Transport {
                    context: "serving the checkpoint sink (TLS)".into(),
                    source: e,
                })
        });
    }
    tracing::info!(dir = %config.dir.display(), socket = ?config.socket, tls = ?config.tls.as_ref().map(|t| t.0), "checkpoint sink ready");
    let outcome = tokio::select! {
        () = stored.notified() => {
            tokio::time::sleep(EXIT_GRACE).await;
            Ok(())
        }
        () = tokio::time::sleep(config.deadline) => Err(Error::Usage(format!(
            "no checkpoint archive arrived within {} s",
            config.deadline.as_secs()
        ))),
        Some(done) = servers.join_next() => match done {
            Ok(Err(e)) => Err(e),
            _ => Err(Error::io("the checkpoint sink's server ended", std::io::Error::other("ended"))),
        },
    };
    let _ = stop_tx.send(true);
    servers.abort_all();
    if let Some(path) = &config.socket {
        let _ = fs::remove_file(path);
    }
    outcome
}

/// Reads at most `max` bytes of `path`; more is an error.
fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, Error> {
    let f =
        File::open(path).map_err(|e| Error::io(format!("cannot open {}", path.display()), e))?;
    let mut buf = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut buf)
        .map_err(|e| Error::io(format!("cannot read {}", path.display()), e))?;
    if buf.len() as u64 > max {
        return Err(Error::TransferRefused {
            message: format!("{} is larger than {max} bytes", path.display()),
        });
    }
    Ok(buf)
}

/// What `--restore-from` did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restored {
    /// Imported now: entries and bytes of file content.
    Imported { entries: u64, file_bytes: u64 },
    /// The marker says an earlier start of this runner imported it.
    Already,
}

/// Imports the checkpoint stored in `from` into the runner's workdir (its
/// files, and bash's state when stored), unless `state_dir` holds the
/// marker of an earlier import. Files of the same top-level name in the
/// workdir are replaced. Symbolic links that leave the tree are taken (a
/// workspace's virtualenv), as the source session had them; nothing is
/// written through one.
pub async fn restore(runner: &Runner, from: &Path, state_dir: &Path) -> Result<Restored, Error> {
    let marker = state_dir.join(RESTORED_MARKER);
    let manifest_path = from.join(MANIFEST_FILE);
    let manifest: Manifest =
        serde_json::from_slice(&read_bounded(&manifest_path, MAX_MANIFEST_BYTES)?).map_err(
            |e| Error::TransferRefused {
                message: format!(
                    "{} is not a checkpoint's manifest: {e}",
                    manifest_path.display()
                ),
            },
        )?;
    if already_restored(&marker, &manifest) {
        return Ok(Restored::Already);
    }
    let shell_state = if manifest.shell_state {
        let bytes = read_bounded(&from.join(STATE_FILE), MAX_STATE_BYTES)?;
        Some(
            ShellState::decode(bytes.as_slice()).map_err(|e| Error::TransferRefused {
                message: format!(
                    "{} is not a ShellState: {e}",
                    from.join(STATE_FILE).display()
                ),
            })?,
        )
    } else {
        None
    };
    if manifest.files == Files::Volume {
        return restore_state(runner, shell_state, state_dir, &marker, &manifest).await;
    }
    let archive_path = from.join(ARCHIVE_FILE);
    let archive = File::open(&archive_path)
        .map_err(|e| Error::io(format!("cannot open {}", archive_path.display()), e))?;
    let size = archive
        .metadata()
        .map_err(|e| Error::io(format!("cannot read {}", archive_path.display()), e))?
        .len();
    if size != manifest.archive_bytes {
        return Err(Error::TransferRefused {
            message: format!(
                "{} holds {size} bytes, its manifest says {}: the checkpoint is damaged",
                archive_path.display(),
                manifest.archive_bytes
            ),
        });
    }
    let header = ImportHeader {
        path: String::new(),
        overwrite: true,
        max_bytes: 0,
        max_entries: 0,
        allow_escaping_symlinks: true,
        shell_state,
    };
    let done = runner
        .import(header, std::io::BufReader::new(archive))
        .await?;
    fs::create_dir_all(state_dir)
        .map_err(|e| Error::io(format!("cannot create {}", state_dir.display()), e))?;
    fs::write(&marker, b"imported\n")
        .map_err(|e| Error::io(format!("cannot write {}", marker.display()), e))?;
    Ok(Restored::Imported {
        entries: done.entries,
        file_bytes: done.file_bytes,
    })
}

/// Whether `marker` says this checkpoint was imported here already. For an
/// archive any marker does (it is in the fork's own state directory); for
/// files on a volume only one naming this checkpoint: the volume brought
/// its source's state directory, and with it any marker its source had.
fn already_restored(marker: &Path, manifest: &Manifest) -> bool {
    match manifest.files {
        Files::Archive => fs::symlink_metadata(marker).is_ok(),
        Files::Volume => {
            let mut buf = Vec::new();
            File::open(marker)
                .and_then(|f| f.take(MAX_MANIFEST_BYTES).read_to_end(&mut buf))
                .is_ok()
                && buf == marker_text(&manifest.checkpoint).as_bytes()
        }
    }
}

fn marker_text(checkpoint: &str) -> String {
    format!("imported checkpoint {checkpoint}\n")
}

/// A fork whose files came with its volume: its source's bash state (in
/// the state directory the volume brought) is never used -- it holds the
/// source runner's environment -- and the checkpoint's state, when it has
/// one, replaces it.
async fn restore_state(
    runner: &Runner,
    shell_state: Option<ShellState>,
    state_dir: &Path,
    marker: &Path,
    manifest: &Manifest,
) -> Result<Restored, Error> {
    if manifest.checkpoint.is_empty() {
        return Err(Error::TransferRefused {
            message:
                "the checkpoint's manifest says its files are on a volume but names no checkpoint"
                    .into(),
        });
    }
    runner.forget_shell_state()?;
    let _ = fs::remove_file(marker);
    if let Some(state) = shell_state {
        let header = ImportHeader {
            path: String::new(),
            overwrite: true,
            max_bytes: 0,
            max_entries: 0,
            allow_escaping_symlinks: false,
            shell_state: Some(state),
        };
        // An archive of no entries: only the state is installed.
        runner
            .import(header, std::io::Cursor::new(vec![0u8; 1024]))
            .await?;
    }
    fs::create_dir_all(state_dir)
        .map_err(|e| Error::io(format!("cannot create {}", state_dir.display()), e))?;
    fs::write(marker, marker_text(&manifest.checkpoint))
        .map_err(|e| Error::io(format!("cannot write {}", marker.display()), e))?;
    Ok(Restored::Imported {
        entries: 0,
        file_bytes: 0,
    })
}
