//! `agent-sidecar call | health | tools`: the subcommands that talk to a
//! running runner, for scripts and probes inside the sandbox. Each returns
//! the exit code of the convention in [`runner_api::exit`].

use runner_api::{Client, exit};

use crate::cli::{CallArgs, TargetArgs, print_line};
use crate::error::Error;

/// Runs one client subcommand to completion on a small runtime of its own
/// (a probe runs every few seconds; it should cost little).
pub fn block_on<F>(f: F) -> Result<u8, Error>
where
    F: std::future::Future<Output = Result<u8, Error>>,
{
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the async runtime", e))?
        .block_on(f)
}

/// One call, printed as `{"content": ..., "is_error": ...}` on one line
/// whether or not the tool failed; the exit code says which.
pub async fn call(args: CallArgs) -> Result<u8, Error> {
    let id = args.id.clone().unwrap_or_else(runner_api::generate_call_id);
    let mut client = Client::connect(&args.target.target()).await?;
    let res = client
        .run(&id, &args.tool, &args.input, args.confirmed)
        .await?;
    let line = serde_json::to_string(&res)
        .map_err(|e| Error::io("cannot encode the result", std::io::Error::other(e)))?;
    print_line(&line)?;
    Ok(if res.is_error {
        exit::TOOL_ERROR
    } else {
        exit::OK
    })
}

/// SERVING (exit 0) or NOT_SERVING (exit 1: the runner answered, and it is
/// draining for shutdown); a runner that cannot be reached is exit 3.
pub async fn health(args: TargetArgs) -> Result<u8, Error> {
    let mut client = Client::connect(&args.target()).await?;
    if client.health().await? {
        print_line("SERVING")?;
        Ok(exit::OK)
    } else {
        print_line("NOT_SERVING")?;
        Ok(exit::TOOL_ERROR)
    }
}

/// The enabled tool definitions as one JSON array, each with its policy.
pub async fn tools(args: TargetArgs) -> Result<u8, Error> {
    let mut client = Client::connect(&args.target()).await?;
    let defs = client.list_tools().await?;
    let json: Vec<serde_json::Value> = defs
        .into_iter()
        .map(|d| {
            serde_json::json!({
                "name": d.name,
                "description": d.description,
                "input_schema": serde_json::from_str::<serde_json::Value>(&d.input_schema_json)
                    .unwrap_or(serde_json::Value::Null),
                "permission_policy": d.permission_policy,
            })
        })
        .collect();
    print_line(&serde_json::Value::Array(json).to_string())?;
    Ok(exit::OK)
}
