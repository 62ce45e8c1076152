//! One work item from poll to stop: acknowledge it, keep its lease, give
//! its session a sandbox, run the session's tool calls there and post each
//! result, and at the end stop the item and release the sandbox. Every
//! wait is bounded by the lease, the idle limit or a deadline.

use std::sync::Arc;
use std::time::Duration;

use crds::AgentSession;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::api::SessionInfo;
use crate::api::{EventStream, ManagedApi, WorkItem};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::files::Sandbox;
use crate::lease::{Lease, LeaseEnd, Target};
use crate::ledger::{Ledger, ToolCall};
use crate::memory::{self, Mounted};
use crate::retry;
use crate::sandbox;
use crate::skills;
use crate::tools::Outcome;

/// The most history pages read (1000 events each).
const MAX_PAGES: usize = 1000;
/// How long a sandbox may take to become Ready.
const READY_LIMIT: Duration = Duration::from_secs(180);
/// Reconnects of a session's event stream before the run gives up.
const MAX_RECONNECTS: u32 = 50;
/// How long results are retried when no lease TTL is known.
const SEND_WINDOW: Duration = Duration::from_secs(300);
/// How long putting skills and memory stores into a sandbox may take.
const SETUP_LIMIT: Duration = Duration::from_secs(600);
/// How long syncing memory stores back may take.
const SYNC_LIMIT: Duration = Duration::from_secs(300);

/// The text sent for a call that printed nothing (the API refuses an
/// empty text block; the official worker sends the same).
pub const NO_OUTPUT: &str = "(no output)";

/// What one item is served with.
#[derive(Debug, Clone)]
pub struct Assignment {
    /// The environment's namespace.
    pub namespace: String,
    /// A snapshot of the environment when the item was taken.
    pub environment: Arc<crds::AgentEnvironment>,
    /// The environment key when the item was taken.
    pub key: Arc<str>,
    /// The item.
    pub item: WorkItem,
    /// The sandbox an earlier incarnation made for it (a restart).
    pub resumed: Option<AgentSession>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEnd {
    /// Not a session item, or its session was already over.
    Skipped(String),
    /// The session ended or went idle past the limit.
    Done(String),
    /// The lease ended first.
    Lease(LeaseEnd),
    /// Something failed; the item was stopped.
    Failed(String),
}

/// The `user.tool_result` (or `user.custom_tool_result`) for a call.
pub fn result_event(call: &ToolCall, o: &Outcome) -> Value {
    let text = if o.content.is_empty() {
        NO_OUTPUT
    } else {
        o.content.as_str()
    };
    let content = json!([{ "type": "text", "text": text }]);
    if call.custom {
        json!({"type": "user.custom_tool_result", "custom_tool_use_id": call.id, "content": content, "is_error": o.is_error})
    } else {
        json!({"type": "user.tool_result", "tool_use_id": call.id, "content": content, "is_error": o.is_error})
    }
}

/// Serves one item to its end.
pub async fn serve(ctx: Arc<Context>, a: Assignment) -> RunEnd {
    let env_id = a.environment.spec.environment_id.clone();
    let work = a.item.id.clone();
    let Some(session_id) = a
        .item
        .session_id
        .clone()
        .filter(|_| a.item.kind == "session")
    else {
        // Healthchecks and kinds this build does not know: nothing to run.
        let _ = ctx.api.stop(&env_id, &a.key, &work, true).await;
        return RunEnd::Skipped(format!("work item of kind {:?}", a.item.kind));
    };
    if a.resumed.is_none()
        && let Err(e) = ctx.api.ack(&env_id, &a.key, &work).await
    {
        if !e.is_transient() {
            let _ = ctx.api.stop(&env_id, &a.key, &work, true).await;
        }
        return RunEnd::Failed(format!("ack: {e}"));
    }
    let bearer: Arc<str> = a
        .item
        .sessions_token
        .as_deref()
        .map(Arc::from)
        .unwrap_or_else(|| a.key.clone());
    let lease = Lease::start(
        Target {
            api: ctx.api.clone(),
            environment: env_id.clone(),
            work: work.clone(),
            bearer: bearer.clone(),
        },
        a.resumed.is_some(),
    );
    let sessions: Api<AgentSession> = Api::namespaced(ctx.kube.clone(), &a.namespace);
    let mut sandbox_obj: Option<AgentSession> = a.resumed.clone();
    let mut mounted: Option<(Sandbox, Vec<Mounted>)> = None;
    let end = run(
        &ctx,
        &a,
        &session_id,
        &bearer,
        &lease,
        &sessions,
        &mut sandbox_obj,
        &mut mounted,
    )
    .await;
    // Memory goes back only after a clean end: the session ended or went
    // idle, while the lease is still ours.
    if let RunEnd::Done(_) = &end
        && let Some((sb, stores)) = &mounted
        && !stores.is_empty()
        && let Some(token) = a.item.sessions_token.as_deref()
    {
        tokio::select! {
            r = tokio::time::timeout(SYNC_LIMIT, memory::sync(&ctx.api, &*ctx.gateway, sb, token, &work, stores)) => {
                if r.is_err() {
                    tracing::warn!(work = %work, "syncing the memory stores back took over {}s and was cut off; changes not yet sent are not saved", SYNC_LIMIT.as_secs());
                }
            }
            e = lease.ended() => {
                tracing::warn!(work = %work, lease = ?e, "the lease ended while the memory stores were synced back; changes not yet sent are not saved");
            }
        }
    }
    if let Some(s) = &sandbox_obj
        && let Err(e) = sandbox::release(&sessions, s).await
    {
        tracing::warn!(work = %work, session = %s.name_any(), error = %e, "cannot delete the sandbox; its environment still owns it");
    }
    if lease.may_stop()
        && let Err(e) = ctx.api.stop(&env_id, &bearer, &work, true).await
    {
        tracing::warn!(work = %work, error = %e, "cannot stop the work item");
    }
    end
}

#[allow(clippy::too_many_arguments)]
async fn run(
    ctx: &Context,
    a: &Assignment,
    session_id: &str,
    bearer: &str,
    lease: &Lease,
    sessions: &Api<AgentSession>,
    sandbox_obj: &mut Option<AgentSession>,
    mounted: &mut Option<(Sandbox, Vec<Mounted>)>,
) -> RunEnd {
    let info = tokio::select! {
        r = with_retries(|| ctx.api.session(bearer, session_id)) => r,
        e = lease.ended() => return RunEnd::Lease(e),
    };
    let info = match info {
        Ok(i) => i,
        Err(e) => return RunEnd::Failed(format!("session retrieve: {e}")),
    };
    if info.status == "terminated" {
        return RunEnd::Skipped("the session is terminated".into());
    }
    let uid = a.environment.uid().unwrap_or_default();
    // The sandbox; when the plane refuses it, every call is answered with
    // the reason instead of hanging.
    let mut refused: Option<String> = None;
    // Calls attach before they run when an earlier run may have started
    // them: a resumed run, or a sandbox that already existed.
    let mut resumed = a.resumed.is_some();
    if sandbox_obj.is_none() {
        match sandbox::build(&a.environment, &a.item.id, session_id, &info.tools) {
            Ok(want) => match sandbox::ensure(sessions, &want, &uid, &a.item.id).await {
                Ok((s, created)) => {
                    resumed |= !created;
                    *sandbox_obj = Some(s);
                }
                Err(e) => refused = Some(e.to_string()),
            },
            Err(e) => refused = Some(e.to_string()),
        }
    }
    let name = sandbox_obj.as_ref().map(ResourceExt::name_any);
    let mut policies = Default::default();
    if let Some(n) = &name {
        tokio::select! {
            r = sandbox::wait_ready(sessions, n, READY_LIMIT) => match r {
                Ok(s) => {
                    tracing::info!(work = %a.item.id, sandbox = %n, "the sandbox is Ready");
                    policies = s.status.map(|st| st.policies).unwrap_or_default();
                }
                Err(e) => refused = Some(e.to_string()),
            },
            e = lease.ended() => return RunEnd::Lease(e),
        }
    }
    if let Some(r) = &refused {
        tracing::warn!(work = %a.item.id, reason = %r, "the session has no sandbox; its calls get the reason as an error");
    }
    // Skills and memory stores, before any tool runs.
    if refused.is_none()
        && let Some(n) = &name
    {
        let sb = Sandbox::new(
            &a.namespace,
            n,
            &a.environment.spec.sandbox.template.workdir,
            policies.clone(),
        );
        let stores = tokio::select! {
            r = tokio::time::timeout(SETUP_LIMIT, prepare(ctx, a, &sb, bearer, &info)) => r.unwrap_or_else(|_| {
                tracing::warn!(work = %a.item.id, "putting skills and memory stores into the sandbox took over {}s and was cut off; the session runs with what is there", SETUP_LIMIT.as_secs());
                Vec::new()
            }),
            e = lease.ended() => return RunEnd::Lease(e),
        };
        *mounted = Some((sb, stores));
    }
    let idle_limit = Duration::from_secs(a.environment.spec.idle_seconds.clamp(1, 86_400) as u64);
    let mut ledger = Ledger::new();
    let mut stream = match open(&ctx.api, bearer, session_id, &mut ledger).await {
        Ok(s) => s,
        Err(e) => return RunEnd::Failed(format!("opening the session's events: {e}")),
    };
    tracing::debug!(work = %a.item.id, "reading the session's events");
    let mut idle_since: Option<Instant> = None;
    let mut reconnects = 0u32;
    loop {
        while let Some(call) = ledger.next_runnable() {
            if let crate::lease::LeaseState::Ended(e) = lease.state() {
                return RunEnd::Lease(e);
            }
            let outcome = if call.custom {
                Outcome {
                    content: format!(
                        "the custom tool {:?} is not served by this environment's sandbox: only the built-in tools (bash, read, write, edit, glob, grep) run here",
                        call.name
                    ),
                    is_error: true,
                }
            } else if let Some(r) = &refused {
                Outcome {
                    content: format!("this session has no sandbox to run tools in: {r}"),
                    is_error: true,
                }
            } else {
                let n = name.as_deref().unwrap_or_default();
                let approve = policies.get(&call.name).map(String::as_str) == Some("always_ask");
                let started = std::time::Instant::now();
                tracing::debug!(call = %call.id, tool = %call.name, "running a call");
                let o = tokio::select! {
                    o = ctx.gateway.call(&a.namespace, n, &call, approve, resumed) => o,
                    e = lease.ended() => return RunEnd::Lease(e),
                };
                ctx.metrics.call(started.elapsed(), o.is_error);
                o
            };
            let ev = result_event(&call, &outcome);
            let window = lease.ttl().unwrap_or(SEND_WINDOW);
            if let Err(e) = post(&ctx.api, bearer, session_id, &ev, window).await {
                return RunEnd::Failed(format!("posting the result of {}: {e}", call.id));
            }
            ledger.posted(&call.id);
            tracing::debug!(call = %call.id, is_error = outcome.is_error, "posted the result");
        }
        if let Some(e) = ledger.ended() {
            return RunEnd::Done(format!("the session ended ({e:?})"));
        }
        let idle_deadline = if ledger.idle() {
            Some(*idle_since.get_or_insert_with(Instant::now) + idle_limit)
        } else {
            idle_since = None;
            None
        };
        tokio::select! {
            ev = stream.next() => match ev {
                Ok(Some(v)) => { ledger.observe(&v); reconnects = 0; }
                Ok(None) | Err(_) => {
                    if let Err(e) = &ev
                        && !e.is_transient() && e.status().is_some() {
                            return RunEnd::Failed(format!("the session's event stream: {e}"));
                        }
                    reconnects += 1;
                    if reconnects > MAX_RECONNECTS {
                        return RunEnd::Failed("the session's event stream kept failing".into());
                    }
                    tokio::select! {
                        () = tokio::time::sleep(retry::backoff(reconnects - 1, Duration::from_millis(500), Duration::from_secs(10))) => {}
                        e = lease.ended() => return RunEnd::Lease(e),
                    }
                    match open(&ctx.api, bearer, session_id, &mut ledger).await {
                        Ok(s) => stream = s,
                        Err(e) => tracing::warn!(error = %e, "reopening the session's events; retrying"),
                    }
                }
            },
            () = sleep_until(idle_deadline) => {
                return RunEnd::Done(format!("idle for {}s", idle_limit.as_secs()));
            }
            e = lease.ended() => return RunEnd::Lease(e),
        }
    }
}

/// Puts the agent's skills and the session's memory stores into the
/// sandbox; the stores put, for the sync at the end. Failures are logged
/// and the run goes on.
async fn prepare(
    ctx: &Context,
    a: &Assignment,
    sb: &Sandbox,
    bearer: &str,
    info: &SessionInfo,
) -> Vec<Mounted> {
    let work = a.item.id.as_str();
    skills::install(&ctx.api, &*ctx.gateway, sb, bearer, work, &info.skills).await;
    let refs = memory::stores(&info.resources);
    if refs.is_empty() {
        return Vec::new();
    }
    let cfg = a.environment.spec.memory.clone().unwrap_or_default();
    if !cfg.enabled {
        tracing::info!(
            work,
            stores = refs.len(),
            "spec.memory.enabled is false: the session's memory stores are not put into the sandbox"
        );
        return Vec::new();
    }
    let Some(token) = a.item.sessions_token.as_deref() else {
        tracing::warn!(
            work,
            stores = refs.len(),
            "the work item has no sessions token (a resumed run: only the poll carries it), and the memory endpoints take nothing else: the session's memory stores are neither put into the sandbox nor synced back"
        );
        return Vec::new();
    };
    memory::mount(
        &ctx.api,
        &*ctx.gateway,
        sb,
        token,
        work,
        &refs,
        &cfg.directory,
    )
    .await
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Opens the live stream first, then reads the history into the ledger,
/// so that nothing emitted between the two is missed (the overlap is
/// taken once, by event id).
async fn open(
    api: &ManagedApi,
    bearer: &str,
    session: &str,
    ledger: &mut Ledger,
) -> Result<EventStream> {
    let stream = api.stream(bearer, session).await?;
    let mut page: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let (events, next) =
            with_retries(|| api.events_page(bearer, session, page.as_deref())).await?;
        for ev in &events {
            ledger.observe(ev);
        }
        match next {
            Some(n) if !events.is_empty() => page = Some(n),
            _ => return Ok(stream),
        }
    }
    Err(Error::Protocol {
        what: "events list",
        message: format!("more than {MAX_PAGES} pages of events"),
    })
}

/// Posts a result, retrying transient failures with jittered backoff for
/// as long as `window` allows; a fatal 4xx ends the retries.
async fn post(
    api: &ManagedApi,
    bearer: &str,
    session: &str,
    ev: &Value,
    window: Duration,
) -> Result<()> {
    let until = Instant::now() + window;
    let mut n = 0;
    loop {
        match api
            .send_events(bearer, session, std::slice::from_ref(ev))
            .await
        {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() && Instant::now() < until => {
                let d = retry::backoff(n, Duration::from_secs(1), Duration::from_secs(30));
                tokio::time::sleep(d.min(until.saturating_duration_since(Instant::now()))).await;
                n += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// A few tries of a read, for transient failures only.
async fn with_retries<T, F, Fut>(mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let mut n = 0;
    loop {
        match f().await {
            Err(e) if e.is_transient() && n < 4 => {
                tokio::time::sleep(retry::backoff(
                    n,
                    Duration::from_millis(500),
                    Duration::from_secs(8),
                ))
                .await;
                n += 1;
            }
            r => return r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(custom: bool) -> ToolCall {
        ToolCall {
            id: "toolu_1".into(),
            name: "bash".into(),
            input: json!({}),
            custom,
            thread: None,
        }
    }

    #[test]
    fn results_carry_the_runner_text_unchanged() {
        let o = Outcome {
            content: "line\nexit code: 1".into(),
            is_error: true,
        };
        let ev = result_event(&call(false), &o);
        assert_eq!(
            ev,
            json!({"type": "user.tool_result", "tool_use_id": "toolu_1",
                   "content": [{"type": "text", "text": "line\nexit code: 1"}], "is_error": true})
        );
    }

    #[test]
    fn empty_output_and_custom_tools_have_their_own_shapes() {
        let o = Outcome {
            content: String::new(),
            is_error: false,
        };
        let ev = result_event(&call(true), &o);
        assert_eq!(ev["type"], "user.custom_tool_result");
        assert_eq!(ev["custom_tool_use_id"], "toolu_1");
        assert_eq!(ev["content"][0]["text"], NO_OUTPUT);
    }
}
