//! The command line: `kubectl agent tools|call|bash|cp`.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use crds::AgentSession;
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Client};
use runner_api::proto::RunRequest;
use runner_api::{RUNNER_PORT, exit};

use crate::error::{Error, not_bound, refusal};
use crate::kubeconfig::KubeFlags;
use crate::{cp, forward, session, through_gateway, unbound, wake};

/// Call an AgentSession's tools, and copy files to and from it, from kubectl.
#[derive(Debug, Parser)]
#[command(
    name = "kubectl-agent",
    bin_name = "kubectl agent",
    version,
    after_help = "Exit codes: 0 ok; 1 the tool reported an error (is_error); 2 refused or malformed (usage, a policy refusal, a busy runner); 3 could not call (session not found or not ready, port-forward failed, the connection broke, the runner failed); 130 a followed call cancelled by Ctrl-C."
)]
pub struct Cli {
    /// Namespace of the session (default: the kubeconfig context's).
    #[arg(short, long, global = true)]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub kube: KubeFlags,
    /// Never use the gateway; always port-forward (e.g. from outside the
    /// cluster, where its address does not route and each call would
    /// first wait 2 s for it).
    #[arg(long, global = true, env = "KUBECTL_AGENT_NO_GATEWAY")]
    pub no_gateway: bool,
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
    /// Copy a file or directory to or from a session's workspace (modes and
    /// symbolic links kept, setuid/setgid dropped; all or nothing). One of
    /// SRC and DST is SESSION:PATH, PATH relative to the workdir (empty for
    /// the workdir itself); SESSION:DIR/ puts a file inside DIR. Through
    /// port-forward only, never the gateway.
    Cp {
        src: String,
        dst: String,
        /// Replace what is in the way (a directory whole; on upload, the
        /// clashing top-level names).
        #[arg(long)]
        overwrite: bool,
        /// Most bytes of file content copied [default: 2 GiB here; the
        /// runner's --max-transfer-bytes bounds it there].
        #[arg(long, value_name = "N", default_value_t = 0, hide_default_value = true)]
        max_bytes: u64,
        /// Take symbolic links that lead out of the copied tree (a
        /// virtualenv's bin/python); refused otherwise.
        #[arg(long)]
        allow_escaping_symlinks: bool,
    },
}

/// Runs the command line. Exit codes ([`runner_api::exit`], shared with
/// `agent-sidecar`): 0 the call succeeded, 1 the tool reported an error
/// (the model would see is_error), 2 the call was refused or malformed,
/// 3 it could not be made; 130 when Ctrl-C cancelled a followed call.
pub async fn main(cli: Cli) -> ExitCode {
    match run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kubectl agent: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// How long a call waits for a woken session's sandbox.
const WAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(180);

async fn run(cli: Cli) -> Result<ExitCode, Error> {
    let cfg = cli.kube.config().await?;
    let token = (!cli.no_gateway)
        .then(|| through_gateway::bearer(&cfg))
        .flatten();
    let client = Client::try_from(cfg).map_err(|e| Error::Config(e.to_string()))?;
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
            Ok(ExitCode::from(exit::OK))
        }
        Command::Call {
            session: name,
            tool,
            input,
            confirm,
            id,
            json,
        } => {
            let s = wake::awake(&sessions, get(name).await?, WAKE_TIMEOUT).await?;
            call(&client, token, &ns, &s, &tool, &input, confirm, id, json).await
        }
        Command::Bash {
            session: name,
            confirm,
            follow,
            command,
        } => {
            let s = wake::awake(&sessions, get(name).await?, WAKE_TIMEOUT).await?;
            let input = serde_json::json!({"command": command.join(" ")}).to_string();
            if follow {
                follow_bash(&client, &ns, &s, &input, confirm).await
            } else {
                call(
                    &client, token, &ns, &s, "bash", &input, confirm, None, false,
                )
                .await
            }
        }
        Command::Cp {
            src,
            dst,
            overwrite,
            max_bytes,
            allow_escaping_symlinks,
        } => {
            let opts = cp::Options {
                overwrite,
                max_bytes,
                allow_escaping_symlinks,
            };
            let (session, remote, local, down) = match (
                cp::Place::parse(&src),
                cp::Place::parse(&dst),
            ) {
                (cp::Place::Session { name, path }, cp::Place::Local(l)) => (name, path, l, true),
                (cp::Place::Local(l), cp::Place::Session { name, path }) => (name, path, l, false),
                _ => {
                    return Err(Error::Cp(
                        "exactly one of SRC and DST must be SESSION:PATH (write ./a:b for a local name with a colon)".into(),
                    ));
                }
            };
            let s = wake::awake(&sessions, get(session).await?, WAKE_TIMEOUT).await?;
            let pod = session::ready_pod(&s)?;
            let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
            let channel = forward::channel(pods, pod, RUNNER_PORT).await?;
            let mut runner = runner_api::Client::from_channel(channel);
            let copied = if down {
                cp::download(&mut runner, &remote, &local, opts).await?
            } else {
                cp::upload(&mut runner, &local, &remote, opts).await?
            };
            eprintln!(
                "kubectl agent: copied {} entries ({} bytes) to {}",
                copied.entries, copied.bytes, copied.to
            );
            if copied.skipped_count > 0 {
                eprintln!(
                    "kubectl agent: left out {}: {}",
                    copied.skipped_count,
                    copied.skipped.join("; ")
                );
            }
            Ok(ExitCode::from(exit::OK))
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn call(
    client: &Client,
    token: Option<String>,
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
    let id = id.unwrap_or_else(runner_api::generate_call_id);
    let name = s.metadata.name.as_deref().unwrap_or_default();
    if let Some(mut gw) = through_gateway::route(client, token).await {
        let ask = s
            .status
            .as_ref()
            .and_then(|st| st.policies.get(tool))
            .is_some_and(|p| p == "always_ask");
        match gw.call(ns, name, tool, input, &id, confirm && ask).await? {
            through_gateway::Outcome::Done(r) => {
                return print_result(
                    &runner_api::ToolResult {
                        content: r.content,
                        is_error: r.is_error,
                    },
                    json,
                );
            }
            through_gateway::Outcome::Fallback(why) => {
                eprintln!(
                    "kubectl agent: the gateway did not take the call ({why}); using port-forward"
                );
            }
        }
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let channel = forward::channel(pods, pod, RUNNER_PORT).await?;
    let mut runner = runner_api::Client::from_channel(channel);
    // A warm sandbox may not know its session yet (see `unbound`): the same
    // call (nothing ran) is tried again on the same connection.
    let mut unbound_since = None;
    let resp = loop {
        let e = match runner.run(&id, tool, input, confirm).await {
            Ok(resp) => break resp,
            Err(e) => e,
        };
        let since = *unbound_since.get_or_insert_with(std::time::Instant::now);
        match unbound::next(&e, since.elapsed()) {
            unbound::Next::Retry => tokio::time::sleep(unbound::PAUSE).await,
            unbound::Next::GiveUp => return Err(not_bound(name)),
            unbound::Next::Fail => return Err(refusal(e, tool, name)),
        }
    };
    print_result(&resp, json)
}

/// Prints a result as the model sees it (or as one JSON line) and gives
/// the exit code.
fn print_result(resp: &runner_api::ToolResult, json: bool) -> Result<ExitCode, Error> {
    if json {
        let line = serde_json::to_string(resp).map_err(|e| Error::Output(e.to_string()))?;
        println!("{line}");
    } else {
        print!("{}", resp.content);
        if !resp.content.ends_with('\n') && !resp.content.is_empty() {
            println!();
        }
    }
    Ok(ExitCode::from(if resp.is_error {
        exit::TOOL_ERROR
    } else {
        exit::OK
    }))
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
    let id = runner_api::generate_call_id();
    let connect = || {
        let (pods, pod) = (pods.clone(), pod.clone());
        async move {
            let channel = forward::channel(pods, pod, RUNNER_PORT).await?;
            Ok(runner_api::Client::from_channel(channel))
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
                let _ = c.cancel(&id).await;
            }
            eprintln!("kubectl agent: cancelled call {id}");
            return Ok(ExitCode::from(exit::INTERRUPTED));
        }
    };
    if done.is_error {
        // The output was printed as it came; what follows it in the result
        // (the exit code, a timeout) is what is left to say.
        if let Some(last) = done.content.lines().last() {
            eprintln!("{last}");
        }
        Ok(ExitCode::from(exit::TOOL_ERROR))
    } else {
        Ok(ExitCode::from(exit::OK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runner_api::Refusal;

    #[test]
    fn refusals_read_in_the_plugins_words_and_exit_by_the_convention() {
        let read = |r: Refusal| {
            refusal(
                runner_api::Error::from(r.status("runner's words")),
                "write",
                "demo",
            )
        };
        let e = read(Refusal::ConfirmationRequired);
        assert!(e.to_string().contains("rerun with --confirm"), "{e}");
        assert!(matches!(
            read(Refusal::DisabledTool),
            Error::Disabled { .. }
        ));
        assert!(matches!(
            read(Refusal::NotSandboxTool),
            Error::NotSandboxTool { .. }
        ));
        for r in Refusal::ALL {
            assert_eq!(read(r).exit_code(), exit::REFUSED, "{r}");
        }
        let busy = read(Refusal::Busy);
        assert!(busy.to_string().contains("runner's words"), "{busy}");

        let late = not_bound("demo");
        assert_eq!(late.exit_code(), exit::COULD_NOT_CALL);
        assert!(late.to_string().contains("not bound within 10 s"), "{late}");
        assert!(
            late.to_string()
                .contains("kubectl describe agentsession demo"),
            "{late}"
        );

        let broken = refusal(
            runner_api::Error::from(tonic::Status::unavailable("connection reset")),
            "bash",
            "demo",
        );
        assert_eq!(broken.exit_code(), exit::COULD_NOT_CALL);
        let gave_up = Error::Disconnected {
            times: 8,
            id: "c".into(),
        };
        assert_eq!(gave_up.exit_code(), exit::COULD_NOT_CALL);
    }
}
