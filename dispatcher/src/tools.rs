//! Tool calls through the gateway, with the dispatcher's own
//! ServiceAccount token: the same authenticated path (TokenReview,
//! SubjectAccessReview on `agentsessions/call`) and mutual TLS to the
//! runner that every other program uses. Never port-forward, never the
//! runner's socket.
//!
//! Calls run as streamed calls under the hosted `tool_use` id, so the
//! runner keeps each one for ten minutes after it ends: a dispatcher that
//! lost its connection, or restarted, attaches to the call by id and takes
//! its result instead of running it again.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use gateway::proto::call_event::Event;
use gateway::proto::gateway_client::GatewayClient;
use gateway::proto::{ApproveRequest, AttachRequest, CallRequest, Session};
use gateway::published::{self, Published};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tonic::transport::Channel;

use crate::error::{Error, Result};
use crate::ledger::ToolCall;
use crate::retry;

/// Where the operator publishes the gateway.
const DIRECTORY: (&str, &str) = (published::NAMESPACE, published::NAME);
/// The longest one call may take end to end (bash allows ten minutes).
pub const CALL_DEADLINE: Duration = Duration::from_secs(11 * 60);
/// Tries of a call whose connection failed (each attaches first).
const TRIES: u32 = 4;
/// A token file larger than this is not one.
const MAX_TOKEN_BYTES: u64 = 64 * 1024;
/// The projected token is re-read this often (the kubelet rotates it).
const TOKEN_TTL: Duration = Duration::from_secs(60);

/// A tool call's result, as the runner returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The text the runner returned, unchanged.
    pub content: String,
    /// Whether it is an error result.
    pub is_error: bool,
}

/// The gateway, followed through its directory entry.
///
/// The entry outlives a release (it stays after `helm uninstall`, like the
/// CRDs), so an entry read once at start may name a gateway that is gone
/// while the new operator has not yet rewritten it: the dispatcher watches
/// the entry and moves its channel whenever it changes.
#[derive(Debug)]
pub struct Gateway {
    current: RwLock<Option<(Published, GatewayClient<Channel>)>>,
    published: tokio::sync::Notify,
    token_file: PathBuf,
    token: Mutex<Option<(String, Instant)>>,
}

impl Gateway {
    /// A gateway not yet published; [`Gateway::follow`] fills it in.
    pub fn new(token_file: PathBuf) -> Self {
        Self {
            current: RwLock::new(None),
            published: tokio::sync::Notify::new(),
            token_file,
            token: Mutex::new(None),
        }
    }

    /// Points the channel at `d`; whether it moved.
    pub fn set(&self, d: Published) -> Result<bool> {
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if cur.as_ref().is_some_and(|(have, _)| *have == d) {
            return Ok(false);
        }
        let endpoint = d
            .endpoint(Duration::from_secs(5))
            .map_err(|e| Error::Config(e.to_string()))?
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        let client = published::client(endpoint.connect_lazy(), 64 << 20);
        tracing::info!(address = %d.target, name = %d.host, "calls go to the gateway published here");
        *cur = Some((d, client));
        drop(cur);
        self.published.notify_waiters();
        Ok(true)
    }

    fn clear(&self) {
        let mut cur = self.current.write().unwrap_or_else(|p| p.into_inner());
        if cur.take().is_some() {
            tracing::warn!(
                "the gateway's directory entry {}/{} was deleted; calls wait for a new one",
                DIRECTORY.0,
                DIRECTORY.1
            );
        }
    }

    fn client(&self) -> Result<GatewayClient<Channel>, tonic::Status> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(_, c)| c.clone())
            .ok_or_else(|| {
                tonic::Status::unavailable(format!(
                    "no gateway is published in {}/{}: install the chart with gateway.enabled=true",
                    DIRECTORY.0, DIRECTORY.1
                ))
            })
    }

    /// Whether a gateway is known.
    pub fn is_published(&self) -> bool {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Waits until a gateway is published, at most `limit`.
    pub async fn wait_published(&self, limit: Duration) -> Result<()> {
        let wait = async {
            loop {
                let notified = self.published.notified();
                if self.is_published() {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(limit, wait).await.map_err(|_| {
            Error::Config(format!(
                "no gateway was published in {}/{} within {}s: install the chart with gateway.enabled=true",
                DIRECTORY.0,
                DIRECTORY.1,
                limit.as_secs()
            ))
        })
    }

    /// Watches the gateway's directory entry for as long as the dispatcher
    /// runs (the watch backs off on errors by itself).
    pub async fn follow(self: Arc<Self>, kube: Client) {
        let cms: Api<ConfigMap> = Api::namespaced(kube, DIRECTORY.0);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", DIRECTORY.1));
        let mut events = std::pin::pin!(watcher::watcher(cms, cfg).default_backoff());
        while let Some(ev) = events.next().await {
            match ev {
                Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                    let data = cm.data.unwrap_or_default();
                    let parsed = Published::parse(&data).map_err(|e| Error::Config(e.to_string()));
                    if let Err(e) = parsed.and_then(|d| self.set(d)) {
                        tracing::warn!(error = %e, "the gateway's directory entry is not usable; keeping the last one");
                    }
                }
                Ok(watcher::Event::Delete(_)) => self.clear(),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "watching the gateway's directory entry; retrying");
                }
            }
        }
    }

    fn token(&self) -> Result<String> {
        let mut cached = self.token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((t, at)) = cached.as_ref()
            && at.elapsed() < TOKEN_TTL
        {
            return Ok(t.clone());
        }
        use std::io::Read;
        let mut s = String::new();
        std::fs::File::open(&self.token_file)
            .and_then(|f| f.take(MAX_TOKEN_BYTES).read_to_string(&mut s))
            .map_err(|e| {
                Error::Config(format!(
                    "cannot read the ServiceAccount token {}: {e}",
                    self.token_file.display()
                ))
            })?;
        let t = s.trim().to_owned();
        if t.is_empty() {
            return Err(Error::Config(format!(
                "the ServiceAccount token {} is empty",
                self.token_file.display()
            )));
        }
        *cached = Some((t.clone(), Instant::now()));
        Ok(t)
    }

    fn request<T>(&self, msg: T, timeout: Duration) -> Result<tonic::Request<T>> {
        let mut r = tonic::Request::new(msg);
        let v = format!("Bearer {}", self.token()?).parse().map_err(|_| {
            Error::Config("the ServiceAccount token is not a valid header value".into())
        })?;
        r.metadata_mut().insert("authorization", v);
        r.set_timeout(timeout);
        Ok(r)
    }

    /// Runs one call in the session's sandbox. `approve`: the session's
    /// policy for the tool is `always_ask` and the hosted side has allowed
    /// this call, so the dispatcher asks the gateway for an approval bound
    /// to the call's id and input first. `resume`: the call may have been
    /// started by an earlier incarnation; attach before running.
    pub async fn call(
        &self,
        namespace: &str,
        session: &str,
        call: &ToolCall,
        approve: bool,
        resume: bool,
    ) -> Outcome {
        let addr = Session {
            namespace: namespace.to_owned(),
            name: session.to_owned(),
        };
        let input_json = call.input.to_string();
        let mut attach_first = resume;
        let mut last = String::new();
        for n in 0..TRIES {
            if n > 0 {
                tokio::time::sleep(retry::backoff(
                    n - 1,
                    Duration::from_millis(250),
                    Duration::from_secs(4),
                ))
                .await;
            }
            if attach_first {
                match self.attach(&addr, &call.id).await {
                    Ok(Some(o)) => return o,
                    Ok(None) => {}
                    Err(s) if retryable(&s) => {
                        last = s.message().to_owned();
                        continue;
                    }
                    Err(s) => return refused(&s),
                }
            }
            match self.run(&addr, call, &input_json, approve).await {
                Ok(o) => return o,
                Err(s) if retryable(&s) => {
                    // The call may be running: the next try attaches first.
                    attach_first = true;
                    last = s.message().to_owned();
                }
                Err(s) => return refused(&s),
            }
        }
        Outcome {
            content: format!(
                "the sandbox could not be reached to run this call ({TRIES} tries): {last}"
            ),
            is_error: true,
        }
    }

    async fn attach(&self, addr: &Session, id: &str) -> Result<Option<Outcome>, tonic::Status> {
        let req = AttachRequest {
            session: Some(addr.clone()),
            id: id.to_owned(),
            stdout_offset: i64::MAX as u64,
            stderr_offset: i64::MAX as u64,
        };
        let req = self.request(req, CALL_DEADLINE).map_err(config_status)?;
        match self.client()?.attach(req).await {
            Ok(s) => drain(s.into_inner()).await.map(Some),
            Err(s)
                if s.code() == tonic::Code::NotFound && s.message().contains("no call with id") =>
            {
                Ok(None)
            }
            Err(s) => Err(s),
        }
    }

    async fn run(
        &self,
        addr: &Session,
        call: &ToolCall,
        input_json: &str,
        approve: bool,
    ) -> Result<Outcome, tonic::Status> {
        let mut approval = String::new();
        if approve {
            let req = ApproveRequest {
                session: Some(addr.clone()),
                name: call.name.clone(),
                input_json: input_json.to_owned(),
                id: call.id.clone(),
            };
            let req = self
                .request(req, Duration::from_secs(30))
                .map_err(config_status)?;
            approval = self.client()?.approve(req).await?.into_inner().token;
        }
        let req = CallRequest {
            session: Some(addr.clone()),
            id: call.id.clone(),
            name: call.name.clone(),
            input_json: input_json.to_owned(),
            approval,
        };
        let req = self.request(req, CALL_DEADLINE).map_err(config_status)?;
        let s = self.client()?.run_stream(req).await?;
        drain(s.into_inner()).await
    }
}

/// Reads a call's events to its result; output chunks are dropped as they
/// come (the result carries the output the model sees), so nothing grows.
async fn drain(
    mut s: tonic::Streaming<gateway::proto::CallEvent>,
) -> Result<Outcome, tonic::Status> {
    while let Some(ev) = s.next().await {
        if let Some(Event::Result(r)) = ev?.event {
            return Ok(Outcome {
                content: r.content,
                is_error: r.is_error,
            });
        }
    }
    Err(tonic::Status::unavailable(
        "the call's stream ended without a result",
    ))
}

fn config_status(e: Error) -> tonic::Status {
    tonic::Status::failed_precondition(e.to_string())
}

/// Failures where the call may still run, or be asked again safely.
fn retryable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable
            | tonic::Code::Unknown
            | tonic::Code::ResourceExhausted
            | tonic::Code::Aborted
    )
}

/// A refusal the model should read: the plane would not run the call.
fn refused(s: &tonic::Status) -> Outcome {
    Outcome {
        content: format!("the sandbox refused this call: {}", s.message()),
        is_error: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(
        url: &str,
        address: Option<&str>,
        ca: &str,
    ) -> std::collections::BTreeMap<String, String> {
        let mut m = std::collections::BTreeMap::from([
            ("url".to_owned(), url.to_owned()),
            ("ca.crt".to_owned(), ca.to_owned()),
        ]);
        if let Some(a) = address {
            m.insert("address".to_owned(), a.to_owned());
        }
        m
    }

    #[tokio::test]
    async fn the_channel_moves_only_when_the_entry_changes() {
        let ca = rcgen::generate_simple_self_signed(vec!["gw.ns.svc".into()])
            .unwrap()
            .cert
            .pem();
        let g = Gateway::new(PathBuf::from("/nonexistent"));
        assert!(!g.is_published());
        let e = g.client().unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unavailable);
        assert!(e.message().contains("no gateway is published"), "{e}");
        let old =
            Published::parse(&entry("https://gw.ns.svc:443", Some("10.96.0.9:443"), &ca)).unwrap();
        assert!(g.set(old.clone()).unwrap());
        assert!(
            !g.set(old).unwrap(),
            "the same entry again keeps the channel"
        );
        let moved =
            Published::parse(&entry("https://gw.ns.svc:443", Some("10.96.0.7:443"), &ca)).unwrap();
        assert!(g.set(moved).unwrap(), "a new address moves the channel");
        g.wait_published(Duration::from_millis(10)).await.unwrap();
        g.clear();
        assert!(!g.is_published());
        let e = g
            .wait_published(Duration::from_millis(10))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("within 0s"), "{e}");
    }

    #[test]
    fn only_connection_failures_are_retried() {
        assert!(retryable(&tonic::Status::unavailable("x")));
        assert!(!retryable(&tonic::Status::permission_denied("x")));
        assert!(!retryable(&tonic::Status::invalid_argument("x")));
        let o = refused(&tonic::Status::not_found("tool \"nope\" is not enabled"));
        assert!(o.is_error && o.content.contains("nope"));
    }
}
