//! The agentplane operator, as a library: the `agent-operator` binary is a
//! thin command line over it, and the tests drive the same functions.
//!
//! Pure parts (spec rules, resolution, pod builder, status, admission
//! decisions, the offline check) are separate from the parts that talk to
//! the API server (controller, leader election, webhook server, MCP client).

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod admission;
pub mod check;
pub mod cli;
pub mod controller;
pub mod destinations;
pub mod egress;
pub mod error;
pub mod health;
pub mod leader;
pub mod lifecycle;
pub mod listen;
pub mod mcp;
pub mod names;
pub mod plan;
pub mod pod;
pub mod policy;
pub mod pool;
pub mod pool_controller;
pub mod resolution;
pub mod status;
pub mod tls;
pub mod unreadable;
pub mod validation;
pub mod warm;
pub mod webhook;

pub use error::{Error, Result};
