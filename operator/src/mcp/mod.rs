//! The MCP wing: the client that lists an MCP server's tools (`client`)
//! and the guard on where it may connect (`destinations`). MCP servers are
//! untrusted; everything here is bounded. It imports no reconciler.

pub mod client;
pub mod destinations;
