//! Connections to runners: one HTTP/2 channel per sandbox pod, over mutual
//! TLS (the gateway's certificate as the client; the runner's checked
//! against the platform's CA and [`runner_api::RUNNER_TLS_NAME`]), made on
//! first use and kept while the pod lives. Calls to one runner multiplex on
//! its channel.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use runner_api::proto::runner_client::RunnerClient;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::directory::RunnerAt;
use crate::error::{Error, Result};

/// A runner that has not answered the TCP and TLS handshakes by then is
/// reported unavailable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// The pooled channels.
pub struct Runners {
    tls: ClientTlsConfig,
    max: usize,
    channels: Mutex<HashMap<String, (std::net::SocketAddr, Channel)>>,
}

impl std::fmt::Debug for Runners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runners")
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl Runners {
    /// From the gateway's certificate and key and the CA runners' are
    /// signed by (PEM).
    pub fn new(cert: &[u8], key: &[u8], ca: &[u8], max: usize) -> Self {
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .identity(Identity::from_pem(cert, key))
            .domain_name(runner_api::RUNNER_TLS_NAME);
        Self {
            tls,
            max: max.max(1),
            channels: Mutex::new(HashMap::new()),
        }
    }

    /// A client of the runner at `at`, on its pooled channel. `alive` gives
    /// the UIDs of the pods that still exist, asked only when the pool is
    /// full, to drop the channels of gone pods.
    pub fn client(
        &self,
        at: &RunnerAt,
        alive: impl FnOnce() -> std::collections::HashSet<String>,
    ) -> Result<RunnerClient<Channel>> {
        let mut map = self
            .channels
            .lock()
            .map_err(|_| Error::Internal("runner pool lock poisoned".into()))?;
        if let Some((addr, ch)) = map.get(&at.pod_uid)
            && *addr == at.addr
        {
            return Ok(client(ch.clone()));
        }
        if map.len() >= self.max {
            let alive = alive();
            map.retain(|uid, _| alive.contains(uid));
            if map.len() >= self.max {
                return Err(Error::TooManyRequests(format!(
                    "the gateway holds connections to {} runners, its most; add replicas or raise --max-runners",
                    self.max
                )));
            }
        }
        let endpoint = Endpoint::from_shared(format!("https://{}", at.addr))
            .map_err(|e| Error::Internal(format!("runner address {}: {e}", at.addr)))?
            .tls_config(self.tls.clone())
            .map_err(|e| Error::Tls(format!("runner TLS configuration: {e}")))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10));
        let ch = endpoint.connect_lazy();
        map.insert(at.pod_uid.clone(), (at.addr, ch.clone()));
        Ok(client(ch))
    }

    /// Forgets a runner's channel (its pod went away or it failed).
    pub fn forget(&self, pod_uid: &str) {
        if let Ok(mut map) = self.channels.lock() {
            map.remove(pod_uid);
        }
    }
}

fn client(ch: Channel) -> RunnerClient<Channel> {
    // A tool result is at most the runner's output cap plus framing.
    RunnerClient::new(ch)
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(16 << 20)
}
