//! `kubectl agent`: a session's tools from its status, and one tool call at
//! a time through port-forward to the runner, printed as the model sees it.

pub mod cli;
pub mod cp;
pub mod error;
pub mod follow;
pub mod forward;
pub mod kubeconfig;
pub mod session;
pub mod through_gateway;
pub mod unbound;
pub mod wake;

pub use error::Error;
