//! The agentplane operator, as a library: the `agent-operator` binary is a
//! thin command line over it, and the tests drive the same functions.
//!
//! The code stands in five wings over a shared base (docs/architecture.md
//! draws them): `session`, `pool` and `checkpoint` reconcile, `admission`
//! is the webhook's door, `mcp` lists MCP servers. Imports run one way --
//! `pool` may use `session`, `session` may use `mcp` and `checkpoint`
//! (a fork mounts its checkpoint), nothing else crosses, and
//! the base imports no wing -- which `tests/structure` checks. Pure parts
//! (rules, resolution, plans, builders, status, admission decisions) are
//! separate from the parts that talk to the API server.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

// The wings (see docs/architecture.md for their doors).
pub mod admission;
pub mod checkpoint;
pub mod mcp;
pub mod pool;
pub mod session;

// The shared base: what every wing stands on.
pub mod certs;
pub mod cidr;
pub mod cli;
pub mod context;
pub mod error;
pub mod health;
pub mod leader;
pub mod listen;
pub mod names;
pub mod netpol;
pub mod policy;
pub mod quantity;
pub mod resolution;
pub mod sandbox;
pub mod tls_secrets;
pub mod validation;

pub use error::{Error, Result};
