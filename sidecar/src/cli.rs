//! The `agent-sidecar` command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use runner_api::Target;

use crate::error::Error;

#[derive(Debug, Parser)]
#[command(
    name = "agent-sidecar",
    version,
    about = "The sandbox runner: serves the built-in tools (bash, read, write, edit, glob, grep) over gRPC",
    after_help = "Exit codes of call, health and tools: 0 ok; 1 the tool reported an error (call: is_error) or the runner is not serving (health); 2 refused or malformed (usage, a policy refusal, a busy runner); 3 could not call (the runner is unreachable, the connection broke, or the runner failed). serve and install: 0 done, 1 failed, 2 a flag value they cannot use."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the tools until SIGTERM (which drains in-flight calls).
    Serve(Box<ServeArgs>),
    /// Make one tool call and print {"content": ..., "is_error": ...} as one
    /// JSON line; exit 1 when is_error.
    Call(CallArgs),
    /// Check the runner's health: SERVING exits 0, NOT_SERVING 1.
    Health(TargetArgs),
    /// Print the tool definitions the session enables, as JSON.
    Tools(TargetArgs),
    /// Copy this binary to DEST (mode 0755): how the sandbox pod's init
    /// container, whose image holds nothing else, installs the runner into
    /// the session's image.
    Install {
        /// Destination path, e.g. /opt/agentplane/bin/agent-sidecar.
        dest: PathBuf,
    },
    /// Store one checkpoint: take one Import stream (relayed by the
    /// operator from a session's Export) and keep the archive and bash's
    /// state, as they came, in --dir; exit 0 once stored, 1 when nothing
    /// arrived by --deadline-seconds.
    CheckpointSink(SinkArgs),
    /// Find out whether this pod has a process limit (the kubelet's
    /// podPidsLimit): start threads until the kernel refuses one, then end
    /// them. Exits 0 naming the limit met, 1 when none was met below --max.
    PidsProbe {
        /// Most threads started.
        #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=65536))]
        max: u32,
    },
}

#[derive(Debug, Args)]
pub struct SinkArgs {
    /// The checkpoint's volume: archive.tar, shell-state.pb and
    /// checkpoint.json are written here.
    #[arg(long)]
    pub dir: PathBuf,
    /// Serve on this Unix socket.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Serve on this address with mutual TLS (the runner's certificates in
    /// --tls-dir; only a client certificate for client authentication from
    /// its CA is accepted).
    #[arg(long, value_parser = parse_addr, requires = "tls_dir")]
    pub listen_tls: Option<SocketAddr>,
    /// tls.crt, tls.key and ca.crt, as for serve.
    #[arg(long, requires = "listen_tls")]
    pub tls_dir: Option<PathBuf>,
    /// Most bytes of archive stored (the volume's size, less a margin).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_archive_bytes: u64,
    /// Exit 1 when no archive was stored after this many seconds.
    #[arg(long, default_value_t = 900, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub deadline_seconds: u64,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Unix socket to serve on (created 0600, removed on shutdown).
    #[arg(long, env = "AGENT_SIDECAR_SOCKET")]
    pub socket: PathBuf,
    /// Also listen on this loopback address (IP:PORT), for port-forwarding.
    #[arg(long, value_parser = parse_loopback)]
    pub listen: Option<SocketAddr>,
    /// Also serve the gateway on this address (any interface), with mutual
    /// TLS: only a client certificate signed by --tls-dir's ca.crt for
    /// client authentication is accepted.
    #[arg(long, value_parser = parse_addr, requires = "tls_dir")]
    pub listen_tls: Option<SocketAddr>,
    /// The runner's certificate and key (tls.crt, tls.key) and the CA its
    /// clients must be signed by (ca.crt), for --listen-tls.
    #[arg(long, requires = "listen_tls")]
    pub tls_dir: Option<PathBuf>,
    /// Where relative tool paths resolve and bash starts.
    #[arg(long, env = "AGENT_SIDECAR_WORKDIR")]
    pub workdir: PathBuf,
    /// The session's resolved toolset (JSON: {"tools": [...], "policies": {...}}).
    /// Without it every built-in tool is enabled as always_allow.
    #[arg(long)]
    pub toolset: Option<PathBuf>,
    /// The session id; scopes the default state directory.
    #[arg(long, default_value = "default", value_parser = parse_session)]
    pub session: String,
    /// bash's snapshot and per-call files [default: /tmp/agent-sidecar/<session>].
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
    /// Where oversized outputs are spilled, one <call id>.txt each.
    #[arg(long, default_value = "/tmp/agent-output")]
    pub spill_dir: PathBuf,
    /// Exit (status 0) after this many seconds without a tool call; the
    /// session then ends. Off when absent.
    #[arg(long)]
    pub idle_timeout_seconds: Option<u64>,
    /// Start unbound, as a warm pool's sandbox: refuse every call
    /// (UNAVAILABLE, "unbound") until this binding file and the --toolset
    /// file both appear and parse, then serve the session they name. Until
    /// then a missing --toolset file is expected, not an error.
    #[arg(long, value_name = "PATH", requires = "toolset")]
    pub await_binding: Option<PathBuf>,
    /// How often the --toolset file is checked for changes (a mounted
    /// ConfigMap is updated in place by the kubelet).
    #[arg(long, default_value_t = 5)]
    pub toolset_poll_seconds: u64,
    /// Most calls run at once; one more is refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = crate::runner::DEFAULT_MAX_CONCURRENT_CALLS)]
    pub max_concurrent_calls: usize,
    /// Most bytes of output one bash or grep call may write (the model sees
    /// 100 KiB of it, the rest is spilled); past it the call is ended.
    #[arg(long, default_value_t = crate::tools::DEFAULT_MAX_CALL_OUTPUT_BYTES)]
    pub max_call_output_bytes: u64,
    /// Start every bash call's shell when the call arrives, instead of
    /// keeping one started ahead of the next call (slower; for comparison).
    #[arg(long)]
    pub no_parked_shell: bool,
    /// Most spill files kept in --spill-dir; the oldest are removed first.
    #[arg(long, default_value_t = crate::output::DEFAULT_SPILL_MAX_FILES)]
    pub spill_max_files: usize,
    /// Most bytes the spill files may hold together; the oldest are removed
    /// first, the newest is always kept.
    #[arg(long, default_value_t = crate::output::DEFAULT_SPILL_MAX_BYTES)]
    pub spill_max_bytes: u64,
    /// Most bytes of file content one export or import may move; a request
    /// may ask for less, not more.
    #[arg(long, default_value_t = crate::transfer::DEFAULT_MAX_TRANSFER_BYTES)]
    pub max_transfer_bytes: u64,
    /// End every process in the sandbox, and exit (status 75), when it runs
    /// this many processes and threads besides the runner's own; set below
    /// the pod's PID limit, so the sandbox restarts clean instead of
    /// sitting at it.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(8..))]
    pub max_processes: Option<u32>,
    /// End every process in the sandbox, and exit (status 76), when the
    /// kernel kills one of them for memory (the memory cgroup's OOM-kill
    /// count rises), as nodes that kill a container whole do.
    #[arg(long)]
    pub end_on_oom: bool,
    /// The OOM-kill counter to watch with --end-on-oom [default: the
    /// runner's memory cgroup: memory.events (v2) or memory.oom_control (v1)].
    #[arg(long, value_name = "PATH", requires = "end_on_oom")]
    pub oom_events_file: Option<PathBuf>,
    /// Where to write why the runner ended the sandbox (a pod's
    /// terminationMessagePath, which the operator reads).
    #[arg(long, value_name = "PATH")]
    pub termination_log: Option<PathBuf>,
    /// A checkpoint (as `checkpoint-sink` stored it) to import into the
    /// workdir, files and bash's state, before serving: once, a marker in
    /// --state-dir keeps a restarted runner from importing it again.
    #[arg(long, value_name = "DIR", conflicts_with = "await_binding")]
    pub restore_from: Option<PathBuf>,
}

impl ServeArgs {
    /// The runner's bounds as the flags set them.
    pub fn limits(&self) -> crate::runner::Limits {
        crate::runner::Limits {
            max_concurrent_calls: self.max_concurrent_calls,
            call: crate::tools::CallLimits {
                max_output_bytes: self.max_call_output_bytes,
                park_shells: !self.no_parked_shell,
            },
            spill_max_files: self.spill_max_files,
            spill_max_bytes: self.spill_max_bytes,
            max_transfer_bytes: self.max_transfer_bytes,
        }
    }

    /// What the sandbox watch looks for, as the flags set it.
    pub fn watch(&self) -> crate::watch::WatchConfig {
        crate::watch::WatchConfig {
            max_processes: self.max_processes.map(|n| n as usize),
            oom_events: self
                .end_on_oom
                .then(|| {
                    self.oom_events_file
                        .clone()
                        .or_else(crate::watch::default_oom_events)
                })
                .flatten(),
        }
    }
}

#[derive(Debug, Args)]
pub struct TargetArgs {
    /// The runner's Unix socket.
    #[arg(long, conflicts_with = "addr", required_unless_present = "addr")]
    pub socket: Option<PathBuf>,
    /// The runner's TCP address (IP:PORT, numeric), e.g. a port-forward.
    #[arg(long, value_parser = parse_addr)]
    pub addr: Option<SocketAddr>,
}

impl TargetArgs {
    pub fn target(&self) -> Target {
        match (&self.socket, self.addr) {
            (Some(p), _) => Target::Unix(p.clone()),
            (None, Some(a)) => Target::Tcp(a),
            // clap's required_unless_present makes this unreachable; a
            // default keeps it from being a panic anyway.
            (None, None) => Target::Unix(PathBuf::from(runner_api::RUNNER_SOCKET)),
        }
    }
}

#[derive(Debug, Args)]
pub struct CallArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// The call id (tool-use id); names the call's files. Generated when absent.
    #[arg(long)]
    pub id: Option<String>,
    /// Say a human confirmed the call (required for always_ask tools).
    #[arg(long)]
    pub confirmed: bool,
    /// The tool: bash, read, write, edit, glob or grep.
    pub tool: String,
    /// The tool input as a JSON object.
    pub input: String,
}

/// Numeric IP:PORT, never a host name (see the client module).
pub fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse::<SocketAddr>()
        .map_err(|_| format!("{s:?} is not a numeric IP:PORT address (e.g. 127.0.0.1:7070); host names are not resolved"))
}

/// The TCP listener must be loopback: the runner authenticates nobody, and
/// the pod design reaches it through the API server's port-forward.
pub fn parse_loopback(s: &str) -> Result<SocketAddr, String> {
    let addr = parse_addr(s)?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{addr} is not a loopback address; the runner has no authentication, so it only listens on 127.0.0.1 or [::1] (reach it through a port-forward)"
        ));
    }
    Ok(addr)
}

fn parse_session(s: &str) -> Result<String, String> {
    toolset::spill_file_name(s)
        .map(|_| s.to_owned())
        .map_err(|e| format!("session id {s:?} cannot name a directory: {e}"))
}

/// Writes one line to stdout and flushes it: a caller reading the output
/// of a probe or a pipeline sees the line even if the process is killed
/// right after.
pub fn print_line(s: &str) -> Result<(), Error> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{s}")
        .and_then(|()| out.flush())
        .map_err(|e| Error::io("cannot write to stdout", e))
}

#[cfg(test)]
mod tests {
    //! The operator renders the runner's command lines with `runner-api`;
    //! these parse them with this binary's parser, so renaming a flag here
    //! or there fails a test instead of every sandbox pod.

    use std::net::SocketAddr;

    use clap::Parser;
    use runner_api::{Health, Install, Invocation, Serve};

    use super::*;

    #[test]
    fn serve_as_the_operator_renders_it_parses_field_for_field() {
        // Destructured, so a field added to `Serve` fails to compile here
        // until this test checks it too.
        let rendered = Serve {
            socket: runner_api::RUNNER_SOCKET.into(),
            listen: Some(runner_api::RUNNER_LISTEN),
            workdir: "/workspace".into(),
            toolset: Some("/etc/agentplane/toolset.json".into()),
            session: Some("demo".into()),
            state_dir: Some(runner_api::STATE_DIR.into()),
            spill_dir: Some(runner_api::SPILL_DIR.into()),
            idle_timeout_seconds: Some(600),
            await_binding: Some("/etc/agentplane/binding.json".into()),
            max_processes: Some(512),
            end_on_oom: true,
            termination_log: Some(runner_api::ended::TERMINATION_LOG.into()),
            gateway: Some((
                SocketAddr::from(([0, 0, 0, 0], runner_api::RUNNER_TLS_PORT)),
                runner_api::RUNNER_TLS_DIR.into(),
            )),
            restore_from: None,
        };
        let Serve {
            socket,
            listen,
            workdir,
            toolset,
            session,
            state_dir,
            spill_dir,
            idle_timeout_seconds,
            await_binding,
            max_processes,
            end_on_oom,
            termination_log,
            gateway,
            restore_from,
        } = rendered.clone();
        let cli = Cli::try_parse_from(rendered.command(runner_api::SANDBOX_BIN))
            .unwrap_or_else(|e| panic!("the runner rejects the operator's serve: {e}"));
        let Command::Serve(args) = cli.command else {
            panic!("not parsed as serve: {:?}", cli.command);
        };
        assert_eq!(args.socket, PathBuf::from(socket));
        assert_eq!(args.listen, listen);
        assert_eq!(args.workdir, PathBuf::from(workdir));
        assert_eq!(args.toolset, toolset.map(PathBuf::from));
        assert_eq!(Some(args.session), session);
        assert_eq!(args.state_dir, state_dir.map(PathBuf::from));
        assert_eq!(Some(args.spill_dir), spill_dir.map(PathBuf::from));
        assert_eq!(args.idle_timeout_seconds, idle_timeout_seconds);
        assert_eq!(args.await_binding, await_binding.map(PathBuf::from));
        assert_eq!(args.max_processes, max_processes);
        assert_eq!(args.end_on_oom, end_on_oom);
        assert_eq!(args.termination_log, termination_log.map(PathBuf::from));
        assert_eq!(
            args.listen_tls.zip(args.tls_dir),
            gateway.map(|(a, d)| (a, PathBuf::from(d)))
        );
        assert_eq!(args.restore_from, restore_from.map(PathBuf::from));
        // A fork's runner is a cold one: --restore-from with the rest.
        let fork = Serve {
            await_binding: None,
            restore_from: Some(runner_api::CHECKPOINT_DIR.into()),
            ..rendered
        };
        let Command::Serve(args) = Cli::try_parse_from(fork.command(runner_api::SANDBOX_BIN))
            .unwrap_or_else(|e| panic!("the runner rejects the operator's fork: {e}"))
            .command
        else {
            panic!("not parsed as serve");
        };
        assert_eq!(
            args.restore_from,
            Some(PathBuf::from(runner_api::CHECKPOINT_DIR))
        );
    }

    #[test]
    fn checkpoint_sink_as_the_operator_renders_it_parses() {
        let rendered = runner_api::CheckpointSink {
            dir: runner_api::CHECKPOINT_DIR.into(),
            listen_tls: SocketAddr::from(([0, 0, 0, 0], runner_api::RUNNER_TLS_PORT)),
            tls_dir: runner_api::RUNNER_TLS_DIR.into(),
            max_archive_bytes: 1 << 30,
            deadline_seconds: 600,
        };
        let Command::CheckpointSink(args) =
            Cli::try_parse_from(rendered.command(runner_api::IMAGE_BIN))
                .unwrap_or_else(|e| panic!("the runner rejects the operator's sink: {e}"))
                .command
        else {
            panic!("not parsed as checkpoint-sink");
        };
        assert_eq!(args.dir, PathBuf::from(rendered.dir));
        assert_eq!(args.listen_tls, Some(rendered.listen_tls));
        assert_eq!(args.tls_dir, Some(PathBuf::from(rendered.tls_dir)));
        assert_eq!(args.max_archive_bytes, rendered.max_archive_bytes);
        assert_eq!(args.deadline_seconds, rendered.deadline_seconds);
        assert_eq!(args.socket, None);
    }

    #[test]
    fn serve_with_only_the_required_flags_takes_the_runners_defaults() {
        let cli = Cli::try_parse_from(Serve::new("/s.sock", "/w").command("agent-sidecar"))
            .expect("parses");
        let Command::Serve(args) = cli.command else {
            panic!("not parsed as serve");
        };
        assert_eq!(args.listen, None::<SocketAddr>);
        assert_eq!(args.listen_tls, None::<SocketAddr>);
        assert_eq!(args.toolset, None);
        assert_eq!(args.session, "default");
        assert_eq!(args.idle_timeout_seconds, None);
        assert_eq!(args.await_binding, None);
    }

    #[test]
    fn install_and_health_as_the_operator_renders_them_parse() {
        let install = Install {
            dest: runner_api::SANDBOX_BIN.into(),
        };
        match Cli::try_parse_from(install.command(runner_api::IMAGE_BIN)) {
            Ok(Cli {
                command: Command::Install { dest },
            }) => assert_eq!(dest, PathBuf::from(install.dest)),
            other => panic!("install: {other:?}"),
        }
        let health = Health {
            socket: runner_api::RUNNER_SOCKET.into(),
        };
        match Cli::try_parse_from(health.command(runner_api::SANDBOX_BIN)) {
            Ok(Cli {
                command: Command::Health(t),
            }) => assert_eq!(t.target(), Target::Unix(PathBuf::from(health.socket))),
            other => panic!("health: {other:?}"),
        }
    }
}
