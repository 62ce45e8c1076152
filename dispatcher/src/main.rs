//! `agent-dispatcher`: see `dispatcher::cli`.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    dispatcher::cli::main(dispatcher::cli::Args::parse()).await
}
