//! The runner's contract, shared by the runner (`sidecar`, binary
//! `agent-sidecar`) and everything that starts or calls it (the operator,
//! `kubectl agent`).
//!
//! It exists so that a change on one side of the contract breaks the build
//! or a test on the other, instead of breaking pods at run time: the
//! operator renders the runner's command line from [`invocation`] rather
//! than writing flags as strings, a client reads a refusal as a
//! [`Refusal`] rather than matching its wire string, and both CLIs exit
//! with the codes in [`exit`]. It is deliberately small (no runner code, no
//! Kubernetes client) so callers do not inherit the runner's dependencies.
//!
//! - [`proto`]: the gRPC messages and services (`proto/runner.proto`).
//! - [`client`]: a client over a Unix socket, loopback TCP, or a channel
//!   the caller already opened (a port-forward).
//! - [`refusal`]: why the runner declined a call, as carried in gRPC
//!   metadata.
//! - [`invocation`]: `serve`, `install` and `health` as types that render
//!   their argv, and the paths and port the sandbox pod uses.
//! - [`binding`]: what a warm pool's sandbox is told when a session claims
//!   it (the session's name and environment).
//! - [`chunks`]: transfer chunks as a byte stream for the archive code.
//! - [`exit`]: the exit-code convention of `agent-sidecar` and
//!   `kubectl agent`.

pub mod binding;
pub mod call_id;
pub mod chunks;
pub mod client;
pub mod ended;
pub mod error;
pub mod exit;
pub mod invocation;
pub mod proto;
pub mod refusal;

pub use binding::{BINDING_FILE, Binding, BoundEnv};
pub use call_id::generate_call_id;
pub use client::{Archive, Client, Events, Target, ToolResult};
pub use error::Error;
pub use invocation::{
    CHECKPOINT_DIR, CHECKPOINT_MANIFEST, CHECKPOINT_STATE, CheckpointSink, Health, IMAGE_BIN,
    Install, Invocation, RUN_DIR, RUNNER_LISTEN, RUNNER_PORT, RUNNER_SOCKET, RUNNER_TLS_DIR,
    RUNNER_TLS_NAME, RUNNER_TLS_PORT, SANDBOX_BIN, SANDBOX_BIN_DIR, SPILL_DIR, STATE_DIR, Serve,
};
pub use refusal::{REFUSAL_METADATA_KEY, Refusal};
