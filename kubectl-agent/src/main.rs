//! `kubectl-agent`: see `kubectl_agent::cli`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    kubectl_agent::cli::main(kubectl_agent::cli::Cli::parse()).await
}
