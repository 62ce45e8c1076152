//! The one entry point for a tool call: policy gate, dispatch, the output
//! budget and the duration metric, in that order, for every call.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use toolset::{PermissionPolicy, ResolvedToolset};

use crate::binding::{AwaitBinding, Bound, Found, Gate};
use crate::calls::Record;
use crate::error::Error;
use crate::guard::Protected;
use crate::output::{Output, Spill, finish};
use crate::reaper::Supervisor;
use crate::tools::{self, CallLimits, Ctx};
use crate::watch::Alarm;

pub use runner_api::ToolResult;

/// Where a runner keeps its files and what it may run.
#[derive(Debug, Clone)]
pub struct RunnerConfig {
    /// Where relative tool paths resolve and where bash starts.
    pub workdir: PathBuf,
    /// The session's shell snapshot and per-call working files.
    pub state_dir: PathBuf,
    /// Where oversized outputs go, one `<call id>.txt` each.
    pub spill_dir: PathBuf,
    /// The session's resolved built-in toolset.
    pub toolset: ResolvedToolset,
    /// Bounds that keep a hostile call from exhausting the runner or the node.
    pub limits: Limits,
    /// The runner's own files besides its state directory (its socket, the
    /// toolset file), which the file tools refuse; the state directory, the
    /// runner's binary and the programs it runs are added by [`Runner::new`].
    pub protected: Vec<PathBuf>,
    /// Directories of the runner's that the file tools may reach but
    /// exports never carry and imports never write (the TLS directory);
    /// the spill directory is added by [`Runner::new`].
    pub private: Vec<PathBuf>,
    /// A warm pool's sandbox: start unbound, with `toolset` (which then
    /// enables nothing) in force only until these files bind the runner to
    /// its session (see [`crate::binding`]).
    pub await_binding: Option<AwaitBinding>,
    /// Raised by the sandbox watch when it ended the sandbox at a bound;
    /// the calls that ran then say so in their results.
    pub alarm: Arc<Alarm>,
}

/// The runner's bounds, each a command-line flag of `serve`.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Calls run at once; one more is refused (`RESOURCE_EXHAUSTED`).
    pub max_concurrent_calls: usize,
    pub call: CallLimits,
    pub spill_max_files: usize,
    pub spill_max_bytes: u64,
    /// Most bytes of file content one export or import may move.
    pub max_transfer_bytes: u64,
}

/// Default of [`Limits::max_concurrent_calls`].
pub const DEFAULT_MAX_CONCURRENT_CALLS: usize = 64;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_concurrent_calls: DEFAULT_MAX_CONCURRENT_CALLS,
            call: CallLimits::default(),
            spill_max_files: crate::output::DEFAULT_SPILL_MAX_FILES,
            spill_max_bytes: crate::output::DEFAULT_SPILL_MAX_BYTES,
            max_transfer_bytes: crate::transfer::DEFAULT_MAX_TRANSFER_BYTES,
        }
    }
}

impl RunnerConfig {
    /// A configuration with the default limits and nothing extra protected.
    pub fn new(
        workdir: PathBuf,
        state_dir: PathBuf,
        spill_dir: PathBuf,
        toolset: ResolvedToolset,
    ) -> Self {
        RunnerConfig {
            workdir,
            state_dir,
            spill_dir,
            toolset,
            limits: Limits::default(),
            protected: Vec::new(),
            private: Vec::new(),
            await_binding: None,
            alarm: Arc::default(),
        }
    }

    /// The default state directory for a session: per session, so two
    /// sessions sharing a filesystem never share a shell.
    pub fn default_state_dir(session: &str) -> PathBuf {
        PathBuf::from("/tmp/agent-sidecar").join(session)
    }

    /// The default spill directory.
    pub fn default_spill_dir() -> PathBuf {
        PathBuf::from("/tmp/agent-output")
    }
}

/// Executes built-in tool calls inside the sandbox container it runs in.
#[derive(Debug, Clone)]
pub struct Runner {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    ctx: Ctx,
    spill: Spill,
    /// Swapped whole when the mounted toolset file changes, so a policy
    /// change reaches a running sandbox without replacing its pod.
    toolset: std::sync::RwLock<Arc<ResolvedToolset>>,
    /// When the last call started or ended, for the idle timeout.
    last_activity: std::sync::Mutex<Instant>,
    /// One permit per call being run.
    slots: Arc<tokio::sync::Semaphore>,
    /// Streamed calls by id.
    calls: crate::calls::Calls,
    max_concurrent_calls: usize,
    /// A warm sandbox's wait for its session; `None` for a runner started
    /// bound (the usual case).
    gate: Option<Gate>,
    alarm: Arc<Alarm>,
    /// Held shared by every call that may change the workspace or bash's
    /// state (bash, write, edit) and exclusively by an export or the move
    /// of an import into place: an export sees no call half done. Fair
    /// (tokio's lock queues in order), so calls that arrive while an
    /// export waits wait behind it.
    workspace: Arc<tokio::sync::RwLock<()>>,
    transfers: crate::transfer::Transfers,
    /// One export or import at a time.
    transfer_slot: Arc<tokio::sync::Semaphore>,
}

impl Runner {
    /// Prepares the state directories, finds the programs the tools run and
    /// starts the process supervisor. Must be called inside a tokio runtime.
    pub fn new(config: RunnerConfig) -> Result<Runner, Error> {
        let workdir = std::path::absolute(&config.workdir)
            .map_err(|e| Error::io(format!("workdir {}", config.workdir.display()), e))?;
        match std::fs::metadata(&workdir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(Error::Usage(format!(
                    "workdir {} is not a directory",
                    workdir.display()
                )));
            }
            Err(e) => return Err(Error::io(format!("workdir {}", workdir.display()), e)),
        }
        let state_dir = std::path::absolute(&config.state_dir)
            .map_err(|e| Error::io(format!("state dir {}", config.state_dir.display()), e))?;
        let spill_dir = std::path::absolute(&config.spill_dir)
            .map_err(|e| Error::io(format!("spill dir {}", config.spill_dir.display()), e))?;
        if config.limits.max_concurrent_calls == 0 {
            return Err(Error::Usage(
                "--max-concurrent-calls must be at least 1".into(),
            ));
        }
        std::fs::create_dir_all(&state_dir)
            .map_err(|e| Error::io(format!("cannot create {}", state_dir.display()), e))?;
        // Resolved once, before any tool runs and before the supervisor
        // reaps children (the probe waits for its own).
        let grep = tools::programs::probe();
        let protected = protected_paths(&state_dir, &config.protected, &grep);
        let supervisor = Supervisor::start()
            .map_err(|e| Error::io("cannot watch for child processes (SIGCHLD)", e))?;
        let ctx = Ctx::new(
            workdir,
            &state_dir,
            supervisor,
            grep,
            protected,
            config.limits.call,
        )?;
        let limits = config.limits;
        let gate = config.await_binding.map(Gate::new);
        let private = config.private.iter().fold(
            Protected::default().tree(&spill_dir, "the runner's spill directory"),
            |p, dir| p.tree(dir, "one of the runner's own directories"),
        );
        let transfers = crate::transfer::Transfers {
            max_bytes: limits.max_transfer_bytes,
            private,
            spool_dir: state_dir.join("transfer"),
        };
        Ok(Runner {
            inner: Arc::new(Inner {
                ctx,
                spill: Spill {
                    dir: spill_dir,
                    max_files: limits.spill_max_files,
                    max_bytes: limits.spill_max_bytes,
                },
                toolset: std::sync::RwLock::new(Arc::new(config.toolset)),
                last_activity: std::sync::Mutex::new(Instant::now()),
                slots: Arc::new(tokio::sync::Semaphore::new(limits.max_concurrent_calls)),
                calls: crate::calls::Calls::default(),
                max_concurrent_calls: limits.max_concurrent_calls,
                gate,
                alarm: config.alarm,
                workspace: Arc::new(tokio::sync::RwLock::new(())),
                transfers,
                transfer_slot: Arc::new(tokio::sync::Semaphore::new(1)),
            }),
        })
    }

    /// What the sandbox watch raises when it ends the sandbox.
    pub fn alarm(&self) -> Arc<Alarm> {
        Arc::clone(&self.inner.alarm)
    }

    /// The session's resolved toolset, as of now.
    pub fn toolset(&self) -> Arc<ResolvedToolset> {
        match self.inner.toolset.read() {
            Ok(t) => Arc::clone(&t),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Replaces the resolved toolset; calls that start afterwards see the
    /// new one.
    pub fn set_toolset(&self, toolset: ResolvedToolset) {
        let mut slot = match self.inner.toolset.write() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        *slot = Arc::new(toolset);
    }

    /// Binds a warm sandbox to its session if the files are there, and
    /// says whether the runner may run calls: `Err(Error::Unbound)` while it
    /// waits. Every call that runs a tool asks first, so the first call after
    /// the kubelet writes the files is served rather than refused; the poll
    /// in `serve` binds a sandbox nobody calls. Cheap once bound (one atomic
    /// load); concurrent callers bind once.
    pub fn ensure_bound(&self) -> Result<(), Error> {
        let Some(gate) = &self.inner.gate else {
            return Ok(());
        };
        gate.try_bind(|found| self.bind(found))
            .map(|_| ())
            .ok_or(Error::Unbound)
    }

    /// Whether the runner serves calls: started bound, or bound since.
    pub fn is_bound(&self) -> bool {
        self.inner.gate.as_ref().is_none_or(|g| g.bound().is_some())
    }

    /// The binding a warm sandbox was bound with, once it is.
    pub fn binding(&self) -> Option<&Bound> {
        self.inner.gate.as_ref().and_then(Gate::bound)
    }

    /// Where a warm sandbox's binding and toolset files are.
    pub fn awaited(&self) -> Option<&AwaitBinding> {
        self.inner.gate.as_ref().map(|g| &g.paths)
    }

    /// Applies a binding: the session's toolset and environment, and the
    /// idle clock started now (it does not run while a warm pod waits).
    fn bind(&self, found: &Found) {
        self.set_toolset(found.toolset.clone());
        let env = found
            .binding
            .env
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_str()));
        let dropped = self.inner.ctx.bind_env(env);
        if !dropped.is_empty() {
            tracing::warn!(
                names = ?dropped,
                "the binding's environment names variables a shell never inherits (scrubbed); left out"
            );
        }
        self.touch();
        tracing::info!(
            session = %toolset::truncate_runes(&found.binding.session, 253),
            tools = found.toolset.tools.len(),
            env = found.binding.env.len() - dropped.len(),
            "bound to a session; serving its calls"
        );
    }

    /// How long since a call last started or ended; zero while a warm
    /// sandbox waits for its session, so the idle timeout never ends a pod
    /// the pool is keeping warm.
    pub fn idle_for(&self) -> std::time::Duration {
        if !self.is_bound() {
            return std::time::Duration::ZERO;
        }
        match self.inner.last_activity.lock() {
            Ok(t) => t.elapsed(),
            Err(poisoned) => poisoned.into_inner().elapsed(),
        }
    }

    fn touch(&self) {
        let mut t = match self.inner.last_activity.lock() {
            Ok(t) => t,
            Err(poisoned) => poisoned.into_inner(),
        };
        *t = Instant::now();
    }

    /// The absolute workdir.
    pub fn workdir(&self) -> &std::path::Path {
        &self.inner.ctx.workdir
    }

    /// Runs one call of a built-in tool. `id` names the call (the tool-use
    /// id) and its files; `confirmed` says a human approved it, which an
    /// `always_ask` tool requires.
    pub async fn run(
        &self,
        id: &str,
        name: &str,
        input: &[u8],
        confirmed: bool,
    ) -> Result<ToolResult, Error> {
        let started = Instant::now();
        if let Err(e) = self.ensure_bound() {
            let res = Err(e);
            crate::telemetry::record_run(name, started.elapsed(), &res);
            return res;
        }
        // Refused rather than queued: a queue would hold the request (and the
        // executor's lease) with no bound, where a refusal says what to do.
        let Ok(_slot) = Arc::clone(&self.inner.slots).try_acquire_owned() else {
            let res = Err(Error::Busy {
                limit: self.inner.max_concurrent_calls,
            });
            crate::telemetry::record_run(name, started.elapsed(), &res);
            return res;
        };
        self.touch();
        let res = self.run_inner(id, name, input, confirmed, None).await;
        self.touch();
        crate::telemetry::record_run(name, started.elapsed(), &res);
        res
    }

    /// Starts a call that runs to its end whatever happens to the caller's
    /// connection, and returns its record to follow, re-attach to (by id,
    /// [`Runner::call`]) or cancel. Its result is the one [`Runner::run`]
    /// gives for the same call. Refusals before the call starts (busy, an
    /// id still running) are errors here.
    pub fn start(
        &self,
        id: &str,
        name: &str,
        input: Vec<u8>,
        confirmed: bool,
    ) -> Result<Arc<Record>, Error> {
        let started = Instant::now();
        let slot = self.ensure_bound().and_then(|()| {
            Arc::clone(&self.inner.slots)
                .try_acquire_owned()
                .map_err(|_| Error::Busy {
                    limit: self.inner.max_concurrent_calls,
                })
        });
        let slot = match slot {
            Ok(s) => s,
            Err(e) => {
                let res = Err(e);
                crate::telemetry::record_run(name, started.elapsed(), &res);
                return Err(res.err().unwrap_or(Error::SupervisorGone));
            }
        };
        let record = self.inner.calls.begin(id)?;
        let (this, rec, id, name) = (
            self.clone(),
            Arc::clone(&record),
            id.to_owned(),
            name.to_owned(),
        );
        tokio::spawn(async move {
            let _slot = slot;
            this.touch();
            let res = this
                .run_inner(&id, &name, &input, confirmed, Some(&rec))
                .await;
            this.touch();
            crate::telemetry::record_run(&name, started.elapsed(), &res);
            if let Err(e) = &res {
                tracing::warn!(id = %id, tool = %name, error = %e, "streamed call not run");
            }
            rec.finish(res.map_err(|e| e.to_status()));
        });
        Ok(record)
    }

    /// A streamed call, running or finished within the retention bound.
    pub fn call(&self, id: &str) -> Result<Arc<Record>, Error> {
        self.inner
            .calls
            .get(id)
            .ok_or_else(|| Error::UnknownCall { id: id.to_owned() })
    }

    async fn run_inner(
        &self,
        id: &str,
        name: &str,
        input: &[u8],
        confirmed: bool,
        live: Option<&Record>,
    ) -> Result<ToolResult, Error> {
        toolset::spill_file_name(id).map_err(|e| Error::InvalidCallId {
            id: id.to_owned(),
            reason: e.to_string(),
        })?;
        if let Some(refusal) = gate(&self.toolset(), name, confirmed)? {
            return Ok(refusal);
        }
        // Held to the end of the call, so an export waits for it.
        let _workspace = match name {
            "bash" | "write" | "edit" => Some(self.inner.workspace.read().await),
            _ => None,
        };
        let spill = self.inner.spill.clone();
        let ctx_id = id.to_owned();
        let alarm = self.alarm();
        let generation = alarm.generation();
        let (content, is_error) = match name {
            "bash" | "grep" => {
                let mut out = if name == "bash" {
                    tools::bash::run(&self.inner.ctx, id, input, live).await?
                } else {
                    tools::grep::run(&self.inner.ctx, id, input).await?
                };
                // A call that ended killed may have been the kernel's OOM
                // kill: known now, said in this very result.
                alarm.check_oom_now();
                if let Some(notice) = alarm.since(generation) {
                    out.trailer.push_str(&format!("\n[{notice}]"));
                    out.is_error = true;
                }
                // Reading the head of a large output and renaming it is file I/O.
                blocking(move || finish(out, &ctx_id, &spill)).await?
            }
            _ => {
                // The file tools and their budget in one hop off the async
                // workers: each hop costs a thread wake-up, which is most of
                // a small call's latency.
                let this = self.clone();
                let name = name.to_owned();
                let input = input.to_vec();
                blocking(move || {
                    let ctx = &this.inner.ctx;
                    let out = match name.as_str() {
                        "read" => tools::read::run(ctx, &input),
                        "write" => tools::write::run(ctx, &input),
                        "edit" => tools::edit::run(ctx, &input),
                        "glob" => tools::glob::run(ctx, &input),
                        // gate() let through only the six.
                        other => Output::error(unknown_tool(other)),
                    };
                    finish(out, &ctx_id, &spill)
                })
                .await?
            }
        };
        Ok(ToolResult { content, is_error })
    }
}

impl Runner {
    /// The transfer slot, for a bound runner.
    fn transfer_slot(&self) -> Result<tokio::sync::OwnedSemaphorePermit, Error> {
        self.ensure_bound()?;
        Arc::clone(&self.inner.transfer_slot)
            .try_acquire_owned()
            .map_err(|_| Error::TransferBusy)
    }

    /// Archives a directory of the workspace (and bash's state, when asked)
    /// once the calls that may change it have finished, holding new ones
    /// off until the archive is written; see [`crate::transfer`].
    pub async fn export(
        &self,
        req: runner_api::proto::ExportRequest,
    ) -> Result<crate::transfer::Exported, Error> {
        let _slot = self.transfer_slot()?;
        self.touch();
        let _still = self.inner.workspace.write().await;
        let this = self.clone();
        let res =
            tokio::task::spawn_blocking(move || this.inner.transfers.export(&this.inner.ctx, &req))
                .await
                .map_err(|e| Error::io("an export task failed", std::io::Error::other(e)))?;
        self.touch();
        res
    }

    /// Holds the workspace still for a copy of its volume taken from
    /// outside (see [`Held`]): waits for the calls that may change it,
    /// holds new ones, pauses background jobs and flushes the filesystem.
    /// Calls run again when the returned hold is dropped.
    pub async fn hold(&self, shell_state: bool) -> Result<Held, Error> {
        let slot = self.transfer_slot()?;
        self.touch();
        let still = Arc::clone(&self.inner.workspace).write_owned().await;
        let this = self.clone();
        let (state, paused) = tokio::task::spawn_blocking(move || {
            this.inner.transfers.hold(&this.inner.ctx, shell_state)
        })
        .await
        .map_err(|e| Error::io("a hold task failed", std::io::Error::other(e)))??;
        Ok(Held {
            shell_state: state,
            since: Instant::now(),
            _paused: paused,
            _still: still,
            _slot: slot,
        })
    }

    /// Drops bash's saved state: the next call starts a fresh shell.
    pub fn forget_shell_state(&self) -> Result<(), Error> {
        self.inner
            .ctx
            .snapshot
            .clear()
            .map_err(|e| Error::io("cannot remove bash's saved state", e))
    }

    /// Unpacks an archive read from `input` into a staging directory, then,
    /// holding the workspace still, moves it into place and installs its
    /// bash state; see [`crate::transfer`].
    pub async fn import(
        &self,
        header: runner_api::proto::ImportHeader,
        input: impl std::io::Read + Send + 'static,
    ) -> Result<runner_api::proto::ImportResponse, Error> {
        let _slot = self.transfer_slot()?;
        self.touch();
        let this = self.clone();
        let staged = tokio::task::spawn_blocking(move || {
            this.inner.transfers.stage(&this.inner.ctx, &header, input)
        })
        .await
        .map_err(|e| Error::io("an import task failed", std::io::Error::other(e)))??;
        let _still = self.inner.workspace.write().await;
        let this = self.clone();
        let res = tokio::task::spawn_blocking(move || {
            this.inner.transfers.commit(&this.inner.ctx, staged)
        })
        .await
        .map_err(|e| Error::io("an import task failed", std::io::Error::other(e)))?;
        self.touch();
        res
    }
}

/// The workspace held still: no bash, write or edit call runs and the
/// session's background jobs are stopped until this is dropped (fields
/// drop in order: jobs continue, then calls, then the transfer slot).
#[derive(Debug)]
pub struct Held {
    /// bash's state as the next call would start from it, when asked.
    pub shell_state: Option<runner_api::proto::ShellState>,
    /// When calls were first held.
    pub since: Instant,
    _paused: crate::transfer::Paused,
    _still: tokio::sync::OwnedRwLockWriteGuard<()>,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

/// Runs blocking file work for the current call. On the multi-thread
/// runtime (`serve`) the call's own task runs it in place and the worker's
/// other tasks move to another thread: the call does not wait for a pool
/// thread to wake and then for its worker to be woken again, two thread
/// switches that were most of a small read's latency on a 2-core node. A
/// current-thread runtime (in-process tests) cannot do that, so there the
/// work goes to the blocking pool as before. A panic in the work is the
/// call's fault, not the runner's end.
async fn blocking<T, F>(f: F) -> Result<T, Error>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi {
        return tokio::task::block_in_place(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(f))
                .map_err(|_| Error::io("a tool task failed", std::io::Error::other("panicked")))
        });
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::io("a tool task failed", std::io::Error::other(e)))
}

fn unknown_tool(name: &str) -> String {
    format!(
        "unknown tool {:?}: this runner executes {}",
        toolset::truncate_runes(name, 128),
        toolset::BUILTIN_TOOLS.join(", ")
    )
}

/// The policy gate, in order: a name that is no tool at all is a tool error
/// the model can read (it made the name up); a web tool, a tool the session
/// disables, and an unconfirmed `always_ask` tool are refusals ([`Error`]),
/// because they say something about the executor's routing or the human's
/// consent, not about the tool.
pub fn gate(
    toolset: &ResolvedToolset,
    name: &str,
    confirmed: bool,
) -> Result<Option<ToolResult>, Error> {
    if toolset::is_web_tool(name) {
        return Err(Error::NotSandboxTool {
            tool: name.to_owned(),
        });
    }
    if !toolset::BUILTIN_TOOLS.contains(&name) {
        return Ok(Some(ToolResult {
            content: unknown_tool(name),
            is_error: true,
        }));
    }
    match toolset.policy(name) {
        None => Err(Error::DisabledTool {
            tool: name.to_owned(),
        }),
        Some(PermissionPolicy::AlwaysAsk) if !confirmed => Err(Error::ConfirmationRequired {
            tool: name.to_owned(),
        }),
        Some(_) => Ok(None),
    }
}

/// The runner's own files: its state, the paths the caller names (socket,
/// toolset file), its binary, and the programs it executes.
fn protected_paths(
    state_dir: &std::path::Path,
    extra: &[PathBuf],
    grep: &tools::programs::GrepBinary,
) -> Protected {
    let mut p = Protected::default().tree(state_dir, "the runner's state directory");
    for path in extra {
        // Followed at each check: the toolset and binding files come from a
        // mounted ConfigMap, whose links the kubelet swaps.
        p = p.swapped_file(path, "one of the runner's own files");
    }
    if let Ok(exe) = std::env::current_exe() {
        p = p.file(&exe, "the runner's binary");
    }
    p = p.file(
        std::path::Path::new(tools::programs::BASH),
        "the shell the runner executes",
    );
    if let tools::programs::GrepBinary::Found { path, .. } = grep {
        p = p.file(path, "the grep the runner executes");
    }
    p
}
