//! The command line: `kubectl agent tools|call|bash`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use crds::{AgentSession, RUNNER_PORT};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use sidecar::proto::RunRequest;
use sidecar::proto::runner_client::RunnerClient;

use crate::error::Error;
use crate::{forward, session};

/// Call an AgentSession's tools from kubectl.
#[derive(Debug, Parser)]
#[command(name = "kubectl-agent", bin_name = "kubectl agent", version)]
pub struct Cli {
    /// Namespace of the session (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    pub namespace: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// List the session's enabled tools and their permission policies.
    Tools { session: String },
    /// Make one tool call and print the result as the model would see it.
    Call {
        session: String,
        /// bash, read, write, edit, glob or grep.
        tool: String,
        /// The tool input as a JSON object, e.g. '{"command": "ls"}'.
        input: String,
        /// A human approved this call (needed for always_ask tools).
        #[arg(long)]
        confirm: bool,
        /// Tool-use id (names the call's files in the sandbox).
        #[arg(long)]
        id: Option<String>,
        /// Print {"content", "is_error"} as one JSON line instead of the text.
        #[arg(long)]
        json: bool,
    },
    /// Shorthand for `call SESSION bash '{"command": "CMD..."}'`.
    Bash {
        session: String,
        #[arg(long)]
        confirm: bool,
        /// Print the output as the command writes it (stdout to stdout,
        /// stderr to stderr), reconnecting if the port-forward breaks;
        /// Ctrl-C cancels the call in the sandbox.
        #[arg(long, short = 'f')]
        follow: bool,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

/// Runs the command line. Exit codes: 0 the call succeeded, 1 the tool
/// reported an error (the model would see is_error), 2 the call was refused
/// or malformed, 3 it could not be made.
pub async fn main(cli: Cli) -> ExitCode {
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kubectl agent: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    let client = Client::try_default()
        .await
        .map_err(|e| Error::Config(e.to_string()))?;
    let ns = cli
        .namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let sessions: Api<AgentSession> = Api::namespaced(client.clone(), &ns);
    let get = |name: String| {
        let sessions = sessions.clone();
        let ns = ns.clone();
        async move {
            sessions.get_opt(&name).await?.ok_or(Error::NotFound {
                namespace: ns,
                name,
            })
        }
    };
    match cli.command {
        Command::Tools { session: name } => {
            let s = get(name).await?;
            print!("{}", session::tools_table(&s));
            Ok(ExitCode::SUCCESS)
        }
        Command::Call {
            session: name,
            tool,
            input,
            confirm,
            id,
            json,
        } => {
            let s = get(name).await?;
            call(&client, &ns, &s, &tool, &input, confirm, id, json).await
        }
        Command::Bash {
            session: name,
            confirm,
            follow,
            command,
        } => {
            let s = get(name).await?;
            let input = serde_json::json!({"command": command.join(" ")}).to_string();
            if follow {
                follow_bash(&client, &ns, &s, &input, confirm).await
            } else {
                call(&client, &ns, &s, "bash", &input, confirm, None, false).await
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn call(
    client: &Client,
    ns: &str,
    s: &AgentSession,
    tool: &str,
    input: &str,
    confirm: bool,
    id: Option<String>,
    json: bool,
) -> Result<ExitCode, Error> {
    let parsed: serde_json::Value =
        serde_json::from_str(input).map_err(|e| Error::Input(e.to_string()))?;
    if !parsed.is_object() {
        return Err(Error::Input(format!("got {parsed}")));
    }
    let pod = session::preflight(s, tool, confirm)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let channel = forward::channel(pods, pod, RUNNER_PORT).await?;
    let mut runner = RunnerClient::new(channel);
    let resp = runner
        .run(RunRequest {
            id: id.unwrap_or_else(sidecar::cli::generate_id),
            name: tool.to_owned(),
            input_json: input.to_owned(),
            confirmed: confirm,
        })
        .await
        .map_err(|st| refusal(&st, tool, s.metadata.name.as_deref().unwrap_or_default()))?
        .into_inner();
    if json {
        println!(
            "{}",
            serde_json::json!({"content": resp.content, "is_error": resp.is_error})
        );
    } else {
        print!("{}", resp.content);
        if !resp.content.ends_with('\n') && !resp.content.is_empty() {
            println!();
        }
    }
    Ok(if resp.is_error {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

/// The plugin's error for a status the runner answered with.
pub fn refusal(st: &tonic::Status, tool: &str, session: &str) -> Error {
    let kind = st
        .metadata()
        .get(sidecar::error::REFUSAL_METADATA_KEY)
        .and_then(|v| v.to_str().ok());
    match kind {
        Some("confirmation_required") => Error::ConfirmationRequired {
            tool: tool.to_owned(),
        },
        Some("not_sandbox_tool") => Error::NotSandboxTool {
            tool: tool.to_owned(),
        },
        Some("disabled_tool") => Error::Disabled {
            session: session.to_owned(),
            tool: tool.to_owned(),
            enabled: "(see kubectl agent tools)".into(),
        },
        _ => Error::Refused {
            code: format!("{:?}", st.code()),
            message: st.message().to_owned(),
        },
    }
}

/// `bash --follow`: streamed, re-attached after a broken port-forward,
/// cancelled in the sandbox on Ctrl-C.
async fn follow_bash(
    client: &Client,
    ns: &str,
    s: &AgentSession,
    input: &str,
    confirm: bool,
) -> Result<ExitCode, Error> {
    let pod = session::preflight(s, "bash", confirm)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let name = s.metadata.name.clone().unwrap_or_default();
    let id = sidecar::cli::generate_id();
    let connect = || {
        let (pods, pod) = (pods.clone(), pod.clone());
        async move {
            Ok(RunnerClient::new(
                forward::channel(pods, pod, RUNNER_PORT).await?,
            ))
        }
    };
    let req = RunRequest {
        id: id.clone(),
        name: "bash".into(),
        input_json: input.to_owned(),
        confirmed: confirm,
    };
    let (mut out, mut err) = (std::io::stdout(), std::io::stderr());
    let followed = crate::follow::follow(connect, &name, req, &mut out, &mut err);
    let done = tokio::select! {
        r = followed => r?,
        _ = tokio::signal::ctrl_c() => {
            if let Ok(mut c) = connect().await {
                let _ = c.cancel(sidecar::proto::CancelRequest { id: id.clone() }).await;
            }
            eprintln!("kubectl agent: cancelled call {id}");
            return Ok(ExitCode::from(130));
        }
    };
    if done.is_error {
        // The output was printed as it came; what follows it in the result
        // (the exit code, a timeout) is what is left to say.
        if let Some(last) = done.content.lines().last() {
            eprintln!("{last}");
        }
        Ok(ExitCode::from(1))
    } else {
        Ok(ExitCode::SUCCESS)
    }
}
