//! How the runner is started and probed, as types that render their argv.
//!
//! The operator writes these command lines into every sandbox pod; if it
//! wrote the flags as strings, renaming a flag in the runner would still
//! compile and break every pod at start. Rendering them here, next to a
//! test in the runner that parses the result with the runner's own
//! command-line parser, turns that into a failing test.
//!
//! The paths are those of the sandbox pod the operator builds: the runner
//! image holds the static binary at [`IMAGE_BIN`]; an init container
//! installs it at [`SANDBOX_BIN`] in an emptyDir mounted at
//! [`SANDBOX_BIN_DIR`]; the session's image runs it from there, with its
//! socket, bash state and spill files in the emptyDir at [`RUN_DIR`] (which
//! survives a container restart, and with it the shell state).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

/// The emptyDir holding the runner's socket, state and spill files.
pub const RUN_DIR: &str = "/run/agent";
/// The runner's Unix socket in the sandbox container.
pub const RUNNER_SOCKET: &str = "/run/agent/runner.sock";
/// The loopback port the runner also listens on, reached by port-forward.
pub const RUNNER_PORT: u16 = 7070;
/// The loopback address the runner listens on in the sandbox pod: never
/// the pod network, because the runner authenticates nobody.
pub const RUNNER_LISTEN: SocketAddr =
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, RUNNER_PORT));
/// The port the runner serves the gateway on, on the pod network, with
/// mutual TLS: only a client certificate the platform's CA issued for
/// client authentication (the gateway's) is accepted.
pub const RUNNER_TLS_PORT: u16 = 7443;
/// Where the sandbox container finds its runner's certificate, key and the
/// CA that signed the gateway's (`tls.crt`, `tls.key`, `ca.crt`).
pub const RUNNER_TLS_DIR: &str = "/etc/agentplane-tls";
/// The DNS name every runner certificate carries and the gateway checks: a
/// runner is addressed by its pod's IP, which no certificate names.
pub const RUNNER_TLS_NAME: &str = "runner.agentplane.internal";
/// bash's snapshot and per-call files in the sandbox pod.
pub const STATE_DIR: &str = "/run/agent/state";
/// Where the runner spills oversized outputs in the sandbox pod.
pub const SPILL_DIR: &str = "/run/agent/output";
/// The emptyDir the runner binary is installed into.
pub const SANDBOX_BIN_DIR: &str = "/opt/agentplane/bin";
/// The runner binary inside the sandbox container.
pub const SANDBOX_BIN: &str = "/opt/agentplane/bin/agent-sidecar";
/// The runner binary inside the runner image (which holds nothing else).
pub const IMAGE_BIN: &str = "/agent-sidecar";

/// A runner subcommand with its flags.
pub trait Invocation {
    /// The arguments after the program name.
    fn args(&self) -> Vec<String>;

    /// The whole command line: `program` followed by [`Invocation::args`].
    fn command(&self, program: &str) -> Vec<String> {
        std::iter::once(program.to_owned())
            .chain(self.args())
            .collect()
    }
}

/// `agent-sidecar serve`: the flags the operator sets. An absent optional
/// field leaves the flag out, so the runner's default applies. Paths are
/// strings because they end up in a pod spec, which holds UTF-8 only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serve {
    /// `--socket`: the Unix socket to serve on.
    pub socket: String,
    /// `--listen`: the loopback address to serve on as well.
    pub listen: Option<SocketAddr>,
    /// `--workdir`: where relative paths resolve and bash starts.
    pub workdir: String,
    /// `--toolset`: the session's resolved toolset file.
    pub toolset: Option<String>,
    /// `--session`: the session id.
    pub session: Option<String>,
    /// `--state-dir`: bash's snapshot and per-call files.
    pub state_dir: Option<String>,
    /// `--spill-dir`: where oversized outputs go.
    pub spill_dir: Option<String>,
    /// `--idle-timeout-seconds`: exit 0 after this long without a call.
    pub idle_timeout_seconds: Option<u64>,
    /// `--await-binding`: the binding file of a warm pool's sandbox. The
    /// runner refuses every call ([`crate::Refusal::Unbound`]) until this
    /// file (a [`crate::Binding`]) and the `--toolset` file appear, then
    /// serves the session they name.
    pub await_binding: Option<String>,
    /// `--max-processes`: end the sandbox (exit
    /// [`crate::ended::PROCESS_LIMIT`]) when it runs this many tasks.
    pub max_processes: Option<u32>,
    /// `--end-on-oom`: end the sandbox (exit [`crate::ended::OUT_OF_MEMORY`])
    /// when the kernel kills a process in it for memory.
    pub end_on_oom: bool,
    /// `--termination-log`: where the runner says why it ended the sandbox.
    pub termination_log: Option<String>,
    /// `--listen-tls` and `--tls-dir`: serve the gateway on this address,
    /// with mutual TLS from the certificates in that directory.
    pub gateway: Option<(SocketAddr, String)>,
    /// `--restore-from`: a checkpoint's directory (a fork's read-only
    /// volume) imported into the workdir once, before serving.
    pub restore_from: Option<String>,
}

impl Serve {
    /// A runner on `socket` working in `workdir`, every other flag left to
    /// the runner's defaults.
    pub fn new(socket: impl Into<String>, workdir: impl Into<String>) -> Serve {
        Serve {
            socket: socket.into(),
            listen: None,
            workdir: workdir.into(),
            toolset: None,
            session: None,
            state_dir: None,
            spill_dir: None,
            idle_timeout_seconds: None,
            await_binding: None,
            max_processes: None,
            end_on_oom: false,
            termination_log: None,
            gateway: None,
            restore_from: None,
        }
    }
}

impl Invocation for Serve {
    fn args(&self) -> Vec<String> {
        let mut args = vec!["serve".to_owned()];
        let mut flag = |name: &str, value: Option<String>| {
            if let Some(v) = value {
                args.push(name.to_owned());
                args.push(v);
            }
        };
        flag("--socket", Some(self.socket.clone()));
        flag("--listen", self.listen.map(|a| a.to_string()));
        flag("--workdir", Some(self.workdir.clone()));
        flag("--toolset", self.toolset.clone());
        flag("--session", self.session.clone());
        flag("--state-dir", self.state_dir.clone());
        flag("--spill-dir", self.spill_dir.clone());
        flag(
            "--idle-timeout-seconds",
            self.idle_timeout_seconds.map(|s| s.to_string()),
        );
        flag("--await-binding", self.await_binding.clone());
        flag("--max-processes", self.max_processes.map(|n| n.to_string()));
        flag("--termination-log", self.termination_log.clone());
        flag("--restore-from", self.restore_from.clone());
        if let Some((addr, dir)) = &self.gateway {
            args.extend(["--listen-tls".to_owned(), addr.to_string()]);
            args.extend(["--tls-dir".to_owned(), dir.clone()]);
        }
        if self.end_on_oom {
            args.push("--end-on-oom".to_owned());
        }
        args
    }
}

/// Where a checkpoint's volume is mounted: read-write in its sink pod,
/// read-only in a fork's sandbox.
pub const CHECKPOINT_DIR: &str = "/run/agentplane-checkpoint";
/// A checkpoint's manifest in [`CHECKPOINT_DIR`], written last: the set is whole.
pub const CHECKPOINT_MANIFEST: &str = "checkpoint.json";
/// bash's state in [`CHECKPOINT_DIR`], a `ShellState` message.
pub const CHECKPOINT_STATE: &str = "shell-state.pb";

/// `agent-sidecar checkpoint-sink`: the operator's short-lived pod that
/// stores one checkpoint's archive on its volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSink {
    /// `--dir`: the volume's mount.
    pub dir: String,
    /// `--listen-tls`: where the operator reaches it.
    pub listen_tls: SocketAddr,
    /// `--tls-dir`: the runner certificate of the namespace.
    pub tls_dir: String,
    /// `--max-archive-bytes`.
    pub max_archive_bytes: u64,
    /// `--deadline-seconds`.
    pub deadline_seconds: u64,
}

impl Invocation for CheckpointSink {
    fn args(&self) -> Vec<String> {
        vec![
            "checkpoint-sink".to_owned(),
            "--dir".to_owned(),
            self.dir.clone(),
            "--listen-tls".to_owned(),
            self.listen_tls.to_string(),
            "--tls-dir".to_owned(),
            self.tls_dir.clone(),
            "--max-archive-bytes".to_owned(),
            self.max_archive_bytes.to_string(),
            "--deadline-seconds".to_owned(),
            self.deadline_seconds.to_string(),
        ]
    }
}

/// `agent-sidecar install DEST`: copies the running binary to `dest`, which
/// is how an image holding nothing but the runner hands it to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    pub dest: String,
}

impl Invocation for Install {
    fn args(&self) -> Vec<String> {
        vec!["install".to_owned(), self.dest.clone()]
    }
}

/// `agent-sidecar health --socket PATH`: exits 0 when the runner serves,
/// which makes it a readiness probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Health {
    pub socket: String,
}

impl Invocation for Health {
    fn args(&self) -> Vec<String> {
        vec![
            "health".to_owned(),
            "--socket".to_owned(),
            self.socket.clone(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_pods_paths_agree_with_each_other() {
        let under = |p: &str, dir: &str| Path::new(p).parent() == Some(Path::new(dir));
        assert!(under(RUNNER_SOCKET, RUN_DIR));
        assert!(under(STATE_DIR, RUN_DIR));
        assert!(under(SPILL_DIR, RUN_DIR));
        assert!(under(SANDBOX_BIN, SANDBOX_BIN_DIR));
        assert_eq!(
            Path::new(SANDBOX_BIN).file_name(),
            Path::new(IMAGE_BIN).file_name()
        );
        assert!(RUNNER_LISTEN.ip().is_loopback());
        assert_eq!(RUNNER_LISTEN.port(), RUNNER_PORT);
    }

    #[test]
    fn absent_fields_leave_their_flags_out() {
        assert_eq!(
            Serve::new("/s.sock", "/w").command("/bin/r"),
            ["/bin/r", "serve", "--socket", "/s.sock", "--workdir", "/w"]
        );
        assert_eq!(
            Install { dest: "/d".into() }.command(IMAGE_BIN),
            ["/agent-sidecar", "install", "/d"]
        );
        assert_eq!(
            Health {
                socket: RUNNER_SOCKET.into()
            }
            .args(),
            ["health", "--socket", "/run/agent/runner.sock"]
        );
    }
}
