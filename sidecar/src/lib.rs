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
//! are the binary around it (its `main` only parses and dispatches). The
//! contract with callers -- the proto, the client, refusals, the command
//! line the operator renders, exit codes -- lives in the `runner-api` crate.

pub mod authority;
pub mod calls;
pub mod cli;
pub mod error;
pub mod fsutil;
pub mod guard;
pub mod install;
pub mod lifecycle;
pub mod output;
pub mod procs;
pub mod reaper;
pub mod remote;
pub mod runner;
pub mod service;
pub mod snapshot;
pub mod stream;
pub mod telemetry;
pub mod tools;

pub use error::Error;
pub use runner::{Limits, Runner, RunnerConfig, ToolResult};
/// The gRPC types, generated in `runner-api` from its `proto/runner.proto`.
pub use runner_api::proto;
