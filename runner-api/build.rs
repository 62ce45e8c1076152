//! Generates the gRPC code from `proto/runner.proto` with a pure-Rust protobuf
//! compiler, so a fresh machine builds with cargo alone (no system `protoc`),
//! and writes the encoded file descriptor set the reflection service serves
//! (`$OUT_DIR/runner_descriptor.bin`).

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/runner.proto");
    let fds = protox::compile(["proto/runner.proto"], ["proto"])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("runner_descriptor.bin"), fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}
