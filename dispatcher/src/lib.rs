//! The Managed Agents dispatcher, as a library: the `agent-dispatcher`
//! binary is a thin command line over it.
//!
//! A Claude Managed Agents `self_hosted` environment hands each session
//! that needs tools to a worker through a work queue. Here the worker is
//! the trusted side of the plane: it holds the environment key (read from
//! a Secret only it may read), polls the queue, gives each session a
//! sandbox (an `AgentSession` owned by the `AgentEnvironment`), runs every
//! `agent.tool_use` in it through the gateway with its own ServiceAccount,
//! and posts the runner's result back. The sandbox holds no Anthropic
//! credential and needs no route to the API.
//!
//! Pure parts (`ledger`, `sse`, `retry`, the parsing in `api`, `sandbox`'s
//! object building, `environment`'s status) are tested without a network;
//! the rest is tested against a stand-in of the API and a real cluster.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod api;
pub mod cli;
pub mod context;
pub mod controller;
pub mod environment;
pub mod error;
pub mod files;
pub mod item;
pub mod lease;
pub mod ledger;
pub mod memory;
pub mod metrics;
pub mod retry;
pub mod sandbox;
pub mod skills;
pub mod sse;
pub mod tools;

pub use error::{Error, Result};
