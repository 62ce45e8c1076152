//! Generated gRPC types for `proto/runner.proto` (package `agentplane.runner.v1`).
//!
//! Both the client and the server halves are generated here, so the runner
//! and every caller compile against the same file and cannot drift apart.
#![allow(missing_docs, missing_debug_implementations, clippy::all)]

tonic::include_proto!("agentplane.runner.v1");

/// The encoded `FileDescriptorSet` of `proto/runner.proto`, for the
/// runner's reflection service.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("runner_descriptor");
