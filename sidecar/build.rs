//! Generates the gRPC code from `proto/runner.proto` with a pure-Rust protobuf
//! compiler, so a fresh machine builds with cargo alone (no system `protoc`).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/runner.proto");
    let fds = protox::compile(["proto/runner.proto"], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
