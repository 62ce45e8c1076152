//! The agentplane operator, as a library: the `agent-operator` binary is a
//! thin command line over it, and the tests drive the same functions.
//!
//! Pure parts (spec rules, resolution, pod builder, status, admission
//! decisions, the offline check) are separate from the parts that talk to
//! the API server (controller, leader election, webhook server, MCP client).

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

// The wings (see docs/architecture.md for their doors).
pub mod admission;
pub mod mcp;
pub mod pool;
pub mod session;

// The shared base: what every wing stands on.
pub mod cidr;
pub mod cli;
pub mod context;
pub mod error;
pub mod health;
pub mod leader;
pub mod listen;
pub mod names;
pub mod policy;
pub mod resolution;
pub mod sandbox;
pub mod validation;

pub use error::{Error, Result};
