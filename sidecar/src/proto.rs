//! Generated gRPC types for `proto/runner.proto` (package `agentplane.runner.v1`).
#![allow(missing_docs, missing_debug_implementations, clippy::all)]

tonic::include_proto!("agentplane.runner.v1");

/// The encoded `FileDescriptorSet` of `proto/runner.proto`, for the
/// reflection service.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("runner_descriptor");
