//! The AgentCheckpoint wing (issue 25, docs/checkpoints.md): takes a
//! session's workspace and bash state onto a volume the checkpoint owns,
//! and tells the session wing whether a fork may start from it.
//!
//! - [`plan`]: pure -- the sizes a checkpoint gets, the one step a
//!   reconcile takes, the statuses it writes, a fork's `Checkpoint`
//!   condition;
//! - [`build`]: pure -- the checkpoint's claim and its sink pod;
//! - [`fork`]: pure -- a fork from a session's name: the checkpoint it
//!   takes of that session (named after the fork, owned by it) and whether
//!   to make it;
//! - [`relay`]: the one piece of network I/O -- the source runner's
//!   `Export` streamed into the sink's `Import` over mutual TLS, with a few
//!   MiB in flight at most;
//! - [`volume`]: pure -- a checkpoint taken as a VolumeSnapshot of the
//!   session's workspace claim: whether the storage allows it, the
//!   snapshot and the Secret with bash's state, the step a reconcile takes;
//! - [`snapshotting`]: that take's I/O -- the runner's `Hold` around the
//!   snapshot's cut;
//! - [`controller`]: the reconciler that reads, carries out the plan and
//!   writes the status.
//!
//! It stands on the base alone; the session wing may use its fork helpers
//! (a fork's pod mounts the checkpoint's claim), never the other way.

pub mod build;
pub mod controller;
pub mod fork;
pub mod plan;
pub mod relay;
pub mod snapshotting;
pub mod volume;
