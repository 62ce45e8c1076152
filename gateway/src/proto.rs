//! Generated gRPC types for `proto/gateway.proto` (package
//! `agentplane.gateway.v1`), client and server.
#![allow(missing_docs, missing_debug_implementations, clippy::all)]

tonic::include_proto!("agentplane.gateway.v1");
