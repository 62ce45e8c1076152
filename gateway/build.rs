//! Generates the gateway's gRPC code from `proto/gateway.proto` with a
//! pure-Rust protobuf compiler (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/gateway.proto");
    let fds = protox::compile(["proto/gateway.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
