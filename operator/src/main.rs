//! `agent-operator`: see `operator::cli`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    operator::cli::main(operator::cli::Cli::parse()).await
}
