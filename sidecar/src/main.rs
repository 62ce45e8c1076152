//! `agent-sidecar`: serve the tools, or call a running runner. Parsing and
//! dispatch only; the subcommands live in the library.

use std::process::ExitCode;

use clap::Parser;
use runner_api::exit;
use sidecar::cli::{Cli, Command};
use sidecar::{Error, install, lifecycle, remote};

/// `serve` or `install` failed (the pod's restart policy retries on it).
const FAILED: u8 = 1;

fn main() -> ExitCode {
    let code = match Cli::parse().command {
        Command::Serve(args) => process(lifecycle::serve(*args)),
        Command::Install { dest } => process(install::install(&dest)),
        Command::CheckpointSink(args) => process(lifecycle::checkpoint_sink(args)),
        Command::Call(args) => client(remote::block_on(remote::call(args))),
        Command::Health(args) => client(remote::block_on(remote::health(args))),
        Command::Tools(args) => client(remote::block_on(remote::tools(args))),
        Command::PidsProbe { max } => sidecar::pids_probe::run(max),
    };
    ExitCode::from(code)
}

/// `call`, `health`, `tools`: the shared exit-code convention.
fn client(res: Result<u8, Error>) -> u8 {
    res.unwrap_or_else(|e| {
        eprintln!("agent-sidecar: {e}");
        e.exit_code()
    })
}

/// `serve`, `install`: 0 when done, 2 for a flag value the runner cannot
/// use, 1 for any other failure (which the pod's restart policy retries).
fn process(res: Result<(), Error>) -> u8 {
    match res {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("agent-sidecar: {e}");
            match e {
                Error::Usage(_) => exit::REFUSED,
                Error::SandboxEnded { why, .. } => u8::try_from(why.exit_code()).unwrap_or(FAILED),
                _ => FAILED,
            }
        }
    }
}
