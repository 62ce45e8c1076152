//! What every front (gRPC, HTTP, MCP) does for a call, in one place: who
//! calls (TokenReview), whether they may (SubjectAccessReview), where the
//! session's runner is (the watch cache), whether the tool's permission
//! policy lets the call run (an approval for `always_ask`), and the call
//! itself over the runner's pooled mutual-TLS channel. The fronts only
//! translate.

use std::pin::Pin;
use std::sync::Arc;

use crds::AgentSession;
use futures::{Stream, StreamExt};
use runner_api::proto::{
    AttachRequest, CancelRequest, RunEvent, RunRequest, RunResponse, run_event,
};

use crate::address::{self, SessionAddr};
use crate::approval::{Approvals, Subject};
use crate::auth::{Auth, Caller, Permission};
use crate::directory::Directory;
use crate::error::{Error, Result};
use crate::limits::{Limits, Slot};
use crate::runners::Runners;

/// A call as a front received it.
#[derive(Debug, Clone)]
pub struct Call {
    pub id: Option<String>,
    pub tool: String,
    pub input: serde_json::Value,
    pub approval: Option<String>,
}

/// A call's result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    pub id: String,
    pub content: String,
    pub is_error: bool,
}

/// What a streamed or attached call yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Stdout { offset: u64, data: Vec<u8> },
    Stderr { offset: u64, data: Vec<u8> },
    Result(Outcome),
}

/// A session's tool, as callers see it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ToolView {
    pub name: String,
    pub description: String,
    pub input_schema: serde_json::Value,
    pub permission_policy: String,
}

pub type Events = Pin<Box<dyn Stream<Item = Result<Event>> + Send>>;

/// The longest tool name looked at.
const MAX_TOOL_NAME: usize = 256;

/// Everything a call needs.
#[derive(Debug)]
pub struct Gate {
    pub auth: Auth,
    pub directory: Directory,
    pub runners: Runners,
    pub approvals: Approvals,
    pub limits: Limits,
}

/// What `admit` found.
struct Admitted {
    caller: Caller,
    session: Arc<AgentSession>,
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

impl Gate {
    /// Authenticates, then authorises `permission` on the session, then
    /// finds it. A caller without the permission learns nothing about
    /// whether the session exists.
    async fn admit(
        &self,
        header: Option<&str>,
        addr: &SessionAddr,
        permission: Permission,
    ) -> Result<Admitted> {
        let caller = self.auth.authenticate(header).await?;
        self.auth.authorize(&caller, addr, permission).await?;
        let session = self
            .directory
            .session(addr)
            .ok_or_else(|| Error::NotFound(format!("session {addr} does not exist")))?;
        Ok(Admitted { caller, session })
    }

    fn runner(
        &self,
        addr: &SessionAddr,
        session: &AgentSession,
    ) -> Result<(
        String,
        runner_api::proto::runner_client::RunnerClient<tonic::transport::Channel>,
    )> {
        let at = self.directory.runner(addr, session)?;
        let dir = &self.directory;
        let client = self.runners.client(&at, || dir.pod_uids())?;
        Ok((at.pod_uid, client))
    }

    /// A runner's error status, as the caller should read it.
    fn runner_error(&self, addr: &SessionAddr, pod_uid: &str, status: tonic::Status) -> Error {
        use tonic::Code;
        let transport = matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled
        ) && runner_api::Refusal::from_status(&status).is_none();
        if !transport {
            return Error::Runner(status);
        }
        self.runners.forget(pod_uid);
        if self.directory.session(addr).is_none() {
            Error::NotFound(format!(
                "session {addr} was deleted; the call ended with its sandbox"
            ))
        } else if !self.directory.has_pod(pod_uid) {
            Error::Unavailable(format!(
                "session {addr}'s sandbox pod went away (replaced, suspended or evicted); the call ended with it"
            ))
        } else {
            Error::Unavailable(format!(
                "session {addr}'s runner is unreachable: {}",
                status.message()
            ))
        }
    }

    /// The session's tools, from its status.
    pub async fn tools(&self, header: Option<&str>, addr: &SessionAddr) -> Result<Vec<ToolView>> {
        let a = self.admit(header, addr, Permission::Call).await?;
        Ok(tools_of(&a.session))
    }

    /// Checks the call, and says whether the runner may run it confirmed.
    fn check_call(&self, addr: &SessionAddr, session: &AgentSession, call: &Call) -> Result<bool> {
        if call.tool.is_empty() || call.tool.len() > MAX_TOOL_NAME {
            return Err(Error::Invalid(format!(
                "name: a tool name of 1-{MAX_TOOL_NAME} bytes is needed"
            )));
        }
        if let Some(id) = &call.id {
            address::call_id(id)?;
        }
        if !call.input.is_object() {
            return Err(Error::Invalid(
                "input: a tool's input is a JSON object".into(),
            ));
        }
        let ask = policy_of(session, &call.tool).as_deref() == Some("always_ask");
        match (&call.approval, ask) {
            (None, false) => Ok(false),
            (None, true) => Err(Error::ApprovalRequired {
                tool: call.tool.clone(),
                namespace: addr.namespace.clone(),
                name: addr.name.clone(),
            }),
            (Some(token), _) => {
                let subject = Subject {
                    addr,
                    tool: &call.tool,
                    input: &call.input,
                    id: None,
                };
                // An approval names the call id or none.
                let by_id = call.id.as_deref().map(|id| Subject {
                    id: Some(id),
                    ..subject
                });
                let now = now_unix();
                match by_id {
                    Some(s) if self.approvals.check(token, &s, now).is_ok() => Ok(true),
                    _ => self.approvals.check(token, &subject, now).map(|()| true),
                }
            }
        }
    }

    fn request(call: &Call, confirmed: bool) -> RunRequest {
        RunRequest {
            id: call.id.clone().unwrap_or_else(runner_api::generate_call_id),
            name: call.tool.clone(),
            input_json: call.input.to_string(),
            confirmed,
        }
    }

    /// Runs a call to its end.
    pub async fn call(
        &self,
        header: Option<&str>,
        addr: &SessionAddr,
        call: Call,
    ) -> Result<Outcome> {
        let a = self.admit(header, addr, Permission::Call).await?;
        let confirmed = self.check_call(addr, &a.session, &call)?;
        let _slot = self.limits.take(&a.caller.user)?;
        let (uid, mut client) = self.runner(addr, &a.session)?;
        let req = Self::request(&call, confirmed);
        let id = req.id.clone();
        let res = client
            .run(req)
            .await
            .map_err(|s| self.runner_error(addr, &uid, s))?
            .into_inner();
        Ok(outcome(id, res))
    }

    /// Runs a call, its output as it comes.
    pub async fn stream(
        self: &Arc<Self>,
        header: Option<&str>,
        addr: &SessionAddr,
        call: Call,
    ) -> Result<Events> {
        let a = self.admit(header, addr, Permission::Call).await?;
        let confirmed = self.check_call(addr, &a.session, &call)?;
        let slot = self.limits.take(&a.caller.user)?;
        let (uid, mut client) = self.runner(addr, &a.session)?;
        let req = Self::request(&call, confirmed);
        let id = req.id.clone();
        let events = client
            .run_stream(req)
            .await
            .map_err(|s| self.runner_error(addr, &uid, s))?
            .into_inner();
        Ok(self.relay(events, id, addr.clone(), uid, slot))
    }

    /// A call's output from the given offsets, then its result.
    pub async fn attach(
        self: &Arc<Self>,
        header: Option<&str>,
        addr: &SessionAddr,
        id: &str,
        stdout_offset: u64,
        stderr_offset: u64,
    ) -> Result<Events> {
        address::call_id(id)?;
        let a = self.admit(header, addr, Permission::Call).await?;
        let slot = self.limits.take(&a.caller.user)?;
        let (uid, mut client) = self.runner(addr, &a.session)?;
        let events = client
            .attach(AttachRequest {
                id: id.to_owned(),
                stdout_offset,
                stderr_offset,
            })
            .await
            .map_err(|s| self.runner_error(addr, &uid, s))?
            .into_inner();
        Ok(self.relay(events, id.to_owned(), addr.clone(), uid, slot))
    }

    fn relay(
        self: &Arc<Self>,
        events: tonic::Streaming<RunEvent>,
        id: String,
        addr: SessionAddr,
        uid: String,
        slot: Slot,
    ) -> Events {
        let me = Arc::clone(self);
        let mut done = false;
        Box::pin(events.filter_map(move |e| {
            // The slot is held for as long as the stream is.
            let _held = &slot;
            let out = if done {
                None
            } else {
                match e {
                    Ok(RunEvent { event: Some(ev) }) => match ev {
                        run_event::Event::Stdout(c) => Some(Ok(Event::Stdout {
                            offset: c.offset,
                            data: c.data,
                        })),
                        run_event::Event::Stderr(c) => Some(Ok(Event::Stderr {
                            offset: c.offset,
                            data: c.data,
                        })),
                        run_event::Event::Result(r) => {
                            done = true;
                            Some(Ok(Event::Result(outcome(id.clone(), r))))
                        }
                    },
                    Ok(RunEvent { event: None }) => None,
                    Err(s) => {
                        done = true;
                        Some(Err(me.runner_error(&addr, &uid, s)))
                    }
                }
            };
            futures::future::ready(out)
        }))
    }

    /// Ends a running call.
    pub async fn cancel(&self, header: Option<&str>, addr: &SessionAddr, id: &str) -> Result<bool> {
        address::call_id(id)?;
        let a = self.admit(header, addr, Permission::Call).await?;
        let (uid, mut client) = self.runner(addr, &a.session)?;
        let res = client
            .cancel(CancelRequest { id: id.to_owned() })
            .await
            .map_err(|s| self.runner_error(addr, &uid, s))?;
        Ok(res.into_inner().was_running)
    }

    /// Approves one call: needs the approve permission, not the call one.
    pub async fn approve(
        &self,
        header: Option<&str>,
        addr: &SessionAddr,
        tool: &str,
        input: &serde_json::Value,
        id: Option<&str>,
    ) -> Result<(String, i64)> {
        let a = self.admit(header, addr, Permission::Approve).await?;
        if let Some(id) = id {
            address::call_id(id)?;
        }
        if !tools_of(&a.session).iter().any(|t| t.name == tool) {
            return Err(Error::NotFound(format!(
                "session {addr} has no tool {tool:?}"
            )));
        }
        if !input.is_object() {
            return Err(Error::Invalid(
                "input: a tool's input is a JSON object".into(),
            ));
        }
        tracing::info!(session = %addr, tool, approver = %a.caller.user, "call approved");
        Ok(self.approvals.issue(
            &Subject {
                addr,
                tool,
                input,
                id,
            },
            now_unix(),
        ))
    }
}

fn outcome(id: String, r: RunResponse) -> Outcome {
    Outcome {
        id,
        content: r.content,
        is_error: r.is_error,
    }
}

/// The tools in a session's status.
pub fn tools_of(session: &AgentSession) -> Vec<ToolView> {
    let Some(status) = session.status.as_ref() else {
        return Vec::new();
    };
    status
        .tools
        .iter()
        .map(|t| ToolView {
            name: t.name.clone(),
            description: t.description.clone(),
            input_schema: t.input_schema.clone(),
            permission_policy: t
                .policy
                .clone()
                .or_else(|| status.policies.get(&t.name).cloned())
                .unwrap_or_else(|| "always_allow".to_owned()),
        })
        .collect()
}

/// A tool's permission policy in the session's status.
fn policy_of(session: &AgentSession, tool: &str) -> Option<String> {
    let status = session.status.as_ref()?;
    status
        .tools
        .iter()
        .find(|t| t.name == tool)
        .and_then(|t| t.policy.clone())
        .or_else(|| status.policies.get(tool).cloned())
}
