//! The gRPC front: every runner call, addressed by namespace and name, with
//! the bearer token in the `authorization` metadata. Errors are the runner's
//! own statuses when it answered, else [`Error::to_status`] (with the
//! reason in `agentplane-reason`).

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::address::SessionAddr;
use crate::error::Error;
use crate::gate::{Call, Event, Gate};
use crate::proto::gateway_server::{Gateway, GatewayServer};
use crate::proto::{
    Approval, ApproveRequest, AttachRequest, CallEvent, CallRequest, CallResult, CancelRequest,
    CancelResponse, Chunk, ListToolsRequest, ListToolsResponse, Session, Tool, call_event,
};

/// The service.
#[derive(Debug, Clone)]
pub struct Service {
    gate: Arc<Gate>,
}

/// The gRPC server of `gate`, with its message bounds.
pub fn server(gate: Arc<Gate>) -> GatewayServer<Service> {
    GatewayServer::new(Service { gate })
        .max_decoding_message_size(crate::http::MAX_BODY_BYTES)
        .max_encoding_message_size(64 << 20)
}

fn auth<T>(req: &Request<T>) -> Option<String> {
    req.metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn addr(s: Option<&Session>) -> Result<SessionAddr, Status> {
    let s = s.ok_or_else(|| {
        Error::Invalid("session: the session's namespace and name are needed".into()).to_status()
    })?;
    SessionAddr::new(&s.namespace, &s.name).map_err(|e| e.to_status())
}

fn input(json: &str) -> Result<serde_json::Value, Status> {
    if json.is_empty() {
        return Ok(serde_json::Value::Object(serde_json::Map::new()));
    }
    serde_json::from_str(json)
        .map_err(|e| Error::Invalid(format!("input_json: not JSON: {e}")).to_status())
}

fn call_of(r: &CallRequest) -> Result<Call, Status> {
    Ok(Call {
        id: (!r.id.is_empty()).then(|| r.id.clone()),
        tool: r.name.clone(),
        input: input(&r.input_json)?,
        approval: (!r.approval.is_empty()).then(|| r.approval.clone()),
    })
}

type EventStream = Pin<Box<dyn Stream<Item = Result<CallEvent, Status>> + Send>>;

fn events(s: crate::gate::Events) -> EventStream {
    Box::pin(s.map(|e| {
        e.map(|e| CallEvent {
            event: Some(match e {
                Event::Stdout { offset, data } => call_event::Event::Stdout(Chunk { offset, data }),
                Event::Stderr { offset, data } => call_event::Event::Stderr(Chunk { offset, data }),
                Event::Result(o) => call_event::Event::Result(CallResult {
                    id: o.id,
                    content: o.content,
                    is_error: o.is_error,
                }),
            }),
        })
        .map_err(|e| e.to_status())
    }))
}

#[tonic::async_trait]
impl Gateway for Service {
    async fn run(&self, req: Request<CallRequest>) -> Result<Response<CallResult>, Status> {
        let header = auth(&req);
        let r = req.into_inner();
        let addr = addr(r.session.as_ref())?;
        let o = self
            .gate
            .call(header.as_deref(), &addr, call_of(&r)?)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(CallResult {
            id: o.id,
            content: o.content,
            is_error: o.is_error,
        }))
    }

    type RunStreamStream = EventStream;

    async fn run_stream(
        &self,
        req: Request<CallRequest>,
    ) -> Result<Response<Self::RunStreamStream>, Status> {
        let header = auth(&req);
        let r = req.into_inner();
        let addr = addr(r.session.as_ref())?;
        let s = self
            .gate
            .stream(header.as_deref(), &addr, call_of(&r)?)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(events(s)))
    }

    type AttachStream = EventStream;

    async fn attach(
        &self,
        req: Request<AttachRequest>,
    ) -> Result<Response<Self::AttachStream>, Status> {
        let header = auth(&req);
        let r = req.into_inner();
        let addr = addr(r.session.as_ref())?;
        let s = self
            .gate
            .attach(
                header.as_deref(),
                &addr,
                &r.id,
                r.stdout_offset,
                r.stderr_offset,
            )
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(events(s)))
    }

    async fn cancel(
        &self,
        req: Request<CancelRequest>,
    ) -> Result<Response<CancelResponse>, Status> {
        let header = auth(&req);
        let r = req.into_inner();
        let addr = addr(r.session.as_ref())?;
        let was_running = self
            .gate
            .cancel(header.as_deref(), &addr, &r.id)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(CancelResponse { was_running }))
    }

    async fn list_tools(
        &self,
        req: Request<ListToolsRequest>,
    ) -> Result<Response<ListToolsResponse>, Status> {
        let header = auth(&req);
        let r = req.into_inner();
        let addr = addr(r.session.as_ref())?;
        let tools = self
            .gate
            .tools(header.as_deref(), &addr)
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(ListToolsResponse {
            tools: tools
                .into_iter()
                .map(|t| Tool {
                    name: t.name,
                    description: t.description,
                    input_schema_json: t.input_schema.to_string(),
                    permission_policy: t.permission_policy,
                })
                .collect(),
        }))
    }

    async fn approve(&self, req: Request<ApproveRequest>) -> Result<Response<Approval>, Status> {
        let header = auth(&req);
        let r = req.into_inner();
        let addr = addr(r.session.as_ref())?;
        let input = input(&r.input_json)?;
        let (token, expires_at_unix) = self
            .gate
            .approve(
                header.as_deref(),
                &addr,
                &r.name,
                &input,
                (!r.id.is_empty()).then_some(r.id.as_str()),
            )
            .await
            .map_err(|e| e.to_status())?;
        Ok(Response::new(Approval {
            token,
            expires_at_unix,
        }))
    }
}
