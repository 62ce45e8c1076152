//! The agentplane gateway, as a library: the `agent-gateway` binary is a
//! thin command line over it, and the tests drive the same functions.
//!
//! Programs -- agent loops, the Python client, any MCP client -- call a
//! session's tools here. The cluster decides who they are (TokenReview)
//! and what they may do (SubjectAccessReview on the session's virtual
//! subresources `agentsessions/call` and `agentsessions/approve`); the
//! gateway finds the session's runner in a watch cache and reaches it over
//! mutual TLS. Stateless: replicas share nothing but the Secret holding
//! their certificate, from which approvals are signed too.
//!
//! `gate` is the one path every front shares; `http` and `grpc` translate.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod address;
pub mod approval;
pub mod auth;
pub mod cache;
pub mod cli;
pub mod directory;
pub mod error;
pub mod gate;
pub mod grpc;
pub mod http;
pub mod limits;
pub mod mcp;
pub mod proto;
pub mod published;
pub mod runners;
pub mod serve;

pub use error::{Error, Result};
