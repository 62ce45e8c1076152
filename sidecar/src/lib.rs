//! The in-pod runner: executes the six built-in tools of
//! `agent_toolset_20260401` (bash, read, write, edit, glob, grep) against the
//! filesystem of the sandbox container it runs in, and serves them over gRPC.
//!
//! The container is the confinement (see the `toolset` crate and the seed):
//! the file tools resolve relative paths against the workdir and otherwise let
//! a path be a path, because bash, running next to them, could reach it anyway.
//!
//! Layout: [`runner`] is the one entry point for a call (policy gate, dispatch,
//! output budget, metric); [`tools`] holds one module per tool; [`service`]
//! is the gRPC surface; [`cli`], [`lifecycle`], [`install`] and [`remote`]
//! are the binary around it (its `main` only parses and dispatches);
//! [`toolset_file`] reads the session's toolset for the ones that need it.
//! The files import one way (no file imports one that imports it back;
//! the workspace's `tests/structure` keeps it so), and none imports this one: an item is
//! named at the module that defines it. The contract with callers -- the
//! proto, the client, refusals, the command line the operator renders, exit
//! codes -- lives in the `runner-api` crate.

pub mod authority;
pub mod binding;
pub mod calls;
pub mod checkpoint;
pub mod cli;
pub mod error;
pub mod fsutil;
pub mod guard;
pub mod install;
pub mod lifecycle;
pub mod mtls;
pub mod output;
pub mod pids_probe;
pub mod procs;
pub mod reaper;
pub mod remote;
pub mod runner;
pub mod service;
pub mod shellstate;
pub mod snapshot;
pub mod stream;
pub mod telemetry;
pub mod tools;
pub mod toolset_file;
pub mod transfer;
pub mod watch;

pub use error::Error;

/// Internals the fuzz targets (`fuzz/`) drive directly. Not part of the API:
/// nothing outside the fuzz crate calls these, and they may change freely.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::tools::check_input;

    /// The head of an over-budget output, cut so that head, newline,
    /// notice and trailer fit [`toolset::MAX_OUTPUT_BYTES`].
    pub fn compose(head: &str, notice: &str, trailer: &str) -> String {
        crate::output::compose(head, notice, trailer)
    }

    /// Bytes read from an output file as text: lossy UTF-8, a character
    /// cut by the read limit (`cut`) dropped rather than replaced.
    pub fn bytes_to_text(bytes: Vec<u8>, cut: bool) -> String {
        crate::output::bytes_to_text(bytes, cut)
    }
}
pub use runner::{Limits, Runner, RunnerConfig, ToolResult};
/// The gRPC types, generated in `runner-api` from its `proto/runner.proto`.
pub use runner_api::proto;
