//! `agent-gateway`: see `gateway::cli`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    gateway::cli::main(gateway::cli::Args::parse()).await
}
