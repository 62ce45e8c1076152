//! Calls through the gateway, when one is installed and reachable and the
//! kubeconfig's user has a bearer token to show it: the operator publishes
//! where the gateway is in `kube-public/agentplane-gateway` (URL, Service
//! address, CA). Anything else -- no token (client certificates, exec
//! plugins), no directory entry, no route to the Service within two
//! seconds, or a token the gateway does not accept -- and the plugin uses
//! port-forward as before. `--confirm` on an `always_ask` tool becomes an
//! approval asked of the gateway with the user's own identity, which needs
//! create on `agentsessions/approve`.

use std::time::Duration;

use gateway::proto::gateway_client::GatewayClient;
use gateway::proto::{ApproveRequest, CallRequest, CallResult, Session};
use gateway::published::{self, Published};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{Api, Client};
use secrecy::ExposeSecret;
use tonic::transport::Channel;

use crate::error::Error;

/// A gateway that has not answered by then is taken as unreachable.
const CONNECT: Duration = Duration::from_secs(2);
/// A token file larger than this is not one.
const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// The bearer token of the kubeconfig's user, if it has one.
pub fn bearer(cfg: &kube::Config) -> Option<String> {
    if let Some(t) = &cfg.auth_info.token {
        return Some(t.expose_secret().to_owned());
    }
    let path = cfg.auth_info.token_file.as_ref()?;
    use std::io::Read;
    let mut s = String::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_TOKEN_BYTES)
        .read_to_string(&mut s)
        .ok()?;
    let t = s.trim();
    (!t.is_empty()).then(|| t.to_owned())
}

/// A connected gateway and the token to show it.
#[derive(Debug)]
pub struct Route {
    client: GatewayClient<Channel>,
    token: String,
}

/// The gateway, if there is one to use.
pub async fn route(kube: &Client, token: Option<String>) -> Option<Route> {
    let token = token?;
    let cms: Api<ConfigMap> = Api::namespaced(kube.clone(), published::NAMESPACE);
    let data = cms.get_opt(published::NAME).await.ok()??.data?;
    let channel = Published::parse(&data)
        .ok()?
        .endpoint(CONNECT)
        .ok()?
        .connect()
        .await
        .ok()?;
    Some(Route {
        client: published::client(channel, 16 << 20),
        token,
    })
}

fn with_token<T>(msg: T, token: &str) -> Result<tonic::Request<T>, Error> {
    let mut r = tonic::Request::new(msg);
    let value = format!("Bearer {token}")
        .parse()
        .map_err(|_| Error::Config("the kubeconfig's token is not a valid header value".into()))?;
    r.metadata_mut().insert("authorization", value);
    Ok(r)
}

/// What became of a call offered to the gateway.
#[derive(Debug)]
pub enum Outcome {
    /// It ran.
    Done(CallResult),
    /// The gateway would not take it from this user (token not accepted)
    /// or could not be reached: use port-forward.
    Fallback(String),
}

/// Whether a status means "use port-forward instead": only a token the
/// gateway did not accept, when nothing ran. (A connection that breaks
/// mid-call is not retried elsewhere: the call may have run.)
fn falls_back(s: &tonic::Status) -> bool {
    s.code() == tonic::Code::Unauthenticated
}

fn refused(s: &tonic::Status) -> Error {
    match s.code() {
        tonic::Code::PermissionDenied | tonic::Code::InvalidArgument => {
            Error::GatewayRefused(s.message().to_owned())
        }
        _ => Error::Gateway(s.message().to_owned()),
    }
}

impl Route {
    /// Calls `tool` on the session; with `approve`, first asks the gateway
    /// to approve this exact call as the user.
    pub async fn call(
        &mut self,
        namespace: &str,
        name: &str,
        tool: &str,
        input_json: &str,
        id: &str,
        approve: bool,
    ) -> Result<Outcome, Error> {
        let session = Some(Session {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        });
        let mut approval = String::new();
        if approve {
            let req = ApproveRequest {
                session: session.clone(),
                name: tool.to_owned(),
                input_json: input_json.to_owned(),
                id: id.to_owned(),
            };
            match self.client.approve(with_token(req, &self.token)?).await {
                Ok(a) => approval = a.into_inner().token,
                Err(s) if falls_back(&s) => return Ok(Outcome::Fallback(s.message().to_owned())),
                Err(s) => return Err(refused(&s)),
            }
        }
        let req = CallRequest {
            session,
            id: id.to_owned(),
            name: tool.to_owned(),
            input_json: input_json.to_owned(),
            approval,
        };
        match self.client.run(with_token(req, &self.token)?).await {
            Ok(r) => Ok(Outcome::Done(r.into_inner())),
            Err(s) if falls_back(&s) => Ok(Outcome::Fallback(s.message().to_owned())),
            Err(s) => Err(refused(&s)),
        }
    }
}
