//! Generated gRPC types for `proto/runner.proto` (package `agentplane.runner.v1`).
#![allow(missing_docs, missing_debug_implementations, clippy::all)]

tonic::include_proto!("agentplane.runner.v1");
