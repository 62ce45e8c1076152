//! A gRPC channel to the runner through the API server's port-forward: the
//! runner listens on loopback inside the pod, so nothing is exposed on the
//! pod network and access is exactly the RBAC verb pods/portforward.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::Error;

/// Opens a channel to `port` of `pod`. Each connection the channel makes
/// is its own port-forward stream.
pub async fn channel(pods: Api<Pod>, pod: String, port: u16) -> Result<Channel, Error> {
    let target = pod.clone();
    Endpoint::from_static("http://127.0.0.1:1")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let pods = pods.clone();
            let pod = target.clone();
            async move {
                let mut pf = pods
                    .portforward(&pod, &[port])
                    .await
                    .map_err(std::io::Error::other)?;
                let stream = pf
                    .take_stream(port)
                    .ok_or_else(|| std::io::Error::other("the API server returned no stream"))?;
                tokio::spawn(async move {
                    let _ = pf.join().await;
                });
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            }
        }))
        .await
        .map_err(|e| Error::PortForward {
            pod,
            message: format!("{e}: {}", source_chain(&e)),
        })
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut cur = e.source();
    while let Some(s) = cur {
        parts.push(s.to_string());
        cur = s.source();
    }
    parts.join(": ")
}
