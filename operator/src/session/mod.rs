//! The AgentSession wing: the reconciler that turns a session into its
//! sandbox pod, toolset ConfigMap, workspace claim and egress
//! NetworkPolicy, and writes what it did into the session's status.
//!
//! The decision is pure (`plan`, over what `controller` observed); the
//! builders (`pod`, `egress`), the warm-pod claim (`claim`), the status
//! (`status`), the stages of a session's life (`lifecycle`), sessions
//! that cannot be decoded (`unreadable`), the watches that run before this
//! replica leads (`watches`) and the two lanes into the reconcile slots
//! (`lanes`) are its parts. It may list MCP
//! servers through the `mcp` wing; it never imports the `pool` wing (a
//! claim reads the pool controller's caches through the shared context).

pub mod bulk;
pub mod cache;
pub mod claim;
pub mod claiming;
pub mod controller;
pub mod egress;
pub mod lanes;
pub mod lifecycle;
pub mod observe;
pub mod own_writes;
pub mod plan;
pub mod pod;
pub mod status;
pub mod unreadable;
pub mod watches;
pub mod written;
